  // normir common piece: @${FN}, each of the ${NR} values of %v summed over 2^${STEPS} lanes of a
  // warp by butterfly shuffles (offsets 1, 2, ..., 2^(STEPS-1)); every lane gets the sums. The
  // step count is a constant of the piece, so that each shuffle's offset is a constant once the
  // loops unroll: AMDGPU lowers those to swizzles and permlane swaps (a shuffle whose offset MLIR
  // cannot fold becomes ds_bpermute and DPP adds).
  func.func private @${FN}(%v: vector<${NR}xf32>) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %one = arith.constant 1 : i32
    %width = arith.constant ${WARP} : i32
    %r = affine.for %j = 0 to ${NR} iter_args(%a = %v) -> (vector<${NR}xf32>) {
      %e = vector.extract %a[%j] : f32 from vector<${NR}xf32>
      %s = affine.for %i = 0 to ${STEPS} iter_args(%acc = %e) -> (f32) {
        %i32 = arith.index_cast %i : index to i32
        %offset = arith.shli %one, %i32 : i32
        %other, %ok = gpu.shuffle xor %acc, %offset, %width : f32
        %sum = arith.addf %acc, %other : f32
        affine.yield %sum : f32
      }
      %a2 = vector.insert %s, %a[%j] : f32 into vector<${NR}xf32>
      affine.yield %a2 : vector<${NR}xf32>
    }
    return %r : vector<${NR}xf32>
  }
