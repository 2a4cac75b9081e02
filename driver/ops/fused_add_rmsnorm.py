"""Fused residual-add RMSNorm (and RMSNorm with a bias, an output dtype or a weight offset): the
launches, float64 references, custom ops (torch.ops.normir.fused_add_rmsnorm_fwd / _bwd, with
fake implementations and registered autograd), the autograd Function, the public functions and
the module. The shared machinery is in _rows.py; the kernels are the family's skeletons with the
residual, bias and offset flags on.

    h = x + residual (fp32), residual_out = h stored in residual_dtype (default: residual's)
    y = rmsnorm(residual_out as stored) * (w + weight_offset) + b, in out_dtype (default: x's)
    dh = (dy * w' - h_hat * c1) * rstd + d_residual_out;  dx = dresidual = dh
    dw = sum_rows(dy * h_hat),  db = sum_rows(dy)

The norm is taken of residual_out as stored, which is exactly what the backward reads, so forward
and backward differentiate one function. Without a residual, the normalized row is x itself.
"""

from __future__ import annotations

import math

import torch

from .. import launch as L
from . import _rows as R
from ._rows import BWD_KEY_EPS, check_eps, check_input, check_like, check_stat, rows_of

FWD, BWD = "fused_add_rmsnorm_fwd", "fused_add_rmsnorm_bwd"


# ---------------------------------------------------------------------------- checks


def check_dtype(dt: torch.dtype | None, name: str) -> str | None:
    if dt is None:
        return None
    if not isinstance(dt, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype or None, got {type(dt).__name__}")
    return L.dtype_name(dt, name)


def check_offset(weight_offset: float, weight: torch.Tensor | None) -> float:
    if isinstance(weight_offset, bool) or not isinstance(weight_offset, (int, float)) \
            or not math.isfinite(float(weight_offset)):
        raise TypeError(f"weight_offset must be a finite float, got {weight_offset!r}")
    if weight_offset != 0.0 and weight is None:
        raise ValueError("weight_offset scales by (weight + weight_offset): it needs a weight; pass one or leave "
                         "weight_offset at 0.0")
    return float(weight_offset)


def _fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset):
    eps = check_eps(eps)
    check_input(x, "x")
    n = x.shape[-1]
    if residual is not None:
        check_input(residual, "residual")
        if residual.shape != x.shape or residual.device != x.device:
            raise ValueError(f"residual must match x in shape and device: residual is {tuple(residual.shape)} on "
                             f"{residual.device}, x is {tuple(x.shape)} on {x.device}")
    w = R.check_weight(weight, x, n)
    b = R.check_weight(bias, x, n, "bias")
    check_dtype(residual_dtype, "residual_dtype")
    check_dtype(out_dtype, "out_dtype")
    return eps, n, w, b, check_offset(weight_offset, weight)


# ---------------------------------------------------------------------------- launches


def _fwd(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
         eps: float, residual_dtype: torch.dtype | None, out_dtype: torch.dtype | None, weight_offset: float,
         store_rstd: bool, store_residual: bool, kernel: str = FWD
         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The forward on real tensors (kernel: this op's or LayerNorm's): (y, residual_out, rstd,
    mean); residual_out only with a residual and store_residual, rstd (and, for an op with a
    mean, mean) only with store_rstd."""
    eps, n, w, b, offset = _fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset)
    x2, xs = rows_of(x)
    r2, rs = rows_of(residual) if residual is not None else (None, 0)
    m = x2.numel() // n
    h_dtype = (residual_dtype or residual.dtype) if residual is not None else x.dtype
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    store_residual = store_residual and residual is not None
    res_out = torch.empty(x.shape, dtype=h_dtype, device=x.device) if store_residual else None
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) if store_rstd else None
    has_mean = L.KERNELS[kernel].stats.has_mean
    mean = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) if store_rstd and has_mean else None
    if m:
        dev = x.get_device()
        rows = (x2, r2, y, res_out)
        vec = R.vector_width(n, (*rows, w, b), (xs, rs) if r2 is not None else (xs,), rows=len(rows))
        dt = L.TORCH_DTYPES[x.dtype]
        extra = (("rdtype", L.TORCH_DTYPES[residual.dtype] if residual is not None else ""),
                 ("sdtype", L.TORCH_DTYPES[h_dtype] if residual is not None else ""),
                 ("odtype", L.TORCH_DTYPES[y.dtype]), ("bdtype", L.TORCH_DTYPES[b.dtype] if b is not None else ""),
                 ("store_residual", store_residual), ("weight_offset", offset))
        p = R.plan(kernel, dev, n, dt, L.TORCH_DTYPES[w.dtype] if w is not None else dt, eps, w is not None,
                   store_rstd, vec, extra=extra)
        with R.on_device(dev):
            p.handle.launch_named(
                p.grid(m), L.stream(dev), x=x2.data_ptr(), residual=r2.data_ptr() if r2 is not None else 0,
                w=w.data_ptr() if w is not None else 0, b=b.data_ptr() if b is not None else 0, y=y.data_ptr(),
                residual_out=res_out.data_ptr() if res_out is not None else 0,
                rstd=rstd.data_ptr() if rstd is not None else 0,
                **({"mean": mean.data_ptr() if mean is not None else 0} if has_mean else {}),
                rows=m, x_stride=xs, residual_stride=rs, y_stride=n, residual_out_stride=n)
    return y, res_out, rstd, mean


def _bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype, dres_dtype,
                made_by: str = "fused_add_rmsnorm_fwd(..., store_rstd=True)"):
    check_input(residual_out, "residual_out")
    n = residual_out.shape[-1]
    check_input(dy, "dy")
    if dy.shape != residual_out.shape or dy.device != residual_out.device:
        raise ValueError(f"dy must match residual_out in shape and device: dy is {tuple(dy.shape)} on {dy.device}, "
                         f"residual_out is {tuple(residual_out.shape)} on {residual_out.device}")
    if d_residual_out is not None:
        check_like(d_residual_out, residual_out, "d_residual_out", "residual_out")
    w = R.check_weight(weight, residual_out, n)
    check_stat(rstd, residual_out, "rstd", made_by, "residual_out")
    check_dtype(bias_dtype, "bias_dtype")
    check_dtype(dx_dtype, "dx_dtype")
    check_dtype(dres_dtype, "dresidual_dtype")
    return n, w, check_offset(weight_offset, weight)


def _bwd(dy: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
         d_residual_out: torch.Tensor | None, bias_dtype: torch.dtype | None, weight_offset: float,
         dx_dtype: torch.dtype | None, dres_dtype: torch.dtype | None, atomic: bool = False,
         mean: torch.Tensor | None = None, kernel: str = BWD
         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The backward on real tensors (kernel: this op's, or LayerNorm's with its mean): (dx,
    dresidual, dw, db). dx is dh in dx_dtype (default residual_out's); dresidual, the same values
    in dres_dtype, is None unless that type differs; dw None without a weight, db (in bias_dtype)
    None without a bias."""
    n, w, offset = _bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype,
                               dres_dtype)
    has_bias = bias_dtype is not None
    h2, hs = rows_of(residual_out)
    dy2, dys = rows_of(dy)
    g2, gs = rows_of(d_residual_out) if d_residual_out is not None else (None, 0)
    rstd = rstd.contiguous()
    mean = mean.contiguous() if mean is not None else None
    m = h2.numel() // n
    dx_dtype = dx_dtype or residual_out.dtype
    dx = torch.empty(residual_out.shape, dtype=dx_dtype, device=residual_out.device)
    dres = torch.empty(residual_out.shape, dtype=dres_dtype, device=dx.device) \
        if dres_dtype is not None and dres_dtype != dx_dtype else None
    # The column sums overwrite dw and db; without rows they are zero.
    fill = torch.zeros if m == 0 else torch.empty
    dw = fill((n,), dtype=w.dtype, device=dx.device) if w is not None else None
    db = fill((n,), dtype=bias_dtype, device=dx.device) if has_bias else None
    if m == 0:
        return dx, dres, dw, db
    dev = dx.get_device()
    rows = (h2, dy2, g2, dx, dres)
    vec = R.vector_width(n, (*rows, w), (hs, dys, gs) if g2 is not None else (hs, dys), rows=len(rows))
    dt = L.TORCH_DTYPES[residual_out.dtype]
    extra = (("rdtype", L.TORCH_DTYPES[dres.dtype] if dres is not None else ""), ("odtype", L.TORCH_DTYPES[dy.dtype]),
             ("xdtype", L.TORCH_DTYPES[dx_dtype]), ("bdtype", "f32" if has_bias else ""),  # db's sums in fp32
             ("has_dres_out", g2 is not None), ("weight_offset", offset))
    with R.on_device(dev):
        p = R.plan(kernel, dev, n, dt, L.TORCH_DTYPES[w.dtype] if w is not None else dt, BWD_KEY_EPS,
                   w is not None, False, vec, atomic, extra)
        if atomic and not p.layout.dw_regs:
            raise ValueError(f"atomic=True needs the column sums in registers; N={n} keeps them in memory: use the "
                             "default atomic=False")
        stream = L.stream(dev)
        parts = p.clusters(m) * p.layout.rows if not atomic else 1
        alloc = torch.zeros if atomic else torch.empty
        dw_part = alloc((parts, n), dtype=torch.float32, device=dx.device) if w is not None else None
        db_part = alloc((parts, n), dtype=torch.float32, device=dx.device) if has_bias else None
        p.handle.launch_named(
            p.grid(m), stream, x=h2.data_ptr(), w=w.data_ptr() if w is not None else 0, dy=dy2.data_ptr(),
            rstd=rstd.data_ptr(), **({"mean": mean.data_ptr()} if mean is not None else {}),
            dres_out=g2.data_ptr() if g2 is not None else 0, dx=dx.data_ptr(),
            dres=dres.data_ptr() if dres is not None else 0,
            dw_part=dw_part.data_ptr() if dw_part is not None else 0,
            db_part=db_part.data_ptr() if db_part is not None else 0, rows=m, x_stride=hs, dy_stride=dys,
            dres_out_stride=gs, dx_stride=n, dres_stride=n)
        for part, out in ((dw_part, dw), (db_part, db)):
            if part is not None:
                R.column_sums("rmsnorm_dw_reduce", dev, stream, part, parts, out)
    return dx, dres, dw, db


# ---------------------------------------------------------------------------- custom ops


@torch.library.custom_op("normir::fused_add_rmsnorm_fwd", mutates_args=())
def _fwd_op(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
            eps: float, residual_dtype: torch.dtype | None, out_dtype: torch.dtype | None, weight_offset: float,
            store_rstd: bool, store_residual: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, residual_out, rstd); residual_out and rstd have shape (0,) where not stored."""
    y, res_out, rstd, _ = _fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, store_rstd,
                               store_residual)
    return y, (res_out if res_out is not None else x.new_empty((0,))), \
        (rstd if rstd is not None else R.stat_out(x, False))


@_fwd_op.register_fake
def _(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, store_rstd, store_residual):
    _fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset)
    y = x.new_empty(x.shape, dtype=out_dtype or x.dtype)
    stored = store_residual and residual is not None
    res_out = x.new_empty(x.shape if stored else (0,), dtype=(residual_dtype or residual.dtype) if stored else x.dtype)
    return y, res_out, R.stat_out(x, store_rstd)


@torch.library.custom_op("normir::fused_add_rmsnorm_bwd", mutates_args=())
def _bwd_op(dy: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
            d_residual_out: torch.Tensor | None, bias_dtype: torch.dtype | None, weight_offset: float,
            dx_dtype: torch.dtype | None, dres_dtype: torch.dtype | None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dresidual, dw, db); dresidual has shape (0,) unless its dtype differs from dx's (then
    dx is both gradients), dw and db (0,) without a weight or bias."""
    return bwd_outputs(*_bwd(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype,
                             dres_dtype))


def bwd_outputs(dx, dres, dw, db):
    """A backward custom op's outputs: the absent ones as (0,)-shaped tensors (fresh, unaliased)."""
    empty = dx.new_empty((0,))
    return dx, (dres if dres is not None else empty), (dw if dw is not None else empty), \
        (db if db is not None else empty.clone())


def fake_bwd_outputs(residual_out, weight, n, bias_dtype, dx_dtype, dres_dtype):
    """A backward custom op's fake outputs (dx, dresidual, dw, db), shaped as bwd_outputs makes them."""
    dx_dtype = dx_dtype or residual_out.dtype
    dx = residual_out.new_empty(residual_out.shape, dtype=dx_dtype)
    two = dres_dtype is not None and dres_dtype != dx_dtype
    dres = residual_out.new_empty(residual_out.shape if two else (0,), dtype=dres_dtype if two else dx_dtype)
    dw = weight.new_empty((n,)) if weight is not None else dx.new_empty((0,))
    db = residual_out.new_empty((n,) if bias_dtype is not None else (0,), dtype=bias_dtype or dx_dtype)
    return dx, dres, dw, db


@_bwd_op.register_fake
def _(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype, dres_dtype):
    n = _bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype, dres_dtype)[0]
    return fake_bwd_outputs(residual_out, weight, n, bias_dtype, dx_dtype, dres_dtype)


def _fwd_setup(ctx, inputs, output):
    x, residual, weight, bias, _, _, _, weight_offset, store_rstd, store_residual = inputs
    y, res_out, rstd = output
    ctx.has_residual, ctx.bias_dtype, ctx.weight_offset = residual is not None, bias.dtype if bias is not None \
        else None, weight_offset
    ctx.dtypes = (x.dtype, residual.dtype if residual is not None else None)
    ctx.ready = store_rstd and (store_residual or residual is None)
    ctx.save_for_backward(res_out if residual is not None else x, weight, rstd)
    ctx.mark_non_differentiable(rstd)


def _fwd_backward(ctx, dy, d_res_out, _drstd):
    if not ctx.ready:
        raise RuntimeError("normir::fused_add_rmsnorm_fwd saved no rstd or residual_out for the backward: call it "
                           "with store_rstd=True and store_residual=True (normir.rmsnorm does) when a gradient is "
                           "needed")
    h, weight, rstd = ctx.saved_tensors
    x_dtype, r_dtype = ctx.dtypes
    g = d_res_out if ctx.has_residual and d_res_out is not None and d_res_out.numel() else None
    dx, dres, dw, db = torch.ops.normir.fused_add_rmsnorm_bwd(dy, h, weight, rstd, g, ctx.bias_dtype,
                                                             ctx.weight_offset, x_dtype, r_dtype)
    need = ctx.needs_input_grad
    dres = dres if dres.numel() or not ctx.has_residual else dx
    return ((dx if need[0] else None), (dres if ctx.has_residual and need[1] else None),
            (dw if weight is not None and need[2] else None), (db if ctx.bias_dtype and need[3] else None),
            None, None, None, None, None, None)


_fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup)


# ---------------------------------------------------------------------------- autograd (eager)


class FusedNormFunction(torch.autograd.Function):
    """The eager autograd path of the fused norms (the custom ops' registered autograd is the
    traced one); kernels: the (forward, backward) pair, this module's or LayerNorm's. Returns (y,
    residual_out); residual_out is None without a residual, or when neither kept (keep) nor
    needed for a gradient."""

    @staticmethod
    def forward(ctx, kernels, x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, keep):
        need_grad = any(ctx.needs_input_grad[1:5])
        ctx.set_materialize_grads(False)  # an unused residual_out's gradient stays None: not read
        y, res_out, rstd, mean = _fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset,
                                      need_grad, need_grad or keep, kernels[0])
        ctx.kernel = kernels[1]
        ctx.has_residual, ctx.bias_dtype, ctx.weight_offset = residual is not None, bias.dtype if bias is not None \
            else None, weight_offset
        ctx.dtypes = (x.dtype, residual.dtype if residual is not None else None)
        ctx.y_dtype = y.dtype
        if need_grad:
            ctx.save_for_backward(res_out if residual is not None else x, weight, rstd, mean)
        return y, res_out

    @staticmethod
    def backward(ctx, dy, d_res_out):
        h, weight, rstd, mean = ctx.saved_tensors
        x_dtype, r_dtype = ctx.dtypes
        if dy is None:  # only residual_out was used
            dy = torch.zeros(h.shape, dtype=ctx.y_dtype, device=h.device)
        dx, dres, dw, db = _bwd(dy, h, weight, rstd, d_res_out if ctx.has_residual else None, ctx.bias_dtype,
                                ctx.weight_offset, x_dtype, r_dtype, mean=mean, kernel=ctx.kernel)
        need = ctx.needs_input_grad
        dres = dres if dres is not None else dx
        return (None, (dx if need[1] else None), (dres if ctx.has_residual and need[2] else None),
                (dw if need[3] else None), (db if need[4] else None), None, None, None, None, None)


# ---------------------------------------------------------------------------- public API


def fused_norm(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, prenorm):
    """normir.rmsnorm's general form, with autograd: y, or (y, residual_out) with prenorm. The
    eager Function or, while tracing, the custom op. Without a residual, residual_out is x itself
    (x.to(residual_dtype) where that type is given and differs)."""
    if not isinstance(prenorm, bool):
        raise TypeError(f"prenorm must be a bool, got {type(prenorm).__name__}")
    if R.eager(x):
        y, res_out = FusedNormFunction.apply((FWD, BWD), x, residual, weight, bias, eps, residual_dtype, out_dtype,
                                             weight_offset, prenorm)
    else:  # the checks first: the dispatcher's own type errors name no fix
        _fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset)
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, residual, weight, bias))
        y, res_out, _ = torch.ops.normir.fused_add_rmsnorm_fwd(x, residual, weight, bias, eps, residual_dtype,
                                                              out_dtype, weight_offset, grad, grad or prenorm)
    if not prenorm:
        return y
    if residual is None:
        res_out = x if residual_dtype is None or residual_dtype == x.dtype else x.to(residual_dtype)
    return y, res_out


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, eps: float = 1e-6,
                      prenorm: bool = True, *, bias: torch.Tensor | None = None,
                      residual_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None,
                      weight_offset: float = 0.0):
    """h = x + residual; y = rmsnorm(h) * (weight + weight_offset) + bias, with autograd.
    Returns (y, residual_out) with prenorm (the default), else y; see normir.rmsnorm."""
    return fused_norm(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, prenorm)


def fused_add_rmsnorm_fwd(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
                          eps: float = 1e-6, *, bias: torch.Tensor | None = None,
                          residual_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None,
                          weight_offset: float = 0.0, store_rstd: bool = False):
    """The forward alone: (y, residual_out, rstd). residual_out is x itself without a residual;
    rstd (fp32, x.shape[:-1]) only with store_rstd, else None."""
    if R.eager(x):
        y, res_out, rstd, _ = _fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset,
                                   store_rstd, True)
    else:
        _fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset)
        y, res_out, rstd = torch.ops.normir.fused_add_rmsnorm_fwd(x, residual, weight, bias, eps, residual_dtype,
                                                                  out_dtype, weight_offset, store_rstd, True)
    return y, (res_out if residual is not None else x), (rstd if store_rstd else None)


def fused_add_rmsnorm_bwd(dy: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor | None,
                          rstd: torch.Tensor, d_residual_out: torch.Tensor | None = None, *, has_bias: bool = False,
                          weight_offset: float = 0.0, dx_dtype: torch.dtype | None = None,
                          dresidual_dtype: torch.dtype | None = None, db_dtype: torch.dtype | None = None,
                          atomic: bool = False):
    """The backward alone: (dh, dw, db). dh = (dy * w' - h_hat * c1) * rstd (+ d_residual_out) is
    the gradient of both x and residual, in dx_dtype (default residual_out's); where
    dresidual_dtype differs from it, dh is the pair (dx, dresidual), both written in one pass. dw
    is None without a weight, db None unless has_bias (in db_dtype, default the weight's); both
    summed in fp32 in a fixed order (atomic=True: fp32 atomics)."""
    if not isinstance(has_bias, bool):
        raise TypeError(f"has_bias must be a bool, got {type(has_bias).__name__}")
    bias_dtype = (db_dtype or (weight.dtype if isinstance(weight, torch.Tensor) else None) or dx_dtype
                  or residual_out.dtype) if has_bias else None
    if R.eager(dy):
        dx, dres, dw, db = _bwd(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype,
                                dresidual_dtype, atomic)
    else:
        _bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype,
                    dresidual_dtype)
        dx, dres, dw, db = torch.ops.normir.fused_add_rmsnorm_bwd(dy, residual_out, weight, rstd, d_residual_out,
                                                                  bias_dtype, weight_offset, dx_dtype, dresidual_dtype)
        dres = dres if dres.numel() else None
        dw, db = (dw if weight is not None else None), (db if has_bias else None)
    return (dx if dres is None else (dx, dres)), dw, db


# ---------------------------------------------------------------------------- references


def fused_add_rmsnorm_ref(x, residual, weight, bias, eps, residual_dtype=None, weight_offset=0.0):
    """float64 reference: (y, residual_out, rstd). h = x + residual in fp32, rounded to
    residual_dtype as the kernel stores it, and normalized as stored; without a residual x is
    normalized and residual_out is x (in residual_dtype)."""
    if residual is not None:
        h = (x.float() + residual.float()).to(residual_dtype or residual.dtype)
        y, rstd = _norm_ref(h.double(), weight, bias, eps, weight_offset)
    else:
        h = x if residual_dtype is None else x.to(residual_dtype)
        y, rstd = _norm_ref(x.double(), weight, bias, eps, weight_offset)
    return y, h, rstd


def _norm_ref(hd, weight, bias, eps, weight_offset):
    rstd = torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps)
    y = hd * rstd
    if weight is not None:
        y = y * (weight.double() + weight_offset)
    if bias is not None:
        y = y + bias.double()
    return y, rstd.squeeze(-1)


def fused_add_rmsnorm_bwd_ref(h, weight, bias, eps, weight_offset, dy, d_residual_out=None):
    """float64 reference gradients (dh, dw, db) of y = norm(h) * (w + offset) + b and of
    residual_out = h, given dy and d_residual_out, through autograd; dw, db None where absent."""
    return grads_ref(lambda hd, w, b: _norm_ref(hd, w, b, eps, weight_offset)[0], h, weight, bias, dy, d_residual_out)


def grads_ref(norm, h, weight, bias, dy, d_residual_out=None):
    """float64 gradients (dh, dw, db) of y = norm(h, w, b) and of residual_out = h, given dy and
    d_residual_out, through autograd; dw, db None where absent."""
    hd = h.detach().double().requires_grad_(True)
    params = [t.detach().double().requires_grad_(True) if t is not None else None for t in (weight, bias)]
    y = norm(hd, *params)
    out = (y * dy.double()).sum()
    if d_residual_out is not None:
        out = out + (hd * d_residual_out.double()).sum()
    grads = torch.autograd.grad(out, [hd] + [p for p in params if p is not None])
    it = iter(grads[1:])
    return grads[0], *(next(it) if p is not None else None for p in params)


# ---------------------------------------------------------------------------- module


class FusedAddRMSNorm(torch.nn.Module):
    """forward(x, residual) -> (y, residual_out): h = x + residual, y = rmsnorm(h) * (w +
    weight_offset) (+ bias), residual_out = h in residual_dtype (default: residual's)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, elementwise_affine: bool = True, bias: bool = False,
                 residual_dtype: torch.dtype | None = None, weight_offset: float = 0.0, device=None, dtype=None):
        super().__init__()
        self.eps = check_eps(eps)
        self.residual_dtype = residual_dtype
        self.weight_offset = float(weight_offset)
        init = 1.0 - self.weight_offset  # w + weight_offset starts at 1
        self.weight = torch.nn.Parameter(torch.full((hidden_size,), init, device=device, dtype=dtype)) \
            if elementwise_affine else None
        self.bias = torch.nn.Parameter(torch.zeros(hidden_size, device=device, dtype=dtype)) \
            if bias and elementwise_affine else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_add_rmsnorm(x, residual, self.weight, self.eps, bias=self.bias,
                                 residual_dtype=self.residual_dtype, weight_offset=self.weight_offset)
