"""Where a small call's host microseconds go (issue 17): each step of normir's eager forward
timed alone, beside the whole call and torch eager's, on one GPU.

Every row is the wall clock of CALLS back-to-back calls followed by one synchronize, per call
(the median of ROUNDS rounds), at N = 4096, bf16, for M in MS. The steps are the ones the fast
path of a repeated call takes (driver/ops/_fused.py): reading the tensors' properties and the
cache key, allocating y, the stream lookup, packing the arguments and the driver's launch.
The dispatcher rows split a compiled graph's call of torch.ops.normir.* into its layers: the
Python autograd kernel (skipped below autograd) and the op's implementation; the compiled rows
time a torch.compile'd function (dynamic shapes: one graph for every M) calling normir or torch.
Usage: python3 scripts/host_profile.py [--out DIR] [--steps REGEX]  (writes DIR/host_profile.json)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench import host_us  # the benchmark's small-call timer (scripts/ is on sys.path when run)
from torch.autograd.function import _SingleLevelFunction

N = 4096
MS = (1, 16, 128)
CALLS = 2000
ROUNDS = 5
EPS = 1e-6


_COMPILED: dict[str, Callable] = {}  # compiled once for every M (dynamic shapes)


def _compiled(name: str, fn: Callable) -> Callable:
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=True, fullgraph=True)
    return _COMPILED[name]


def steps(m: int) -> dict[str, Callable[[], object]]:
    """name -> a call timing one step (or the whole call) on an m x N problem."""
    import normir
    from normir.ops import _fused as F
    from normir.ops import _rows as R
    from normir.ops import rmsnorm as RMS

    x = torch.randn(m, N, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    xg, wg = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
    normir.rmsnorm_fwd(x, w, EPS)  # loads the kernel and fills the fast path's cache
    key = F._fwd_key(RMS.FWD, x, None, w, None, EPS, None, None, 0.0, False, False)
    plan = F._FWD_SEEN[key][0]
    h = plan.handle
    dev = x.get_device()
    y = torch.empty_like(x)
    values = dict(x=x.data_ptr(), w=w.data_ptr(), y=y.data_ptr(), rstd=0, rows=m, x_stride=N, y_stride=N)
    args = plan.pick(values)
    grid = plan.grid(m)
    stream = R.raw_stream(dev)
    h.launch(grid, stream, *args)  # the config's grid and stream, for the raw driver calls below
    vp = ctypes.c_void_p
    ex_typed = ctypes.PyDLL(h.driver.lib._name).cuLaunchKernelEx
    ex_typed.argtypes, ex_typed.restype = [vp, vp, vp, vp], ctypes.c_int
    call_addrs = (h._call_args[0].value, h._call_args[1].value, None, h._extra)
    rstd = normir.rmsnorm_fwd(x, w, EPS, store_rstd=True)[1]
    res = torch.randn_like(x)

    def props():  # what the fast path reads before its launch
        return (type(EPS) is float, x.dim(), x.get_device(), x.shape[-1], x.dtype, w.dtype, w.shape,
                w.get_device(), x.is_contiguous(), w.is_contiguous(), x.data_ptr(), w.data_ptr(), x.numel())

    def fwdbwd_normir():
        return torch.autograd.grad(normir.rmsnorm(xg, wg, EPS), [xg, wg], dy)

    def fwdbwd_torch():
        return torch.autograd.grad(torch.nn.functional.rms_norm(xg, (N,), wg, EPS), [xg, wg], dy)

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return a.view_as(a)

        @staticmethod
        def backward(ctx, g):
            return g, None

    y_id = Identity.apply(xg, wg)
    y_n = normir.rmsnorm(xg, wg, EPS)
    y_t = torch.nn.functional.rms_norm(xg, (N,), wg, EPS)
    c_apply_identity = super(_SingleLevelFunction, Identity).apply
    c_apply_rms = super(_SingleLevelFunction, RMS.RMSNormFunction).apply
    op = torch.ops.normir.rmsnorm_fwd.default
    below = torch._C._AutoDispatchBelowAutograd

    def op_below_autograd():
        with below():
            return op(x, w, EPS, False)

    def op_no_grad():  # as a compiled graph's forward calls it: grad off, the weight a leaf
        with torch.no_grad():
            return op(xg, wg, EPS, False)

    c_fwd_normir = _compiled("fwd normir", lambda a, b: normir.rmsnorm_fwd(a, b, EPS)[0])
    c_fwd_torch = _compiled("fwd torch", lambda a, b: torch.nn.functional.rms_norm(a, (N,), b, EPS))
    c_train_normir = _compiled("fwd+bwd normir", lambda a, b: normir.rmsnorm(a, b, EPS))
    c_train_torch = _compiled("fwd+bwd torch", lambda a, b: torch.nn.functional.rms_norm(a, (N,), b, EPS))
    return {
        "python call (empty function)": lambda: None,
        "tensor properties and key": props,
        "dict lookup of the key": lambda: F._FWD_SEEN.get(key),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "stream lookup": lambda: (R.current_device(), R.raw_stream(dev)),
        "arguments by name (the plan's pick)": lambda: plan.pick(values),
        "argument packing": lambda: h._pack(h._mem, 0, *args, *((grid,) * (1 + h._with_grid))),
        "driver launch (packed)": lambda: h._call(*h._call_args),
        "driver launch, argtypes, GIL held": lambda: ex_typed(*call_addrs),
        "cuLaunchKernel (extra), not Ex": lambda: h.driver._launch(h._fn, grid, 1, 1, h.block, 1, 1, h.shared_bytes,
                                                                   stream, None, h._extra),
        "handle.launch (pack + launch)": lambda: h.launch(grid, stream, *args),
        "normir._fwd (fast path, whole)": lambda: RMS._fwd(x, w, EPS, False),
        "normir.rmsnorm_fwd": lambda: normir.rmsnorm_fwd(x, w, EPS),
        "normir.rmsnorm_fwd, store_rstd": lambda: normir.rmsnorm_fwd(x, w, EPS, store_rstd=True),
        "check_eps + check_input + check_weight": lambda: (R.check_eps(EPS), R.check_input(x, "x"),
                                                           R.check_weight(w, x, N)),
        "rows_of + vector_width + plan": lambda: (R.rows_of(x), R.vector_width(N, (x, y, w), (N,)),
                                                  R.plan(dev, kernel="rmsnorm_fwd", n=N, dtype="bf16", wdtype="bf16",
                                                         eps=EPS, has_weight=True, store_rstd=False, vec=8)),
        "normir._fwd, general path": lambda: (F._FWD_SEEN.clear(), RMS._fwd(x, w, EPS, False)),
        "torch.ops.normir.rmsnorm_fwd": lambda: torch.ops.normir.rmsnorm_fwd(x, w, EPS, False),
        "dispatcher: .default overload": lambda: op(x, w, EPS, False),
        "dispatcher: below autograd": op_below_autograd,
        "dispatcher: no_grad, weight requires grad": op_no_grad,
        "compiled: normir.rmsnorm_fwd": lambda: c_fwd_normir(x, w),
        "compiled: torch rms_norm": lambda: c_fwd_torch(x, w),
        "compiled fwd+bwd: normir.rmsnorm": lambda: torch.autograd.grad(c_train_normir(xg, wg), [xg, wg], dy),
        "compiled fwd+bwd: torch rms_norm": lambda: torch.autograd.grad(c_train_torch(xg, wg), [xg, wg], dy),
        "normir.rmsnorm_bwd": lambda: normir.rmsnorm_bwd(x, w, dy, rstd),
        "normir.fused_add_rmsnorm_fwd": lambda: normir.fused_add_rmsnorm_fwd(x, res, w, EPS),
        "normir.layernorm_fwd": lambda: normir.layernorm_fwd(x, w, w, 1e-5),
        "normir.rmsnorm, no grad": lambda: normir.rmsnorm(x, w, EPS),
        "autograd.Function.apply (identity)": lambda: Identity.apply(xg, wg),
        "C apply (identity)": lambda: c_apply_identity(xg, wg),
        "RMSNormFunction.apply": lambda: RMS.RMSNormFunction.apply(xg, wg, EPS),
        "C apply (RMSNormFunction)": lambda: c_apply_rms(xg, wg, EPS),
        "normir._fwd, store_rstd (fast path)": lambda: RMS._fwd(x, w, EPS, True),
        "torch.empty(rows, device=x.device)": lambda: torch.empty((m,), dtype=torch.float32, device=x.device),
        "torch.empty(rows, device=index)": lambda: torch.empty((m,), dtype=torch.float32, device=dev),
        "x.new_empty(rows, dtype=f32)": lambda: x.new_empty((m,), dtype=torch.float32),
        "normir.rmsnorm, weight requires grad": lambda: normir.rmsnorm(xg, wg, EPS),
        "torch rms_norm, no grad": lambda: torch.nn.functional.rms_norm(x, (N,), w, EPS),
        "torch rms_norm, weight requires grad": lambda: torch.nn.functional.rms_norm(xg, (N,), wg, EPS),
        "autograd.grad, identity Function": lambda: torch.autograd.grad(Identity.apply(xg, wg), [xg], dy),
        "autograd.grad, torch x * 2": lambda: torch.autograd.grad(xg * 2, [xg], dy),
        "autograd.grad retained, identity Function": lambda: torch.autograd.grad(y_id, [xg], dy, retain_graph=True),
        "autograd.grad retained, normir": lambda: torch.autograd.grad(y_n, [xg, wg], dy, retain_graph=True),
        "autograd.grad retained, torch": lambda: torch.autograd.grad(y_t, [xg, wg], dy, retain_graph=True),
        "normir fwd+bwd (autograd)": fwdbwd_normir,
        "torch fwd+bwd (autograd)": fwdbwd_torch,
    }


def inside_the_engine() -> None:
    """Where normir's backward spends its time when autograd's device thread runs it: the
    RMSNormFunction.backward body, and the kernel launches in it, timed from inside."""
    import normir
    from normir.ops import rmsnorm as RMS

    x = torch.randn(1, N, device="cuda", dtype=torch.bfloat16).requires_grad_(True)
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16).requires_grad_(True)
    dy = torch.randn_like(x)
    spans: dict[str, list[float]] = {"RMSNormFunction.backward": [], "_bwd": []}
    orig_backward, orig_bwd = RMS.RMSNormFunction.backward, RMS._bwd

    def timed(name, fn):
        def run(*a):
            t0 = time.perf_counter()
            out = fn(*a)
            spans[name].append(time.perf_counter() - t0)
            return out
        return run

    RMS.RMSNormFunction.backward = staticmethod(timed("RMSNormFunction.backward", orig_backward))
    RMS._bwd = timed("_bwd", orig_bwd)
    try:
        y = normir.rmsnorm(x, w, EPS)
        for _ in range(CALLS):
            torch.autograd.grad(y, [x, w], dy, retain_graph=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            torch.autograd.grad(y, [x, w], dy, retain_graph=True)
        torch.cuda.synchronize()
        total = (time.perf_counter() - t0) / CALLS * 1e6
    finally:
        RMS.RMSNormFunction.backward, RMS._bwd = orig_backward, orig_bwd
    print(f"autograd.grad of normir.rmsnorm, retained graph, M=1: {total:.2f} us per call; inside it: "
          + ", ".join(f"{k} {statistics.median(v) * 1e6:.2f} us" for k, v in spans.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="folder for host_profile.json (default: .)")
    ap.add_argument("--steps", default="", help="time only the steps whose name matches this regex")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_profile.py needs a CUDA GPU", file=sys.stderr)
        return 1
    rows = []
    for m in MS:
        fns = {k: f for k, f in steps(m).items() if re.search(args.steps, k)}
        rounds = {name: [] for name in fns}
        for r in range(ROUNDS):
            names = list(fns)
            for name in names[r % len(names):] + names[:r % len(names)]:
                rounds[name].append(host_us(fns[name], CALLS))
        for name, ts in rounds.items():
            rows.append({"M": m, "N": N, "step": name, "us": statistics.median(ts), "us_rounds": ts})
    if not args.steps:
        inside_the_engine()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_profile.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                                       "torch": torch.__version__, "calls": CALLS,
                                                       "rounds": ROUNDS, "rows": rows}, indent=1))
    names = list(dict.fromkeys(r["step"] for r in rows))
    print(f"host us per call (N={N}, bf16; median of {ROUNDS} rounds of {CALLS} calls)")
    print(f"{'step':40s}" + "".join(f"{'M=' + str(m):>9s}" for m in MS))
    for name in names:
        print(f"{name:40s}" + "".join(f"{r['us']:9.2f}" for m in MS for r in rows
                                       if r["M"] == m and r["step"] == name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
