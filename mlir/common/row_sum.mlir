  // normir common piece: @${FN}, a row reduction (spliced into every row kernel's gpu.module: the
  // op's row sums, FN=normir_row_sum; a quantized forward's amax too, FN=normir_row_max).
  // Merges the row summaries %v (${NR} fp32 values) of the ${TPR} consecutive threads that share a
  // row with @${PAIR} (the op's merge: a sum; LayerNorm's forward: Chan's update of (n, mean, M2);
  // the amax's: a max) and returns the row's to each thread (NR: 1 for RMSNorm, 3 and 2 for
  // LayerNorm, 1 for the amax).
  // TPR <= ${WARP}: butterfly shuffles with offsets < TPR stay inside the row's lane group.
  // TPR >  ${WARP}: the row is ${WPR} whole warps (one row per block); warp totals meet in %red
  // and each warp merges them with a second butterfly (missing warps: zeros, the merge's identity:
  // the amax merges magnitudes, >= 0).
  // The trailing barrier (RED_REUSED = ${RED_REUSED}) lets the caller reuse %red for the next
  // row (persistent kernels); a kernel that sums one row per block goes without it.
  func.func private @${FN}(%v: vector<${NR}xf32>, %tid: index,
      %red: memref<${NR}x${WPR}xf32, #gpu.address_space<workgroup>>) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %in_warp = func.call @${FN}_lanes(%v) : (vector<${NR}xf32>) -> vector<${NR}xf32>
    %multi_warp = arith.constant ${MULTI_WARP}
    %total = scf.if %multi_warp -> (vector<${NR}xf32>) {
      %warp = arith.constant ${WARP} : index
      %wpr = arith.constant ${WPR} : index
      %lane = arith.remui %tid, %warp : index
      %warp_id = arith.divui %tid, %warp : index
      %is_first = arith.cmpi eq, %lane, %c0 : index
      scf.if %is_first {
        affine.for %j = 0 to ${NR} {
          %e = vector.extract %in_warp[%j] : f32 from vector<${NR}xf32>
          memref.store %e, %red[%j, %warp_id] : memref<${NR}x${WPR}xf32, #gpu.address_space<workgroup>>
        }
      }
      gpu.barrier
      // Every warp merges the WPR warp totals itself: one register per sum, no second barrier
      // round trip, and each warp ends with the row totals. Lane i takes total i mod WPR_P2 (the
      // power of two >= WPR; totals past WPR: zeros), so log2(WPR_P2) butterfly steps give every
      // lane all of them.
      %wpr_p2 = arith.constant ${WPR_P2} : index
      %part_id = arith.remui %lane, %wpr_p2 : index
      %has_part = arith.cmpi ult, %part_id, %wpr : index
      %zero = arith.constant dense<0.0> : vector<${NR}xf32>
      %part = scf.if %has_part -> (vector<${NR}xf32>) {
        %p = affine.for %j = 0 to ${NR} iter_args(%a = %zero) -> (vector<${NR}xf32>) {
          %e = memref.load %red[%j, %part_id] : memref<${NR}x${WPR}xf32, #gpu.address_space<workgroup>>
          %a2 = vector.insert %e, %a[%j] : f32 into vector<${NR}xf32>
          affine.yield %a2 : vector<${NR}xf32>
        }
        scf.yield %p : vector<${NR}xf32>
      } else {
        scf.yield %zero : vector<${NR}xf32>
      }
      %all = func.call @${FN}_warps(%part) : (vector<${NR}xf32>) -> vector<${NR}xf32>
      %trail = arith.constant ${RED_REUSED}
      scf.if %trail {
        gpu.barrier
      }
      scf.yield %all : vector<${NR}xf32>
    } else {
      scf.yield %in_warp : vector<${NR}xf32>
    }
    return %total : vector<${NR}xf32>
  }

  // The butterflies: over the row's lanes of a warp (TPR <= WARP), and over a whole warp.
  // normir:splice common/butterfly.mlir FN=${FN}_lanes STEPS=${SHUFFLE_STEPS}
  // normir:splice common/butterfly.mlir FN=${FN}_warps STEPS=${WARP_STEPS}
