  // normir common piece: cluster_sum where a row is one block (no split, or no clusters on the
  // target): the block's total is the row's, and there are no peers to wait for.
  func.func private @normir_cluster_init(%mbar: memref<2xi64, #gpu.address_space<workgroup>>, %tid: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
  func.func private @normir_cluster_sum(%v: f32, %tid: index,
      %xch: memref<${XCH_SLOTS}xf32, #gpu.address_space<workgroup>>,
      %mbar: memref<2xi64, #gpu.address_space<workgroup>>, %iter: index) -> f32
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    return %v : f32
  }
