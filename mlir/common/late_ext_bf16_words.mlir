  // normir common piece: late_ext for the row tensor ${TENSOR} in bf16, by 32-bit words: bf16 -> f32
  // for values held across a reduction (and the forward's w and b). The same conversion as
  // arith.extf, spelled with integer ops so that LLVM does not merge it with the first pass's
  // extf: the register copy of the row stays packed (2 bytes an element) instead of as fp32. Each
  // word holds two elements: the low one is the word shifted up 16 bits, the high one the word
  // with its low 16 bits cleared: one instruction an element, where extf and late_ext_bf16.mlir's
  // form take two for the high one (a byte permute, then a shift). LayerNorm's forwards of one
  // read whose layout fixes the registers take it (layout._cast_words); the rest keep
  // late_ext_bf16.mlir.
  func.func private @normir_late_ext_${TENSOR}(%v: vector<${V}xbf16>) -> vector<${V}xf32>
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %sixteen = arith.constant 16 : i32
    %high_mask = arith.constant -65536 : i32  // 0xffff0000
    %zero = arith.constant dense<0.0> : vector<${V}xf32>
    %words = vector.bitcast %v : vector<${V}xbf16> to vector<${HALF_V}xi32>
    %f = affine.for %i = 0 to ${HALF_V} iter_args(%acc = %zero) -> (vector<${V}xf32>) {
      %word = vector.extract %words[%i] : i32 from vector<${HALF_V}xi32>
      %lo_bits = arith.shli %word, %sixteen : i32
      %hi_bits = arith.andi %word, %high_mask : i32
      %lo = arith.bitcast %lo_bits : i32 to f32
      %hi = arith.bitcast %hi_bits : i32 to f32
      %c2 = arith.constant 2 : index
      %at = arith.muli %i, %c2 : index
      %acc_lo = vector.insert %lo, %acc[%at] : f32 into vector<${V}xf32>
      %c1 = arith.constant 1 : index
      %at_hi = arith.addi %at, %c1 : index
      %acc_hi = vector.insert %hi, %acc_lo[%at_hi] : f32 into vector<${V}xf32>
      affine.yield %acc_hi : vector<${V}xf32>
    }
    return %f : vector<${V}xf32>
  }
