"""Where the host time of one small forward call goes (N=4096, M=1, bf16), piece by piece.

    python scripts/host_profile.py     # on the GPU machine; microseconds per call
"""

import torch
from bench import host_us  # the benchmark's small-M timer (scripts/ is on sys.path when run)

import normir
from normir import launch as L
from normir.ops import rmsnorm as R


def main() -> None:
    x = torch.randn((1, 4096), device="cuda").bfloat16()
    w = torch.randn(4096, device="cuda").bfloat16()
    y, _ = normir.rmsnorm_fwd(x, w)
    h, lay = L.handle("rmsnorm_fwd", 0, 4096, "bf16", "bf16", 1e-6, True, False, 8)
    s = L.stream(0)
    args = (x.data_ptr(), w.data_ptr(), y.data_ptr(), 0, 1, 4096, 4096, 1)
    # The launch's ctypes call alone: as runtime.py makes it (ctypes objects, no argtypes), and
    # through argtypes from plain ints.
    import ctypes

    vp = ctypes.c_void_p
    ex_typed = ctypes.PyDLL(h.driver.lib._name).cuLaunchKernelEx
    ex_typed.argtypes, ex_typed.restype = [vp, vp, vp, vp], ctypes.c_int
    h.launch(1, s, *args)  # fills the buffer: grid 1 on this stream
    cfg_addr, fn_addr = h._call_args[0].value, h._call_args[1].value
    # The classic cuLaunchKernel with every argument a ready-made ctypes object.
    classic = ctypes.PyDLL(h.driver.lib._name).cuLaunchKernel
    classic.restype = ctypes.c_int
    one, grid1, block = ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(h.block)
    shm, st, fnp = ctypes.c_uint(h.shared_bytes), vp(s), vp(fn_addr)

    def fast_checks(x=x, weight=w, eps=1e-6, store_rstd=False):
        # The forward fast path's checks and lookup (rmsnorm_fwd), without allocation or launch.
        if type(x) is torch.Tensor and type(eps) is float and type(store_rstd) is bool and x.dim() and (
                weight is None or type(weight) is torch.Tensor):
            dev = x.get_device()
            n = x.shape[-1]
            key = (x.dtype, n, dev, eps, store_rstd, weight.dtype, weight.shape, weight.get_device())
            hit = R._FWD_SEEN.get(key)
            return hit is not None and x.is_contiguous() and weight.is_contiguous() and (
                x.data_ptr() | weight.data_ptr()) & 15 == 0 and x.numel() // n and R._current_device() == dev \
                and R._raw_stream(dev)

    rows = {
        "fast-path checks": fast_checks,
        "cuLaunchKernel, objects": lambda: classic(fnp, grid1, one, one, block, one, one, shm, st, None, h._extra),
        "ctypes call, argtypes": lambda: ex_typed(cfg_addr, fn_addr, None, h._extra),
        "ctypes call, objects": lambda: h._call(*h._call_args),
        "torch.empty_like": lambda: torch.empty_like(x),
        "x.new_empty": lambda: x.new_empty(x.shape),
        "torch.empty": lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device),
        "check_eps": lambda: R.check_eps(1e-6),
        "check_input": lambda: R.check_input(x, "x"),
        "check_weight": lambda: R.check_weight(w, x, 4096),
        "rows_of": lambda: R.rows_of(x),
        "vector_width": lambda: L.vector_width(4096, 2, ((x.data_ptr(), 2), (y.data_ptr(), 2), (w.data_ptr(), 2)), (4096,)),
        "handle lookup": lambda: L.handle("rmsnorm_fwd", 0, 4096, "bf16", "bf16", 1e-6, True, False, 8),
        "stream": lambda: L.stream(0),
        "current device": lambda: R._current_device(),
        "launch only": lambda: h.launch(1, s, *args),
        "normir.rmsnorm_fwd": lambda: normir.rmsnorm_fwd(x, w, 1e-6),
        "F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6),
    }
    for name, fn in rows.items():
        print(f"{name:20} {host_us(fn, 5000):6.2f} us")


if __name__ == "__main__":
    main()
