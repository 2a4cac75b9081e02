"""Where the host time of small calls goes (N=4096, M=1, bf16), piece by piece.

    python scripts/host_profile.py     # on the GPU machine; microseconds per call
"""

import ctypes

import torch
from bench import host_us  # the benchmark's small-M timer (scripts/ is on sys.path when run)

import normir
from normir import launch as L
from normir.ops import _rows as R
from normir.ops import rmsnorm as ops


def main() -> None:
    x = torch.randn((1, 4096), device="cuda").bfloat16()
    w = torch.randn(4096, device="cuda").bfloat16()
    dy = torch.randn((1, 4096), device="cuda").bfloat16()
    y, rstd = normir.rmsnorm_fwd(x, w, store_rstd=True)
    p = R.plan("rmsnorm_fwd", 0, 4096, "bf16", "bf16", 1e-6, True, False, 8)
    h = p.handle
    s = L.stream(0)
    args = dict(x=x.data_ptr(), w=w.data_ptr(), y=y.data_ptr(), rstd=0, rows=1, x_stride=4096, y_stride=4096)
    h.launch_named(1, s, **args)  # fills the buffer: grid 1 on this stream
    vp = ctypes.c_void_p
    ex_typed = ctypes.PyDLL(h.driver.lib._name).cuLaunchKernelEx
    ex_typed.argtypes, ex_typed.restype = [vp, vp, vp, vp], ctypes.c_int
    cfg_addr, fn_addr = h._call_args[0].value, h._call_args[1].value
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    xt, wt = x.clone().requires_grad_(True), w.clone().requires_grad_(True)

    rows = {
        "ctypes call, argtypes": lambda: ex_typed(cfg_addr, fn_addr, None, h._extra),
        "ctypes call, objects": lambda: h._call(*h._call_args),
        "launch only": lambda: h.launch(1, s, *args.values()),
        "launch by name": lambda: h.launch_named(1, s, **args),
        "torch.empty_like": lambda: torch.empty_like(x),
        "torch.empty((0,))": lambda: torch.empty((0,), dtype=torch.float32, device=x.device),
        "x.device": lambda: x.device,
        "is_compiling": torch.compiler.is_compiling,
        "eager(x)": lambda: R.eager(x),
        "check_eps": lambda: R.check_eps(1e-6),
        "check_input": lambda: R.check_input(x, "x"),
        "check_weight": lambda: R.check_weight(w, x, 4096),
        "rows_of": lambda: R.rows_of(x),
        "vector_width": lambda: R.vector_width(4096, (x, y, w), (4096,)),
        "plan": lambda: R.plan("rmsnorm_fwd", 0, 4096, "bf16", "bf16", 1e-6, True, False, 8),
        "stream": lambda: L.stream(0),
        "current device": R.current_device,
        "fwd general path": lambda: (ops._FWD_SEEN.clear(), ops._fwd(x, w, 1e-6, False)),
        "normir.rmsnorm_fwd": lambda: normir.rmsnorm_fwd(x, w, 1e-6),
        "normir.rmsnorm_fwd rstd": lambda: normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=True),
        "torch.ops.normir.rmsnorm_fwd": lambda: torch.ops.normir.rmsnorm_fwd(x, w, 1e-6, False),
        "F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6),
        "normir.rmsnorm_bwd": lambda: normir.rmsnorm_bwd(x, w, dy, rstd),
        "normir fwd+bwd autograd": lambda: torch.autograd.grad(normir.rmsnorm(xg, wg, 1e-6), [xg, wg], dy),
        "torch fwd+bwd autograd": lambda: torch.autograd.grad(
            torch.nn.functional.rms_norm(xt, (4096,), wt, 1e-6), [xt, wt], dy),
    }
    for name, fn in rows.items():
        print(f"{name:30} {host_us(fn, 5000):7.2f} us")


if __name__ == "__main__":
    main()
