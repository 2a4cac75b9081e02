  // normir common piece: rsqrt for ROCDL targets (v_rsq_f32). math.rsqrt would be sqrt + divide.
  func.func private @normir_rsqrt(%a: f32) -> f32 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %r = llvm.call_intrinsic "llvm.amdgcn.rsq"(%a) : (f32) -> f32
    return %r : f32
  }
