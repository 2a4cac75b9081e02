  // normir target piece (ROCDL, gfx950: OCP fp8): a quantized forward's conversions to bytes.
  // Two fp32 values (clamped to fp8's range) to e4m3fn, rounded to nearest even: v_cvt_pk_fp8_f32,
  // whose first operand is the low byte.
  func.func private @normir_fp8_pair(%lo: f32, %hi: f32) -> vector<2xi8> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %old = arith.constant 0 : i32
    %word = rocdl.cvt.pk.fp8.f32 %lo, %hi -> %old[false] : i32
    %pair = arith.trunci %word : i32 to i16
    %pv = llvm.bitcast %pair : i16 to vector<2xi8>
    return %pv : vector<2xi8>
  }
  // A chunk of V scaled fp32 values to int8: rounded to nearest even (v_rndne_f32), a NaN to 0,
  // saturated to [-128, 127] (v_med3-able max and min), converted.
  func.func private @normir_to_i8(%v: vector<${V}xf32>) -> vector<${V}xi8> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %r = llvm.intr.roundeven(%v) : (vector<${V}xf32>) -> vector<${V}xf32>
    %lo_lim = arith.constant dense<-128.0> : vector<${V}xf32>
    %hi_lim = arith.constant dense<127.0> : vector<${V}xf32>
    %zero = arith.constant dense<0.0> : vector<${V}xf32>
    %nan = arith.cmpf uno, %r, %r : vector<${V}xf32>
    %finite = arith.select %nan, %zero, %r : vector<${V}xi1>, vector<${V}xf32>
    %above = llvm.intr.maxnum(%finite, %lo_lim) : (vector<${V}xf32>, vector<${V}xf32>) -> vector<${V}xf32>
    %sat = llvm.intr.minnum(%above, %hi_lim) : (vector<${V}xf32>, vector<${V}xf32>) -> vector<${V}xf32>
    %q = arith.fptosi %sat : vector<${V}xf32> to vector<${V}xi8>
    return %q : vector<${V}xi8>
  }
