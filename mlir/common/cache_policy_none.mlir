  // normir common piece: cache_policy where the target or the layout has no cache hints: no
  // policies (row_io takes its plain vector.load/store path then).
  func.func private @normir_policy_first() -> i64 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %p = arith.constant 0 : i64
    return %p : i64
  }
  func.func private @normir_policy_last() -> i64 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %p = arith.constant 0 : i64
    return %p : i64
  }
  func.func private @normir_policy_store() -> i64 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %p = arith.constant 0 : i64
    return %p : i64
  }
