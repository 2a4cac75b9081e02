  // normir common piece: cache_hint where the target or the layout has none: plain loads and
  // stores, the policy ignored. (The kernels take their vector.load/store path then anyway.)
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
  func.func private @normir_ld_hint(%base: index, %elem: index, %policy: i64, %last: i1) -> vector<${V}x${T}>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %eb = arith.constant ${EB} : index
    %byte = arith.muli %elem, %eb : index
    %addr = arith.addi %base, %byte : index
    %addr_i64 = arith.index_cast %addr : index to i64
    %ptr = llvm.inttoptr %addr_i64 : i64 to !llvm.ptr<1>
    %v = llvm.load %ptr {alignment = ${ALIGN} : i64} : !llvm.ptr<1> -> vector<${V}x${T}>
    return %v : vector<${V}x${T}>
  }
  func.func private @normir_st_hint(%base: index, %elem: index, %v: vector<${V}x${T}>, %policy: i64)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %eb = arith.constant ${EB} : index
    %byte = arith.muli %elem, %eb : index
    %addr = arith.addi %base, %byte : index
    %addr_i64 = arith.index_cast %addr : index to i64
    %ptr = llvm.inttoptr %addr_i64 : i64 to !llvm.ptr<1>
    llvm.store %v, %ptr {alignment = ${ALIGN} : i64} : vector<${V}x${T}>, !llvm.ptr<1>
    return
  }
