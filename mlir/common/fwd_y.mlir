        // normir common fragment (spliced inside a chunk loop of norm_fwd.mlir's pass 2, not a
        // function: the text is the loop's own, so the unrolled loop folds it): chunk k's y in fp32,
        // %yb = normir_fwd_norm(h - shift) (rounded to T with ROUND_XHAT) * (w + WEIGHT_OFFSET) + b,
        // from the held chunk (x_held)
        // or the row read again, and %yq, what a quantized forward quantizes: y * smooth with
        // HAS_SMOOTH, else y. Reads the skeleton's pass-2 values (%rstd_v, %mean_v, %shift_v, the
        // buffers and flags) and the chunk's %k, %col.
            %xv = scf.if %x_held -> (vector<${V}x${HT}>) {
              %v = vector.load %xbuf[%k, %c0] : memref<${K}x${V}x${HT}, #gpu.address_space<private>>, vector<${V}x${HT}>
              scf.yield %v : vector<${V}x${HT}>
            } else {
              %v = func.call @normir_fwd_load_h(%x_arg, %residual_arg, %row, %col, %rows, %x_stride, %residual_stride,
                                                %pol_first, %true)
                  : (memref<${N}x${T}>, memref<${N}x${RT}>, index, index, index, index, index, i64, i1) -> vector<${V}x${HT}>
              scf.yield %v : vector<${V}x${HT}>
            }
            %xf = func.call @normir_late_ext_h(%xv) : (vector<${V}x${HT}>) -> vector<${V}xf32>
            %xs = arith.subf %xf, %shift_v : vector<${V}xf32>
            %xn_f = func.call @normir_fwd_norm(%xs, %rstd_v, %mean_v)
                : (vector<${V}xf32>, vector<${V}xf32>, vector<${V}xf32>) -> vector<${V}xf32>
            %xn = scf.if %round_xhat -> (vector<${V}xf32>) {  // vLLM's dynamic rule: x_hat in x's type
              %xt = ${TRUNC_T} %xn_f : vector<${V}xf32> to vector<${V}x${T}>
              %xr = ${EXT_T} %xt : vector<${V}x${T}> to vector<${V}xf32>
              scf.yield %xr : vector<${V}xf32>
            } else {
              scf.yield %xn_f : vector<${V}xf32>
            }
            %yf = scf.if %has_weight -> (vector<${V}xf32>) {
              %w_early = arith.cmpi ult, %k, %overlap_k : index
              %w_in_buf = arith.ori %w_held, %w_early : i1
              %wv = scf.if %w_in_buf -> (vector<${V}x${WT}>) {
                %v = vector.load %wbuf[%k, %c0] : memref<${K}x${V}x${WT}, #gpu.address_space<private>>, vector<${V}x${WT}>
                scf.yield %v : vector<${V}x${WT}>
              } else {
                %v = vector.load %w_arg[%col] {alignment = ${W_ALIGN}} : memref<${N}x${WT}>, vector<${V}x${WT}>
                scf.yield %v : vector<${V}x${WT}>
              }
              %wf0 = func.call @normir_late_ext_w(%wv) : (vector<${V}x${WT}>) -> vector<${V}xf32>
              %wf = scf.if %has_offset -> (vector<${V}xf32>) {  // y = x_hat * (w + weight_offset)
                %wo = arith.addf %wf0, %offset_v : vector<${V}xf32>
                scf.yield %wo : vector<${V}xf32>
              } else {
                scf.yield %wf0 : vector<${V}xf32>
              }
              %yw = arith.mulf %xn, %wf ${WB_CONTRACT} : vector<${V}xf32>
              scf.yield %yw : vector<${V}xf32>
            } else {
              scf.yield %xn : vector<${V}xf32>
            }
            %yb = scf.if %has_bias -> (vector<${V}xf32>) {
              %b_early = arith.cmpi ult, %k, %overlap_k : index
              %bv = scf.if %b_early -> (vector<${V}x${BT}>) {
                %v = vector.load %bbuf[%k, %c0] : memref<${K}x${V}x${BT}, #gpu.address_space<private>>, vector<${V}x${BT}>
                scf.yield %v : vector<${V}x${BT}>
              } else {
                %v = vector.load %b_arg[%col] {alignment = ${ALIGN_BT}} : memref<${N}x${BT}>, vector<${V}x${BT}>
                scf.yield %v : vector<${V}x${BT}>
              }
              %bf = func.call @normir_late_ext_b(%bv) : (vector<${V}x${BT}>) -> vector<${V}xf32>
              %yb1 = arith.addf %yf, %bf ${WB_CONTRACT} : vector<${V}xf32>
              scf.yield %yb1 : vector<${V}xf32>
            } else {
              scf.yield %yf : vector<${V}xf32>
            }
            %yq = scf.if %has_smooth -> (vector<${V}xf32>) {
              %sv = vector.load %smooth_arg[%col] {alignment = ${ALIGN_SMOOTH}} : memref<${N}xf32>, vector<${V}xf32>
              %ys = arith.mulf %yb, %sv : vector<${V}xf32>
              scf.yield %ys : vector<${V}xf32>
            } else {
              scf.yield %yb : vector<${V}xf32>
            }
