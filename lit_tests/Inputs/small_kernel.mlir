// A small kernel with the normir placeholders it needs (N, T, TARGET) and one misspelt op
// (gpu.thread_idd, line 8).
module attributes {gpu.container_module} {
gpu.module @normir [${TARGET}] {
  gpu.func @rmsnorm_fwd(%x_arg: memref<${N}x${T}>) kernel attributes {known_block_size = array<i32: 64, 1, 1>} {
    %c0 = arith.constant 0 : index
    %n = arith.constant ${N} : index
    %tid = gpu.thread_idd x
    gpu.return
  }
}
}
