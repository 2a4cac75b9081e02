  // normir common piece: dst[col + i] += v[i] with fp32 atomics at device scope. memref.atomic_rmw
  // would be system scope; llvm.atomicrmw is the native atomic. The target gives the scope and
  // attributes (ATOMIC_SCOPE, ATOMIC_ATTRS): NVVM "device" (atom.global.add.f32); ROCDL "agent"
  // on coarse-grained, non-remote memory, so that it becomes global_atomic_add_f32, not a CAS loop.
  func.func private @normir_atomic_add_vec(%dst: memref<${N}xf32>, %col: index, %v: vector<${V}xf32>)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c4 = arith.constant 4 : index
    %base = memref.extract_aligned_pointer_as_index %dst : memref<${N}xf32> -> index
    affine.for %i = 0 to ${V} {
      %e = vector.extract %v[%i] : f32 from vector<${V}xf32>
      %idx = arith.addi %col, %i : index
      %off = arith.muli %idx, %c4 : index
      %addr = arith.addi %base, %off : index
      %addr_i64 = arith.index_cast %addr : index to i64
      %p = llvm.inttoptr %addr_i64 : i64 to !llvm.ptr<1>
      %old = llvm.atomicrmw fadd %p, %e syncscope("${ATOMIC_SCOPE}") monotonic ${ATOMIC_ATTRS}: !llvm.ptr<1>, f32
    }
    return
  }
