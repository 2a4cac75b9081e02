  // normir common piece: two row summaries (n, mean, M2) merged by Chan's update (normir_chan,
  // in common/stats_layer.mlir): LayerNorm's forward, NR = ${NR}. The cluster exchange merges
  // blocks in rank order into zeros (normir_combine: the general update, one approximate
  // reciprocal). A butterfly step's two summaries (normir_combine_pair) are over as many
  // elements where the layout gives every thread as many chunks and whole warps a power of two
  // (EQUAL_COUNTS = ${EQUAL_COUNTS}): then mean = (ma + mb) / 2, M2 = M2a + M2b + delta^2 * na / 2,
  // with no reciprocal, and nb (equal to na) is never shuffled.
  func.func private @normir_combine(%a: vector<${NR}xf32>, %b: vector<${NR}xf32>) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %m = func.call @normir_chan(%a, %b) : (vector<${NR}xf32>, vector<${NR}xf32>) -> vector<${NR}xf32>
    return %m : vector<${NR}xf32>
  }
  func.func private @normir_combine_pair(%a: vector<${NR}xf32>, %b: vector<${NR}xf32>) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %equal = arith.constant ${EQUAL_COUNTS}
    %m = scf.if %equal -> (vector<${NR}xf32>) {
      %half = arith.constant 0.5 : f32
      %na = vector.extract %a[0] : f32 from vector<${NR}xf32>
      %ma = vector.extract %a[1] : f32 from vector<${NR}xf32>
      %mb = vector.extract %b[1] : f32 from vector<${NR}xf32>
      %qa = vector.extract %a[2] : f32 from vector<${NR}xf32>
      %qb = vector.extract %b[2] : f32 from vector<${NR}xf32>
      %n = arith.addf %na, %na : f32
      %msum = arith.addf %ma, %mb : f32
      %mean = arith.mulf %msum, %half : f32
      %delta = arith.subf %mb, %ma : f32
      %d2 = arith.mulf %delta, %delta : f32
      %w = arith.mulf %na, %half : f32
      %qab = arith.addf %qa, %qb : f32
      %q = func.call @normir_fma(%d2, %w, %qab) : (f32, f32, f32) -> f32
      %r = vector.from_elements %n, %mean, %q : vector<${NR}xf32>
      scf.yield %r : vector<${NR}xf32>
    } else {
      %r = func.call @normir_chan(%a, %b) : (vector<${NR}xf32>, vector<${NR}xf32>) -> vector<${NR}xf32>
      scf.yield %r : vector<${NR}xf32>
    }
    return %m : vector<${NR}xf32>
  }
