  // normir common piece: programmatic dependent launch on NVVM targets (sm_90+). A kernel launched
  // with programmatic stream serialization (the column sums, after the row kernel that wrote their
  // partial rows) may start while the kernel ahead of it still runs: normir_grid_dep_wait holds it
  // until that kernel has finished and its writes are visible (griddepcontrol.wait).
  // normir_grid_dep_launch lets the kernel after this one start early (its blocks take the
  // multiprocessors this one leaves and wait there); it changes nothing for a plain launch.
  func.func private @normir_grid_dep_wait() attributes {llvm.linkage = #llvm.linkage<internal>} {
    llvm.inline_asm has_side_effects "griddepcontrol.wait;", "~{memory}" : () -> ()
    return
  }
  func.func private @normir_grid_dep_launch() attributes {llvm.linkage = #llvm.linkage<internal>} {
    llvm.inline_asm has_side_effects "griddepcontrol.launch_dependents;", "~{memory}" : () -> ()
    return
  }
