  // normir common piece: a quantized forward's amax merge (row_sum's PAIR for normir_row_max):
  // two maxima of |y| merged by maxnum, which ignores a NaN (the other operand wins). The LLVM intrinsics here and in
  // the skeleton's amax: arith's scalar min/max lower to libdevice and OCML calls.
  func.func private @normir_max_pair(%a: vector<1xf32>, %b: vector<1xf32>) -> vector<1xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %m = llvm.intr.maxnum(%a, %b) : (vector<1xf32>, vector<1xf32>) -> vector<1xf32>
    return %m : vector<1xf32>
  }
