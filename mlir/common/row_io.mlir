  // normir common piece: row_io for the row tensor ${TENSOR} (elements of ${TYPE}, ${V} to a chunk,
  // ${ALIGN}-byte accesses): the one place a kernel reads or writes a chunk of a row, spliced once
  // per tensor. Plain vector loads and stores, or with HINT_LD / HINT_ST (${HINT_LD} / ${HINT_ST})
  // those of the target's hint_io piece, which carry an L2 eviction policy (and on loads an L1
  // qualifier, `last` marking a row's last read); staged chunks are read from shared memory.
  // normir:splice ${HINT_IO_PIECE}

  // Chunk [row, col : col + V] of the tensor, rows %stride elements apart.
  func.func private @normir_load_${TENSOR}(%arg: memref<${N}x${TYPE}>, %row: index, %col: index, %rows: index,
      %stride: index, %policy: i64, %last: i1) -> vector<${V}x${TYPE}> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %hint_ld = arith.constant ${HINT_LD}
    %v = scf.if %hint_ld -> (vector<${V}x${TYPE}>) {
      %base = memref.extract_aligned_pointer_as_index %arg : memref<${N}x${TYPE}> -> index
      %e0 = arith.muli %row, %stride : index
      %e = arith.addi %e0, %col : index
      %h = func.call @normir_ld_hint_${TENSOR}(%base, %e, %policy, %last) : (index, index, i64, i1) -> vector<${V}x${TYPE}>
      scf.yield %h : vector<${V}x${TYPE}>
    } else {
      %view = memref.reinterpret_cast %arg to offset: [0], sizes: [%rows, ${N}], strides: [%stride, 1]
          : memref<${N}x${TYPE}> to memref<?x${N}x${TYPE}, strided<[?, 1]>>
      %l = vector.load %view[%row, %col] {alignment = ${ALIGN}} : memref<?x${N}x${TYPE}, strided<[?, 1]>>, vector<${V}x${TYPE}>
      scf.yield %l : vector<${V}x${TYPE}>
    }
    return %v : vector<${V}x${TYPE}>
  }

  func.func private @normir_store_${TENSOR}(%arg: memref<${N}x${TYPE}>, %row: index, %col: index, %rows: index,
      %stride: index, %v: vector<${V}x${TYPE}>, %policy: i64) attributes {llvm.linkage = #llvm.linkage<internal>} {
    %hint_st = arith.constant ${HINT_ST}
    scf.if %hint_st {
      %base = memref.extract_aligned_pointer_as_index %arg : memref<${N}x${TYPE}> -> index
      %e0 = arith.muli %row, %stride : index
      %e = arith.addi %e0, %col : index
      func.call @normir_st_hint_${TENSOR}(%base, %e, %v, %policy) : (index, index, vector<${V}x${TYPE}>, i64) -> ()
    } else {
      %view = memref.reinterpret_cast %arg to offset: [0], sizes: [%rows, ${N}], strides: [%stride, 1]
          : memref<${N}x${TYPE}> to memref<?x${N}x${TYPE}, strided<[?, 1]>>
      vector.store %v, %view[%row, %col] {alignment = ${ALIGN}} : memref<?x${N}x${TYPE}, strided<[?, 1]>>, vector<${V}x${TYPE}>
    }
    return
  }

  // A staged chunk: the 16 bytes at shared address %addr (where the stage piece copied it).
  func.func private @normir_load_staged_${TENSOR}(%addr: index) -> vector<${V}x${TYPE}>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %addr_i64 = arith.index_cast %addr : index to i64
    %ptr = llvm.inttoptr %addr_i64 : i64 to !llvm.ptr<3>
    %v = llvm.load %ptr {alignment = 16 : i64} : !llvm.ptr<3> -> vector<${V}x${TYPE}>
    return %v : vector<${V}x${TYPE}>
  }
