// A kernel text with a placeholder no option fills (a typo for EPS).
module {
  func.func @f() -> f32 {
    %eps = arith.constant ${NOPE} : f32
    return %eps : f32
  }
}
