// A kernel that parses and verifies, but uses an op (tensor.empty, line 9) that no pass of the
// llvm stage lowers.
module attributes {gpu.container_module} {
gpu.module @normir [${TARGET}] {
  gpu.func @rmsnorm_fwd(%x_arg: memref<${N}x${T}>, %rstd_arg: memref<1xf32>)
      kernel attributes {known_block_size = array<i32: 64, 1, 1>} {
    %c0 = arith.constant 0 : index
    %r = memref.reinterpret_cast %rstd_arg to offset: [0], sizes: [4], strides: [1] : memref<1xf32> to memref<4xf32>
    %t = tensor.empty() : tensor<4xf32>
    %e = tensor.extract %t[%c0] : tensor<4xf32>
    memref.store %e, %r[%c0] : memref<4xf32>
    gpu.return
  }
}
}
