  // normir common piece: cluster_sum for NVVM targets with thread-block clusters (sm_90+).
  // A row is split over the ${CLUSTER} blocks of a cluster. Each block's row total goes into its
  // own %xch[%parity] (cluster_post, which then arrives at the cluster barrier); cluster_read
  // waits for the barrier, then every thread reads the ${CLUSTER} slots through distributed
  // shared memory (mapa + ld.shared::cluster) and adds them in rank order, so every block of the
  // cluster gets the same bits. cluster_sum is the two back to back; a caller may instead do
  // work that does not need the total between them. Callers alternate %parity per row: a block
  // can only reach row i+2 (and overwrite slot i % 2) after every peer passed row i+1's
  // barrier, which is after their reads of row i. barrier.cluster.arrive releases and .wait
  // acquires by default.
  func.func private @normir_cluster_post(%v: f32, %tid: index,
      %xch: memref<2xf32, #gpu.address_space<workgroup>>, %parity: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %is_first = arith.cmpi eq, %tid, %c0 : index
    scf.if %is_first {
      memref.store %v, %xch[%parity] : memref<2xf32, #gpu.address_space<workgroup>>
    }
    nvvm.cluster.arrive
    return
  }
  // %own (this block's total) is not used: the block reads its own slot as its peers do.
  func.func private @normir_cluster_read(%own: f32,
      %xch: memref<2xf32, #gpu.address_space<workgroup>>, %parity: index) -> f32
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %zero = arith.constant 0.0 : f32
    %four = arith.constant 4 : i64
    nvvm.cluster.wait
    %base = memref.extract_aligned_pointer_as_index %xch : memref<2xf32, #gpu.address_space<workgroup>> -> index
    %base_i64 = arith.index_cast %base : index to i64
    %parity_i64 = arith.index_cast %parity : index to i64
    %offset = arith.muli %parity_i64, %four : i64
    %slot_i64 = arith.addi %base_i64, %offset : i64
    %slot = llvm.inttoptr %slot_i64 : i64 to !llvm.ptr<3>
    %total = affine.for %r = 0 to ${CLUSTER} iter_args(%acc = %zero) -> (f32) {
      %r_i32 = arith.index_cast %r : index to i32
      %peer = nvvm.mapa %slot, %r_i32 : !llvm.ptr<3> -> !llvm.ptr<7>
      %part = llvm.load %peer : !llvm.ptr<7> -> f32
      %sum = arith.addf %acc, %part : f32
      affine.yield %sum : f32
    }
    return %total : f32
  }
  func.func private @normir_cluster_sum(%v: f32, %tid: index,
      %xch: memref<2xf32, #gpu.address_space<workgroup>>, %parity: index) -> f32
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    func.call @normir_cluster_post(%v, %tid, %xch, %parity)
        : (f32, index, memref<2xf32, #gpu.address_space<workgroup>>, index) -> ()
    %total = func.call @normir_cluster_read(%v, %xch, %parity)
        : (f32, memref<2xf32, #gpu.address_space<workgroup>>, index) -> f32
    return %total : f32
  }

  // A block must not exit (or reuse %xch) while peers may still read it: every block arrives
  // after its last reads and waits before it exits. Arrive and wait alternate, one pair per call.
  func.func private @normir_cluster_arrive() attributes {llvm.linkage = #llvm.linkage<internal>} {
    nvvm.cluster.arrive
    return
  }
  func.func private @normir_cluster_wait() attributes {llvm.linkage = #llvm.linkage<internal>} {
    nvvm.cluster.wait
    return
  }
