// Column sums: out[j] = sum_p part[p, j] over the fp32 partial rows a persistent kernel wrote
// (dw), in a fixed order, cast to the output's dtype (the weight's). With HAS_BIAS, db's too in
// the same launch: part holds dw's partial rows, then db's (2 x parts rows), and the second half
// of the grid sums db's into db (the bias's dtype). One launch saves the second's start and tail.
// Block of ${BLOCK} threads = ${COL_THREADS} column threads x ${ROW_THREADS} row threads; a column thread owns ${V}
// consecutive columns (one 16-byte fp32 access); row thread r sums partial rows r, r + RT, ...
// then row thread 0 adds the RT sums in order 0..RT-1. The order depends only on the number of
// partial rows, so the result is bit-identical from run to run (unlike atomics).
// Grid: ceil(NCHUNK / COL_THREADS) blocks per sum (dw; dw then db with HAS_BIAS).
// Placeholders: N, WT, BT, V, COL_THREADS, ROW_THREADS, BLOCK, NCHUNK, TRUNC_WT, TRUNC_BT, HAS_BIAS, TARGET,
// GRID_DEP_PIECE (the wait for the row kernel where the launch lets this one start early).
// Arguments: part (fp32, parts x N, or 2 x parts x N), out (WT, N), db (BT, N; unused without
// HAS_BIAS), the number of partial rows per sum.
module attributes {gpu.container_module} {
gpu.module @normir [${TARGET}] {
// normir:splice ${GRID_DEP_PIECE}
  gpu.func @${ENTRY}(
      ${ARGS})
      workgroup(%sums: memref<${ROW_THREADS}x${COL_THREADS}x${V}xf32, #gpu.address_space<workgroup>>)
      kernel attributes {known_block_size = array<i32: ${BLOCK}, 1, 1>${KERNEL_ATTRS}} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    %ct = arith.constant ${COL_THREADS} : index
    %rt = arith.constant ${ROW_THREADS} : index
    %vw = arith.constant ${V} : index
    %nchunk = arith.constant ${NCHUNK} : index
    %zero_v = arith.constant dense<0.0> : vector<${V}xf32>
    %has_bias = arith.constant ${HAS_BIAS}
    // Launched to start before the row kernel ends (where the target allows it): wait for it
    // here, before any partial row is read.
    func.call @normir_grid_dep_wait() : () -> ()
    %tid = gpu.thread_id x
    %bid = gpu.block_id x
    %cthread = arith.remui %tid, %ct : index
    %rthread = arith.divui %tid, %ct : index
    // Which sum this block adds (0: dw, 1: db) and its column block within that sum.
    %ct_minus_1 = arith.subi %ct, %c1 : index
    %nchunk_up = arith.addi %nchunk, %ct_minus_1 : index
    %blocks_per_sum = arith.divui %nchunk_up, %ct : index
    %which_db = arith.divui %bid, %blocks_per_sum : index
    %col_block_db = arith.remui %bid, %blocks_per_sum : index
    %which = arith.select %has_bias, %which_db, %c0 : index
    %col_block = arith.select %has_bias, %col_block_db, %bid : index
    %is_db = arith.cmpi ne, %which, %c0 : index
    %first_chunk = arith.muli %col_block, %ct : index
    %chunk = arith.addi %first_chunk, %cthread : index
    %col = arith.muli %chunk, %vw : index
    %live = arith.cmpi ult, %chunk, %nchunk : index
    %nsums = arith.select %has_bias, %c2, %c1 : index
    %all_parts = arith.muli %parts, %nsums : index
    %part = memref.reinterpret_cast %part_arg to offset: [0], sizes: [%all_parts, ${N}], strides: [${N}, 1]
        : memref<${N}xf32> to memref<?x${N}xf32, strided<[${N}, 1]>>
    // This sum's partial rows: [which * parts, (which + 1) * parts).
    %row0 = arith.muli %which, %parts : index
    %first_row = arith.addi %row0, %rthread : index
    %end_row = arith.addi %row0, %parts : index
    // The rows 4 at a time, their loads issued together (the partial rows sit in L2, just written:
    // one load in flight a thread left the sums latency-bound), then the rest one at a time; the
    // adds in row order either way, so the sum is the same to the bit.
    %has_rows = arith.cmpi ult, %first_row, %end_row : index
    %span = arith.subi %end_row, %first_row : index
    %rt_minus_1 = arith.subi %rt, %c1 : index
    %span_up = arith.addi %span, %rt_minus_1 : index
    %my_rows_any = arith.divui %span_up, %rt : index
    %my_rows = arith.select %has_rows, %my_rows_any, %c0 : index
    %c4 = arith.constant 4 : index
    %groups = arith.divui %my_rows, %c4 : index
    %step4 = arith.muli %rt, %c4 : index
    %rt2 = arith.muli %rt, %c2 : index
    %rt3 = arith.addi %rt2, %rt : index
    %grouped = arith.muli %groups, %step4 : index
    %rest_row = arith.addi %first_row, %grouped : index
    %sum = scf.if %live -> (vector<${V}xf32>) {
      %s4 = scf.for %p = %first_row to %rest_row step %step4 iter_args(%acc = %zero_v) -> (vector<${V}xf32>) {
        %p1 = arith.addi %p, %rt : index
        %p2 = arith.addi %p, %rt2 : index
        %p3 = arith.addi %p, %rt3 : index
        %v0 = vector.load %part[%p, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
        %v1 = vector.load %part[%p1, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
        %v2 = vector.load %part[%p2, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
        %v3 = vector.load %part[%p3, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
        %a0 = arith.addf %acc, %v0 : vector<${V}xf32>
        %a1 = arith.addf %a0, %v1 : vector<${V}xf32>
        %a2 = arith.addf %a1, %v2 : vector<${V}xf32>
        %a3 = arith.addf %a2, %v3 : vector<${V}xf32>
        scf.yield %a3 : vector<${V}xf32>
      }
      %s = scf.for %p = %rest_row to %end_row step %rt iter_args(%acc = %s4) -> (vector<${V}xf32>) {
        %v = vector.load %part[%p, %col] {alignment = ${PART_ALIGN}} : memref<?x${N}xf32, strided<[${N}, 1]>>, vector<${V}xf32>
        %a = arith.addf %acc, %v : vector<${V}xf32>
        scf.yield %a : vector<${V}xf32>
      }
      scf.yield %s : vector<${V}xf32>
    } else {
      scf.yield %zero_v : vector<${V}xf32>
    }
    vector.store %sum, %sums[%rthread, %cthread, %c0] : memref<${ROW_THREADS}x${COL_THREADS}x${V}xf32, #gpu.address_space<workgroup>>, vector<${V}xf32>
    gpu.barrier
    %is_first = arith.cmpi eq, %rthread, %c0 : index
    %write = arith.andi %is_first, %live : i1
    scf.if %write {
      %total = affine.for %r = 0 to ${ROW_THREADS} iter_args(%acc = %zero_v) -> (vector<${V}xf32>) {
        %v = vector.load %sums[%r, %cthread, %c0] : memref<${ROW_THREADS}x${COL_THREADS}x${V}xf32, #gpu.address_space<workgroup>>, vector<${V}xf32>
        %a = arith.addf %acc, %v : vector<${V}xf32>
        affine.yield %a : vector<${V}xf32>
      }
      scf.if %is_db {
        %db = ${TRUNC_BT} %total : vector<${V}xf32> to vector<${V}x${BT}>
        vector.store %db, %db_arg[%col] {alignment = ${ALIGN_BT}} : memref<${N}x${BT}>, vector<${V}x${BT}>
      } else {
        %out = ${TRUNC_WT} %total : vector<${V}xf32> to vector<${V}x${WT}>
        vector.store %out, %out_arg[%col] {alignment = ${W_ALIGN}} : memref<${N}x${WT}>, vector<${V}x${WT}>
      }
    }
    gpu.return
  }
}
}
