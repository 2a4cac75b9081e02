"""Side-by-side RMSNorm and LayerNorm bandwidth benchmark: normir against the kernels users would
pick instead.

Everything runs in one process, on one GPU, on the same inputs:

- a device-to-device copy (``dst.copy_(src)``, 2^28 elements) gives the ceiling; its GB/s counts
  the bytes read plus the bytes written;
- forward, backward and (optionally) forward+backward of RMSNorm over the last dim, with bf16 x and
  weight (``--dtype``), eps 1e-6, shapes M x N with M*N = 2^27 (M = 2^27 // N);
- the fused residual add (``add_fwd``, ``add_bwd``): h = x + residual, y = rmsnorm(h) * w, returning
  (y, h); the backward from dy and d_residual_out gives dx (= dresidual) and dw;
- LayerNorm with a weight and a bias (``ln_fwd``, ``ln_bwd``), bf16 x, weight and bias, eps 1e-5,
  and its fused residual add (``add_ln_fwd``, ``add_ln_bwd``): h = x + residual, y = layernorm(h) *
  w + b, returning (y, h); the backward from dy and d_residual_out gives dx (= dresidual), dw, db;
- small-M rows (N=4096, M in 1, 16, 128; with ``fwd`` in --ops): host-visible microseconds per
  call, a wall clock over many back-to-back calls followed by one synchronize (host overhead +
  launch), for each op of SMALL_OPS: the forward (normir's ``rmsnorm_fwd``), the autograd path's
  forward (a weight that requires grad), forward + backward through autograd, and the other
  forwards; normir over torch eager per row. The forwards (GRAPH_OPS) are also timed inside a
  CUDA graph of GRAPH_CALLS captured calls: the device's microseconds per call, no host time.

Providers (``PROVIDERS`` below; a peer whose import fails is skipped with the reason printed):
normir (``rmsnorm_fwd``; backward as one ``rmsnorm_bwd`` call, dx + dw), normir-atomic (the same
backward with ``atomic_dw=True``; n/a where the row takes the streaming mode), torch eager
(``F.rms_norm``), torch.compile of an fp32 rmsnorm cast back (dynamic=False), Liger (the Triton
``LigerRMSNormFunction`` that ``LigerRMSNorm`` calls, in_place=False so dy is never overwritten)
and quack (``quack.rmsnorm.rmsnorm``). Peers' backward is ``torch.autograd.grad(y, [x, w], dy,
retain_graph=True)`` on a retained graph, so it includes their dw reduction and autograd's overhead.

Bandwidth = bytes that must move / median time of ``triton.testing.do_bench`` (warmup 25 ms,
rep 100 ms), with e = element size of x. Every shape is timed in ``--rounds`` rounds (default 3),
each over all providers in a rotated order (round r starts with provider r), and a provider's time
is the median of its rounds, so that no provider always runs first or right after another; the
copy ceiling is the median of as many rounds. bench.json keeps every round's time.
  fwd:    x read + y written            = 2 * M * N * e
  bwd:    x, dy read + dx written       = 3 * M * N * e
  fwdbwd: the sum of the two            = 5 * M * N * e
  add_fwd: x, residual read + y, residual_out written             = 4 * M * N * e
  add_bwd: dy, d_residual_out, residual_out read + dx written    = 4 * M * N * e
(weight, rstd and dw are O(M + N) and not counted; dresidual is dx itself.) For the fused add, normir
is ``fused_add_rmsnorm_fwd`` / ``fused_add_rmsnorm_bwd``, torch eager is ``x + residual`` then
``F.rms_norm``, torch.compile compiles that, Liger is ``LigerFusedAddRMSNormFunction`` (in_place=False)
and quack ``rmsnorm(x, w, residual=residual, prenorm=True)``.
  ln_fwd:     x read + y written                                  = 2 * M * N * e
  ln_bwd:     x, dy read + dx written                             = 3 * M * N * e
  add_ln_fwd: x, residual read + y, residual_out written          = 4 * M * N * e
  add_ln_bwd: dy, d_residual_out, residual_out read + dx written  = 4 * M * N * e
(mean, rstd, weight, bias, dw and db not counted.) For LayerNorm, normir is ``layernorm_fwd`` /
``layernorm_bwd`` (one call: dx, dw, db; normir-atomic with ``atomic=True``) and for the fused add
``fused_add_layernorm_fwd`` / ``fused_add_layernorm_bwd``; torch eager is ``F.layer_norm`` (after
``x + residual`` for the fused add), torch.compile compiles the same; Liger is
``LigerLayerNormFunction.apply(x, w, b, eps)`` (backward through autograd: dx, dw, db) and quack
``quack.rmsnorm.layernorm_fwd(x, w, b, eps)`` / ``layernorm_bwd(x, w, dy, rstd, mean, has_bias=True)``
(its backward has no autograd, so it is called directly on the rstd and mean of a forward done
outside; quack takes only a 2-D x and an fp32 weight and bias, converted once outside the timed
call). Neither peer has a fused-add LayerNorm: those rows are normir, torch eager and torch.compile.

Output: a progress line per shape, then the summary tables (last, so a tail of the log shows them);
``bench.json`` (GPU, versions, date, copy GB/s, every time and error) and ``bench.png`` (GB/s vs N,
one subplot per op) in ``--out``. bench.json is rewritten after every shape, so a run cut short
keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import site
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

EPS = 1e-6
LN_EPS = 1e-5  # LayerNorm's (torch.nn.LayerNorm's default)
TOTAL = 1 << 27  # elements per shape (M * N)
FULL_NS = (1024, 2048, 2880, 4096, 7168, 8192, 16384, 32768, 65536)
QUICK_NS = (1024, 4096, 65536)
COPY_ELEMS = 1 << 28
SMALL_N = 4096
SMALL_MS = (1, 16, 128)
SMALL_CALLS = 2000
# Host-visible time of small calls, per op: fwd (normir: rmsnorm_fwd, the *_fwd function; peers:
# their forward), fwd_grad (the autograd path: a forward recording a graph for a weight that
# requires grad), fwdbwd (forward and backward through autograd), and each other forward.
SMALL_OPS = ("fwd", "fwd_grad", "fwdbwd", "add_fwd", "ln_fwd", "add_ln_fwd", "ip_add_fwd", "q8_fwd", "qi8_fwd",
             "add_q8_fwd", "ln_q8_fwd")
# The forwards are also timed inside a CUDA graph of GRAPH_CALLS back-to-back calls: the device's
# time per call with no host time in it (what a captured model pays per norm).
GRAPH_OPS = ("fwd", "add_fwd", "ln_fwd", "add_ln_fwd", "ip_add_fwd", "q8_fwd", "qi8_fwd", "add_q8_fwd", "ln_q8_fwd")
GRAPH_CALLS = 100
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OPS = ("fwd", "bwd", "fwdbwd", "add_fwd", "add_bwd", "ln_fwd", "ln_bwd", "add_ln_fwd", "add_ln_bwd",
       "ip_add_fwd", "q8_fwd", "qi8_fwd", "add_q8_fwd", "ln_q8_fwd")
# M x N tensors of x's dtype each op moves (a quantized q is half a 16-bit tensor: one byte an element)
BYTES_PER_ELEM = {"fwd": 2, "bwd": 3, "fwdbwd": 5, "add_fwd": 4, "add_bwd": 4,
                  "ln_fwd": 2, "ln_bwd": 3, "add_ln_fwd": 4, "add_ln_bwd": 4,
                  # the serving forms: the fused add in place (x, residual read; both written), and
                  # y quantized per token (fp8, int8; the fused add's residual updated in place)
                  "ip_add_fwd": 4, "q8_fwd": 1.5, "qi8_fwd": 1.5, "add_q8_fwd": 3.5, "ln_q8_fwd": 1.5}
# The quantized ops' formats and fused adds: (torch dtype of q, residual added)
QUANT_OPS = {"q8_fwd": (torch.float8_e4m3fn, False), "qi8_fwd": (torch.int8, False),
             "add_q8_fwd": (torch.float8_e4m3fn, True), "ln_q8_fwd": (torch.float8_e4m3fn, False)}


@dataclass(frozen=True)
class Inputs:
    """One shape's tensors, shared by every provider: x, residual, dy and d_residual_out (M x N),
    the weight and LayerNorm's bias (N)."""

    x: torch.Tensor
    residual: torch.Tensor | None
    w: torch.Tensor
    dy: torch.Tensor | None
    dh: torch.Tensor | None
    b: torch.Tensor | None = None


def inputs(m: int, n: int, dtype: torch.dtype, *, add: bool = True, ln: bool = True,
           device: str = "cuda") -> Inputs:
    """Fresh random inputs for one shape: the residual and d_residual_out where an op adds one
    (add), the bias where an op is LayerNorm's (ln)."""
    def rows() -> torch.Tensor:
        return torch.randn(m, n, device=device, dtype=dtype)

    return Inputs(x=rows(), residual=rows() if add else None, w=torch.randn(n, device=device, dtype=dtype), dy=rows(),
                  dh=rows() if add else None, b=torch.randn(n, device=device, dtype=dtype) if ln else None)


Fn = Callable[[torch.Tensor, torch.Tensor, float], Any]  # (x, w, eps) -> y
AddFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], Any]  # (x, residual, w, eps) -> (y, h)
LnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], Any]  # (x, w, b, eps) -> y
# (x, residual, w, b, eps) -> (y, h)
AddLnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], Any]
Setup = Callable[[Inputs], Callable[[], Any]]  # prepares what the timed call needs, returns that call


@dataclass(frozen=True)
class Provider:
    """One implementation: per op it offers, a setup that prepares whatever the timed call needs
    (a retained graph, rstd) and returns that call."""

    name: str
    ops: dict[str, Setup]

    @property
    def is_peer(self) -> bool:
        return not self.name.startswith("normir")


def provider(name: str, fn: Fn | None = None, add: AddFn | None = None, ln: LnFn | None = None,
             add_ln: AddLnFn | None = None, **ops: Setup) -> Provider:
    """A provider from a differentiable rmsnorm fn and fused-add fn, and a differentiable layernorm
    fn and fused-add layernorm fn (forward, backward through autograd, forward+backward), with the
    setups in ops taking their place where given."""
    made: dict[str, Setup] = {}
    if fn is not None:
        made.update(fwd=forward(fn), fwd_grad=autograd_forward(fn), bwd=autograd_bwd(fn),
                    fwdbwd=autograd_fwdbwd(fn))
    if add is not None:
        made.update(add_fwd=add_forward(add), add_bwd=add_autograd_bwd(add))
    if ln is not None:
        made.update(ln_fwd=ln_forward(ln), ln_bwd=ln_autograd_bwd(ln))
    if add_ln is not None:
        made.update(add_ln_fwd=add_ln_forward(add_ln), add_ln_bwd=add_ln_autograd_bwd(add_ln))
    return Provider(name, {**made, **ops})


# ---------------------------------------------------------------------------- setups


def _leaves(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.detach().requires_grad_(True), w.detach().requires_grad_(True)


def forward(fn: Fn) -> Setup:
    return lambda t: lambda: fn(t.x, t.w, EPS)


def autograd_bwd(fn: Fn) -> Setup:
    """Backward of a differentiable fn: autograd.grad on a graph built once and retained."""

    def setup(t: Inputs):
        xr, wr = _leaves(t.x, t.w)
        y = fn(xr, wr, EPS)
        return lambda: torch.autograd.grad(y, [xr, wr], t.dy, retain_graph=True)

    return setup


def autograd_forward(fn: Fn) -> Setup:
    """A differentiable fn's forward on leaves that require grad: the autograd path, graph recorded."""

    def setup(t: Inputs):
        xr, wr = _leaves(t.x, t.w)
        return lambda: fn(xr, wr, EPS)

    return setup


def autograd_fwdbwd(fn: Fn) -> Setup:
    """Forward then backward of a differentiable fn, both inside the timed call."""

    def setup(t: Inputs):
        xr, wr = _leaves(t.x, t.w)
        return lambda: torch.autograd.grad(fn(xr, wr, EPS), [xr, wr], t.dy)

    return setup


def add_forward(fn: AddFn) -> Setup:
    return lambda t: lambda: fn(t.x, t.residual, t.w, EPS)


def add_autograd_bwd(fn: AddFn) -> Setup:
    """Backward of a differentiable fused add, (y, h) -> (dx, dresidual, dw) given dy and
    d_residual_out, on a graph built once and retained."""

    def setup(t: Inputs):
        xr, wr = _leaves(t.x, t.w)
        rr = t.residual.detach().requires_grad_(True)
        y, h = fn(xr, rr, wr, EPS)
        return lambda: torch.autograd.grad([y, h], [xr, rr, wr], [t.dy, t.dh], retain_graph=True)

    return setup


def ln_forward(fn: LnFn) -> Setup:
    return lambda t: lambda: fn(t.x, t.w, t.b, LN_EPS)


def ln_autograd_bwd(fn: LnFn) -> Setup:
    """Backward of a differentiable layernorm, y -> (dx, dw, db) given dy, on a graph built once
    and retained."""

    def setup(t: Inputs):
        xr, wr = _leaves(t.x, t.w)
        br = t.b.detach().requires_grad_(True)
        y = fn(xr, wr, br, LN_EPS)
        return lambda: torch.autograd.grad(y, [xr, wr, br], t.dy, retain_graph=True)

    return setup


def add_ln_forward(fn: AddLnFn) -> Setup:
    return lambda t: lambda: fn(t.x, t.residual, t.w, t.b, LN_EPS)


def add_ln_autograd_bwd(fn: AddLnFn) -> Setup:
    """Backward of a differentiable fused-add layernorm, (y, h) -> (dx, dresidual, dw, db) given
    dy and d_residual_out, on a graph built once and retained."""

    def setup(t: Inputs):
        xr, wr = _leaves(t.x, t.w)
        rr, br = t.residual.detach().requires_grad_(True), t.b.detach().requires_grad_(True)
        y, h = fn(xr, rr, wr, br, LN_EPS)
        return lambda: torch.autograd.grad([y, h], [xr, rr, wr, br], [t.dy, t.dh], retain_graph=True)

    return setup


def normir_bwd(atomic_dw: bool) -> Setup:
    """normir backward as one rmsnorm_bwd call (dx and dw), rstd from a forward done outside."""

    def setup(t: Inputs):
        import normir

        _, rstd = normir.rmsnorm_fwd(t.x, t.w, EPS, store_rstd=True)
        return lambda: normir.rmsnorm_bwd(t.x, t.w, t.dy, rstd, atomic_dw=atomic_dw)

    return setup


def normir_add_fwd(t: Inputs) -> Callable[[], Any]:
    import normir

    return lambda: normir.fused_add_rmsnorm_fwd(t.x, t.residual, t.w, EPS)


def normir_add_bwd(atomic: bool) -> Setup:
    """normir's fused-add backward as one fused_add_rmsnorm_bwd call (dh and dw), from a forward
    done outside."""

    def setup(t: Inputs):
        import normir

        _, h, rstd = normir.fused_add_rmsnorm_fwd(t.x, t.residual, t.w, EPS, store_rstd=True)
        return lambda: normir.fused_add_rmsnorm_bwd(t.dy, h, t.w, rstd, t.dh, atomic=atomic)

    return setup


def normir_ln_fwd(t: Inputs) -> Callable[[], Any]:
    import normir

    return lambda: normir.layernorm_fwd(t.x, t.w, t.b, LN_EPS)


def normir_ln_bwd(atomic: bool) -> Setup:
    """normir's LayerNorm backward as one layernorm_bwd call (dx, dw and db), mean and rstd from a
    forward done outside."""

    def setup(t: Inputs):
        import normir

        _, mean, rstd = normir.layernorm_fwd(t.x, t.w, t.b, LN_EPS, store_stats=True)
        return lambda: normir.layernorm_bwd(t.x, t.w, t.dy, mean, rstd, has_bias=True, atomic=atomic)

    return setup


def normir_add_ln_fwd(t: Inputs) -> Callable[[], Any]:
    import normir

    return lambda: normir.fused_add_layernorm_fwd(t.x, t.residual, t.w, t.b, LN_EPS)


def normir_add_ln_bwd(atomic: bool) -> Setup:
    """normir's fused-add LayerNorm backward as one fused_add_layernorm_bwd call (dh, dw and db),
    from a forward done outside."""

    def setup(t: Inputs):
        import normir

        _, h, mean, rstd = normir.fused_add_layernorm_fwd(t.x, t.residual, t.w, t.b, LN_EPS, store_stats=True)
        return lambda: normir.fused_add_layernorm_bwd(t.dy, h, t.w, mean, rstd, t.dh, has_bias=True, atomic=atomic)

    return setup


def normir_serving(enable_pdl: bool | None = None) -> dict[str, Setup]:
    """The serving forms (normir.serving): the fused add in place, and the per-token quantized
    forwards (LayerNorm's through normir.layernorm_quant), into preallocated outputs. The in-place
    calls work on copies made in the setup: each timed call rewrites them with the same math.
    enable_pdl: programmatic dependent launch (None: NORMIR_PDL's, on; the normir-nopdl row off)."""
    import normir

    S = normir.serving

    def ip_add(t: Inputs):
        x, r = t.x.clone(), t.residual.clone()
        return lambda: S.fused_add_rms_norm(x, r, t.w, EPS, enable_pdl=enable_pdl)

    def quantized(op: str) -> Setup:
        qdtype, add = QUANT_OPS[op]

        def setup(t: Inputs):
            q = torch.empty(t.x.shape, dtype=qdtype, device=t.x.device)
            scales = torch.empty((*t.x.shape[:-1], 1), device=t.x.device)
            if op == "ln_q8_fwd":
                return lambda: normir.layernorm_quant(t.x, t.w, t.b, LN_EPS, enable_pdl=enable_pdl)
            r = t.residual.clone() if add else None
            return lambda: S.rms_norm_dynamic_per_token_quant(q, t.x, t.w, scales, EPS, None, r, enable_pdl=enable_pdl)

        return setup

    return {"ip_add_fwd": ip_add, **{op: quantized(op) for op in QUANT_OPS}}


def per_token_quant(y: torch.Tensor, qdtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The peers' quantization after the norm (torch): per-row amax scales, as normir's dynamic rule."""
    fp8 = qdtype == torch.float8_e4m3fn
    qmax, floor = (448.0, 1.0 / (448.0 * 512.0)) if fp8 else (127.0, torch.finfo(torch.float32).eps)
    yf = y.float()
    s = torch.clamp_min(yf.abs().amax(-1, keepdim=True) / qmax, floor)
    q = (yf / s).clamp(-qmax, qmax).to(qdtype) if fp8 else torch.round(yf * (1.0 / s)).clamp(-128, 127).to(qdtype)
    return q, s


def quant_composites(norm: Fn, ln: LnFn, wrap: Callable[[Callable], Callable] = lambda f: f) -> dict[str, Setup]:
    """A peer's quantized rows: its norm then per_token_quant (and the add first where fused),
    each composite wrapped (torch.compile for the compiled peer), and its in-place fused add."""
    def composite(op: str) -> Setup:
        qdtype, add = QUANT_OPS[op]
        if op == "ln_q8_fwd":
            fn = wrap(lambda x, w, b: per_token_quant(ln(x, w, b, LN_EPS), qdtype))
            return lambda t: (lambda: fn(t.x, t.w, t.b))
        if add:
            def fused(x, r, w):
                h = x + r
                r.copy_(h)
                return per_token_quant(norm(h, w, EPS), qdtype)

            fn = wrap(fused)

            def fused_setup(t: Inputs):
                r = t.residual.clone()
                return lambda: fn(t.x, r, t.w)

            return fused_setup
        fn = wrap(lambda x, w: per_token_quant(norm(x, w, EPS), qdtype))
        return lambda t: (lambda: fn(t.x, t.w))

    def in_place(x, r, w):
        r.add_(x)
        x.copy_(norm(r, w, EPS))

    ip = wrap(in_place)

    def ip_setup(t: Inputs):
        x, r = t.x.clone(), t.residual.clone()
        return lambda: ip(x, r, t.w)

    return {"ip_add_fwd": ip_setup, **{op: composite(op) for op in QUANT_OPS}}


# ---------------------------------------------------------------------------- providers


def _rmsnorm_fp32(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (y * w.float()).to(x.dtype)


def load_normir() -> list[Provider]:
    import normir

    return [
        Provider("normir", {"fwd": forward(lambda x, w, eps: normir.rmsnorm_fwd(x, w, eps)[0]),
                            "fwd_grad": autograd_forward(normir.rmsnorm),
                            "bwd": normir_bwd(False), "fwdbwd": autograd_fwdbwd(normir.rmsnorm),
                            "add_fwd": normir_add_fwd, "add_bwd": normir_add_bwd(False),
                            "ln_fwd": normir_ln_fwd, "ln_bwd": normir_ln_bwd(False),
                            "add_ln_fwd": normir_add_ln_fwd, "add_ln_bwd": normir_add_ln_bwd(False),
                            **normir_serving()}),
        Provider("normir-atomic", {"bwd": normir_bwd(True), "add_bwd": normir_add_bwd(True),
                                   "ln_bwd": normir_ln_bwd(True), "add_ln_bwd": normir_add_ln_bwd(True)}),
        Provider("normir-nopdl", normir_serving(enable_pdl=False)),  # what programmatic launch buys
    ]


def _add_then_norm(norm: Fn) -> AddFn:
    def add(x, residual, w, eps):
        h = x + residual
        return norm(h, w, eps), h

    return add


def _add_then_ln(norm: LnFn) -> AddLnFn:
    def add(x, residual, w, b, eps):
        h = x + residual
        return norm(h, w, b, eps), h

    return add


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def load_torch() -> list[Provider]:
    def eager(x, w, eps):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)

    return [provider("torch", eager, _add_then_norm(eager), _layer_norm, _add_then_ln(_layer_norm),
                     **quant_composites(eager, _layer_norm))]


def load_compile() -> list[Provider]:
    import torch._dynamo.config as dcfg

    # A sweep over many shapes recompiles; past the default limit (8) dynamo silently runs eager.
    for key in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dcfg, key):
            setattr(dcfg, key, 1000)
    compiled = torch.compile(_rmsnorm_fp32, dynamic=False)
    compiled_add = torch.compile(_add_then_norm(_rmsnorm_fp32), dynamic=False)
    # LayerNorm: F.layer_norm as is (inductor's decomposition computes a 16-bit x's statistics in fp32).
    compiled_ln = torch.compile(_layer_norm, dynamic=False)
    compiled_add_ln = torch.compile(_add_then_ln(_layer_norm), dynamic=False)
    quant = quant_composites(_rmsnorm_fp32, _layer_norm, lambda f: torch.compile(f, dynamic=False))
    return [provider("compile", compiled, compiled_add, compiled_ln, compiled_add_ln, **quant)]


def load_liger() -> list[Provider]:
    fn_cls = importlib.import_module("liger_kernel.ops.rms_norm").LigerRMSNormFunction
    add_cls = importlib.import_module("liger_kernel.ops.fused_add_rms_norm").LigerFusedAddRMSNormFunction
    ln_cls = importlib.import_module("liger_kernel.ops.layer_norm").LigerLayerNormFunction

    def liger(x, w, eps):  # offset 0, Llama casting (fp32 rstd), in_place=False: dy stays intact
        return fn_cls.apply(x, w, eps, 0.0, "llama", False)

    def liger_add(x, residual, w, eps):  # returns (y, x + residual)
        return add_cls.apply(x, residual, w, eps, 0.0, "llama", False)

    def liger_ln(x, w, b, eps):  # forward(ctx, X, W, B, eps); saves mean and rstd; no fused-add LayerNorm
        return ln_cls.apply(x, w, b, eps)

    return [provider("liger", liger, liger_add, liger_ln)]


def load_quack() -> list[Provider]:
    # quack/__init__ rebinds quack.rmsnorm to the function; import the module by name.
    mod = importlib.import_module("quack.rmsnorm")

    def quack(x, w, eps):
        return mod.rmsnorm(x, w, eps=eps)

    def quack_add(x, residual, w, eps):
        return mod.rmsnorm(x, w, residual=residual, eps=eps, prenorm=True)

    return [provider("quack", quack, quack_add, **quack_layernorm(mod))]


def quack_layernorm(mod: Any) -> dict[str, Setup]:
    """quack's LayerNorm setups: layernorm_fwd(x, weight, bias=None, eps=1e-6, return_rstd=False,
    return_mean=False) and layernorm_bwd(x, weight, dout, rstd, mean, has_bias=True) -> (dx, dw,
    db), which have no autograd Function and take only a 2-D x and an fp32 weight and bias (made
    once, outside the timed call). None where this quack has no LayerNorm (nor a fused-add one)."""
    fwd, bwd = getattr(mod, "layernorm_fwd", None), getattr(mod, "layernorm_bwd", None)
    if fwd is None or bwd is None:
        return {}

    def fp32(t: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
        return t.w.float(), t.b.float()

    def ln_fwd(t: Inputs):
        w, b = fp32(t)
        return lambda: fwd(t.x, w, b, eps=LN_EPS)

    def ln_bwd(t: Inputs):
        w, b = fp32(t)
        _, rstd, mean = fwd(t.x, w, b, eps=LN_EPS, return_rstd=True, return_mean=True)
        return lambda: bwd(t.x, w, t.dy, rstd, mean, has_bias=True)

    return {"ln_fwd": ln_fwd, "ln_bwd": ln_bwd}


# name -> loader, in column order; a loader that raises drops its providers with the reason.
PROVIDERS: dict[str, Callable[[], list[Provider]]] = {
    "normir": load_normir,
    "torch": load_torch,
    "compile": load_compile,
    "liger": load_liger,
    "quack": load_quack,
}

DISTRIBUTIONS = ("torch", "triton", "normir", "liger-kernel", "quack-kernels", "nvidia-cutlass-dsl")


def load_providers(peers_dir: str | None) -> tuple[list[Provider], dict[str, str]]:
    """Every provider that imports, and a status line per loader ("ok" or why it was skipped)."""
    if peers_dir:
        if os.path.isdir(peers_dir):
            site.addsitedir(os.path.abspath(peers_dir))
        else:
            print(f"warning: --peers-dir {peers_dir} is not a folder; peers come from the environment only")
    providers, status = [], {}
    for name, loader in PROVIDERS.items():
        try:
            providers += loader()
            status[name] = "ok"
        except Exception as e:  # any import failure just drops the peer
            status[name] = f"skipped: {short_error(e)}"
            print(f"{name}: {status[name]}", flush=True)
    return providers, status


def versions() -> dict[str, str | None]:
    out = {}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    out["torch"] = torch.__version__
    return out


# ---------------------------------------------------------------------------- measuring


def short_error(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def bench_ms(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def gbps(nbytes: int, ms: float | None) -> float | None:
    return None if ms is None else nbytes / (ms * 1e6)


def rotated(items: list[Any], r: int) -> list[Any]:
    """items starting at index r (mod their count): round r's order."""
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def in_rounds(names: list[str], rounds: int, time_one: Callable[[str], float]
              ) -> tuple[dict[str, float | None], dict[str, list[float]], dict[str, str]]:
    """Time every name in `rounds` rounds, round r in the order rotated by r; a name that raises
    is recorded once and left out of later rounds. Returns (median per name, in the names'
    order; None for a failed one), every round's time, and the errors."""
    times: dict[str, list[float]] = {}
    errors: dict[str, str] = {}
    for r in range(rounds):
        for name in rotated(names, r):
            if name in errors:
                continue
            try:
                times.setdefault(name, []).append(time_one(name))
            except Exception as e:  # one failing provider records its error, the rest go on
                errors[name] = short_error(e)
    medians = {name: None if name in errors else statistics.median(times[name]) for name in names}
    return medians, {k: v for k, v in times.items() if k not in errors}, errors


def copy_ceiling(dtype: torch.dtype, rounds: int) -> dict[str, Any]:
    """Device-to-device copy of COPY_ELEMS elements, the median of `rounds`; bytes = read + written."""
    src = torch.randn(COPY_ELEMS, device="cuda", dtype=dtype)
    dst = torch.empty_like(src)
    times = [bench_ms(lambda: dst.copy_(src)) for _ in range(rounds)]
    ms = statistics.median(times)
    nbytes = 2 * src.numel() * src.element_size()
    return {"elements": COPY_ELEMS, "bytes": nbytes, "ms": ms, "ms_rounds": times, "gbps": gbps(nbytes, ms)}




def measure_shape(providers: list[Provider], ops: list[str], m: int, n: int,
                  dtype: torch.dtype, rounds: int) -> dict[str, dict[str, Any]]:
    """Every provider and op on one M x N shape, in `rounds` rotated rounds; fresh random inputs
    shared by all (freed before the cache is emptied)."""
    out = _measure_shape(providers, ops, m, n, dtype, rounds)
    torch.cuda.empty_cache()
    return out


def _measure_shape(providers: list[Provider], ops: list[str], m: int, n: int,
                   dtype: torch.dtype, rounds: int) -> dict[str, dict[str, Any]]:
    t = inputs(m, n, dtype, add=any(op.startswith(("add_", "ip_add")) for op in ops),
               ln=any(is_layernorm(op) for op in ops))
    out = {}
    for op in ops:
        nbytes = BYTES_PER_ELEM[op] * m * n * t.x.element_size()
        by_name = {p.name: p.ops[op] for p in providers if op in p.ops}
        print(f"{op:10s} {m}x{n}: measuring {', '.join(by_name)}", flush=True)  # locates a stall
        # A fresh setup per round (a retained graph for the backward), dropped once timed.
        ms, ms_rounds, errors = in_rounds(
            list(by_name), rounds, lambda name, by_name=by_name: bench_ms(by_name[name](t)))
        row = {"M": m, "N": n, "bytes": nbytes, "ms": ms, "ms_rounds": ms_rounds,
               "gbps": {k: gbps(nbytes, v) for k, v in ms.items()}, "errors": errors}
        out[op] = row
        cells = " | ".join(f"{k} {fmt(v, 0)}" for k, v in row["gbps"].items())
        print(f"{op:10s} {m}x{n}: {cells} GB/s", flush=True)
        for k, err in row["errors"].items():
            print(f"    {k}: {err}", flush=True)
    return out


def host_us(fn: Callable[[], Any], calls: int = SMALL_CALLS) -> float:
    """Microseconds per call seen by the host: `calls` back-to-back calls, then one synchronize."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def graph_us(fn: Callable[[], Any], calls: int = GRAPH_CALLS) -> float:
    """Microseconds per call inside a CUDA graph of `calls` back-to-back calls of fn, captured
    after a warm-up on a side stream (kernel loads, compilation) as torch.cuda.graph asks."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return bench_ms(graph.replay) * 1e3 / calls


def small_row(providers: list[Provider], op: str, m: int, dtype: torch.dtype, rounds: int) -> dict[str, Any]:
    """Host-visible us per call of `op` for every provider that has it, on one m x SMALL_N
    shape: the median of `rounds` rotated rounds; for GRAPH_OPS also the us per call inside a
    CUDA graph (graph_us)."""
    def rnd(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    t = Inputs(x=rnd(m, SMALL_N), residual=rnd(m, SMALL_N), w=rnd(SMALL_N), dy=rnd(m, SMALL_N),
               dh=rnd(m, SMALL_N), b=rnd(SMALL_N))
    fns = {p.name: p.ops[op] for p in providers if op in p.ops}
    us, us_rounds, errors = in_rounds(list(fns), rounds, lambda name: host_us(fns[name](t)))
    row = {"op": op, "M": m, "N": SMALL_N, "calls": SMALL_CALLS, "us": us, "us_rounds": us_rounds, "errors": errors}
    if op in GRAPH_OPS:
        row["graph_us"], row["graph_us_rounds"], graph_errors = in_rounds(
            list(fns), rounds, lambda name: graph_us(fns[name](t)))
        errors.update({k: f"in a CUDA graph: {e}" for k, e in graph_errors.items() if k not in errors})
    return row


def measure_small(providers: list[Provider], dtype: torch.dtype, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for op in SMALL_OPS:
        for m in SMALL_MS:
            row = small_row(providers, op, m, dtype, rounds)
            print(f"small {op:10s} {m}x{SMALL_N}: " + " | ".join(f"{k} {fmt(v, 1)}" for k, v in row["us"].items())
                  + " us", flush=True)
            for k, err in row["errors"].items():
                print(f"    {k}: {err}", flush=True)
            rows.append(row)
    torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------- reporting


def is_layernorm(op: str) -> bool:
    return op.removeprefix("add_").startswith("ln_")


SERVING_TITLES = {"ip_add_fwd": "fused add + rmsnorm fwd, in place", "q8_fwd": "rmsnorm fwd, fp8 per token",
                  "qi8_fwd": "rmsnorm fwd, int8 per token", "add_q8_fwd": "fused add + rmsnorm fwd, fp8 per token",
                  "ln_q8_fwd": "layernorm fwd, fp8 per token"}


def op_title(op: str) -> str:
    """The plot's name of an op: "fused add + rmsnorm bwd", "layernorm fwd"."""
    if op in SERVING_TITLES:
        return SERVING_TITLES[op]
    base = op.removeprefix("add_")
    norm, direction = ("layernorm", base.removeprefix("ln_")) if is_layernorm(op) else ("rmsnorm", base)
    return f"{'fused add + ' if op.startswith('add_') else ''}{norm} {direction}"


def fmt(v: float | None, digits: int) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def best_peer(gb: dict[str, float | None], peers: set[str]) -> tuple[str, float] | None:
    cands = [(v, k) for k, v in gb.items() if k in peers and v is not None]
    return None if not cands else max(cands)[::-1]


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * wd for wd in widths], *rows]
    return "\n".join("  ".join(c.rjust(wd) for c, wd in zip(r, widths)) for r in lines)


def by_round(row: dict[str, Any], peer: str) -> tuple[float, int, int] | None:
    """normir against `peer` round by round (both timed in each round): the median of normir's
    speed over the peer's, in percent, the rounds normir was faster in, and the rounds."""
    mine, theirs = row.get("ms_rounds", {}).get("normir"), row.get("ms_rounds", {}).get(peer)
    if not mine or not theirs or len(mine) != len(theirs):
        return None
    gains = [100 * (t / m - 1) for m, t in zip(mine, theirs)]
    return statistics.median(gains), sum(g > 0 for g in gains), len(gains)


def op_table(op: str, rows: list[dict[str, Any]], copy_gbps: float, peers: set[str]) -> str:
    names = list(dict.fromkeys(k for r in rows for k in r["gbps"]))
    header = ["M x N", *names, "normir %copy", "best peer", "vs best, by round"]
    body = []
    for r in rows:
        gb = r["gbps"]
        mine = gb.get("normir")
        best = best_peer(gb, peers)
        paired = None if best is None else by_round(r, best[0])
        body.append([f"{r['M']}x{r['N']}", *(fmt(gb.get(k), 0) for k in names),
                     "n/a" if mine is None else f"{100 * mine / copy_gbps:.1f}%",
                     "n/a" if best is None else f"{best[1]:.0f} {best[0]}",
                     "n/a" if paired is None else f"{paired[0]:+.2f}% ({paired[1]}/{paired[2]})"])
    return (f"{op} (GB/s; {BYTES_PER_ELEM[op]} x M*N elements moved; vs best: the median of normir's speed "
            "over the best peer's in each round, and the rounds normir was faster in)\n" + table(header, body))


def small_table(rows: list[dict[str, Any]]) -> str:
    """Per op, host-visible us per call, and normir's over torch eager's."""
    parts = []
    for op in dict.fromkeys(r.get("op", "fwd") for r in rows):
        mine = [r for r in rows if r.get("op", "fwd") == op]
        names = list(dict.fromkeys(k for r in mine for k in r["us"]))
        body = [[f"{r['M']}x{r['N']}", *(fmt(r["us"].get(k), 1) for k in names),
                 fmt(r["us"]["normir"] / r["us"]["torch"], 2) if r["us"].get("normir") and r["us"].get("torch")
                 else "n/a"]
                for r in mine]
        parts.append(f"small M, {op} (host-visible us per call over {SMALL_CALLS} calls, median of the rounds)\n"
                     + table(["M x N", *names, "normir/torch"], body))
        graphed = [r for r in mine if r.get("graph_us")]
        if graphed:
            body = [[f"{r['M']}x{r['N']}", *(fmt(r["graph_us"].get(k), 2) for k in names)] for r in graphed]
            parts.append(f"small M, {op} inside a CUDA graph (us per call over {GRAPH_CALLS} captured calls, "
                         "median of the rounds)\n" + table(["M x N", *names], body))
    return "\n\n".join(parts)


def summary(data: dict[str, Any], peers: set[str]) -> str:
    c = data["copy"]
    parts = [f"{data['gpu']} | torch {data['versions']['torch']} | {data['dtype']} | "
             f"copy {c['gbps']:.0f} GB/s ({c['elements']} elements, read + write) | "
             f"medians of {data.get('rounds', 1)} rotated rounds"]
    for op, rows in data["results"].items():
        if rows:
            parts.append(op_table(op, rows, c["gbps"], peers))
    if data.get("small_m"):
        parts.append(small_table(data["small_m"]))
    return "\n\n".join(parts)


def save_json(out: Path, data: dict[str, Any]) -> None:
    tmp = out / "bench.json.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, out / "bench.json")


def plot(path: Path, data: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op, rows in data["results"].items() if rows]
    if not ops:
        return
    names = list(dict.fromkeys(k for op in ops for r in data["results"][op] for k in r["gbps"]))
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}  # one color per provider in every subplot
    fig, axes = plt.subplots(1, len(ops), figsize=(6.5 * len(ops), 4.8), squeeze=False)
    for ax, op in zip(axes[0], ops):
        rows = data["results"][op]
        for name in names:
            pts = [(r["N"], r["gbps"][name]) for r in rows if r["gbps"].get(name) is not None]
            if pts:
                style = "-" if name.startswith("normir") else "--"
                ax.plot(*zip(*pts), style, color=colors[name], marker="o", ms=4,
                        lw=2 if name == "normir" else 1.2, label=name)
        ax.axhline(data["copy"]["gbps"], color="k", ls=":", lw=1, label="copy")
        ax.set_xscale("log", base=2)
        ns = sorted({r["N"] for r in rows})
        ax.set_xticks(ns, [str(v) for v in ns], rotation=45, fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("N (M = 2^27 // N)")
        ax.set_ylabel("GB/s")
        ax.set_title(f"{op_title(op)}, {data['dtype']}")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"{data['gpu']}, torch {data['versions']['torch']}, {data['date'][:10]}")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="folder for bench.json and bench.png (default: .)")
    ap.add_argument("--quick", action="store_true", help=f"only N in {QUICK_NS}")
    ap.add_argument("--ns", help="comma list of N (a model's hidden sizes, say); M = 2^27 // N (default: "
                                 f"{','.join(map(str, FULL_NS))})")
    ap.add_argument("--peers-dir", help="folder added with site.addsitedir before importing the peers")
    ap.add_argument("--ops", default="fwd,bwd",
                    help=f"comma list out of {','.join(OPS)}, and small: the small-M rows alone (fwd runs them "
                         "too) (default: fwd,bwd)")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="x and weight dtype (default: bf16)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per shape, each over every provider in a rotated order; the median is kept (default: 3)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: give at least 1")
    if args.ns is not None and args.quick:
        ap.error("--ns and --quick both choose the N: give one")
    try:
        ns = tuple(int(v) for v in (args.ns or "").split(",") if v.strip())
    except ValueError:
        ap.error(f"--ns {args.ns!r}: give whole numbers separated by commas, e.g. 768,1152,1600")
    if args.ns is not None and (not ns or any(not 0 < n <= TOTAL for n in ns)):
        ap.error(f"--ns {args.ns!r}: give N between 1 and {TOTAL}, e.g. 768,1152,1600")
    args.ns = ns or (QUICK_NS if args.quick else FULL_NS)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in args.ops if o not in (*OPS, "small")]
    if bad or not args.ops:
        ap.error(f"--ops: unknown {bad}; choose from {','.join(OPS)},small")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.py needs a CUDA GPU; torch.cuda.is_available() is False", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = DTYPES[args.dtype]
    providers, status = load_providers(args.peers_dir)
    peers = {p.name for p in providers if p.is_peer}
    data: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(), "versions": versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dtype": args.dtype, "eps": EPS, "ln_eps": LN_EPS, "elements_per_shape": TOTAL,
        "timing": "triton.testing.do_bench median (warmup 25 ms, rep 100 ms); small M: wall clock; "
                  "each the median of the rounds, run in rotated provider order",
        "rounds": args.rounds, "providers": status, "copy": copy_ceiling(dtype, args.rounds),
        "results": {op: [] for op in args.ops if op in OPS}, "small_m": [],
    }
    torch.cuda.empty_cache()
    print(f"copy: {data['copy']['gbps']:.0f} GB/s", flush=True)
    for n in args.ns if data["results"] else ():
        t0 = time.perf_counter()
        for op, row in measure_shape(providers, list(data["results"]), TOTAL // n, n, dtype, args.rounds).items():
            data["results"][op].append(row)
        save_json(out, data)
        print(f"       ({time.perf_counter() - t0:.0f} s for N={n})", flush=True)
    if "fwd" in args.ops or "small" in args.ops:
        data["small_m"] = measure_small(providers, dtype, args.rounds)
    save_json(out, data)
    try:
        plot(out / "bench.png", data)
    except Exception as e:  # the plot is a convenience; bench.json already holds the data
        print(f"plot failed: {short_error(e)}")
    print(f"wrote {out / 'bench.json'} and {out / 'bench.png'}\n")
    print(summary(data, peers), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
