  // normir common piece: the column sums' quarter slots (common/slots_split.mlir) in the launch's
  // dynamic shared memory, where they pass the static shared memory's limit: the slots begin at a
  // byte address (the stage piece's base, plus dw's slots for db's), [k][quarter][tid] -> SLOT_Q
  // fp32, 16-byte aligned. Address space 3 is shared memory on both targets.
  func.func private @normir_slot_ptr(%base: index, %k: index, %h: index, %tid: index) -> !llvm.ptr<3>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %at = affine.apply affine_map<(k, h, t)[b] -> (b + ((k * ${SLOT_H} + h) * ${BLOCK} + t) * ${SLOT_Q} * 4)>(%k, %h, %tid)[%base]
    %addr = arith.index_cast %at : index to i64
    %ptr = llvm.inttoptr %addr : i64 to !llvm.ptr<3>
    return %ptr : !llvm.ptr<3>
  }
  func.func private @normir_slot_load(%base: index, %k: index, %h: index, %tid: index) -> vector<${SLOT_Q}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %ptr = func.call @normir_slot_ptr(%base, %k, %h, %tid) : (index, index, index, index) -> !llvm.ptr<3>
    %q = llvm.load %ptr {alignment = 16 : i64} : !llvm.ptr<3> -> vector<${SLOT_Q}xf32>
    return %q : vector<${SLOT_Q}xf32>
  }
  func.func private @normir_slot_store(%q: vector<${SLOT_Q}xf32>, %base: index, %k: index, %h: index, %tid: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %ptr = func.call @normir_slot_ptr(%base, %k, %h, %tid) : (index, index, index, index) -> !llvm.ptr<3>
    llvm.store %q, %ptr {alignment = 16 : i64} : vector<${SLOT_Q}xf32>, !llvm.ptr<3>
    return
  }
