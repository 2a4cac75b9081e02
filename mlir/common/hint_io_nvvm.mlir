  // normir common piece: hint_io for NVVM targets (sm_80+), for the row tensor ${TENSOR}: 16-byte
  // global loads and stores that carry an L2 eviction policy (.L2::cache_hint, common/
  // cache_policy_nvvm.mlir); loads go through ld.global${LD_NC}${LD_L1} (LD_NC: .nc, the non-coherent path, unless
  // the kernel writes what it reads: the in-place forms) (with .L1::evict_last where the
  // layout asks L1 to keep the lines), and a load marked `last` (a row's last read) through
  // ld.global${LD_NC}${LD_L1_LAST}. No MLIR op carries these qualifiers, hence inline PTX. Used only
  // where a chunk is one 16-byte vector (V * EB = 16).
  // base + elem * EB, read through the non-coherent path where the tensors read are read-only.
  func.func private @normir_ld_hint_${TENSOR}(%base: index, %elem: index, %policy: i64, %last: i1) -> vector<${V}x${TYPE}>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %eb = arith.constant ${EB} : index
    %byte = arith.muli %elem, %eb : index
    %addr = arith.addi %base, %byte : index
    %addr_i64 = arith.index_cast %addr : index to i64
    %ptr = llvm.inttoptr %addr_i64 : i64 to !llvm.ptr<1>
    %s = scf.if %last -> (!llvm.struct<(i32, i32, i32, i32)>) {
      %l = llvm.inline_asm "ld.global${LD_NC}${LD_L1_LAST}.L2::cache_hint.v4.b32 {$0, $1, $2, $3}, [$4], $5;",
          "=r,=r,=r,=r,l,l" %ptr, %policy : (!llvm.ptr<1>, i64) -> !llvm.struct<(i32, i32, i32, i32)>
      scf.yield %l : !llvm.struct<(i32, i32, i32, i32)>
    } else {
      %k = llvm.inline_asm "ld.global${LD_NC}${LD_L1}.L2::cache_hint.v4.b32 {$0, $1, $2, $3}, [$4], $5;",
          "=r,=r,=r,=r,l,l" %ptr, %policy : (!llvm.ptr<1>, i64) -> !llvm.struct<(i32, i32, i32, i32)>
      scf.yield %k : !llvm.struct<(i32, i32, i32, i32)>
    }
    %e0 = llvm.extractvalue %s[0] : !llvm.struct<(i32, i32, i32, i32)>
    %e1 = llvm.extractvalue %s[1] : !llvm.struct<(i32, i32, i32, i32)>
    %e2 = llvm.extractvalue %s[2] : !llvm.struct<(i32, i32, i32, i32)>
    %e3 = llvm.extractvalue %s[3] : !llvm.struct<(i32, i32, i32, i32)>
    %words = vector.from_elements %e0, %e1, %e2, %e3 : vector<4xi32>
    %v = vector.bitcast %words : vector<4xi32> to vector<${V}x${TYPE}>
    return %v : vector<${V}x${TYPE}>
  }
  func.func private @normir_st_hint_${TENSOR}(%base: index, %elem: index, %v: vector<${V}x${TYPE}>, %policy: i64)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %eb = arith.constant ${EB} : index
    %byte = arith.muli %elem, %eb : index
    %addr = arith.addi %base, %byte : index
    %addr_i64 = arith.index_cast %addr : index to i64
    %ptr = llvm.inttoptr %addr_i64 : i64 to !llvm.ptr<1>
    %words = vector.bitcast %v : vector<${V}x${TYPE}> to vector<4xi32>
    %e0 = vector.extract %words[0] : i32 from vector<4xi32>
    %e1 = vector.extract %words[1] : i32 from vector<4xi32>
    %e2 = vector.extract %words[2] : i32 from vector<4xi32>
    %e3 = vector.extract %words[3] : i32 from vector<4xi32>
    llvm.inline_asm has_side_effects "st.global.L2::cache_hint.v4.b32 [$0], {$1, $2, $3, $4}, $5;", "l,r,r,r,r,l"
        %ptr, %e0, %e1, %e2, %e3, %policy : (!llvm.ptr<1>, i32, i32, i32, i32, i64) -> ()
    return
  }
