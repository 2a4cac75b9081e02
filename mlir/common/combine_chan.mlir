  // normir common piece: two row summaries (n, mean, M2) merged by Chan's update (normir_chan,
  // in common/stats_layer.mlir): LayerNorm's forward, NR = ${NR}.
  func.func private @normir_combine(%a: vector<${NR}xf32>, %b: vector<${NR}xf32>) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %m = func.call @normir_chan(%a, %b) : (vector<${NR}xf32>, vector<${NR}xf32>) -> vector<${NR}xf32>
    return %m : vector<${NR}xf32>
  }
