  // normir target piece (NVVM, sm_89+): a quantized forward's conversions to bytes.
  // Two fp32 values (clamped to fp8's range) to e4m3fn, rounded to nearest even:
  // cvt.rn.satfinite.e4m3x2.f32, whose first operand is the upper byte (the pair's second element).
  func.func private @normir_fp8_pair(%lo: f32, %hi: f32) -> vector<2xi8> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %pair = nvvm.convert.f32x2.to.f8x2 %hi, %lo {rnd = #nvvm.fp_rnd_mode<rn>, sat = #nvvm.sat_mode<satfinite>} : i16 (f8E4M3FN)
    %pv = llvm.bitcast %pair : i16 to vector<2xi8>
    return %pv : vector<2xi8>
  }
  // A chunk of V scaled fp32 values to int8: round to nearest even, saturated to [-128, 127], a
  // NaN to 0, in one instruction a value (cvt.rni.sat.s8.f32).
  func.func private @normir_to_i8(%v: vector<${V}xf32>) -> vector<${V}xi8> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %none = arith.constant dense<0> : vector<${V}xi8>
    %q = affine.for %i = 0 to ${V} iter_args(%acc = %none) -> (vector<${V}xi8>) {
      %e = vector.extract %v[%i] : f32 from vector<${V}xf32>
      %r = llvm.inline_asm "cvt.rni.sat.s8.f32 $0, $1;", "=r,f" %e : (f32) -> i32
      %b = arith.trunci %r : i32 to i8
      %acc1 = vector.insert %b, %acc[%i] : i8 into vector<${V}xi8>
      affine.yield %acc1 : vector<${V}xi8>
    }
    return %q : vector<${V}xi8>
  }
