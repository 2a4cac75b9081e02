  // normir common piece: late_ext for the row tensor ${TENSOR} in ${TYPE}: the element type -> f32
  // for values held across a reduction (f16, f32: no cheaper packed form to keep, so the ordinary
  // cast).
  func.func private @normir_late_ext_${TENSOR}(%v: vector<${V}x${TYPE}>) -> vector<${V}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %f = ${EXT} %v : vector<${V}x${TYPE}> to vector<${V}xf32>
    return %f : vector<${V}xf32>
  }
