  // A copy of the rsqrt piece with a misspelt op name, found first through --include.
  func.func private @normir_rsqrt(%a: f32) -> f32 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %r = llvm.call_intrinsicc "llvm.nvvm.rsqrt.approx.ftz.f"(%a) : (f32) -> f32
    return %r : f32
  }
