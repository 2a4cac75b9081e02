  // normir common piece: row_sum (spliced into every kernel's gpu.module; written once).
  // Sums %v over the ${TPR} consecutive threads that share a row and returns the total to each.
  // TPR <= ${WARP}: butterfly shuffles with offsets < TPR stay inside the row's lane group.
  // TPR >  ${WARP}: the row is ${WPR} whole warps (one row per block); warp totals meet in %red
  // and each warp adds them up with a second butterfly.
  // The trailing barrier (RED_REUSED = ${RED_REUSED}) lets the caller reuse %red for the next
  // row (persistent kernels); a kernel that sums one row per block goes without it.
  func.func private @normir_row_sum(%v: f32, %tid: index,
      %red: memref<${WPR}xf32, #gpu.address_space<workgroup>>) -> f32
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %one = arith.constant 1 : i32
    %width = arith.constant ${WARP} : i32
    %in_warp = affine.for %i = 0 to ${SHUFFLE_STEPS} iter_args(%acc = %v) -> (f32) {
      %i32 = arith.index_cast %i : index to i32
      %offset = arith.shli %one, %i32 : i32
      %other, %ok = gpu.shuffle xor %acc, %offset, %width : f32
      %sum = arith.addf %acc, %other : f32
      affine.yield %sum : f32
    }
    %multi_warp = arith.constant ${MULTI_WARP}
    %total = scf.if %multi_warp -> (f32) {
      %warp = arith.constant ${WARP} : index
      %wpr = arith.constant ${WPR} : index
      %lane = arith.remui %tid, %warp : index
      %warp_id = arith.divui %tid, %warp : index
      %is_first = arith.cmpi eq, %lane, %c0 : index
      scf.if %is_first {
        memref.store %in_warp, %red[%warp_id] : memref<${WPR}xf32, #gpu.address_space<workgroup>>
      }
      gpu.barrier
      // Every warp sums the WPR warp totals itself (lane i takes total i): one register, no
      // second barrier round trip, and each warp ends with the row total.
      %has_part = arith.cmpi ult, %lane, %wpr : index
      %part = scf.if %has_part -> (f32) {
        %p = memref.load %red[%lane] : memref<${WPR}xf32, #gpu.address_space<workgroup>>
        scf.yield %p : f32
      } else {
        %zero = arith.constant 0.0 : f32
        scf.yield %zero : f32
      }
      %all = affine.for %i = 0 to ${WARP_STEPS} iter_args(%acc = %part) -> (f32) {
        %i32 = arith.index_cast %i : index to i32
        %offset = arith.shli %one, %i32 : i32
        %other, %ok = gpu.shuffle xor %acc, %offset, %width : f32
        %sum = arith.addf %acc, %other : f32
        affine.yield %sum : f32
      }
      %trail = arith.constant ${RED_REUSED}
      scf.if %trail {
        gpu.barrier
      }
      scf.yield %all : f32
    } else {
      scf.yield %in_warp : f32
    }
    return %total : f32
  }
