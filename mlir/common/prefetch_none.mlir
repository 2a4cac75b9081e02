  // normir common piece: prefetch_l2 where the target has none (or the layout does not use it).
  func.func private @normir_prefetch_l2(%base: index, %byte_offset: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
