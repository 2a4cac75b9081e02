  // normir common piece: rsqrt for NVVM targets. math.rsqrt would become a libdevice call.
  func.func private @normir_rsqrt(%a: f32) -> f32 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %r = llvm.call_intrinsic "llvm.nvvm.rsqrt.approx.ftz.f"(%a) : (f32) -> f32
    return %r : f32
  }
