  // normir math piece: RMSNorm's statistics and their gradient, in fp32 (the op's part of
  // norm_fwd.mlir and norm_bwd.mlir; the skeletons do the loads, stores, reductions and layouts).
  //   forward:  rstd = 1 / sqrt(mean_j(x^2) + eps),  x_hat = x * rstd
  //   backward: dot = sum_j x * (dy * w),  b = dot * rstd^3 / N,  p = dy * rstd,
  //             dx = p * w - b * x,  dw += p * x   (the row's scalars applied to the row total:
  //             2 operations per element in pass 1 and 4 in pass 2)
  // One fp32 sum per row (NR = ${NR}), merged by common/combine_sum.mlir; no mean (the skeletons'
  // mean arguments are zeros, unused here). Functions are internal: LLVM inlines them.

  // Forward pass 1: the lane-wise partial sums of the row's elements.
  // Chunks past the row end are zeros (%live false), which add nothing.
  func.func private @normir_fwd_acc(%acc: vector<${V}xf32>, %x: vector<${V}xf32>, %live: i1, %k: index)
      -> vector<${V}xf32> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %next = vector.fma %x, %x, %acc : vector<${V}xf32>
    return %next : vector<${V}xf32>
  }
  // The thread's sums (reduced over its lanes) that the block reduction adds up.
  func.func private @normir_fwd_sums(%acc: vector<${V}xf32>, %owned: index) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %sq = vector.reduction <add>, %acc : vector<${V}xf32> into f32
    %sums = vector.from_elements %sq : vector<${NR}xf32>
    return %sums : vector<${NR}xf32>
  }
  // norm_fwd.mlir's TWO_PASS is LayerNorm's (its variance's second pass): RMSNorm's sum of squares
  // needs none, so these keep the sums as they are.
  func.func private @normir_fwd_center(%acc: vector<${V}xf32>, %x: vector<${V}xf32>, %sums: vector<${NR}xf32>,
      %live: i1) -> vector<${V}xf32> attributes {llvm.linkage = #llvm.linkage<internal>} {
    return %acc : vector<${V}xf32>
  }
  func.func private @normir_fwd_two_pass(%first: vector<${NR}xf32>, %second: vector<${NR}xf32>) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    return %first : vector<${NR}xf32>
  }
  // The row's rstd (and mean: none, 0) from its sums.
  func.func private @normir_fwd_stats(%sums: vector<${NR}xf32>) -> (f32, f32)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %no_mean = arith.constant 0.0 : f32
    %eps = arith.constant ${EPS} : f32
    %inv_n = arith.constant ${INV_N} : f32
    %sq_all = vector.extract %sums[0] : f32 from vector<${NR}xf32>
    %mean_sq = arith.mulf %sq_all, %inv_n : f32
    %var_eps = arith.addf %mean_sq, %eps : f32
    %rstd = func.call @normir_rsqrt(%var_eps) : (f32) -> f32
    return %rstd, %no_mean : f32, f32
  }
  // Forward pass 2: x_hat (the weight and the output cast are the skeleton's).
  func.func private @normir_fwd_norm(%x: vector<${V}xf32>, %rstd_v: vector<${V}xf32>, %mean_v: vector<${V}xf32>)
      -> vector<${V}xf32> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %xn = arith.mulf %x, %rstd_v : vector<${V}xf32>
    return %xn : vector<${V}xf32>
  }

  // Backward pass 1: the lane-wise partial sums (dot = sum x * dy * w).
  func.func private @normir_bwd_acc(%acc: vector<${V}xf32>, %x: vector<${V}xf32>, %dy: vector<${V}xf32>,
      %w: vector<${V}xf32>, %mean_v: vector<${V}xf32>) -> vector<${V}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %wdy = arith.mulf %dy, %w : vector<${V}xf32>
    %next = vector.fma %x, %wdy, %acc : vector<${V}xf32>
    return %next : vector<${V}xf32>
  }
  func.func private @normir_bwd_sums(%acc: vector<${V}xf32>) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %dot = vector.reduction <add>, %acc : vector<${V}xf32> into f32
    %sums = vector.from_elements %dot : vector<${NR}xf32>
    return %sums : vector<${NR}xf32>
  }
  // The row's coefficients for pass 2 from its sums: -b = -(dot / N) * rstd^3.
  func.func private @normir_bwd_coefs(%sums: vector<${NR}xf32>, %rstd: f32) -> vector<${NR}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %inv_n = arith.constant ${INV_N} : f32
    %dot = vector.extract %sums[0] : f32 from vector<${NR}xf32>
    %dot_mean = arith.mulf %dot, %inv_n : f32
    %c1_s = arith.mulf %dot_mean, %rstd : f32
    %c1_r = arith.mulf %c1_s, %rstd : f32
    %b_s = arith.mulf %c1_r, %rstd : f32
    %neg_b_s = arith.negf %b_s : f32
    %coefs = vector.from_elements %neg_b_s : vector<${NR}xf32>
    return %coefs : vector<${NR}xf32>
  }
  // Backward pass 2: dx, and g, the factor of x in the weight's gradient (dw += g * x).
  func.func private @normir_bwd_dx(%x: vector<${V}xf32>, %dy: vector<${V}xf32>, %w: vector<${V}xf32>,
      %rstd_v: vector<${V}xf32>, %mean_v: vector<${V}xf32>, %coefs: vector<${NR}xf32>)
      -> (vector<${V}xf32>, vector<${V}xf32>) attributes {llvm.linkage = #llvm.linkage<internal>} {
    %neg_b = vector.extract %coefs[0] : f32 from vector<${NR}xf32>
    %neg_b_v = vector.broadcast %neg_b : f32 to vector<${V}xf32>
    %p = arith.mulf %dy, %rstd_v : vector<${V}xf32>
    %bx = arith.mulf %x, %neg_b_v : vector<${V}xf32>
    %dx = vector.fma %p, %w, %bx : vector<${V}xf32>
    return %dx, %p : vector<${V}xf32>, vector<${V}xf32>
  }
  // The weight's gradient: acc + g * x.
  func.func private @normir_bwd_dw(%acc: vector<${V}xf32>, %x: vector<${V}xf32>, %g: vector<${V}xf32>,
      %mean_v: vector<${V}xf32>) -> vector<${V}xf32> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %next = vector.fma %g, %x, %acc : vector<${V}xf32>
    return %next : vector<${V}xf32>
  }
