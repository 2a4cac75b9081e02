  // normir common piece: late_ext for the row tensor ${TENSOR} in bf16: bf16 -> f32 for values held
  // across a reduction. The same conversion as arith.extf, spelled with integer ops so that LLVM
  // does not merge it with the first pass's extf: the register copy of the row stays packed (2
  // bytes an element) instead of as fp32.
  func.func private @normir_late_ext_${TENSOR}(%v: vector<${V}xbf16>) -> vector<${V}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %sixteen = arith.constant dense<16> : vector<${V}xi32>
    %bits = arith.bitcast %v : vector<${V}xbf16> to vector<${V}xi16>
    %wide = arith.extui %bits : vector<${V}xi16> to vector<${V}xi32>
    %high = arith.shli %wide, %sixteen : vector<${V}xi32>
    %f = arith.bitcast %high : vector<${V}xi32> to vector<${V}xf32>
    return %f : vector<${V}xf32>
  }
