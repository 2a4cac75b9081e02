// RMSNorm forward.
//   rstd[r] = 1 / sqrt(mean_j(x[r, j]^2) + eps)          (fp32 accumulation)
//   y[r, j] = x[r, j] * rstd[r] * w[j]                   (w omitted when HAS_WEIGHT is false)
//
// Thread layout: a block of ${BLOCK} threads holds ${ROWS} rows; each row is ${TPR} consecutive
// threads. With CLUSTER > 1 a row is split over the ${CLUSTER} blocks of a thread-block cluster
// (ROWS = 1): block `rank` covers columns [rank * NSUB, (rank + 1) * NSUB), NSUB = ${NSUB}, and
// the blocks add their sums of squares through the cluster piece. A block's part of the row is
// cut into ${NCHUNK} chunks of ${V} elements (one vector access each, ${ALIGN} bytes); thread
// `lane` of a row owns chunks k * TPR + lane for k < ${K}. Chunks k < ${KFULL} exist for every
// lane; the last k may fall past the part's end and is masked. With CACHE_ROW the chunks
// stay in a private array (registers after unrolling) between the two passes: x is read once.
// Without it (rows too long for registers) the second pass reads x again, mostly from L2.
// Block (cluster) c takes row group c: a launch has one block (cluster) per group. HINT_LD / HINT_ST: x's loads and
// y's stores carry an L2 eviction policy and, on loads, an L1 one (16-byte chunks on NVVM targets;
// the policy's streamed rows use the load hints, a row's last read marked as such).
//
// Placeholders: N, T (x/y type), WT (weight type), EPS, V, ALIGN, BLOCK, ROWS, TPR, K, KFULL,
// NCHUNK, CLUSTER, NSUB, EB (bytes per element), HAS_WEIGHT, STORE_RSTD,
// CACHE_ROW, PREFETCH_W (weight chunks loaded in pass 1), BATCH_RELOAD (pass 2 reads every
// chunk of x and w before computing), HINT_LD, HINT_ST, EXT_T/EXT_WT (cast
// to f32), TRUNC_T (cast from f32), TARGET (gpu.module target attribute), KERNEL_ATTRS (extra
// kernel attributes: a register bound), the pieces LATE_EXT_PIECE (pass 2's cast), CLUSTER_PIECE
// (cross-block sum) and HINT_PIECE (loads and stores with an L2 policy), and the placeholders of
// the spliced common pieces.
// Arguments: x, w, y (bare pointers), rstd (fp32 per row), rows, row strides of x and y
// (elements), and the grid size in blocks.
module attributes {gpu.container_module} {
gpu.module @normir [${TARGET}] {
// normir:splice common/row_sum.mlir
// normir:splice ${RSQRT_PIECE}
// normir:splice ${LATE_EXT_PIECE}
// normir:splice ${CLUSTER_PIECE}
// normir:splice ${HINT_PIECE}

  gpu.func @${ENTRY}(
      ${ARGS})
      workgroup(%red: memref<${WPR}xf32, #gpu.address_space<workgroup>>)
      private(%xbuf: memref<${K}x${V}x${T}, #gpu.address_space<private>>,
              %wbuf: memref<${K}x${V}x${WT}, #gpu.address_space<private>>)
      kernel attributes {known_block_size = array<i32: ${BLOCK}, 1, 1>${KERNEL_ATTRS}} {
${ABSENT}
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    %tpr = arith.constant ${TPR} : index
    %vw = arith.constant ${V} : index
    %k_full = arith.constant ${KFULL} : index
    %nchunk = arith.constant ${NCHUNK} : index
    %has_weight = arith.constant ${HAS_WEIGHT}
    %store_rstd = arith.constant ${STORE_RSTD}
    %cache_row = arith.constant ${CACHE_ROW}
    %prefetch_w = arith.constant ${PREFETCH_W}
    %eb = arith.constant ${EB} : index
    %hint_ld = arith.constant ${HINT_LD}
    %hint_st = arith.constant ${HINT_ST}
    %batch_reload = arith.constant ${BATCH_RELOAD}
    %eps = arith.constant ${EPS} : f32
    %inv_n = arith.constant ${INV_N} : f32
    %zero_f = arith.constant 0.0 : f32
    %zero_v = arith.constant dense<0.0> : vector<${V}xf32>
    %zero_t = arith.constant dense<0.0> : vector<${V}x${T}>

    %tid = gpu.thread_id x
    %bid = gpu.block_id x
    %slot = arith.divui %tid, %tpr : index
    %lane = arith.remui %tid, %tpr : index
    // A cluster's blocks are consecutive block ids: rank within the cluster, and which cluster.
    %cluster = arith.constant ${CLUSTER} : index
    %rank = arith.remui %bid, %cluster : index
    %cid = arith.divui %bid, %cluster : index
    %clusters = arith.divui %grid, %cluster : index
    %nsub = arith.constant ${NSUB} : index
    %col_base = arith.muli %rank, %nsub : index
    %rows_per_block = arith.constant ${ROWS} : index
    %groups_m1 = arith.addi %rows, %rows_per_block : index
    %groups_m2 = arith.subi %groups_m1, %c1 : index
    %groups = arith.divui %groups_m2, %rows_per_block : index
    %x = memref.reinterpret_cast %x_arg to offset: [0], sizes: [%rows, ${N}], strides: [%x_stride, 1]
        : memref<${N}x${T}> to memref<?x${N}x${T}, strided<[?, 1]>>
    %y = memref.reinterpret_cast %y_arg to offset: [0], sizes: [%rows, ${N}], strides: [%y_stride, 1]
        : memref<${N}x${T}> to memref<?x${N}x${T}, strided<[?, 1]>>
    %x_base = memref.extract_aligned_pointer_as_index %x_arg : memref<${N}x${T}> -> index
    %y_base = memref.extract_aligned_pointer_as_index %y_arg : memref<${N}x${T}> -> index
    // HINT_LD: x's last read asks L2 to evict it first; a first read that pass 2 repeats (no
    // CACHE_ROW) asks it to keep the line. HINT_ST: y's lines leave L2 first.
    %pol_first = func.call @normir_policy_first() : () -> i64
    %pol_last = func.call @normir_policy_last() : () -> i64
    %pol_store = func.call @normir_policy_store() : () -> i64
    %pol_pass1 = arith.select %cache_row, %pol_first, %pol_last : i64
    func.call @normir_cluster_init(%tid) : (index) -> ()  // before any peer's first exchange

    // The grid has a block (cluster) per group: a loop of one trip, which folds away.
    %cid_next = arith.addi %cid, %c1 : index
    scf.for %g = %cid to %cid_next step %c1 {
      %iter = arith.divui %g, %clusters : index
      %g_base = arith.muli %g, %rows_per_block : index
      %row = arith.addi %g_base, %slot : index
      %row_valid = arith.cmpi ult, %row, %rows : index
      // ROWS > 1 only when a row fits in one warp (no barrier), so this branch may diverge;
      // with one row per block it is uniform across the block and the barriers inside are safe.
      scf.if %row_valid {
        // Pass 1: load the row's chunks, accumulate x^2 lane-wise in fp32.
        %sq_vec = affine.for %k = 0 to ${K} iter_args(%acc = %zero_v) -> (vector<${V}xf32>) {
          %ck = arith.muli %k, %tpr : index
          %chunk = arith.addi %ck, %lane : index
          %col_in = arith.muli %chunk, %vw : index
          %col = arith.addi %col_base, %col_in : index
          %always = arith.cmpi ult, %k, %k_full : index
          %in_row = arith.cmpi ult, %chunk, %nchunk : index
          %live = arith.ori %always, %in_row : i1
          %xv = scf.if %live -> (vector<${V}x${T}>) {
            %m = scf.if %hint_ld -> (vector<${V}x${T}>) {
              %e0 = arith.muli %row, %x_stride : index
              %e = arith.addi %e0, %col : index
              %h = func.call @normir_ld_hint(%x_base, %e, %pol_pass1, %cache_row) : (index, index, i64, i1) -> vector<${V}x${T}>
              scf.yield %h : vector<${V}x${T}>
            } else {
              %l = vector.load %x[%row, %col] {alignment = ${ALIGN}} : memref<?x${N}x${T}, strided<[?, 1]>>, vector<${V}x${T}>
              scf.yield %l : vector<${V}x${T}>
            }
            scf.yield %m : vector<${V}x${T}>
          } else {
            scf.yield %zero_t : vector<${V}x${T}>
          }
          scf.if %cache_row {
            vector.store %xv, %xbuf[%k, %c0] : memref<${K}x${V}x${T}, #gpu.address_space<private>>, vector<${V}x${T}>
          }
          // The weight's loads go out with x's, so pass 2 does not wait on them.
          %fetch_w = arith.andi %prefetch_w, %live : i1
          scf.if %fetch_w {
            %wv = vector.load %w_arg[%col] {alignment = ${W_ALIGN}} : memref<${N}x${WT}>, vector<${V}x${WT}>
            vector.store %wv, %wbuf[%k, %c0] : memref<${K}x${V}x${WT}, #gpu.address_space<private>>, vector<${V}x${WT}>
          }
          %xf = ${EXT_T} %xv : vector<${V}x${T}> to vector<${V}xf32>
          %acc_next = vector.fma %xf, %xf, %acc : vector<${V}xf32>
          affine.yield %acc_next : vector<${V}xf32>
        }
        %sq_thread = vector.reduction <add>, %sq_vec : vector<${V}xf32> into f32
        %sq_row = func.call @normir_row_sum(%sq_thread, %tid, %red)
            : (f32, index, memref<${WPR}xf32, #gpu.address_space<workgroup>>) -> f32
        %sq_all = func.call @normir_cluster_sum(%sq_row, %tid, %iter) : (f32, index, index) -> f32
        %mean_sq = arith.mulf %sq_all, %inv_n : f32
        %var_eps = arith.addf %mean_sq, %eps : f32
        %rstd = func.call @normir_rsqrt(%var_eps) : (f32) -> f32

        %is_lane0 = arith.cmpi eq, %lane, %c0 : index
        %is_rank0 = arith.cmpi eq, %rank, %c0 : index
        %lead = arith.andi %is_lane0, %is_rank0 : i1
        %write_rstd = arith.andi %store_rstd, %lead : i1
        scf.if %write_rstd {
          %rstd_out = memref.reinterpret_cast %rstd_arg to offset: [0], sizes: [%rows], strides: [1]
              : memref<1xf32> to memref<?xf32>
          memref.store %rstd, %rstd_out[%row] : memref<?xf32>
        }

        // Pass 2: y = x * rstd * w, from the cached chunks (or x again). With BATCH_RELOAD every
        // chunk of x and w is loaded first (into xbuf, wbuf), then all are normalized and stored.
        %rstd_v = vector.broadcast %rstd : f32 to vector<${V}xf32>
        scf.if %batch_reload {
          affine.for %k = 0 to ${K} {
            %ck = arith.muli %k, %tpr : index
            %chunk = arith.addi %ck, %lane : index
            %col_in = arith.muli %chunk, %vw : index
            %col = arith.addi %col_base, %col_in : index
            %always = arith.cmpi ult, %k, %k_full : index
            %in_row = arith.cmpi ult, %chunk, %nchunk : index
            %live = arith.ori %always, %in_row : i1
            scf.if %live {
              %v = func.call @normir_fwd_read_again(%x_arg, %row, %col, %rows, %x_stride, %pol_first)
                  : (memref<${N}x${T}>, index, index, index, index, i64) -> vector<${V}x${T}>
              vector.store %v, %xbuf[%k, %c0] : memref<${K}x${V}x${T}, #gpu.address_space<private>>, vector<${V}x${T}>
              scf.if %has_weight {
                %wv = vector.load %w_arg[%col] {alignment = ${W_ALIGN}} : memref<${N}x${WT}>, vector<${V}x${WT}>
                vector.store %wv, %wbuf[%k, %c0] : memref<${K}x${V}x${WT}, #gpu.address_space<private>>, vector<${V}x${WT}>
              }
            }
          }
        }
        %x_held = arith.ori %cache_row, %batch_reload : i1
        %w_held = arith.ori %prefetch_w, %batch_reload : i1
        affine.for %k = 0 to ${K} {
          %ck = arith.muli %k, %tpr : index
          %chunk = arith.addi %ck, %lane : index
          %col_in = arith.muli %chunk, %vw : index
          %col = arith.addi %col_base, %col_in : index
          %always = arith.cmpi ult, %k, %k_full : index
          %in_row = arith.cmpi ult, %chunk, %nchunk : index
          %live = arith.ori %always, %in_row : i1
          scf.if %live {
            %xv = scf.if %x_held -> (vector<${V}x${T}>) {
              %v = vector.load %xbuf[%k, %c0] : memref<${K}x${V}x${T}, #gpu.address_space<private>>, vector<${V}x${T}>
              scf.yield %v : vector<${V}x${T}>
            } else {
              %v = func.call @normir_fwd_read_again(%x_arg, %row, %col, %rows, %x_stride, %pol_first)
                  : (memref<${N}x${T}>, index, index, index, index, i64) -> vector<${V}x${T}>
              scf.yield %v : vector<${V}x${T}>
            }
            %xf = func.call @normir_late_ext(%xv) : (vector<${V}x${T}>) -> vector<${V}xf32>
            %xn = arith.mulf %xf, %rstd_v : vector<${V}xf32>
            %yf = scf.if %has_weight -> (vector<${V}xf32>) {
              %wv = scf.if %w_held -> (vector<${V}x${WT}>) {
                %v = vector.load %wbuf[%k, %c0] : memref<${K}x${V}x${WT}, #gpu.address_space<private>>, vector<${V}x${WT}>
                scf.yield %v : vector<${V}x${WT}>
              } else {
                %v = vector.load %w_arg[%col] {alignment = ${W_ALIGN}} : memref<${N}x${WT}>, vector<${V}x${WT}>
                scf.yield %v : vector<${V}x${WT}>
              }
              %wf = ${EXT_WT} %wv : vector<${V}x${WT}> to vector<${V}xf32>
              %yw = arith.mulf %xn, %wf : vector<${V}xf32>
              scf.yield %yw : vector<${V}xf32>
            } else {
              scf.yield %xn : vector<${V}xf32>
            }
            %yv = ${TRUNC_T} %yf : vector<${V}xf32> to vector<${V}x${T}>
            scf.if %hint_st {
              %e0 = arith.muli %row, %y_stride : index
              %e = arith.addi %e0, %col : index
              func.call @normir_st_hint(%y_base, %e, %yv, %pol_store) : (index, index, vector<${V}x${T}>, i64) -> ()
            } else {
              vector.store %yv, %y[%row, %col] {alignment = ${ALIGN}} : memref<?x${N}x${T}, strided<[?, 1]>>, vector<${V}x${T}>
            }
          }
        }
      }
    }
    gpu.return
  }

  // Pass 2's read of x[row, col] when the row is not held: the row's last read (HINT_LD: under
  // the evict-first policy %pol_first, marked last for its L1 qualifier).
  func.func private @normir_fwd_read_again(%x_arg: memref<${N}x${T}>, %row: index, %col: index, %rows: index,
      %x_stride: index, %pol_first: i64) -> vector<${V}x${T}> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %hint_ld = arith.constant ${HINT_LD}
    %v = scf.if %hint_ld -> (vector<${V}x${T}>) {
      %true = arith.constant true
      %x_base = memref.extract_aligned_pointer_as_index %x_arg : memref<${N}x${T}> -> index
      %e0 = arith.muli %row, %x_stride : index
      %e = arith.addi %e0, %col : index
      %h = func.call @normir_ld_hint(%x_base, %e, %pol_first, %true) : (index, index, i64, i1) -> vector<${V}x${T}>
      scf.yield %h : vector<${V}x${T}>
    } else {
      %x = memref.reinterpret_cast %x_arg to offset: [0], sizes: [%rows, ${N}], strides: [%x_stride, 1]
          : memref<${N}x${T}> to memref<?x${N}x${T}, strided<[?, 1]>>
      %l = vector.load %x[%row, %col] {alignment = ${ALIGN}} : memref<?x${N}x${T}, strided<[?, 1]>>, vector<${V}x${T}>
      scf.yield %l : vector<${V}x${T}>
    }
    return %v : vector<${V}x${T}>
  }
}
}
