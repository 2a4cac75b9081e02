  // normir common piece: grid_dep where the target launches kernels in stream order only (no
  // programmatic dependent launch): the kernel ahead has finished when this one starts.
  func.func private @normir_grid_dep_wait() attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
  func.func private @normir_grid_dep_launch() attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
