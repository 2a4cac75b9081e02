  // normir common piece: the element type -> f32 for values held across a reduction (f16, f32:
  // no cheaper packed form to keep, so the ordinary cast).
  func.func private @normir_late_ext(%v: vector<${V}x${T}>) -> vector<${V}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %f = ${EXT_T} %v : vector<${V}x${T}> to vector<${V}xf32>
    return %f : vector<${V}xf32>
  }
