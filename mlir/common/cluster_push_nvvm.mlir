  // normir common piece: cluster_sum for NVVM targets with thread-block clusters (sm_90+), by
  // pushes: no cluster barrier per row. A row is split over the ${CLUSTER} blocks of a cluster,
  // and each block has ${NR} fp32 totals (the op's sums per row) to add to its peers'.
  // Thread 0 of each block arms its own mbarrier @normir_xch_mbar[b] (b = %iter % 2) for
  // CLUSTER x NR x 4 bytes, then writes its block's totals into slots [b][its rank][0..NR) of
  // every block of the cluster, itself included, with st.async, which counts each 4 bytes off that
  // block's mbarrier b when they land (distributed shared memory: mapa + st.async ... complete_tx).
  // Every thread waits for its own mbarrier's phase, then merges the local slots in rank order
  // (normir_combine: the op's merge), so every block gets the same bits. The k-th use of buffer b (row %iter = 2k + b) completes
  // phase k of mbarrier b: the wait is on parity k % 2.
  // Why it is safe: a peer writes buffer b of row i+2 only after its own wait for row i+1, which
  // needs this block's push of row i+1, which comes after this block read row i: no slot is
  // overwritten while it is read, and no phase is skipped. Pushes that land before the owner
  // arms its mbarrier leave the transaction count negative; the phase cannot complete before the
  // owner's arrival. Nobody reads a peer's memory, and every push to a block lands before the
  // block's own wait returns, so blocks leave without a barrier.
  // Unlike barrier.cluster.arrive, a release by every thread, st.async orders nothing else: the
  // last row's stores and copies of the next row (STAGE) stay in flight across the exchange, and
  // no block waits for the slowest thread of each peer (on the H200, 3-18% faster than an
  // exchange through the cluster barrier, which was removed; see docs/tuning.md).
  // st.async needs PTX 8.1.
  llvm.mlir.global internal @normir_xch_slots() {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<${XCH_SLOTS} x f32>
  llvm.mlir.global internal @normir_xch_mbar() {addr_space = 3 : i32, alignment = 8 : i64} : !llvm.array<2 x i64>

  // The 32-bit shared address of a pointer into this block's shared memory.
  func.func private @normir_smem_u32(%p: !llvm.ptr<3>) -> i32 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %a = llvm.ptrtoint %p : !llvm.ptr<3> to i32
    return %a : i32
  }
  func.func private @normir_xch_mbar_at(%b: i32) -> i32 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %mbar = llvm.mlir.addressof @normir_xch_mbar : !llvm.ptr<3>
    %p = llvm.getelementptr %mbar[0, %b] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, !llvm.array<2 x i64>
    %a = func.call @normir_smem_u32(%p) : (!llvm.ptr<3>) -> i32
    return %a : i32
  }

  // Both mbarriers (one arrival each: the owner's arm), made visible to the cluster before any
  // peer pushes: a cluster barrier, once per kernel. Its arrive is here, at the start; its wait
  // is in the first cluster_post (%iter = 0), so that pass 1's loads go out in between.
  func.func private @normir_cluster_init(%tid: index) attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %b0 = arith.constant 0 : i32
    %b1 = arith.constant 1 : i32
    %is_first = arith.cmpi eq, %tid, %c0 : index
    scf.if %is_first {
      %m0 = func.call @normir_xch_mbar_at(%b0) : (i32) -> i32
      %m1 = func.call @normir_xch_mbar_at(%b1) : (i32) -> i32
      llvm.inline_asm has_side_effects "mbarrier.init.shared::cta.b64 [$0], 1;", "r" %m0 : (i32) -> ()
      llvm.inline_asm has_side_effects "mbarrier.init.shared::cta.b64 [$0], 1;", "r" %m1 : (i32) -> ()
      llvm.inline_asm has_side_effects "fence.mbarrier_init.release.cluster;", "" : () -> ()
    }
    nvvm.cluster.arrive.relaxed {aligned}
    return
  }

  func.func private @normir_cluster_post(%v: vector<${NR}xf32>, %tid: index, %iter: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %c2 = arith.constant 2 : index
    %cluster = arith.constant ${CLUSTER} : i32
    %nr = arith.constant ${NR} : i32
    %four = arith.constant 4 : i32
    %per_block = arith.muli %nr, %four : i32
    %bytes = arith.muli %cluster, %per_block : i32  // NR f32 from every block of the cluster
    %first_row = arith.cmpi eq, %iter, %c0 : index
    scf.if %first_row {
      nvvm.cluster.wait {aligned}  // every peer's mbarriers exist (cluster_init)
    }
    %is_first = arith.cmpi eq, %tid, %c0 : index
    scf.if %is_first {
      %b_idx = arith.remui %iter, %c2 : index
      %b = arith.index_cast %b_idx : index to i32
      %mb = func.call @normir_xch_mbar_at(%b) : (i32) -> i32
      llvm.inline_asm has_side_effects "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r" %mb, %bytes
          : (i32, i32) -> ()
      %rank = nvvm.read.ptx.sreg.cluster.ctarank : i32
      %slot_i = arith.muli %b, %cluster : i32
      %slot_r = arith.addi %slot_i, %rank : i32
      %slot_first = arith.muli %slot_r, %nr : i32
      %slots = llvm.mlir.addressof @normir_xch_slots : !llvm.ptr<3>
      affine.for %r = 0 to ${CLUSTER} {
        %r_i32 = arith.index_cast %r : index to i32
        affine.for %j = 0 to ${NR} {
          %j_i32 = arith.index_cast %j : index to i32
          %slot_j = arith.addi %slot_first, %j_i32 : i32
          %slot_p = llvm.getelementptr %slots[0, %slot_j] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, !llvm.array<${XCH_SLOTS} x f32>
          %slot = func.call @normir_smem_u32(%slot_p) : (!llvm.ptr<3>) -> i32
          %e = vector.extract %v[%j] : f32 from vector<${NR}xf32>
          %bits = arith.bitcast %e : f32 to i32
          llvm.inline_asm has_side_effects
              "{ .reg .b32 s, m; mapa.shared::cluster.u32 s, $0, $3; mapa.shared::cluster.u32 m, $1, $3; st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [s], $2, [m]; }",
              "r,r,r,r" %slot, %mb, %bits, %r_i32 : (i32, i32, i32, i32) -> ()
        }
      }
    }
    return
  }
  func.func private @normir_cluster_read(%own: vector<${NR}xf32>, %iter: index) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c2 = arith.constant 2 : index
    %cluster = arith.constant ${CLUSTER} : i32
    %b_idx = arith.remui %iter, %c2 : index
    %use = arith.divui %iter, %c2 : index
    %phase_idx = arith.remui %use, %c2 : index
    %b = arith.index_cast %b_idx : index to i32
    %phase = arith.index_cast %phase_idx : index to i32
    %mb = func.call @normir_xch_mbar_at(%b) : (i32) -> i32
    llvm.inline_asm has_side_effects
        "{ .reg .pred p; NORMIR_XCH_WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1; @!p bra NORMIR_XCH_WAIT; }",
        "r,r" %mb, %phase : (i32, i32) -> ()
    %slots = llvm.mlir.addressof @normir_xch_slots : !llvm.ptr<3>
    %first = arith.muli %b, %cluster : i32
    // The blocks' summaries merged in rank order into zeros (normir_combine: a sum, or Chan's).
    %zero = arith.constant dense<0.0> : vector<${NR}xf32>
    %total = affine.for %r = 0 to ${CLUSTER} iter_args(%acc = %zero) -> (vector<${NR}xf32>) {
      %part = func.call @normir_xch_slot_sums(%slots, %first, %r) : (!llvm.ptr<3>, i32, index) -> vector<${NR}xf32>
      %merged = func.call @normir_combine(%acc, %part) : (vector<${NR}xf32>, vector<${NR}xf32>) -> vector<${NR}xf32>
      affine.yield %merged : vector<${NR}xf32>
    }
    return %total : vector<${NR}xf32>
  }
  // The NR sums rank %r pushed into buffer slots [%first + r][0..NR).
  func.func private @normir_xch_slot_sums(%slots: !llvm.ptr<3>, %first: i32, %r: index) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %nr = arith.constant ${NR} : i32
    %zero = arith.constant dense<0.0> : vector<${NR}xf32>
    %r_i32 = arith.index_cast %r : index to i32
    %i = arith.addi %first, %r_i32 : i32
    %i_first = arith.muli %i, %nr : i32
    %sums = affine.for %j = 0 to ${NR} iter_args(%a = %zero) -> (vector<${NR}xf32>) {
      %j_i32 = arith.index_cast %j : index to i32
      %i_j = arith.addi %i_first, %j_i32 : i32
      %p = llvm.getelementptr %slots[0, %i_j] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, !llvm.array<${XCH_SLOTS} x f32>
      %part = llvm.load volatile %p : !llvm.ptr<3> -> f32
      %a2 = vector.insert %part, %a[%j] : f32 into vector<${NR}xf32>
      affine.yield %a2 : vector<${NR}xf32>
    }
    return %sums : vector<${NR}xf32>
  }
  func.func private @normir_cluster_sum(%v: vector<${NR}xf32>, %tid: index, %iter: index) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    func.call @normir_cluster_post(%v, %tid, %iter) : (vector<${NR}xf32>, index, index) -> ()
    %total = func.call @normir_cluster_read(%v, %iter) : (vector<${NR}xf32>, index) -> vector<${NR}xf32>
    return %total : vector<${NR}xf32>
  }
