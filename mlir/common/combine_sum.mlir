  // normir common piece: two row summaries of ${NR} fp32 sums merged by adding them, value by value
  // (the block reduction's and the cluster exchange's merge for every kernel but LayerNorm's
  // forward). A butterfly step's pair (normir_combine_pair) is added the same way.
  func.func private @normir_combine(%a: vector<${NR}xf32>, %b: vector<${NR}xf32>) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %r = affine.for %j = 0 to ${NR} iter_args(%acc = %a) -> (vector<${NR}xf32>) {
      %x = vector.extract %a[%j] : f32 from vector<${NR}xf32>
      %y = vector.extract %b[%j] : f32 from vector<${NR}xf32>
      %s = arith.addf %x, %y : f32
      %acc2 = vector.insert %s, %acc[%j] : f32 into vector<${NR}xf32>
      affine.yield %acc2 : vector<${NR}xf32>
    }
    return %r : vector<${NR}xf32>
  }
  func.func private @normir_combine_pair(%a: vector<${NR}xf32>, %b: vector<${NR}xf32>) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %r = func.call @normir_combine(%a, %b) : (vector<${NR}xf32>, vector<${NR}xf32>) -> vector<${NR}xf32>
    return %r : vector<${NR}xf32>
  }
