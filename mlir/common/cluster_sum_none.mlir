  // normir common piece: cluster_sum where a row is one block (no split, or no clusters on the
  // target): the block's total is the row's, and there are no peers to wait for.
  func.func private @normir_cluster_init(%tid: index) attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
  func.func private @normir_cluster_post(%v: vector<${NR}xf32>, %tid: index, %iter: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    return
  }
  func.func private @normir_cluster_read(%own: vector<${NR}xf32>, %iter: index) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    return %own : vector<${NR}xf32>
  }
  func.func private @normir_cluster_sum(%v: vector<${NR}xf32>, %tid: index, %iter: index) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    return %v : vector<${NR}xf32>
  }
