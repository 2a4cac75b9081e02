  // normir common piece: cluster_sum for NVVM targets with thread-block clusters (sm_90+).
  // A row is split over the ${CLUSTER} blocks of a cluster. Each block pushes its row total into
  // slot [buffer][its rank] of every block's %xch (distributed shared memory: mapa + a remote
  // store) and arrives on that block's mbarrier of the buffer (release, cluster scope); each
  // block waits on its own mbarrier (acquire, cluster scope) for the ${CLUSTER} arrivals and adds
  // the slots in rank order, so every block of the cluster gets the same bits. Only one thread
  // per block signals and nobody waits for the slowest thread of every block, as a full cluster
  // barrier would.
  // Buffers alternate per row (%iter % 2); the k-th use of a buffer completes its mbarrier's
  // phase k, so the wait is on parity k % 2. A block can only write buffer b of row i+2 after
  // every peer arrived for row i+1, which each does after reading row i: no slot is overwritten
  // while it is read. No block exits while a peer may still write to it: the last writes to a
  // block come before its own last wait returns.
  func.func private @normir_cluster_init(%mbar: memref<2xi64, #gpu.address_space<workgroup>>, %tid: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %arrivals = arith.constant ${CLUSTER} : i32
    %is_first = arith.cmpi eq, %tid, %c0 : index
    scf.if %is_first {
      %base = func.call @normir_cluster_addr(%mbar, %c0) : (memref<2xi64, #gpu.address_space<workgroup>>, index) -> !llvm.ptr<3>
      %c8 = arith.constant 8 : index
      %second = func.call @normir_cluster_addr(%mbar, %c8) : (memref<2xi64, #gpu.address_space<workgroup>>, index) -> !llvm.ptr<3>
      nvvm.mbarrier.init %base, %arrivals : !llvm.ptr<3>, i32
      nvvm.mbarrier.init %second, %arrivals : !llvm.ptr<3>, i32
      nvvm.fence.mbarrier.init
    }
    // Every block's mbarriers exist before anyone arrives on them.
    nvvm.cluster.arrive
    nvvm.cluster.wait
    return
  }

  // The shared address of a workgroup buffer plus a byte offset.
  func.func private @normir_cluster_addr(%buf: memref<2xi64, #gpu.address_space<workgroup>>, %byte: index)
      -> !llvm.ptr<3> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %base = memref.extract_aligned_pointer_as_index %buf : memref<2xi64, #gpu.address_space<workgroup>> -> index
    %addr = arith.addi %base, %byte : index
    %addr_i64 = arith.index_cast %addr : index to i64
    %ptr = llvm.inttoptr %addr_i64 : i64 to !llvm.ptr<3>
    return %ptr : !llvm.ptr<3>
  }

  func.func private @normir_cluster_sum(%v: f32, %tid: index,
      %xch: memref<${XCH_SLOTS}xf32, #gpu.address_space<workgroup>>,
      %mbar: memref<2xi64, #gpu.address_space<workgroup>>, %iter: index) -> f32
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %c2 = arith.constant 2 : index
    %c4 = arith.constant 4 : index
    %c8 = arith.constant 8 : index
    %cluster = arith.constant ${CLUSTER} : index
    %zero = arith.constant 0.0 : f32
    %buf = arith.remui %iter, %c2 : index
    %use = arith.divui %iter, %c2 : index
    %parity = arith.remui %use, %c2 : index
    %parity_i32 = arith.index_cast %parity : index to i32
    %mb_byte = arith.muli %buf, %c8 : index
    %mb = func.call @normir_cluster_addr(%mbar, %mb_byte) : (memref<2xi64, #gpu.address_space<workgroup>>, index) -> !llvm.ptr<3>
    %first_slot = arith.muli %buf, %cluster : index
    %is_first = arith.cmpi eq, %tid, %c0 : index
    scf.if %is_first {
      %rank_i32 = nvvm.read.ptx.sreg.cluster.ctarank : i32
      %rank = arith.index_cast %rank_i32 : i32 to index
      %slot = arith.addi %first_slot, %rank : index
      %slot_byte = arith.muli %slot, %c4 : index
      %xch_base = memref.extract_aligned_pointer_as_index %xch : memref<${XCH_SLOTS}xf32, #gpu.address_space<workgroup>> -> index
      %slot_addr = arith.addi %xch_base, %slot_byte : index
      %slot_i64 = arith.index_cast %slot_addr : index to i64
      %slot_ptr = llvm.inttoptr %slot_i64 : i64 to !llvm.ptr<3>
      affine.for %r = 0 to ${CLUSTER} {
        %r_i32 = arith.index_cast %r : index to i32
        %peer_slot = nvvm.mapa %slot_ptr, %r_i32 : !llvm.ptr<3> -> !llvm.ptr<7>
        llvm.store %v, %peer_slot : f32, !llvm.ptr<7>
        %peer_mb = nvvm.mapa %mb, %r_i32 : !llvm.ptr<3> -> !llvm.ptr<7>
        nvvm.mbarrier.arrive %peer_mb {scope = #nvvm.mem_scope<cluster>} : !llvm.ptr<7>
      }
    }
    scf.while : () -> () {
      %done = nvvm.mbarrier.try_wait %mb, %parity_i32 {scope = #nvvm.mem_scope<cluster>} : !llvm.ptr<3>, i32 -> i1
      %true = arith.constant true
      %again = arith.xori %done, %true : i1
      scf.condition(%again)
    } do {
      scf.yield
    }
    %total = affine.for %r = 0 to ${CLUSTER} iter_args(%acc = %zero) -> (f32) {
      %slot = arith.addi %first_slot, %r : index
      %part = memref.load %xch[%slot] : memref<${XCH_SLOTS}xf32, #gpu.address_space<workgroup>>
      %sum = arith.addf %acc, %part : f32
      affine.yield %sum : f32
    }
    return %total : f32
  }
