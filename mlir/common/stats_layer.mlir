  // normir math piece: LayerNorm's statistics and their gradient, in fp32 (the op's part of
  // norm_fwd.mlir and norm_bwd.mlir; the skeletons do the loads, stores, reductions and layouts).
  //   forward:  mean = mean_j(x),  var = mean_j((x - mean)^2),  rstd = 1 / sqrt(var + eps),
  //             x_hat = (x - mean) * rstd
  //   backward: xc = x - mean,  wdy = dy * w,  S1 = sum_j wdy,  S2 = sum_j wdy * xc,
  //             dx = wdy * rstd - S1 * rstd / N - xc * S2 * rstd^3 / N
  //                = (wdy - c1 - x_hat * c2) * rstd  with c1 = mean(wdy), c2 = mean(wdy * x_hat),
  //             dw += dy * rstd * xc (= dy * x_hat),  db += dy (the skeleton's)
  //
  // The variance is centered, never E[x^2] - mean^2 (which loses every digit of var when
  // mean^2 >> var). The skeleton subtracts a shift first (HAS_MEAN: the row's first element, the
  // same for every thread of a row), so that the statistics see values of the row's spread, not
  // of its offset. Rows held in one block whose threads own unequal chunk counts (TWO_PASS) take
  // the exact two-pass form instead: the row's sum, then the squared deviations from its mean over
  // the held registers, each a plain block sum. Otherwise each chunk's mean and M2 are computed in
  // two passes over its registers and merged into the thread's running (mean, M2) with constant
  // weights (normir_fwd_acc); the block reduction and the cluster exchange merge the threads' and
  // blocks' (n, mean, M2) by Chan et al.'s pairwise update (normir_chan, symmetric in its two
  // arguments, so that every lane of a butterfly gets the same bits; combine_chan.mlir's
  // equal-count form where counts are equal). The forward returns the mean of the shifted row;
  // the skeleton normalizes the shifted row with it and stores mean + shift.
  // The forward's row summary is vector<3xf32> (n, mean, M2; NR = 3, merged by
  // common/combine_chan.mlir), the backward's vector<2xf32> (S1, S2; NR = 2, added). The sizes
  // are written out, so that both halves of the piece verify in either kernel. The forward's
  // accumulator is ${FWD_ACC} (mean, M2), the backward's ${BWD_ACC} (two vectors of V lanes, split
  // by normir_halves).
  // Functions are internal: LLVM inlines them.

  // a * b + c rounded once (math.fma would become a libdevice call on NVVM).
  func.func private @normir_fma(%a: f32, %b: f32, %c: f32) -> f32 attributes {llvm.linkage = #llvm.linkage<internal>} {
    %av = vector.broadcast %a : f32 to vector<1xf32>
    %bv = vector.broadcast %b : f32 to vector<1xf32>
    %cv = vector.broadcast %c : f32 to vector<1xf32>
    %r = vector.fma %av, %bv, %cv : vector<1xf32>
    %e = vector.extract %r[0] : f32 from vector<1xf32>
    return %e : f32
  }

  // q + the sum of d^2 over a chunk's deviations, an fma each.
  func.func private @normir_sum_sq(%d: vector<${V}xf32>, %q: f32) -> f32
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %r = affine.for %j = 0 to ${V} iter_args(%acc = %q) -> (f32) {
      %dj = vector.extract %d[%j] : f32 from vector<${V}xf32>
      %next = func.call @normir_fma(%dj, %dj, %acc) : (f32, f32, f32) -> f32
      affine.yield %next : f32
    }
    return %r : f32
  }

  // Chan's update of (n, mean, M2) triples: n = na + nb, delta = mb - ma,
  // mean = (na * ma + nb * mb) / n, M2 = M2a + M2b + delta^2 * na * nb / n (n = 0: zeros).
  func.func private @normir_chan(%a: vector<3xf32>, %b: vector<3xf32>) -> vector<3xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %one = arith.constant 1.0 : f32
    %na = vector.extract %a[0] : f32 from vector<3xf32>
    %nb = vector.extract %b[0] : f32 from vector<3xf32>
    %n = arith.addf %na, %nb : f32
    %n1 = arith.maximumf %n, %one : f32
    %inv_n = arith.divf %one, %n1 fastmath<afn> : f32  // ~1 ulp: the means are of shifted rows, small
    %ma = vector.extract %a[1] : f32 from vector<3xf32>
    %mb = vector.extract %b[1] : f32 from vector<3xf32>
    %wa = arith.mulf %na, %ma : f32
    %wb = arith.mulf %nb, %mb : f32
    %wsum = arith.addf %wa, %wb : f32
    %mean = arith.mulf %wsum, %inv_n : f32
    %delta = arith.subf %mb, %ma : f32
    %d2 = arith.mulf %delta, %delta : f32
    %nab = arith.mulf %na, %nb : f32
    %frac = arith.mulf %nab, %inv_n : f32
    %cross = arith.mulf %d2, %frac : f32
    %qa = vector.extract %a[2] : f32 from vector<3xf32>
    %qb = vector.extract %b[2] : f32 from vector<3xf32>
    %qab = arith.addf %qa, %qb : f32
    %q = arith.addf %qab, %cross : f32
    %r = vector.from_elements %n, %mean, %q : vector<3xf32>
    return %r : vector<3xf32>
  }

  // Forward pass 1, per chunk: the chunk's own mean and M2 (two passes over its V values, in
  // registers), merged into the thread's running (mean, M2) of its chunks 0..k-1 by Chan's update
  // with the constant weights of k chunks against one (k is a constant once the chunk loop is
  // unrolled: no division is left). Only a thread's last chunk can be past the row's end: a chunk
  // not live leaves the accumulator (${FWD_ACC}: mean, M2) as it was.
  // TWO_PASS = ${TWO_PASS} (rows held in one block, layout._two_pass): the accumulator's second value is
  // the thread's plain sum of its chunks instead, the block adds the threads' (n, -, sum), and
  // normir_fwd_center's second pass over the held chunks sums the squared deviations from the
  // row's mean into a second (n, -, M2): the exact two-pass variance, with no count and no
  // reciprocal in the merges. Both sums sit in the summary's last value, the only one the
  // butterflies shuffle then (PAIR_FIRST = 2); the others are not read.
  func.func private @normir_fwd_acc(%acc: ${FWD_ACC}, %x: vector<${V}xf32>, %live: i1, %k: index) -> ${FWD_ACC}
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %two_pass = arith.constant ${TWO_PASS}
    %one = arith.constant 1.0 : f32
    %inv_v = arith.constant ${INV_V} : f32
    %v_f = arith.constant ${V}.0 : f32
    %sum = vector.reduction <add>, %x : vector<${V}xf32> into f32
    %mc = arith.mulf %sum, %inv_v : f32
    %mc_v = vector.broadcast %mc : f32 to vector<${V}xf32>
    %d = arith.subf %x, %mc_v : vector<${V}xf32>
    %zero = arith.constant 0.0 : f32
    %qc = func.call @normir_sum_sq(%d, %zero) : (vector<${V}xf32>, f32) -> f32
    // Chan, na = k V, nb = V: mean += delta / (k + 1), M2 += qc + delta^2 * V k / (k + 1).
    %k_i = arith.index_cast %k : index to i32
    %k_f = arith.sitofp %k_i : i32 to f32
    %k1_f = arith.addf %k_f, %one : f32
    %w = arith.divf %one, %k1_f : f32
    %vk = arith.mulf %v_f, %k_f : f32
    %cw = arith.mulf %vk, %w : f32
    %ma = vector.extract %acc[0] : f32 from ${FWD_ACC}
    %qa = vector.extract %acc[1] : f32 from ${FWD_ACC}
    %delta = arith.subf %mc, %ma : f32
    %mean = func.call @normir_fma(%delta, %w, %ma) : (f32, f32, f32) -> f32
    %dd = arith.mulf %delta, %delta : f32
    %qs = arith.addf %qa, %qc : f32
    %q = func.call @normir_fma(%dd, %cw, %qs) : (f32, f32, f32) -> f32
    %merged = vector.from_elements %mean, %q : ${FWD_ACC}
    %own = vector.from_elements %mc, %qc : ${FWD_ACC}
    %c0 = arith.constant 0 : index
    %first = arith.cmpi eq, %k, %c0 : index  // chunk 0: its own (mean, M2), nothing to merge
    %next = arith.select %first, %own, %merged : ${FWD_ACC}
    %chan = arith.select %live, %next, %acc : ${FWD_ACC}
    %s_old = vector.extract %acc[1] : f32 from ${FWD_ACC}
    %s_new = arith.addf %s_old, %sum : f32
    %summed = vector.insert %s_new, %acc[1] : f32 into ${FWD_ACC}
    %sum_live = arith.select %live, %summed, %acc : ${FWD_ACC}
    %out = arith.select %two_pass, %sum_live, %chan : ${FWD_ACC}
    return %out : ${FWD_ACC}
  }
  // TWO_PASS's second pass, per chunk: the squared deviations of a live chunk from the row's mean
  // (sums: the row's (n, -, sum)), added to the accumulator's second value.
  func.func private @normir_fwd_center(%acc: ${FWD_ACC}, %x: vector<${V}xf32>, %sums: vector<3xf32>, %live: i1)
      -> ${FWD_ACC} attributes {llvm.linkage = #llvm.linkage<internal>} {
    %inv_n = arith.constant ${INV_N} : f32
    %total = vector.extract %sums[2] : f32 from vector<3xf32>
    %mean = arith.mulf %total, %inv_n : f32
    %mean_v = vector.broadcast %mean : f32 to vector<${V}xf32>
    %d = arith.subf %x, %mean_v : vector<${V}xf32>
    %q_old = vector.extract %acc[1] : f32 from ${FWD_ACC}
    %q = func.call @normir_sum_sq(%d, %q_old) : (vector<${V}xf32>, f32) -> f32
    %with_q = vector.insert %q, %acc[1] : f32 into ${FWD_ACC}
    %out = arith.select %live, %with_q, %acc : ${FWD_ACC}
    return %out : ${FWD_ACC}
  }
  // TWO_PASS's row summary for normir_fwd_stats: (n, mean, M2) from the row's (n, -, sum) and the
  // second reduction's (n, -, M2).
  func.func private @normir_fwd_two_pass(%first: vector<3xf32>, %second: vector<3xf32>) -> vector<3xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %inv_n = arith.constant ${INV_N} : f32
    %n = arith.constant ${N}.0 : f32
    %total = vector.extract %first[2] : f32 from vector<3xf32>
    %mean = arith.mulf %total, %inv_n : f32
    %m2 = vector.extract %second[2] : f32 from vector<3xf32>
    %r = vector.from_elements %n, %mean, %m2 : vector<3xf32>
    return %r : vector<3xf32>
  }
  // The thread's (n, mean, M2) over the `owned` chunks it has.
  func.func private @normir_fwd_sums(%acc: ${FWD_ACC}, %owned: index) -> vector<3xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %v_f = arith.constant ${V}.0 : f32
    %owned_i = arith.index_cast %owned : index to i32
    %c = arith.sitofp %owned_i : i32 to f32
    %n = arith.mulf %c, %v_f : f32
    %m = vector.extract %acc[0] : f32 from ${FWD_ACC}
    %q = vector.extract %acc[1] : f32 from ${FWD_ACC}
    %r = vector.from_elements %n, %m, %q : vector<3xf32>
    return %r : vector<3xf32>
  }
  // The row's rstd and its shifted mean from its triple (n = N once merged).
  func.func private @normir_fwd_stats(%sums: vector<3xf32>) -> (f32, f32)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %eps = arith.constant ${EPS} : f32
    %inv_n = arith.constant ${INV_N} : f32
    %mean = vector.extract %sums[1] : f32 from vector<3xf32>
    %m2 = vector.extract %sums[2] : f32 from vector<3xf32>
    %var = arith.mulf %m2, %inv_n : f32
    %var_eps = arith.addf %var, %eps : f32
    %rstd = func.call @normir_rsqrt(%var_eps) : (f32) -> f32
    return %rstd, %mean : f32, f32
  }
  // Forward pass 2: x_hat = (x - mean) * rstd = x * rstd - mean * rstd, one fma per element (x
  // and mean are of the shifted row, of the row's spread: the product rounds as little as x's)
  // (the weight, bias and output cast are the skeleton's).
  func.func private @normir_fwd_norm(%x: vector<${V}xf32>, %rstd_v: vector<${V}xf32>, %mean_v: vector<${V}xf32>)
      -> vector<${V}xf32> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %mr = arith.mulf %mean_v, %rstd_v : vector<${V}xf32>
    %neg_mr = arith.negf %mr : vector<${V}xf32>
    %xn = vector.fma %x, %rstd_v, %neg_mr : vector<${V}xf32>
    return %xn : vector<${V}xf32>
  }

  // Backward pass 1: lane-wise S1 += wdy and S2 += wdy * xc, the two halves of the accumulator
  // (${BWD_ACC}: S1's V lanes, then S2's; LANES_* are the shuffles' lane lists).
  func.func private @normir_bwd_acc(%acc: ${BWD_ACC}, %x: vector<${V}xf32>, %dy: vector<${V}xf32>,
      %w: vector<${V}xf32>, %mean_v: vector<${V}xf32>) -> ${BWD_ACC} attributes {llvm.linkage = #llvm.linkage<internal>} {
    %wdy = arith.mulf %dy, %w : vector<${V}xf32>
    %xc = arith.subf %x, %mean_v : vector<${V}xf32>
    %s1, %s2 = func.call @normir_halves(%acc) : (${BWD_ACC}) -> (vector<${V}xf32>, vector<${V}xf32>)
    %s1n = arith.addf %s1, %wdy : vector<${V}xf32>
    %s2n = vector.fma %wdy, %xc, %s2 : vector<${V}xf32>
    %next = vector.shuffle %s1n, %s2n [${LANES_2V}] : vector<${V}xf32>, vector<${V}xf32>
    return %next : ${BWD_ACC}
  }
  func.func private @normir_halves(%acc: ${BWD_ACC}) -> (vector<${V}xf32>, vector<${V}xf32>)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %s1 = vector.shuffle %acc, %acc [${LANES_LO}] : ${BWD_ACC}, ${BWD_ACC}
    %s2 = vector.shuffle %acc, %acc [${LANES_HI}] : ${BWD_ACC}, ${BWD_ACC}
    return %s1, %s2 : vector<${V}xf32>, vector<${V}xf32>
  }
  func.func private @normir_bwd_sums(%acc: ${BWD_ACC}) -> vector<2xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %s1, %s2 = func.call @normir_halves(%acc) : (${BWD_ACC}) -> (vector<${V}xf32>, vector<${V}xf32>)
    %t1 = vector.reduction <add>, %s1 : vector<${V}xf32> into f32
    %t2 = vector.reduction <add>, %s2 : vector<${V}xf32> into f32
    %sums = vector.from_elements %t1, %t2 : vector<2xf32>
    return %sums : vector<2xf32>
  }
  // The row's coefficients for pass 2: a = S1 * rstd / N and b = S2 * rstd^3 / N.
  func.func private @normir_bwd_coefs(%sums: vector<2xf32>, %rstd: f32) -> vector<2xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %inv_n = arith.constant ${INV_N} : f32
    %t1 = vector.extract %sums[0] : f32 from vector<2xf32>
    %t2 = vector.extract %sums[1] : f32 from vector<2xf32>
    %c1 = arith.mulf %t1, %inv_n : f32
    %a = arith.mulf %c1, %rstd : f32
    %c2 = arith.mulf %t2, %inv_n : f32
    %r2 = arith.mulf %rstd, %rstd : f32
    %r3 = arith.mulf %r2, %rstd : f32
    %b = arith.mulf %c2, %r3 : f32
    %coefs = vector.from_elements %a, %b : vector<2xf32>
    return %coefs : vector<2xf32>
  }
  // Backward pass 2: dx = p * w - a - xc * b with p = dy * rstd, and p, the factor of xc in the
  // weight's gradient (dw += p * xc).
  func.func private @normir_bwd_dx(%x: vector<${V}xf32>, %dy: vector<${V}xf32>, %w: vector<${V}xf32>,
      %rstd_v: vector<${V}xf32>, %mean_v: vector<${V}xf32>, %coefs: vector<2xf32>)
      -> (vector<${V}xf32>, vector<${V}xf32>) attributes {llvm.linkage = #llvm.linkage<internal>} {
    %a = vector.extract %coefs[0] : f32 from vector<2xf32>
    %b = vector.extract %coefs[1] : f32 from vector<2xf32>
    %neg_a = arith.negf %a : f32
    %neg_b = arith.negf %b : f32
    %neg_a_v = vector.broadcast %neg_a : f32 to vector<${V}xf32>
    %neg_b_v = vector.broadcast %neg_b : f32 to vector<${V}xf32>
    %xc = arith.subf %x, %mean_v : vector<${V}xf32>
    %p = arith.mulf %dy, %rstd_v : vector<${V}xf32>
    %t = vector.fma %xc, %neg_b_v, %neg_a_v : vector<${V}xf32>
    %dx = vector.fma %p, %w, %t : vector<${V}xf32>
    return %dx, %p : vector<${V}xf32>, vector<${V}xf32>
  }
  // The weight's gradient: acc + p * xc.
  func.func private @normir_bwd_dw(%acc: vector<${V}xf32>, %x: vector<${V}xf32>, %g: vector<${V}xf32>,
      %mean_v: vector<${V}xf32>) -> vector<${V}xf32> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %xc = arith.subf %x, %mean_v : vector<${V}xf32>
    %next = vector.fma %g, %xc, %acc : vector<${V}xf32>
    return %next : vector<${V}xf32>
  }
