// The row-norm forward skeleton: every op of the family (RMSNorm, LayerNorm, each with its fused
// residual add) as flags and a math piece (STATS_PIECE: common/stats_rms.mlir, stats_layer.mlir).
//   pass 1: load the row's chunks as h (x; with HAS_RESIDUAL h = x + residual, added in fp32 and
//           rounded once to residual_out's type HT, written to residual_out with STORE_RESIDUAL),
//           accumulate the op's statistics of h per thread (normir_fwd_acc into a ${FWD_ACC};
//           RMSNorm: h^2 lane-wise; LayerNorm: (n, mean, M2) of h less the row's first element,
//           the shift, when HAS_MEAN), merge them over the row (NR = ${NR} fp32 values: row_sum,
//           then the cluster exchange, both through the op's normir_combine, COMBINE_PIECE),
//           and derive rstd and the (shifted) mean (normir_fwd_stats); with TWO_PASS (LayerNorm's
//           rows held, one a block) the merges are plain sums of the row, then a second pass over
//           the held chunks sums the squared deviations from its mean (normir_fwd_center) for a
//           second block sum;
//   pass 2: y = normir_fwd_norm(h - shift, rstd, mean) * (w + WEIGHT_OFFSET) + b, in YT (w when
//           HAS_WEIGHT, the offset when HAS_OFFSET, b when HAS_BIAS); rstd stored when
//           STORE_RSTD, and with HAS_MEAN the mean (shifted mean + shift) beside it.
//   quantized (QUANT, the serving forwards): v = y (* smooth with HAS_SMOOTH) is stored as q, one
//           byte an element (QINT: int8, else fp8 e4m3fn), v * (1 / s) (QDIV: v / s) converted by
//           the target's QUANT_PIECE; s is scale[0] (static), or with QDYNAMIC the row's
//           max(amax(v) / QMAX, QFLOOR), amax over a pass of its own through the held row (or the
//           row read again) and normir_row_max, capped at scale_ub[0] with HAS_SCALE_UB, stored
//           per row in scales; y itself is written only with STORE_Y (always, unquantized).
//   in place (IN_PLACE, the serving forms: y may be x, residual_out the residual): residual_out
//           is stored in pass 2, after the row's reductions, each chunk by the thread that read it
//           (and y after it), so no input is read after it was overwritten whatever the layout;
//           the aliased tensors carry no noalias/readonly attributes and no non-coherent loads.
//   vLLM's dynamic rule (SUM_F32: HT is f32, the norm taken of the fp32 sum, residual_out its
//           rounding to ST; ROUND_XHAT: x_hat rounded to T before the weight), for its ops alone.
// The norm is taken of h as residual_out stores it (ST; HT = ST but with SUM_F32), which is what the backward reads: forward and
// backward differentiate one function. Each flag is an i1 constant; a variant without a feature
// keeps none of its loads, stores or registers (canonicalization folds the dead branch).
//
// Thread layout: a block of ${BLOCK} threads holds ${ROWS} rows; each row is ${TPR} consecutive
// threads. With CLUSTER > 1 a row is split over the ${CLUSTER} blocks of a thread-block cluster
// (ROWS = 1): block `rank` covers columns [rank * NSUB, (rank + 1) * NSUB), NSUB = ${NSUB}, and
// the blocks add their sums through the cluster piece. A block's part of the row is cut into
// ${NCHUNK} chunks of ${V} elements (one vector access each, ${ALIGN} bytes of x); thread `lane`
// of a row owns chunks k * TPR + lane for k < ${K}. Chunks k < ${KFULL} exist for every lane; the
// last k may fall past the part's end and is masked. With CACHE_ROW the chunks of h stay in a
// private array (registers after unrolling) between the two passes: the row is read once.
// Without it (rows too long for registers, or the policy's streamed rows) pass 2 reads the row
// again, mostly from L2 (residual_out where it was stored, else x and residual); with
// BATCH_RELOAD it loads all its chunks of the row and w before computing. Block (cluster) c takes
// row group c: a launch has one block (cluster) per group. Row tensors are read and written
// through row_io (one splice per tensor); with HINT_LD / HINT_ST their loads and stores carry
// cache policies (the first read that pass 2 repeats keeps its lines in L2; a row's last read and
// the stores evict first).
// With OVERLAP_K > 0 (rows held) pass 2's first OVERLAP_K chunks of w and b are loaded before the
// row's reductions and kept in private arrays (wbuf, bbuf), their latency under the waits.
//
// Placeholders: N, the element types T (x), RT (residual), HT (h held), ST (residual_out), YT (y), WT
// (weight), BT (bias), with per type ALIGN_*, EB_* (bytes per element), EXT_* (cast to f32) and
// TRUNC_* (cast from f32), X_TO_H, H_TO_S; V, ALIGN, EB, W_ALIGN, BLOCK, ROWS, TPR, WPR, K, KFULL,
// NCHUNK, CLUSTER, NSUB, NR, FWD_ACC, OVERLAP_K; the flags HAS_MEAN, HAS_WEIGHT, HAS_RESIDUAL, STORE_RESIDUAL, HAS_BIAS,
// HAS_OFFSET, STORE_RSTD, CACHE_ROW, PREFETCH_W (weight chunks loaded in pass 1), BATCH_RELOAD, TWO_PASS,
// IN_PLACE, ROUND_XHAT, PDL, STORE_Y, QUANT, QDYNAMIC, QDIV, QINT, HAS_SMOOTH, HAS_SCALE_UB; QMAX, QFLOOR, ALIGN_QT, ALIGN_SMOOTH;
// WEIGHT_OFFSET; TARGET (gpu.module target attribute), KERNEL_ATTRS (a register bound), ENTRY,
// ARGS (the signature, from the kernel catalogue) and ABSENT (the template's tensors a kernel
// does not pass); the pieces STATS_PIECE (the op's math), RSQRT_PIECE, LATE_EXT_HT_PIECE (pass
// 2's cast of the held h), LATE_EXT_WT_PIECE and LATE_EXT_BT_PIECE (the weight's and bias's),
// LATE_EXT_DEV_PIECE (TWO_PASS's cast of the held h, spelled unlike pass 2's),
// WB_CONTRACT (fastmath<contract>, x_hat * w + b as one fma, where the casts go by words, or none),
// CLUSTER_PIECE (cross-block sums), POLICY_PIECE (cache policies), GRID_DEP_PIECE (PDL's wait), QUANT_PIECE (fp8 pairs and int8),
// and the spliced pieces' own.
// Tensors: x, residual, w, b, y, residual_out, q (rows of N or N columns), smooth (N fp32), rstd,
// mean and scales (fp32 per row), scale and scale_ub (one fp32); scalars: rows, the row strides of
// x, residual, y, residual_out and q (elements), and the grid size in blocks.
module attributes {gpu.container_module} {
gpu.module @normir [${TARGET}] {
// normir:splice common/row_sum.mlir FN=normir_row_sum PAIR=normir_combine_pair
// normir:splice common/row_sum.mlir FN=normir_row_max PAIR=normir_max_pair NR=1 PAIR_FIRST=0
// normir:splice common/combine_max.mlir
// normir:splice common/quant.mlir
// normir:splice ${QUANT_PIECE}
// normir:splice ${COMBINE_PIECE}
// normir:splice ${STATS_PIECE}
// normir:splice ${RSQRT_PIECE}
// normir:splice ${LATE_EXT_HT_PIECE} TENSOR=h TYPE=${HT} EXT=${EXT_HT}
// normir:splice ${LATE_EXT_WT_PIECE} TENSOR=w TYPE=${WT} EXT=${EXT_WT}
// normir:splice ${LATE_EXT_BT_PIECE} TENSOR=b TYPE=${BT} EXT=${EXT_BT}
// normir:splice ${LATE_EXT_DEV_PIECE} TENSOR=h_dev TYPE=${HT} EXT=${EXT_HT}
// normir:splice ${CLUSTER_PIECE}
// normir:splice ${POLICY_PIECE}
// normir:splice ${GRID_DEP_PIECE}
// normir:splice common/row_io.mlir TENSOR=x TYPE=${T} ALIGN=${ALIGN_T} EB=${EB_T}
// normir:splice common/row_io.mlir TENSOR=residual TYPE=${RT} ALIGN=${ALIGN_RT} EB=${EB_RT}
// normir:splice common/row_io.mlir TENSOR=residual_out TYPE=${ST} ALIGN=${ALIGN_ST} EB=${EB_ST}
// normir:splice common/row_io.mlir TENSOR=y TYPE=${YT} ALIGN=${ALIGN_YT} EB=${EB_YT}
// normir:splice common/row_io.mlir TENSOR=q TYPE=i8 ALIGN=${ALIGN_QT} EB=1 HINT_IO_PIECE=common/hint_io_none.mlir HINT_LD=false HINT_ST=false

  gpu.func @${ENTRY}(
      ${ARGS})
      workgroup(%red: memref<${NR}x${WPR}xf32, #gpu.address_space<workgroup>>)
      private(%xbuf: memref<${K}x${V}x${HT}, #gpu.address_space<private>>,
              %wbuf: memref<${K}x${V}x${WT}, #gpu.address_space<private>>,
              %bbuf: memref<${K}x${V}x${BT}, #gpu.address_space<private>>)
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
    %has_offset = arith.constant ${HAS_OFFSET}
    %has_bias = arith.constant ${HAS_BIAS}
    %store_rstd = arith.constant ${STORE_RSTD}
    %has_mean = arith.constant ${HAS_MEAN}
    %store_mean = arith.andi %store_rstd, %has_mean : i1
    %true = arith.constant true
    %store_residual = arith.constant ${STORE_RESIDUAL}
    // IN_PLACE (y may be x, residual_out the residual): residual_out is stored in pass 2, each
    // chunk by the thread that read it, after the row's reductions; no thread then reads a chunk
    // another has written (the shift, h[row, 0], is read by all before any store).
    %in_place = arith.constant ${IN_PLACE}
    %round_xhat = arith.constant ${ROUND_XHAT}
    %out_of_place = arith.xori %in_place, %true : i1
    %store_residual_early = arith.andi %store_residual, %out_of_place : i1
    %store_residual_late = arith.andi %store_residual, %in_place : i1
    %cache_row = arith.constant ${CACHE_ROW}
    %prefetch_w = arith.constant ${PREFETCH_W}
    %eb = arith.constant ${EB} : index
    %batch_reload = arith.constant ${BATCH_RELOAD}
    %two_pass = arith.constant ${TWO_PASS}
    %store_y = arith.constant ${STORE_Y}
    %quant = arith.constant ${QUANT}
    %qdynamic = arith.constant ${QDYNAMIC}
    %qdiv = arith.constant ${QDIV}
    %qint = arith.constant ${QINT}
    %has_smooth = arith.constant ${HAS_SMOOTH}
    %has_scale_ub = arith.constant ${HAS_SCALE_UB}
    %overlap_k = arith.constant ${OVERLAP_K} : index
    %zero_f = arith.constant 0.0 : f32
    %zero_acc = arith.constant dense<0.0> : ${FWD_ACC}
    %false = arith.constant false
    %zero_h = arith.constant dense<0.0> : vector<${V}x${HT}>
    %offset_v = arith.constant dense<${WEIGHT_OFFSET}> : vector<${V}xf32>

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
    // HINT_LD: x's last read asks L2 to evict it first; a first read that pass 2 repeats (no
    // CACHE_ROW) asks it to keep the line. HINT_ST: y's lines leave L2 first.
    %pol_first = func.call @normir_policy_first() : () -> i64
    %pol_last = func.call @normir_policy_last() : () -> i64
    %pol_store = func.call @normir_policy_store() : () -> i64
    %pol_pass1 = arith.select %cache_row, %pol_first, %pol_last : i64
    func.call @normir_cluster_init(%tid) : (index) -> ()  // before any peer's first exchange
    // PDL (launched with programmatic stream serialization): this grid may start while the kernel
    // ahead of it ends; it waits for that kernel and its writes before its first global access,
    // so it is safe whatever that kernel wrote (weights included), and lets the next one launch.
    %pdl = arith.constant ${PDL}
    scf.if %pdl {
      func.call @normir_grid_dep_wait() : () -> ()
      func.call @normir_grid_dep_launch() : () -> ()
    }

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
        // HAS_MEAN: the row's first element h[row, 0], the shift every thread subtracts before
        // the statistics (the same for every block of a cluster; one cached line per row).
        %shift = scf.if %has_mean -> (f32) {
          %h0 = func.call @normir_fwd_load_h(%x_arg, %residual_arg, %row, %c0, %rows, %x_stride, %residual_stride,
                                             %pol_first, %false)
              : (memref<${N}x${T}>, memref<${N}x${RT}>, index, index, index, index, index, i64, i1) -> vector<${V}x${HT}>
          %e = vector.extract %h0[0] : ${HT} from vector<${V}x${HT}>
          %ef = ${EXT_HT} %e : ${HT} to f32
          scf.yield %ef : f32
        } else {
          %no_shift = arith.constant 0.0 : f32
          scf.yield %no_shift : f32
        }
        %shift_v = vector.broadcast %shift : f32 to vector<${V}xf32>
        // Pass 1: load the row's chunks, accumulate the op's statistics of h (less the shift).
        %acc_row = affine.for %k = 0 to ${K} iter_args(%acc = %zero_acc) -> (${FWD_ACC}) {
          // normir:splice common/chunk.mlir LIVE=live
          %xv = scf.if %live -> (vector<${V}x${HT}>) {
            %m = func.call @normir_fwd_load_h(%x_arg, %residual_arg, %row, %col, %rows, %x_stride, %residual_stride,
                                              %pol_pass1, %cache_row)
                : (memref<${N}x${T}>, memref<${N}x${RT}>, index, index, index, index, index, i64, i1) -> vector<${V}x${HT}>
            scf.if %store_residual_early {
              %ms = ${H_TO_S} %m : vector<${V}x${HT}> to vector<${V}x${ST}>
              func.call @normir_store_residual_out(%residual_out_arg, %row, %col, %rows, %residual_out_stride, %ms, %pol_store)
                  : (memref<${N}x${ST}>, index, index, index, index, vector<${V}x${ST}>, i64) -> ()
            }
            scf.yield %m : vector<${V}x${HT}>
          } else {
            scf.yield %zero_h : vector<${V}x${HT}>
          }
          scf.if %cache_row {
            vector.store %xv, %xbuf[%k, %c0] : memref<${K}x${V}x${HT}, #gpu.address_space<private>>, vector<${V}x${HT}>
          }
          // The weight's loads go out with x's, so pass 2 does not wait on them.
          %fetch_w = arith.andi %prefetch_w, %live : i1
          scf.if %fetch_w {
            %wv = vector.load %w_arg[%col] {alignment = ${W_ALIGN}} : memref<${N}x${WT}>, vector<${V}x${WT}>
            vector.store %wv, %wbuf[%k, %c0] : memref<${K}x${V}x${WT}, #gpu.address_space<private>>, vector<${V}x${WT}>
          }
          %xf = ${EXT_HT} %xv : vector<${V}x${HT}> to vector<${V}xf32>
          %xs = arith.subf %xf, %shift_v : vector<${V}xf32>
          %acc_next = func.call @normir_fwd_acc(%acc, %xs, %live, %k) : (${FWD_ACC}, vector<${V}xf32>, i1, index) -> ${FWD_ACC}
          affine.yield %acc_next : ${FWD_ACC}
        }
        // OVERLAP_K (rows held): pass 2's first chunks of w and b, loaded before the reductions, so
        // that their latency passes under the block's barrier and the cluster exchange's wait.
        affine.for %k = 0 to ${OVERLAP_K} {
          // normir:splice common/chunk.mlir LIVE=live
          scf.if %live {
            scf.if %has_weight {
              %early_w = vector.load %w_arg[%col] {alignment = ${W_ALIGN}} : memref<${N}x${WT}>, vector<${V}x${WT}>
              vector.store %early_w, %wbuf[%k, %c0] : memref<${K}x${V}x${WT}, #gpu.address_space<private>>, vector<${V}x${WT}>
            }
            scf.if %has_bias {
              %early_b = vector.load %b_arg[%col] {alignment = ${ALIGN_BT}} : memref<${N}x${BT}>, vector<${V}x${BT}>
              vector.store %early_b, %bbuf[%k, %c0] : memref<${K}x${V}x${BT}, #gpu.address_space<private>>, vector<${V}x${BT}>
            }
          }
        }
        // The chunks this thread owns: KFULL, and the masked one where it is inside the part.
        %k_tail = arith.constant ${K} : index
        %has_tail_k = arith.cmpi ugt, %k_tail, %k_full : index
        %tail_base = arith.muli %k_full, %tpr : index
        %tail_chunk = arith.addi %tail_base, %lane : index
        %tail_in = arith.cmpi ult, %tail_chunk, %nchunk : index
        %tail_own = arith.andi %has_tail_k, %tail_in : i1
        %tail_n = arith.select %tail_own, %c1, %c0 : index
        %owned = arith.addi %k_full, %tail_n : index
        %sums_thread = func.call @normir_fwd_sums(%acc_row, %owned) : (${FWD_ACC}, index) -> vector<${NR}xf32>
        %sums_row = func.call @normir_row_sum(%sums_thread, %tid, %red)
            : (vector<${NR}xf32>, index, memref<${NR}x${WPR}xf32, #gpu.address_space<workgroup>>) -> vector<${NR}xf32>
        %sums_all = func.call @normir_cluster_sum(%sums_row, %tid, %iter)
            : (vector<${NR}xf32>, index, index) -> vector<${NR}xf32>
        // TWO_PASS (held rows, one row a block): the squared deviations from the row's mean, over
        // the held chunks, and a second block sum. The barrier first: every warp has read the
        // first sum's warp totals from %red before any writes the second's.
        %sums = scf.if %two_pass -> (vector<${NR}xf32>) {
          gpu.barrier
          %dev_acc = affine.for %k = 0 to ${K} iter_args(%q = %zero_acc) -> (${FWD_ACC}) {
            // normir:splice common/chunk.mlir LIVE=live
            %xv = vector.load %xbuf[%k, %c0] : memref<${K}x${V}x${HT}, #gpu.address_space<private>>, vector<${V}x${HT}>
            // Cast in another spelling than pass 2's (LATE_EXT_DEV_PIECE), so that LLVM does not
            // share the two casts and keep the row in fp32 across the second sum.
            %xf = func.call @normir_late_ext_h_dev(%xv) : (vector<${V}x${HT}>) -> vector<${V}xf32>
            %xs = arith.subf %xf, %shift_v : vector<${V}xf32>
            %q2 = func.call @normir_fwd_center(%q, %xs, %sums_all, %live)
                : (${FWD_ACC}, vector<${V}xf32>, vector<${NR}xf32>, i1) -> ${FWD_ACC}
            affine.yield %q2 : ${FWD_ACC}
          }
          %dev_thread = func.call @normir_fwd_sums(%dev_acc, %owned) : (${FWD_ACC}, index) -> vector<${NR}xf32>
          %dev_row = func.call @normir_row_sum(%dev_thread, %tid, %red)
              : (vector<${NR}xf32>, index, memref<${NR}x${WPR}xf32, #gpu.address_space<workgroup>>) -> vector<${NR}xf32>
          %both = func.call @normir_fwd_two_pass(%sums_all, %dev_row)
              : (vector<${NR}xf32>, vector<${NR}xf32>) -> vector<${NR}xf32>
          scf.yield %both : vector<${NR}xf32>
        } else {
          scf.yield %sums_all : vector<${NR}xf32>
        }
        %rstd, %mean_s = func.call @normir_fwd_stats(%sums) : (vector<${NR}xf32>) -> (f32, f32)

        %is_lane0 = arith.cmpi eq, %lane, %c0 : index
        %is_rank0 = arith.cmpi eq, %rank, %c0 : index
        %lead = arith.andi %is_lane0, %is_rank0 : i1
        %write_rstd = arith.andi %store_rstd, %lead : i1
        scf.if %write_rstd {
          %rstd_out = memref.reinterpret_cast %rstd_arg to offset: [0], sizes: [%rows], strides: [1]
              : memref<1xf32> to memref<?xf32>
          memref.store %rstd, %rstd_out[%row] : memref<?xf32>
        }
        %write_mean = arith.andi %store_mean, %lead : i1
        scf.if %write_mean {
          %mean_out = memref.reinterpret_cast %mean_arg to offset: [0], sizes: [%rows], strides: [1]
              : memref<1xf32> to memref<?xf32>
          %mean = arith.addf %mean_s, %shift : f32
          memref.store %mean, %mean_out[%row] : memref<?xf32>
        }

        // Pass 2: y = x * rstd * w, from the cached chunks (or x again). With BATCH_RELOAD every
        // chunk of x and w is loaded first (into xbuf, wbuf), then all are normalized and stored.
        %rstd_v = vector.broadcast %rstd : f32 to vector<${V}xf32>
        %mean_v = vector.broadcast %mean_s : f32 to vector<${V}xf32>
        scf.if %batch_reload {
          affine.for %k = 0 to ${K} {
            // normir:splice common/chunk.mlir LIVE=live
            scf.if %live {
              %v = func.call @normir_fwd_load_h(%x_arg, %residual_arg, %row, %col, %rows, %x_stride, %residual_stride,
                                                %pol_first, %true)
                  : (memref<${N}x${T}>, memref<${N}x${RT}>, index, index, index, index, index, i64, i1) -> vector<${V}x${HT}>
              vector.store %v, %xbuf[%k, %c0] : memref<${K}x${V}x${HT}, #gpu.address_space<private>>, vector<${V}x${HT}>
              scf.if %has_weight {
                %wv = vector.load %w_arg[%col] {alignment = ${W_ALIGN}} : memref<${N}x${WT}>, vector<${V}x${WT}>
                vector.store %wv, %wbuf[%k, %c0] : memref<${K}x${V}x${WT}, #gpu.address_space<private>>, vector<${V}x${WT}>
              }
            }
          }
        }
        %x_held = arith.ori %cache_row, %batch_reload : i1
        %w_held = arith.ori %prefetch_w, %batch_reload : i1
        // QUANT: the row's scale s and the factor q takes (1 / s; QDIV: s itself, q = y / s). With
        // QDYNAMIC s comes from the row's amax of y (y * smooth with HAS_SMOOTH; NaN ignored), over
        // a pass of its own through the held row (or the row read again), merged over the row's
        // threads (normir_row_max: %red again, after a barrier where warps share it), capped at
        // scale_ub (HAS_SCALE_UB), s = max(amax / QMAX, QFLOOR), stored per row; else s = scale[0].
        %scale_s, %scale_mul = scf.if %quant -> (f32, f32) {
          %s = scf.if %qdynamic -> (f32) {
            %amax_thread = affine.for %k = 0 to ${K} iter_args(%am = %zero_f) -> (f32) {
              // normir:splice common/chunk.mlir LIVE=live
              %am_next = scf.if %live -> (f32) {
                // normir:splice common/fwd_y.mlir
                // |y|: the sign bit cleared (the NVVM and ROCDL lowerings take no vector fabs)
                %y_bits = arith.bitcast %yq : vector<${V}xf32> to vector<${V}xi32>
                %magnitude = arith.constant dense<2147483647> : vector<${V}xi32>
                %abs_bits = arith.andi %y_bits, %magnitude : vector<${V}xi32>
                %ya = arith.bitcast %abs_bits : vector<${V}xi32> to vector<${V}xf32>
                %chunk_max = vector.reduction <maxnumf>, %ya : vector<${V}xf32> into f32
                %m = llvm.intr.maxnum(%am, %chunk_max) : (f32, f32) -> f32
                scf.yield %m : f32
              } else {
                scf.yield %am : f32
              }
              affine.yield %am_next : f32
            }
            %multi_warp = arith.constant ${MULTI_WARP}
            scf.if %multi_warp {  // one row a block: uniform
              gpu.barrier
            }
            %amax_v = vector.from_elements %amax_thread : vector<1xf32>
            %red_max = memref.reinterpret_cast %red to offset: [0], sizes: [1, ${WPR}], strides: [${WPR}, 1]
                : memref<${NR}x${WPR}xf32, #gpu.address_space<workgroup>> to memref<1x${WPR}xf32, #gpu.address_space<workgroup>>
            %amax_row = func.call @normir_row_max(%amax_v, %tid, %red_max)
                : (vector<1xf32>, index, memref<1x${WPR}xf32, #gpu.address_space<workgroup>>) -> vector<1xf32>
            %amax = vector.extract %amax_row[0] : f32 from vector<1xf32>
            %capped = scf.if %has_scale_ub -> (f32) {
              %ub = memref.load %scale_ub_arg[%c0] : memref<1xf32>
              %a = llvm.intr.minnum(%amax, %ub) : (f32, f32) -> f32
              scf.yield %a : f32
            } else {
              scf.yield %amax : f32
            }
            %qmax = arith.constant ${QMAX} : f32
            %qfloor = arith.constant ${QFLOOR} : f32
            %s_raw = arith.divf %capped, %qmax : f32
            %s_row = llvm.intr.maxnum(%s_raw, %qfloor) : (f32, f32) -> f32
            scf.if %lead {
              %scales_out = memref.reinterpret_cast %scales_arg to offset: [0], sizes: [%rows], strides: [1]
                  : memref<1xf32> to memref<?xf32>
              memref.store %s_row, %scales_out[%row] : memref<?xf32>
            }
            scf.yield %s_row : f32
          } else {
            %s_given = memref.load %scale_arg[%c0] : memref<1xf32>
            scf.yield %s_given : f32
          }
          %one = arith.constant 1.0 : f32
          %inv = arith.divf %one, %s : f32  // IEEE division: once a row
          %mul = arith.select %qdiv, %s, %inv : f32
          scf.yield %s, %mul : f32, f32
        } else {
          %one = arith.constant 1.0 : f32
          scf.yield %one, %one : f32, f32
        }
        %scale_v = vector.broadcast %scale_mul : f32 to vector<${V}xf32>
        affine.for %k = 0 to ${K} {
          // normir:splice common/chunk.mlir LIVE=live
          scf.if %live {
            // normir:splice common/fwd_y.mlir
            scf.if %store_residual_late {
              %hs = ${H_TO_S} %xv : vector<${V}x${HT}> to vector<${V}x${ST}>
              func.call @normir_store_residual_out(%residual_out_arg, %row, %col, %rows, %residual_out_stride, %hs, %pol_store)
                  : (memref<${N}x${ST}>, index, index, index, index, vector<${V}x${ST}>, i64) -> ()
            }
            scf.if %store_y {
              %yv = ${TRUNC_YT} %yb : vector<${V}xf32> to vector<${V}x${YT}>
              func.call @normir_store_y(%y_arg, %row, %col, %rows, %y_stride, %yv, %pol_store)
                  : (memref<${N}x${YT}>, index, index, index, index, vector<${V}x${YT}>, i64) -> ()
            }
            scf.if %quant {
              %qin = scf.if %qdiv -> (vector<${V}xf32>) {
                %d = arith.divf %yq, %scale_v : vector<${V}xf32>  // a true divide (dynamic fp8)
                scf.yield %d : vector<${V}xf32>
              } else {
                %m = arith.mulf %yq, %scale_v : vector<${V}xf32>
                scf.yield %m : vector<${V}xf32>
              }
              %qv = scf.if %qint -> (vector<${V}xi8>) {
                %i = func.call @normir_to_i8(%qin) : (vector<${V}xf32>) -> vector<${V}xi8>
                scf.yield %i : vector<${V}xi8>
              } else {
                %f = func.call @normir_to_fp8(%qin) : (vector<${V}xf32>) -> vector<${V}xi8>
                scf.yield %f : vector<${V}xi8>
              }
              func.call @normir_store_q(%q_arg, %row, %col, %rows, %q_stride, %qv, %pol_store)
                  : (memref<${N}xi8>, index, index, index, index, vector<${V}xi8>, i64) -> ()
            }
          }
        }
      }
    }
    gpu.return
  }

  // The row the op normalizes, chunk [row, col : col + V], in its held type HT: x itself, or with
  // HAS_RESIDUAL h = x + residual added in fp32 and rounded to HT (residual_out's type), so that
  // the norm is taken of exactly what residual_out stores (and what the backward reads).
  func.func private @normir_fwd_load_h(%x_arg: memref<${N}x${T}>, %residual_arg: memref<${N}x${RT}>, %row: index,
      %col: index, %rows: index, %x_stride: index, %residual_stride: index, %policy: i64, %last: i1)
      -> vector<${V}x${HT}> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %has_residual = arith.constant ${HAS_RESIDUAL}
    %xv = func.call @normir_load_x(%x_arg, %row, %col, %rows, %x_stride, %policy, %last)
        : (memref<${N}x${T}>, index, index, index, index, i64, i1) -> vector<${V}x${T}>
    %h = scf.if %has_residual -> (vector<${V}x${HT}>) {
      %rv = func.call @normir_load_residual(%residual_arg, %row, %col, %rows, %residual_stride, %policy, %last)
          : (memref<${N}x${RT}>, index, index, index, index, i64, i1) -> vector<${V}x${RT}>
      %xf = ${EXT_T} %xv : vector<${V}x${T}> to vector<${V}xf32>
      %rf = ${EXT_RT} %rv : vector<${V}x${RT}> to vector<${V}xf32>
      %hf = arith.addf %xf, %rf : vector<${V}xf32>
      %hv = ${TRUNC_HT} %hf : vector<${V}xf32> to vector<${V}x${HT}>
      scf.yield %hv : vector<${V}x${HT}>
    } else {
      %same = ${X_TO_H} %xv : vector<${V}x${T}> to vector<${V}x${HT}>
      scf.yield %same : vector<${V}x${HT}>
    }
    return %h : vector<${V}x${HT}>
  }
}
}
