        // normir common fragment (spliced inside a chunk loop, not a function: the text is the
        // loop's own, so the unrolled loop folds it as before): chunk k of thread `lane`, its
        // first column %col (past the part's %col_base) and %${LIVE}, whether it exists (chunks
        // k < KFULL exist for every lane; the last k may fall past the part's NCHUNK chunks).
        // Reads %k, %lane, %col_base and the skeleton's %tpr, %vw, %k_full, %nchunk.
        %ck = arith.muli %k, %tpr : index
        %chunk = arith.addi %ck, %lane : index
        %col_in = arith.muli %chunk, %vw : index
        %col = arith.addi %col_base, %col_in : index
        %always = arith.cmpi ult, %k, %k_full : index
        %in_row = arith.cmpi ult, %chunk, %nchunk : index
        %${LIVE} = arith.ori %always, %in_row : i1
