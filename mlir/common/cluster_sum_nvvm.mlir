  // normir common piece: cluster_sum for NVVM targets with thread-block clusters (sm_90+), by the
  // cluster barrier. A row is split over the ${CLUSTER} blocks of a cluster. Each block's row
  // total goes into its own slot @normir_xch[%iter % 2] (cluster_post, which then arrives at the
  // cluster barrier); cluster_read waits for the barrier, then every thread reads the ${CLUSTER}
  // slots through distributed shared memory (mapa + ld.shared::cluster) and adds them in rank
  // order, so every block of the cluster gets the same bits. cluster_sum is the two back to back;
  // a caller may instead do work that does not need the total between them. %iter counts the
  // rows this block took part in: a block can only reach row i+2 (and overwrite slot i % 2)
  // after every peer passed row i+1's barrier, which is after their reads of row i.
  // barrier.cluster.arrive releases and .wait acquires by default. (See cluster_push_nvvm.mlir
  // for the exchange without a cluster barrier.)
  llvm.mlir.global internal @normir_xch() {addr_space = 3 : i32, alignment = 4 : i64} : !llvm.array<2 x f32>

  func.func private @normir_cluster_init(%tid: index) attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
  func.func private @normir_cluster_slot(%iter: index) -> !llvm.ptr<3> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c2 = arith.constant 2 : index
    %parity = arith.remui %iter, %c2 : index
    %parity_i32 = arith.index_cast %parity : index to i32
    %xch = llvm.mlir.addressof @normir_xch : !llvm.ptr<3>
    %slot = llvm.getelementptr %xch[0, %parity_i32] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, !llvm.array<2 x f32>
    return %slot : !llvm.ptr<3>
  }
  func.func private @normir_cluster_post(%v: f32, %tid: index, %iter: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %is_first = arith.cmpi eq, %tid, %c0 : index
    scf.if %is_first {
      %slot = func.call @normir_cluster_slot(%iter) : (index) -> !llvm.ptr<3>
      llvm.store %v, %slot : f32, !llvm.ptr<3>
    }
    nvvm.cluster.arrive
    return
  }
  // %own (this block's total) is not used: the block reads its own slot as its peers do.
  func.func private @normir_cluster_read(%own: f32, %iter: index) -> f32
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %zero = arith.constant 0.0 : f32
    nvvm.cluster.wait
    %slot = func.call @normir_cluster_slot(%iter) : (index) -> !llvm.ptr<3>
    %total = affine.for %r = 0 to ${CLUSTER} iter_args(%acc = %zero) -> (f32) {
      %r_i32 = arith.index_cast %r : index to i32
      %peer = nvvm.mapa %slot, %r_i32 : !llvm.ptr<3> -> !llvm.ptr<7>
      %part = llvm.load %peer : !llvm.ptr<7> -> f32
      %sum = arith.addf %acc, %part : f32
      affine.yield %sum : f32
    }
    return %total : f32
  }
  func.func private @normir_cluster_sum(%v: f32, %tid: index, %iter: index) -> f32
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    func.call @normir_cluster_post(%v, %tid, %iter) : (f32, index, index) -> ()
    %total = func.call @normir_cluster_read(%v, %iter) : (f32, index) -> f32
    return %total : f32
  }

  // A block must not exit while peers may still read its slots: every block arrives after its
  // last reads (cluster_leave_arrive) and waits before it exits (cluster_leave_wait), one pair
  // per call.
  func.func private @normir_cluster_leave_arrive() attributes {llvm.linkage = #llvm.linkage<internal>} {
    nvvm.cluster.arrive
    return
  }
  func.func private @normir_cluster_leave_wait() attributes {llvm.linkage = #llvm.linkage<internal>} {
    nvvm.cluster.wait
    return
  }
