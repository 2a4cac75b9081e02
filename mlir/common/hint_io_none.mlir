  // normir common piece: hint_io where the target or the layout has no cache hints, for the row
  // tensor ${TENSOR}: plain loads and stores, the policy ignored (never called: row_io takes its
  // vector.load/store path; present so that the kernel text is one).
  func.func private @normir_ld_hint_${TENSOR}(%base: index, %elem: index, %policy: i64, %last: i1) -> vector<${V}x${TYPE}>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %eb = arith.constant ${EB} : index
    %byte = arith.muli %elem, %eb : index
    %addr = arith.addi %base, %byte : index
    %addr_i64 = arith.index_cast %addr : index to i64
    %ptr = llvm.inttoptr %addr_i64 : i64 to !llvm.ptr<1>
    %v = llvm.load %ptr {alignment = ${ALIGN} : i64} : !llvm.ptr<1> -> vector<${V}x${TYPE}>
    return %v : vector<${V}x${TYPE}>
  }
  func.func private @normir_st_hint_${TENSOR}(%base: index, %elem: index, %v: vector<${V}x${TYPE}>, %policy: i64)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %eb = arith.constant ${EB} : index
    %byte = arith.muli %elem, %eb : index
    %addr = arith.addi %base, %byte : index
    %addr_i64 = arith.index_cast %addr : index to i64
    %ptr = llvm.inttoptr %addr_i64 : i64 to !llvm.ptr<1>
    llvm.store %v, %ptr {alignment = ${ALIGN} : i64} : vector<${V}x${TYPE}>, !llvm.ptr<1>
    return
  }
