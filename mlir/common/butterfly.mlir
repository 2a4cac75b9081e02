  // normir common piece: @${FN}, the row summaries (${NR} fp32 values) of 2^${STEPS} lanes of a
  // warp merged by butterfly shuffles (offsets 1, 2, ..., 2^(STEPS-1)) and @${PAIR} (the
  // op's merge of two summaries over as many elements, where the layout gives every thread as
  // many: a sum, or Chan's update); every lane gets the same bits (the merge is symmetric).
  // Values before PAIR_FIRST = ${PAIR_FIRST} are not shuffled: the pair merge does not read the
  // partner's (the count, where counts are equal); the partner's slot keeps this lane's own.
  // The step count is a constant of the piece, so that each shuffle's offset is a constant once
  // the loops unroll: AMDGPU lowers those to swizzles and permlane swaps (a shuffle whose offset
  // MLIR cannot fold becomes ds_bpermute and DPP adds).
  func.func private @${FN}(%v: vector<${NR}xf32>) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %one = arith.constant 1 : i32
    %width = arith.constant ${WARP} : i32
    %r = affine.for %i = 0 to ${STEPS} iter_args(%acc = %v) -> (vector<${NR}xf32>) {
      %i32 = arith.index_cast %i : index to i32
      %offset = arith.shli %one, %i32 : i32
      %other = affine.for %j = ${PAIR_FIRST} to ${NR} iter_args(%o = %acc) -> (vector<${NR}xf32>) {
        %e = vector.extract %acc[%j] : f32 from vector<${NR}xf32>
        %s, %ok = gpu.shuffle xor %e, %offset, %width : f32
        %o2 = vector.insert %s, %o[%j] : f32 into vector<${NR}xf32>
        affine.yield %o2 : vector<${NR}xf32>
      }
      %merged = func.call @${PAIR}(%acc, %other) : (vector<${NR}xf32>, vector<${NR}xf32>) -> vector<${NR}xf32>
      affine.yield %merged : vector<${NR}xf32>
    }
    return %r : vector<${NR}xf32>
  }
