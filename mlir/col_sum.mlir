// Column sums: out[j] = sum_p part[p, j] over the fp32 partial rows a persistent kernel wrote
// (dw), in a fixed order, cast to the output's dtype (the weight's).
// Block of ${BLOCK} threads = ${COL_THREADS} column threads x ${ROW_THREADS} row threads; a column thread owns ${V}
// consecutive columns (one 16-byte fp32 access); row thread r sums partial rows r, r + RT, ...
// then row thread 0 adds the RT sums in order 0..RT-1. The order depends only on the number of
// partial rows, so the result is bit-identical from run to run (unlike atomics).
// Placeholders: N, WT, V, COL_THREADS, ROW_THREADS, BLOCK, NCHUNK, TRUNC_WT, TARGET.
// Arguments: part (fp32, parts x N), out (WT, N), the number of partial rows.
module attributes {gpu.container_module} {
gpu.module @normir [${TARGET}] {
  gpu.func @${ENTRY}(
      ${ARGS})
      workgroup(%sums: memref<${ROW_THREADS}x${COL_THREADS}x${V}xf32, #gpu.address_space<workgroup>>)
      kernel attributes {known_block_size = array<i32: ${BLOCK}, 1, 1>${KERNEL_ATTRS}} {
    %c0 = arith.constant 0 : index
    %ct = arith.constant ${COL_THREADS} : index
    %rt = arith.constant ${ROW_THREADS} : index
    %vw = arith.constant ${V} : index
    %nchunk = arith.constant ${NCHUNK} : index
    %zero_v = arith.constant dense<0.0> : vector<${V}xf32>
    %tid = gpu.thread_id x
    %bid = gpu.block_id x
    %cthread = arith.remui %tid, %ct : index
    %rthread = arith.divui %tid, %ct : index
    %first_chunk = arith.muli %bid, %ct : index
    %chunk = arith.addi %first_chunk, %cthread : index
    %col = arith.muli %chunk, %vw : index
    %live = arith.cmpi ult, %chunk, %nchunk : index
    %part = memref.reinterpret_cast %part_arg to offset: [0], sizes: [%parts, ${N}], strides: [${N}, 1]
        : memref<${N}xf32> to memref<?x${N}xf32, strided<[${N}, 1]>>
    %sum = scf.if %live -> (vector<${V}xf32>) {
      %s = scf.for %p = %rthread to %parts step %rt iter_args(%acc = %zero_v) -> (vector<${V}xf32>) {
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
      %out = ${TRUNC_WT} %total : vector<${V}xf32> to vector<${V}x${WT}>
      vector.store %out, %out_arg[%col] {alignment = ${W_ALIGN}} : memref<${N}x${WT}>, vector<${V}x${WT}>
    }
    gpu.return
  }
}
}
