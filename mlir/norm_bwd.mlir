// The row-norm backward skeleton (dx, and per-block partial column sums of dw and db), every op
// of the family as flags and a math piece (STATS_PIECE; the formulas in common/stats_rms.mlir and
// stats_layer.mlir). x is the row the forward normalized (residual_out for the fused add); with
// HAS_MEAN (LayerNorm) the row's stored mean is read beside rstd and passed to the piece.
//   pass 1: load x and dy (dy in YT), accumulate the op's sums lane-wise (normir_bwd_acc, into a
//           ${BWD_ACC}), reduce
//           them over the row (NR = ${NR} fp32 sums: row_sum, then the cluster exchange), and
//           derive the row's coefficients (normir_bwd_coefs, from the sums and the stored rstd);
//           with HAS_DRES_OUT, ask L2 for the row's d_residual_out (pass 2 reads it once);
//   pass 2: dx, g = normir_bwd_dx(x, dy, w + WEIGHT_OFFSET, rstd, coefs), plus d_residual_out with
//           HAS_DRES_OUT, stored in XT and, with STORE_DRES, the same values as dresidual in RT;
//           the column sums dw += g * x (normir_bwd_dw) and, with HAS_BIAS, db += dy.
// The grid is persistent: block b takes row groups b, b + grid, ... so each block writes one fp32
// partial row per slot at the end (with clusters: per cluster, see below); col_sum.mlir sums the
// partial rows in a fixed order (dw is bit-identical from run to run). With ATOMIC_DW the block
// instead adds its sums into a zeroed fp32 row with fp32 atomics (order varies: not
// bit-reproducible), for comparison.
//
// Thread layout as in norm_fwd.mlir: ${ROWS} rows per block of ${BLOCK} threads, ${TPR} threads
// per row, ${K} chunks of ${V} elements per thread (chunk k*TPR + lane), the last one masked.
// CLUSTER > 1 (rows whose dw sums do not fit one block): the ${CLUSTER} blocks of a thread-block
// cluster share each row, block `rank` taking columns [rank * NSUB, (rank + 1) * NSUB), and the
// persistent loop runs over clusters (cluster c takes rows c, c + grid / CLUSTER, ...). The
// blocks add their sums through the cluster piece; partial dw rows are per cluster.
// CACHE_ROW: x and dy stay in registers between the two passes; otherwise (rows too long) the
// second pass reads them again, mostly from L2. DW_REGS: the dw sums live in registers for the
// whole persistent loop; otherwise they accumulate in the block's own partial row in global
// memory (read-modify-write per row, L2-resident). db's sums (HAS_BIAS) sit beside dw's, or with
// the layout's db_smem in static shared memory (each thread its own K x V slots, which no other
// thread reads, so no barrier), freeing K x V registers: at [k][tid] (1), or in 16-byte quarters
// at [k][quarter][tid] (2; 3: dw's too; common/slots_split.mlir). DB_GET reads a chunk's sums and
// `DB_PUT value, DB_PUT_TO` writes them (a vector.load / vector.store, or the quarters' get and
// put); DW_* the same for dw's.
// L2_PREFETCH: pass 1 also asks L2 for the same chunks of x and dy of the block's next row.
// STAGE: x and dy come through shared memory: while a row is reduced and written, each thread's
// chunks of the next row are already being copied (cp.async) into the other of two buffers, and
// both passes read the current buffer; HBM is read once and never waits on the reductions.
// HINT_LD: x and dy are read under L2 policies (pass 1 keeps what pass 2 reads again; pass 2's,
// their last reads, evict first); HINT_ST: the dx stores evict first. OVERLAP (rows over a
// cluster): pass 2's first OVERLAP_K chunks are loaded between posting the block's sums
// (cluster_post) and waiting for the peers' (cluster_read), with OVERLAP_DRES their
// d_residual_out too (into %gbuf).
// STAGE_DRES (with HAS_DRES_OUT): pass 1 copies the row's chunks of d_residual_out into shared
// memory (the stage piece's asynchronous copies, each thread its own 16-byte slots [k][tid] from
// byte DRES_AT of the dynamic shared memory), and pass 2 reads them there after waiting for its
// own copies: their DRAM latency runs under pass 1, the reductions and the exchange, and holds no
// registers. A thread's copies land in slots only it reads, and the next row's copies are issued
// after its reads of this row's, so no barrier is needed.
//
// Placeholders: those of norm_fwd.mlir (with XT, dx's type; RT here is dresidual's; GT d_residual_out's;
// BWD_ACC for FWD_ACC), plus
// HAS_DRES_OUT, STORE_DRES, DW_REGS, DB_GET, DB_PUT, DB_PUT_TO, DB_IN_WORKGROUP / DB_IN_PRIVATE
// (db's sums declared in one attribution list or the other), the same DW_*, DB_SLOTS_PIECE /
// DW_SLOTS_PIECE (the quarters' get and put, or none), SLOT_Q, SLOT_H, SLOT_BUF, SLOT_LOAD,
// SLOT_STORE, SLOTS_DYN_PIECE and SLOT_BASES (the quarters in dynamic shared memory past the static
// limit: their byte addresses, or none), ATOMIC_DW, PART_ALIGN, L2_PREFETCH, OVERLAP, OVERLAP_K,
// OVERLAP_DRES, STAGE_DRES, DRES_AT, STAGE, STAGE_BLOCK_BYTES, LATE_EXT_T_PIECE / LATE_EXT_YT_PIECE
// (pass 2's casts of x and dy), the target's atomics (ATOMIC_SCOPE, ATOMIC_ATTRS), and its pieces for
// the L2 prefetch (PREFETCH_PIECE) and staging (STAGE_PIECE).
// Tensors: x, w, dy, rstd and mean (fp32 per row), dres_out (d_residual_out), dx, dres, dw_part and
// db_part (fp32 partial rows); scalars: rows, the row strides of x, dy, dres_out, dx and dres
// (elements), and the grid size.
module attributes {gpu.container_module} {
gpu.module @normir [${TARGET}] {
// normir:splice common/row_sum.mlir FN=normir_row_sum PAIR=normir_combine_pair
// normir:splice ${COMBINE_PIECE}
// normir:splice ${STATS_PIECE}
// normir:splice ${RSQRT_PIECE}
// normir:splice common/atomic_add.mlir
// normir:splice ${SLOTS_DYN_PIECE} NAME=dynamic
// normir:splice ${DB_SLOTS_PIECE} NAME=db
// normir:splice ${DW_SLOTS_PIECE} NAME=dw
// normir:splice ${LATE_EXT_T_PIECE} TENSOR=x TYPE=${T} EXT=${EXT_T}
// normir:splice ${LATE_EXT_YT_PIECE} TENSOR=dy TYPE=${YT} EXT=${EXT_YT}
// normir:splice ${CLUSTER_PIECE}
// normir:splice ${PREFETCH_PIECE}
// normir:splice ${STAGE_PIECE}
// normir:splice ${POLICY_PIECE}
// normir:splice ${GRID_DEP_PIECE}
// normir:splice common/row_io.mlir TENSOR=x TYPE=${T} ALIGN=${ALIGN_T} EB=${EB_T}
// normir:splice common/row_io.mlir TENSOR=dy TYPE=${YT} ALIGN=${ALIGN_YT} EB=${EB_YT}
// normir:splice common/row_io.mlir TENSOR=dres_out TYPE=${GT} ALIGN=${ALIGN_GT} EB=${EB_GT}
// normir:splice common/row_io.mlir TENSOR=dx TYPE=${XT} ALIGN=${ALIGN_XT} EB=${EB_XT}
// normir:splice common/row_io.mlir TENSOR=dres TYPE=${RT} ALIGN=${ALIGN_RT} EB=${EB_RT}

  gpu.func @${ENTRY}(
      ${ARGS})
      workgroup(%red: memref<${NR}x${WPR}xf32, #gpu.address_space<workgroup>>${DB_IN_WORKGROUP}${DW_IN_WORKGROUP})
      private(%xbuf: memref<${K}x${V}x${T}, #gpu.address_space<private>>,
              %dybuf: memref<${K}x${V}x${YT}, #gpu.address_space<private>>,
              %gbuf: memref<${K}x${V}x${GT}, #gpu.address_space<private>>${DW_IN_PRIVATE}${DB_IN_PRIVATE})
      kernel attributes {known_block_size = array<i32: ${BLOCK}, 1, 1>${KERNEL_ATTRS}} {
${ABSENT}
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %tpr = arith.constant ${TPR} : index
    %vw = arith.constant ${V} : index
    %k_full = arith.constant ${KFULL} : index
    %nchunk = arith.constant ${NCHUNK} : index
    %rows_per_block = arith.constant ${ROWS} : index
    %has_weight = arith.constant ${HAS_WEIGHT}
    %has_bias = arith.constant ${HAS_BIAS}
    %has_dres_out = arith.constant ${HAS_DRES_OUT}
    %store_dres = arith.constant ${STORE_DRES}
    %cache_row = arith.constant ${CACHE_ROW}
    %overlap = arith.constant ${OVERLAP}
    %overlap_k = arith.constant ${OVERLAP_K} : index
    %overlap_dres = arith.constant ${OVERLAP_DRES}
    %stage_dres = arith.constant ${STAGE_DRES}
    %dw_regs = arith.constant ${DW_REGS}
    %atomic_dw = arith.constant ${ATOMIC_DW}
    %l2_prefetch = arith.constant ${L2_PREFETCH}
    %stage_on = arith.constant ${STAGE}
    %eb = arith.constant ${EB_T} : index
    %eb_dy = arith.constant ${EB_YT} : index
    %eb_g = arith.constant ${EB_GT} : index
    %zero_v = arith.constant dense<0.0> : vector<${V}xf32>
    %zero_acc = arith.constant dense<0.0> : ${BWD_ACC}
    %has_mean = arith.constant ${HAS_MEAN}
    %zero_t = arith.constant dense<0.0> : vector<${V}x${T}>
    %zero_dy = arith.constant dense<0.0> : vector<${V}x${YT}>

    %tid = gpu.thread_id x
    %bid = gpu.block_id x
    %slot = arith.divui %tid, %tpr : index
    %lane = arith.remui %tid, %tpr : index
    // A cluster's blocks are consecutive block ids: rank within the cluster, and which cluster.
    %cluster = arith.constant ${CLUSTER} : index
    %c2 = arith.constant 2 : index
    %rank = arith.remui %bid, %cluster : index
    %cid = arith.divui %bid, %cluster : index
    %clusters = arith.divui %grid, %cluster : index
    %nsub = arith.constant ${NSUB} : index
    %col_base = arith.muli %rank, %nsub : index
    %rstd_all = memref.reinterpret_cast %rstd_arg to offset: [0], sizes: [%rows], strides: [1]
        : memref<1xf32> to memref<?xf32>
    %mean_all = memref.reinterpret_cast %mean_arg to offset: [0], sizes: [%rows], strides: [1]
        : memref<1xf32> to memref<?xf32>
    // This slot's partial dw row: dw_part[cid * ROWS + slot, :] (a cluster's blocks share it).
    %part_rows = arith.muli %clusters, %rows_per_block : index
    %dw_part = memref.reinterpret_cast %dw_part_arg to offset: [0], sizes: [%part_rows, ${N}], strides: [${N}, 1]
        : memref<${N}xf32> to memref<?x${N}xf32, strided<[${N}, 1]>>
    %db_part = memref.reinterpret_cast %db_part_arg to offset: [0], sizes: [%part_rows, ${N}], strides: [${N}, 1]
        : memref<${N}xf32> to memref<?x${N}xf32, strided<[${N}, 1]>>
    %part_base = arith.muli %cid, %rows_per_block : index
    %x_base = memref.extract_aligned_pointer_as_index %x_arg : memref<${N}x${T}> -> index
    %dy_base = memref.extract_aligned_pointer_as_index %dy_arg : memref<${N}x${YT}> -> index
    %dres_out_base = memref.extract_aligned_pointer_as_index %dres_out_arg : memref<${N}x${GT}> -> index
    // HINT_LD (see normir_bwd_row_chunk): pass 1 keeps in L2 what pass 2 reads again; the last
    // read of a line, and with HINT_ST the dx stores, ask L2 to evict it first.
    %pol_first = func.call @normir_policy_first() : () -> i64
    %pol_last = func.call @normir_policy_last() : () -> i64
    %pol_store = func.call @normir_policy_store() : () -> i64
    %pol_pass1 = arith.select %cache_row, %pol_first, %pol_last : i64
    %group_stride = arith.muli %clusters, %rows_per_block : index
    %part_row = arith.addi %part_base, %slot : index
    // STAGE buffers (dynamic shared memory): [buffer][x, dy][k][thread] -> one 16-byte chunk.
    %stage_base = func.call @normir_stage_base() : () -> index
    %dres_at = arith.constant ${DRES_AT} : index
    %dres_slots = arith.addi %stage_base, %dres_at : index
    // The column sums' slots past static shared memory: byte addresses in the dynamic (SLOT_BASES).
    ${SLOT_BASES}
    func.call @normir_cluster_init(%tid) : (index) -> ()  // before any peer's first exchange
    // The column sums' kernel may launch now, where the launch allows it (GRID_DEP_PIECE): its
    // blocks take what room this persistent grid leaves and wait there for it to end.
    func.call @normir_grid_dep_launch() : () -> ()

    // Zeroed dw (and db) sums, once per block.
    affine.for %k = 0 to ${K} {
      scf.if %dw_regs {
        ${DW_PUT} %zero_v, ${DW_PUT_TO}
        scf.if %has_bias {
          ${DB_PUT} %zero_v, ${DB_PUT_TO}
        }
      }
    }

    %groups_m1 = arith.addi %rows, %rows_per_block : index
    %groups_m2 = arith.subi %groups_m1, %c1 : index
    %groups = arith.divui %groups_m2, %rows_per_block : index
    scf.if %stage_on {
      %first_row_base = arith.muli %cid, %rows_per_block : index
      %first_row = arith.addi %first_row_base, %slot : index
      %first_ok = arith.cmpi ult, %first_row, %rows : index
      scf.if %first_ok {
        func.call @normir_bwd_stage(%x_base, %dy_base, %stage_base, %first_row, %c0, %x_stride, %dy_stride,
                                    %lane, %tid, %col_base) : (index, index, index, index, index, index, index, index, index, index) -> ()
      }
      func.call @normir_stage_commit() : () -> ()
    }
    // %iter: this block's row groups so far (the exchange's buffer and phase), counted in 32
    // bits beside the group index rather than divided from it on every row.
    %c0_i32 = arith.constant 0 : i32
    %c1_i32 = arith.constant 1 : i32
    %groups_done = scf.for %g = %cid to %groups step %clusters iter_args(%iter_i32 = %c0_i32) -> (i32) {
      %iter = arith.index_castui %iter_i32 : i32 to index
      %first_iter = arith.cmpi eq, %iter, %c0 : index
      %parity = arith.remui %iter, %c2 : index
      %g_base = arith.muli %g, %rows_per_block : index
      %row = arith.addi %g_base, %slot : index
      %row_valid = arith.cmpi ult, %row, %rows : index
      // Invalid rows (the last group's spare slots) contribute zeros but still take part, so
      // the block's barriers stay uniform and stream mode's partial row is always initialized.
      %rstd = scf.if %row_valid -> (f32) {
        %r = memref.load %rstd_all[%row] : memref<?xf32>
        scf.yield %r : f32
      } else {
        %z = arith.constant 0.0 : f32
        scf.yield %z : f32
      }
      %rstd_v = vector.broadcast %rstd : f32 to vector<${V}xf32>
      // HAS_MEAN: the row's mean, as the forward stored it.
      %load_mean = arith.andi %has_mean, %row_valid : i1
      %mean = scf.if %load_mean -> (f32) {
        %m = memref.load %mean_all[%row] : memref<?xf32>
        scf.yield %m : f32
      } else {
        %z = arith.constant 0.0 : f32
        scf.yield %z : f32
      }
      %mean_v = vector.broadcast %mean : f32 to vector<${V}xf32>
      // The row this slot takes next (the next group of this block or cluster).
      %pf_row = arith.addi %row, %group_stride : index
      %pf_row_ok = arith.cmpi ult, %pf_row, %rows : index
      %pf_on = arith.andi %l2_prefetch, %pf_row_ok : i1
      scf.if %stage_on {
        // Copy the next row into the other buffer, then wait for this row's copies only.
        %other = arith.subi %c1, %parity : index
        scf.if %pf_row_ok {
          func.call @normir_bwd_stage(%x_base, %dy_base, %stage_base, %pf_row, %other, %x_stride, %dy_stride,
                                      %lane, %tid, %col_base) : (index, index, index, index, index, index, index, index, index, index) -> ()
        }
        func.call @normir_stage_commit() : () -> ()
        func.call @normir_stage_wait_older() : () -> ()
      }

      // Pass 1: the row's sums (the stats piece's), lane-wise in fp32.
      %acc_row = affine.for %k = 0 to ${K} iter_args(%acc = %zero_acc) -> (${BWD_ACC}) {
        // normir:splice common/chunk.mlir LIVE=live_col
        %live = arith.andi %live_col, %row_valid : i1
        %xv, %dyv = scf.if %live -> (vector<${V}x${T}>, vector<${V}x${YT}>) {
          %a, %b = func.call @normir_bwd_row_chunk(%x_arg, %dy_arg, %stage_base, %rows, %x_stride, %dy_stride, %row,
                                                   %col, %parity, %k, %tid, %stage_on, %pol_pass1)
              : (memref<${N}x${T}>, memref<${N}x${YT}>, index, index, index, index, index, index, index, index, index, i1, i64)
              -> (vector<${V}x${T}>, vector<${V}x${YT}>)
          scf.yield %a, %b : vector<${V}x${T}>, vector<${V}x${YT}>
        } else {
          scf.yield %zero_t, %zero_dy : vector<${V}x${T}>, vector<${V}x${YT}>
        }
        scf.if %cache_row {
          vector.store %xv, %xbuf[%k, %c0] : memref<${K}x${V}x${T}, #gpu.address_space<private>>, vector<${V}x${T}>
          vector.store %dyv, %dybuf[%k, %c0] : memref<${K}x${V}x${YT}, #gpu.address_space<private>>, vector<${V}x${YT}>
        }
        %pf = arith.andi %pf_on, %live_col : i1
        scf.if %pf {
          %pfx_row = arith.muli %pf_row, %x_stride : index
          %pfx_elem = arith.addi %pfx_row, %col : index
          %pfx_byte = arith.muli %pfx_elem, %eb : index
          func.call @normir_prefetch_l2(%x_base, %pfx_byte) : (index, index) -> ()
          %pfd_row = arith.muli %pf_row, %dy_stride : index
          %pfd_elem = arith.addi %pfd_row, %col : index
          %pfd_byte = arith.muli %pfd_elem, %eb_dy : index
          func.call @normir_prefetch_l2(%dy_base, %pfd_byte) : (index, index) -> ()
        }
        // HAS_DRES_OUT: pass 2 reads d_residual_out once, where its other reads come from
        // registers, shared memory or L2; this row's chunk is asked into L2 now (or with
        // STAGE_DRES copied into its slot), so that the DRAM latency overlaps pass 1 and the
        // reduction.
        %pf_g = arith.andi %has_dres_out, %live : i1
        scf.if %pf_g {
          %g_row = arith.muli %row, %dres_out_stride : index
          %g_elem = arith.addi %g_row, %col : index
          %g_byte = arith.muli %g_elem, %eb_g : index
          scf.if %stage_dres {
            %g_at = func.call @normir_dres_slot(%dres_slots, %k, %tid) : (index, index, index) -> index
            %g_src = arith.addi %dres_out_base, %g_byte : index
            func.call @normir_stage_copy(%g_at, %g_src) : (index, index) -> ()
          } else {
            func.call @normir_prefetch_l2(%dres_out_base, %g_byte) : (index, index) -> ()
          }
        }
        %wf = func.call @normir_bwd_weight(%w_arg, %col, %live_col, %has_weight)
            : (memref<${N}x${WT}>, index, i1, i1) -> vector<${V}xf32>
        %xf = ${EXT_T} %xv : vector<${V}x${T}> to vector<${V}xf32>
        %dyf = ${EXT_YT} %dyv : vector<${V}x${YT}> to vector<${V}xf32>
        %acc_next = func.call @normir_bwd_acc(%acc, %xf, %dyf, %wf, %mean_v)
            : (${BWD_ACC}, vector<${V}xf32>, vector<${V}xf32>, vector<${V}xf32>, vector<${V}xf32>) -> ${BWD_ACC}
        affine.yield %acc_next : ${BWD_ACC}
      }
      scf.if %stage_dres {
        func.call @normir_stage_commit() : () -> ()
      }
      %sums_thread = func.call @normir_bwd_sums(%acc_row) : (${BWD_ACC}) -> vector<${NR}xf32>
      %sums_block = func.call @normir_row_sum(%sums_thread, %tid, %red)
          : (vector<${NR}xf32>, index, memref<${NR}x${WPR}xf32, #gpu.address_space<workgroup>>) -> vector<${NR}xf32>
      // OVERLAP (rows split over a cluster): pass 2's first OVERLAP_K chunks, which do not need
      // the row total, are loaded between posting this block's total and waiting for the
      // peers', into the arrays CACHE_ROW uses, so that their latency and the peers' overlap.
      %sums = scf.if %overlap -> (vector<${NR}xf32>) {
        func.call @normir_cluster_post(%sums_block, %tid, %iter) : (vector<${NR}xf32>, index, index) -> ()
        affine.for %k = 0 to ${OVERLAP_K} {
          // normir:splice common/chunk.mlir LIVE=live_col
          %live = arith.andi %live_col, %row_valid : i1
          %a, %b = scf.if %live -> (vector<${V}x${T}>, vector<${V}x${YT}>) {
            %a1, %b1 = func.call @normir_bwd_row_chunk(%x_arg, %dy_arg, %stage_base, %rows, %x_stride, %dy_stride,
                                                       %row, %col, %parity, %k, %tid, %stage_on, %pol_first)
                : (memref<${N}x${T}>, memref<${N}x${YT}>, index, index, index, index, index, index, index, index, index, i1, i64)
                -> (vector<${V}x${T}>, vector<${V}x${YT}>)
            scf.yield %a1, %b1 : vector<${V}x${T}>, vector<${V}x${YT}>
          } else {
            scf.yield %zero_t, %zero_dy : vector<${V}x${T}>, vector<${V}x${YT}>
          }
          vector.store %a, %xbuf[%k, %c0] : memref<${K}x${V}x${T}, #gpu.address_space<private>>, vector<${V}x${T}>
          vector.store %b, %dybuf[%k, %c0] : memref<${K}x${V}x${YT}, #gpu.address_space<private>>, vector<${V}x${YT}>
          // OVERLAP_DRES: these chunks' d_residual_out too, which pass 2 would otherwise wait on.
          %early_g = arith.andi %overlap_dres, %live : i1
          scf.if %early_g {
            %false = arith.constant false
            %gv = func.call @normir_load_dres_out(%dres_out_arg, %row, %col, %rows, %dres_out_stride, %pol_first, %false)
                : (memref<${N}x${GT}>, index, index, index, index, i64, i1) -> vector<${V}x${GT}>
            vector.store %gv, %gbuf[%k, %c0] : memref<${K}x${V}x${GT}, #gpu.address_space<private>>, vector<${V}x${GT}>
          }
        }
        %t = func.call @normir_cluster_read(%sums_block, %iter) : (vector<${NR}xf32>, index) -> vector<${NR}xf32>
        scf.yield %t : vector<${NR}xf32>
      } else {
        %t = func.call @normir_cluster_sum(%sums_block, %tid, %iter) : (vector<${NR}xf32>, index, index) -> vector<${NR}xf32>
        scf.yield %t : vector<${NR}xf32>
      }
      %coefs = func.call @normir_bwd_coefs(%sums, %rstd) : (vector<${NR}xf32>, f32) -> vector<${NR}xf32>
      scf.if %stage_dres {
        func.call @normir_stage_wait_all() : () -> ()  // this thread's copies of d_residual_out
      }

      // Pass 2: dx, and the column sums (dw += gcol * x), from the stats piece.
      affine.for %k = 0 to ${K} {
        // normir:splice common/chunk.mlir LIVE=live_col
        %live = arith.andi %live_col, %row_valid : i1
        // Pass 2 reads its chunks from %xbuf and %dybuf where pass 1 (CACHE_ROW) or the OVERLAP
        // loads (the first OVERLAP_K chunks) put them.
        %early = arith.cmpi ult, %k, %overlap_k : index
        %held = arith.ori %cache_row, %early : i1
        %xv, %dyv = scf.if %held -> (vector<${V}x${T}>, vector<${V}x${YT}>) {
          %a = vector.load %xbuf[%k, %c0] : memref<${K}x${V}x${T}, #gpu.address_space<private>>, vector<${V}x${T}>
          %b = vector.load %dybuf[%k, %c0] : memref<${K}x${V}x${YT}, #gpu.address_space<private>>, vector<${V}x${YT}>
          scf.yield %a, %b : vector<${V}x${T}>, vector<${V}x${YT}>
        } else {
          %a, %b = scf.if %live -> (vector<${V}x${T}>, vector<${V}x${YT}>) {
            %a1, %b1 = func.call @normir_bwd_row_chunk(%x_arg, %dy_arg, %stage_base, %rows, %x_stride, %dy_stride,
                                                       %row, %col, %parity, %k, %tid, %stage_on, %pol_first)
                : (memref<${N}x${T}>, memref<${N}x${YT}>, index, index, index, index, index, index, index, index, index, i1, i64)
                -> (vector<${V}x${T}>, vector<${V}x${YT}>)
            scf.yield %a1, %b1 : vector<${V}x${T}>, vector<${V}x${YT}>
          } else {
            scf.yield %zero_t, %zero_dy : vector<${V}x${T}>, vector<${V}x${YT}>
          }
          scf.yield %a, %b : vector<${V}x${T}>, vector<${V}x${YT}>
        }
        %wf = func.call @normir_bwd_weight(%w_arg, %col, %live_col, %has_weight)
            : (memref<${N}x${WT}>, index, i1, i1) -> vector<${V}xf32>
        %xf = func.call @normir_late_ext_x(%xv) : (vector<${V}x${T}>) -> vector<${V}xf32>
        %dyf = func.call @normir_late_ext_dy(%dyv) : (vector<${V}x${YT}>) -> vector<${V}xf32>
        %dxf, %gcol = func.call @normir_bwd_dx(%xf, %dyf, %wf, %rstd_v, %mean_v, %coefs)
            : (vector<${V}xf32>, vector<${V}xf32>, vector<${V}xf32>, vector<${V}xf32>, vector<${V}xf32>, vector<${NR}xf32>)
            -> (vector<${V}xf32>, vector<${V}xf32>)
        scf.if %live {
          // With HAS_DRES_OUT: dh = dx + d_residual_out (the residual stream's own gradient).
          %dh = scf.if %has_dres_out -> (vector<${V}xf32>) {
            %g_held = arith.andi %overlap_dres, %early : i1
            %gv = scf.if %g_held -> (vector<${V}x${GT}>) {
              %v = vector.load %gbuf[%k, %c0] : memref<${K}x${V}x${GT}, #gpu.address_space<private>>, vector<${V}x${GT}>
              scf.yield %v : vector<${V}x${GT}>
            } else {
              %v = scf.if %stage_dres -> (vector<${V}x${GT}>) {
                %g_at = func.call @normir_dres_slot(%dres_slots, %k, %tid) : (index, index, index) -> index
                %s = func.call @normir_load_staged_dres_out(%g_at) : (index) -> vector<${V}x${GT}>
                scf.yield %s : vector<${V}x${GT}>
              } else {
                %false = arith.constant false
                %l = func.call @normir_load_dres_out(%dres_out_arg, %row, %col, %rows, %dres_out_stride, %pol_first, %false)
                    : (memref<${N}x${GT}>, index, index, index, index, i64, i1) -> vector<${V}x${GT}>
                scf.yield %l : vector<${V}x${GT}>
              }
              scf.yield %v : vector<${V}x${GT}>
            }
            %gf = ${EXT_GT} %gv : vector<${V}x${GT}> to vector<${V}xf32>
            %sum = arith.addf %dxf, %gf : vector<${V}xf32>
            scf.yield %sum : vector<${V}xf32>
          } else {
            scf.yield %dxf : vector<${V}xf32>
          }
          %dxv = ${TRUNC_XT} %dh : vector<${V}xf32> to vector<${V}x${XT}>
          func.call @normir_store_dx(%dx_arg, %row, %col, %rows, %dx_stride, %dxv, %pol_store)
              : (memref<${N}x${XT}>, index, index, index, index, vector<${V}x${XT}>, i64) -> ()
          // STORE_DRES: dresidual has the same values as dx, in the residual's type.
          scf.if %store_dres {
            %drv = ${TRUNC_RT} %dh : vector<${V}xf32> to vector<${V}x${RT}>
            func.call @normir_store_dres(%dres_arg, %row, %col, %rows, %dres_stride, %drv, %pol_store)
                : (memref<${N}x${RT}>, index, index, index, index, vector<${V}x${RT}>, i64) -> ()
          }
        }
        scf.if %has_weight {
          scf.if %dw_regs {
            %s = ${DW_GET}
            %s2 = func.call @normir_bwd_dw(%s, %xf, %gcol, %mean_v)
                : (vector<${V}xf32>, vector<${V}xf32>, vector<${V}xf32>, vector<${V}xf32>) -> vector<${V}xf32>
            ${DW_PUT} %s2, ${DW_PUT_TO}
          } else {
            // dw sums in memory: the slot owns its partial row; the first group initializes it.
            scf.if %live_col {
              %old = scf.if %first_iter -> (vector<${V}xf32>) {
                scf.yield %zero_v : vector<${V}xf32>
              } else {
                %o = vector.load %dw_part[%part_row, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
                scf.yield %o : vector<${V}xf32>
              }
              %s2 = func.call @normir_bwd_dw(%old, %xf, %gcol, %mean_v)
                  : (vector<${V}xf32>, vector<${V}xf32>, vector<${V}xf32>, vector<${V}xf32>) -> vector<${V}xf32>
              vector.store %s2, %dw_part[%part_row, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
            }
          }
        }
        // HAS_BIAS: db += dy, kept like dw (registers, or the slot's partial row).
        scf.if %has_bias {
          scf.if %dw_regs {
            %s = ${DB_GET}
            %s2 = arith.addf %s, %dyf : vector<${V}xf32>
            ${DB_PUT} %s2, ${DB_PUT_TO}
          } else {
            scf.if %live_col {
              %old = scf.if %first_iter -> (vector<${V}xf32>) {
                scf.yield %zero_v : vector<${V}xf32>
              } else {
                %o = vector.load %db_part[%part_row, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
                scf.yield %o : vector<${V}xf32>
              }
              %s2 = arith.addf %old, %dyf : vector<${V}xf32>
              vector.store %s2, %db_part[%part_row, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
            }
          }
        }
      }
      %iter_next = arith.addi %iter_i32, %c1_i32 : i32
      scf.yield %iter_next : i32
    }

    // Register-mode column sums (dw, db) leave the block: one partial row per slot, or fp32
    // atomics. A bias without a weight has db sums alone.
    %col_sums_on = arith.ori %has_weight, %has_bias : i1
    %flush = arith.andi %col_sums_on, %dw_regs : i1
    scf.if %flush {
      affine.for %k = 0 to ${K} {
        // normir:splice common/chunk.mlir LIVE=live_col
        scf.if %live_col {
          scf.if %has_weight {
            %s = ${DW_GET}
            scf.if %atomic_dw {
              func.call @normir_atomic_add_vec(%dw_part_arg, %col, %s) : (memref<${N}xf32>, index, vector<${V}xf32>) -> ()
            } else {
              vector.store %s, %dw_part[%part_row, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
            }
          }
          scf.if %has_bias {
            %sb = ${DB_GET}
            scf.if %atomic_dw {
              func.call @normir_atomic_add_vec(%db_part_arg, %col, %sb) : (memref<${N}xf32>, index, vector<${V}xf32>) -> ()
            } else {
              vector.store %sb, %db_part[%part_row, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
            }
          }
        }
      }
    }
    gpu.return
  }

  // Chunk k of this thread in row `row`: x and dy from the STAGE buffer `buf`, or from memory
  // (with HINT_LD under the L2 eviction policy `policy`; both passes' loads take the same L1
  // qualifier).
  func.func private @normir_bwd_row_chunk(%x_arg: memref<${N}x${T}>, %dy_arg: memref<${N}x${YT}>,
      %stage_base: index, %rows: index, %x_stride: index, %dy_stride: index, %row: index, %col: index,
      %buf: index, %k: index, %tid: index, %stage_on: i1, %policy: i64) -> (vector<${V}x${T}>, vector<${V}x${YT}>)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %false = arith.constant false
    %a, %b = scf.if %stage_on -> (vector<${V}x${T}>, vector<${V}x${YT}>) {
      %x_at = func.call @normir_stage_slot(%stage_base, %buf, %c0, %k, %tid) : (index, index, index, index, index) -> index
      %dy_at = func.call @normir_stage_slot(%stage_base, %buf, %c1, %k, %tid) : (index, index, index, index, index) -> index
      %a1 = func.call @normir_load_staged_x(%x_at) : (index) -> vector<${V}x${T}>
      %b1 = func.call @normir_load_staged_dy(%dy_at) : (index) -> vector<${V}x${YT}>
      scf.yield %a1, %b1 : vector<${V}x${T}>, vector<${V}x${YT}>
    } else {
      %a1 = func.call @normir_load_x(%x_arg, %row, %col, %rows, %x_stride, %policy, %false)
          : (memref<${N}x${T}>, index, index, index, index, i64, i1) -> vector<${V}x${T}>
      %b1 = func.call @normir_load_dy(%dy_arg, %row, %col, %rows, %dy_stride, %policy, %false)
          : (memref<${N}x${YT}>, index, index, index, index, i64, i1) -> vector<${V}x${YT}>
      scf.yield %a1, %b1 : vector<${V}x${T}>, vector<${V}x${YT}>
    }
    return %a, %b : vector<${V}x${T}>, vector<${V}x${YT}>
  }

  // STAGE_DRES: the shared byte address of this thread's slot for chunk k of d_residual_out.
  func.func private @normir_dres_slot(%dres_slots: index, %k: index, %tid: index) -> index
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %at = affine.apply affine_map<(k, t)[b] -> (b + (k * ${BLOCK} + t) * 16)>(%k, %tid)[%dres_slots]
    return %at : index
  }

  // Shared address of this thread's chunk k of staged tensor `tensor` (x: 0, dy: 1) in STAGE
  // buffer `buf`: stage_base + ((buf * 2 + tensor) * K + k) * BLOCK * 16 + tid * 16.
  func.func private @normir_stage_slot(%stage_base: index, %buf: index, %tensor: index, %k: index, %tid: index)
      -> index attributes {llvm.linkage = #llvm.linkage<internal>} {
    %two = arith.constant 2 : index
    %sixteen = arith.constant 16 : index
    %k_count = arith.constant ${K} : index
    %block_bytes = arith.constant ${STAGE_BLOCK_BYTES} : index
    %buf_x = arith.muli %buf, %two : index
    %x_slot_k = arith.muli %buf_x, %k_count : index
    %x_slot = arith.addi %x_slot_k, %k : index
    %t_slots = arith.muli %tensor, %k_count : index
    %slot = arith.addi %x_slot, %t_slots : index
    %k_byte = arith.muli %slot, %block_bytes : index
    %thread_byte = arith.muli %tid, %sixteen : index
    %off = arith.addi %k_byte, %thread_byte : index
    %at = arith.addi %stage_base, %off : index
    return %at : index
  }

  // Start copying this thread's chunks of x and dy of `row` into STAGE buffer `buf` (16 bytes
  // each; chunks past the row end are not copied and read as zeros).
  func.func private @normir_bwd_stage(%x_base: index, %dy_base: index, %stage_base: index, %row: index,
      %buf: index, %x_stride: index, %dy_stride: index, %lane: index, %tid: index, %col_base: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %tpr = arith.constant ${TPR} : index
    %vw = arith.constant ${V} : index
    %k_full = arith.constant ${KFULL} : index
    %nchunk = arith.constant ${NCHUNK} : index
    %eb = arith.constant ${EB_T} : index
    %eb_dy = arith.constant ${EB_YT} : index
    %x_row = arith.muli %row, %x_stride : index
    %dy_row = arith.muli %row, %dy_stride : index
    affine.for %k = 0 to ${K} {
      // normir:splice common/chunk.mlir LIVE=live
      scf.if %live {
        %x_dst = func.call @normir_stage_slot(%stage_base, %buf, %c0, %k, %tid) : (index, index, index, index, index) -> index
        %dy_dst = func.call @normir_stage_slot(%stage_base, %buf, %c1, %k, %tid) : (index, index, index, index, index) -> index
        %x_elem = arith.addi %x_row, %col : index
        %x_byte = arith.muli %x_elem, %eb : index
        %x_src = arith.addi %x_base, %x_byte : index
        %dy_elem = arith.addi %dy_row, %col : index
        %dy_byte = arith.muli %dy_elem, %eb_dy : index
        %dy_src = arith.addi %dy_base, %dy_byte : index
        func.call @normir_stage_copy(%x_dst, %x_src) : (index, index) -> ()
        func.call @normir_stage_copy(%dy_dst, %dy_src) : (index, index) -> ()
      }
    }
    return
  }

  // w[col : col + V] in fp32 from memory; ones where there is no weight or the chunk is past
  // the row end.
  func.func private @normir_bwd_weight(%w_arg: memref<${N}x${WT}>, %col: index, %live: i1, %has_weight: i1)
      -> vector<${V}xf32> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %one_v = arith.constant dense<1.0> : vector<${V}xf32>
    %load = arith.andi %live, %has_weight : i1
    %wf = scf.if %load -> (vector<${V}xf32>) {
      %wv = vector.load %w_arg[%col] {alignment = ${W_ALIGN}} : memref<${N}x${WT}>, vector<${V}x${WT}>
      %wvf = ${EXT_WT} %wv : vector<${V}x${WT}> to vector<${V}xf32>
      %has_offset = arith.constant ${HAS_OFFSET}
      %w_used = scf.if %has_offset -> (vector<${V}xf32>) {  // the weight is used as w + weight_offset
        %offset_v = arith.constant dense<${WEIGHT_OFFSET}> : vector<${V}xf32>
        %wo = arith.addf %wvf, %offset_v : vector<${V}xf32>
        scf.yield %wo : vector<${V}xf32>
      } else {
        scf.yield %wvf : vector<${V}xf32>
      }
      scf.yield %w_used : vector<${V}xf32>
    } else {
      scf.yield %one_v : vector<${V}xf32>
    }
    return %wf : vector<${V}xf32>
  }
}
}
