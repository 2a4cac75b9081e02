  // normir common piece: the quant target piece where the kernel quantizes nothing (QUANT false):
  // the conversions' names, never called (the skeleton's quantized branch folds away), so that
  // the kernel text is one on every target.
  func.func private @normir_fp8_pair(%lo: f32, %hi: f32) -> vector<2xi8> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %z = arith.constant dense<0> : vector<2xi8>
    return %z : vector<2xi8>
  }
  func.func private @normir_to_i8(%v: vector<${V}xf32>) -> vector<${V}xi8> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %z = arith.constant dense<0> : vector<${V}xi8>
    return %z : vector<${V}xi8>
  }
