  // normir common piece: stage for NVVM targets (sm_80+). 16-byte asynchronous copies from
  // global to shared memory (cp.async.cg: through L2, not L1), grouped and waited on per thread.
  // A thread only reads back the shared bytes it copied itself, so after its own wait no block
  // barrier is needed. The buffers are the launch's dynamic shared memory: an external,
  // zero-length shared array (PTX `.extern .shared ... []`), which begins after the static
  // shared variables. (gpu.dynamic_shared_memory lowers to an internal zero-byte global here,
  // which ptxas places among the static ones.)
  llvm.mlir.global external @normir_stage_smem() {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<0 x i8>

  func.func private @normir_stage_base() -> index attributes {llvm.linkage = #llvm.linkage<internal>} {
    %ptr = llvm.mlir.addressof @normir_stage_smem : !llvm.ptr<3>
    %addr = llvm.ptrtoint %ptr : !llvm.ptr<3> to i64
    %base = arith.index_cast %addr : i64 to index
    return %base : index
  }
  func.func private @normir_stage_copy(%dst: index, %src: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %dst_i64 = arith.index_cast %dst : index to i64
    %src_i64 = arith.index_cast %src : index to i64
    %dst_ptr = llvm.inttoptr %dst_i64 : i64 to !llvm.ptr<3>
    %src_ptr = llvm.inttoptr %src_i64 : i64 to !llvm.ptr<1>
    nvvm.cp.async.shared.global %dst_ptr, %src_ptr, 16, cache = cg : !llvm.ptr<3>, !llvm.ptr<1>
    return
  }
  // Close the copies issued since the last commit into one group.
  func.func private @normir_stage_commit() attributes {llvm.linkage = #llvm.linkage<internal>} {
    nvvm.cp.async.commit.group
    return
  }
  // Wait until every group has landed.
  func.func private @normir_stage_wait_all() attributes {llvm.linkage = #llvm.linkage<internal>} {
    nvvm.cp.async.wait.group 0
    return
  }
  // Wait until at most the newest group is still in flight.
  func.func private @normir_stage_wait_older() attributes {llvm.linkage = #llvm.linkage<internal>} {
    nvvm.cp.async.wait.group 1
    return
  }
