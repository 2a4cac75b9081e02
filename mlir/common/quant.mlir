  // normir common piece: a quantized forward's conversion of a chunk of V fp32 values, already
  // scaled, to fp8 e4m3fn bytes: clamped to [-448, 448] first (minnum, then maxnum: a NaN becomes
  // +448, an inf +-448), then converted two at a time by the target's @normir_fp8_pair (round to
  // nearest even; QUANT_PIECE). A chunk of one element converts it beside a zero (QPAIRS =
  // ${QPAIRS} pairs over the chunk padded to ${QP2} values). The int8 conversion, @normir_to_i8, is
  // the target piece's alone.
  func.func private @normir_to_fp8(%v: vector<${V}xf32>) -> vector<${V}xi8> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %hi_lim = arith.constant dense<448.0> : vector<${V}xf32>
    %lo_lim = arith.constant dense<-448.0> : vector<${V}xf32>
    %below = llvm.intr.minnum(%v, %hi_lim) : (vector<${V}xf32>, vector<${V}xf32>) -> vector<${V}xf32>
    %clamped = llvm.intr.maxnum(%below, %lo_lim) : (vector<${V}xf32>, vector<${V}xf32>) -> vector<${V}xf32>
    %pad = arith.constant dense<0.0> : vector<${QP2}xf32>
    %padded = vector.shuffle %clamped, %pad [${QPAD}] : vector<${V}xf32>, vector<${QP2}xf32>
    %none = arith.constant dense<0> : vector<${QP2}xi8>
    %bytes = affine.for %i = 0 to ${QPAIRS} iter_args(%acc = %none) -> (vector<${QP2}xi8>) {
      %j = affine.apply affine_map<(d) -> (d * 2)>(%i)
      %j1 = affine.apply affine_map<(d) -> (d * 2 + 1)>(%i)
      %lo = vector.extract %padded[%j] : f32 from vector<${QP2}xf32>
      %hi = vector.extract %padded[%j1] : f32 from vector<${QP2}xf32>
      %pair = func.call @normir_fp8_pair(%lo, %hi) : (f32, f32) -> vector<2xi8>
      %b0 = vector.extract %pair[0] : i8 from vector<2xi8>
      %b1 = vector.extract %pair[1] : i8 from vector<2xi8>
      %acc0 = vector.insert %b0, %acc[%j] : i8 into vector<${QP2}xi8>
      %acc1 = vector.insert %b1, %acc0[%j1] : i8 into vector<${QP2}xi8>
      affine.yield %acc1 : vector<${QP2}xi8>
    }
    %q = vector.shuffle %bytes, %bytes [${QLANES}] : vector<${QP2}xi8>, vector<${QP2}xi8>
    return %q : vector<${V}xi8>
  }
