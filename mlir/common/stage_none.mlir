  // normir common piece: stage where the layout does not stage rows in shared memory (or the
  // target has no asynchronous copy): never called, present so that the kernel text is one.
  func.func private @normir_stage_base() -> index attributes {llvm.linkage = #llvm.linkage<internal>} {
    %zero = arith.constant 0 : index
    return %zero : index
  }
  func.func private @normir_stage_copy(%dst: index, %src: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
  func.func private @normir_stage_commit() attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
  func.func private @normir_stage_wait_all() attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
  func.func private @normir_stage_wait_older() attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
