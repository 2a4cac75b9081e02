  // normir common piece: cache_policy for NVVM targets (sm_80+): the L2 eviction policies the
  // hinted loads and stores carry (common/hint_io_nvvm.mlir), from the layout's hint bits: a row's
  // last read (policy_first: ${POLICY_LAST_READ}), a first read that pass 2 repeats (policy_last:
  // ${POLICY_KEEP}), stores (policy_store: evict_first). Made once per kernel (createpolicy).
  func.func private @normir_policy_first() -> i64 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %p = llvm.inline_asm "createpolicy.fractional.L2::${POLICY_LAST_READ}.b64 $0, 1.0;", "=l" : () -> i64
    return %p : i64
  }
  func.func private @normir_policy_last() -> i64 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %p = llvm.inline_asm "createpolicy.fractional.L2::${POLICY_KEEP}.b64 $0, 1.0;", "=l" : () -> i64
    return %p : i64
  }
  func.func private @normir_policy_store() -> i64 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %p = llvm.inline_asm "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;", "=l" : () -> i64
    return %p : i64
  }
