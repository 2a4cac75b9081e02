  // normir common piece: stage for NVVM targets (sm_80+). 16-byte asynchronous copies from
  // global to shared memory (cp.async.cg: through L2, not L1), grouped and waited on per thread.
  // A thread only reads back the shared bytes it copied itself, so after its own wait no block
  // barrier is needed.
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
  // Wait until at most the newest group is still in flight.
  func.func private @normir_stage_wait_older() attributes {llvm.linkage = #llvm.linkage<internal>} {
    nvvm.cp.async.wait.group 1
    return
  }
