  // normir common piece: prefetch_l2 for NVVM targets. Asks L2 for the line holding
  // base + byte_offset (prefetch.global.L2): no register waits on it, so a block can start
  // the memory traffic of a later row while it is still reducing the current one.
  func.func private @normir_prefetch_l2(%base: index, %byte_offset: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %addr = arith.addi %base, %byte_offset : index
    %addr_i64 = arith.index_cast %addr : index to i64
    %ptr = llvm.inttoptr %addr_i64 : i64 to !llvm.ptr<1>
    nvvm.prefetch level = L2, %ptr : !llvm.ptr<1>
    return
  }
