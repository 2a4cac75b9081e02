"""What the fused norms share (fused-add RMSNorm, LayerNorm with or without its add): the
argument checks, the launches of a forward and a backward kernel of the family's skeletons (the
kernel named by the op), the backward custom ops' outputs, the eager autograd Function, and the
float64 reference gradients. The ops' modules (fused_add_rmsnorm.py, layernorm.py) hold their
APIs, custom ops, references and modules.
"""

from __future__ import annotations

import math

import torch

from .. import launch as L
from . import _rows as R
from ._rows import BWD_KEY_EPS, check_eps, check_input, check_like, check_stat, rows_of

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


def fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset):
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


def launch_fwd(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
         eps: float, residual_dtype: torch.dtype | None, out_dtype: torch.dtype | None, weight_offset: float,
         store_rstd: bool, store_residual: bool, kernel: str
         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The forward on real tensors (kernel: this op's or LayerNorm's): (y, residual_out, rstd,
    mean); residual_out only with a residual and store_residual, rstd (and, for an op with a
    mean, mean) only with store_rstd."""
    eps, n, w, b, offset = fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset)
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


def bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype, dres_dtype,
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


def launch_bwd(dy: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
         d_residual_out: torch.Tensor | None, bias_dtype: torch.dtype | None, weight_offset: float,
         dx_dtype: torch.dtype | None, dres_dtype: torch.dtype | None, atomic: bool = False, *,
         kernel: str, mean: torch.Tensor | None = None
         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The backward on real tensors (kernel: this op's, or LayerNorm's with its mean): (dx,
    dresidual, dw, db). dx is dh in dx_dtype (default residual_out's); dresidual, the same values
    in dres_dtype, is None unless that type differs; dw None without a weight, db (in bias_dtype)
    None without a bias."""
    n, w, offset = bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype,
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


def bwd_outputs(dx, dres, dw, db):
    """A backward custom op's outputs: the absent ones as (0,)-shaped tensors, each its own (a
    custom op's outputs may not alias one another: no dresidual and no weight is two of them)."""
    return dx, *(t if t is not None else dx.new_empty((0,)) for t in (dres, dw, db))


def fake_bwd_outputs(residual_out, weight, n, bias_dtype, dx_dtype, dres_dtype):
    """A backward custom op's fake outputs (dx, dresidual, dw, db), shaped as bwd_outputs makes them."""
    dx_dtype = dx_dtype or residual_out.dtype
    dx = residual_out.new_empty(residual_out.shape, dtype=dx_dtype)
    two = dres_dtype is not None and dres_dtype != dx_dtype
    dres = residual_out.new_empty(residual_out.shape if two else (0,), dtype=dres_dtype if two else dx_dtype)
    dw = weight.new_empty((n,)) if weight is not None else dx.new_empty((0,))
    db = residual_out.new_empty((n,) if bias_dtype is not None else (0,), dtype=bias_dtype or dx_dtype)
    return dx, dres, dw, db


# ---------------------------------------------------------------------------- autograd (eager)

# The ops the eager Function serves, by backward kernel: the names its double-backward error gives
# (the op, torch's op to use instead).
_EAGER_NAMES = {"fused_add_rmsnorm_bwd": ("normir.rmsnorm with a residual, bias, weight offset or out_dtype "
                                          "(normir.fused_add_rmsnorm)", R.TORCH_RMS),
                "layernorm_bwd": ("normir.layernorm (normir.fused_add_layernorm)", R.TORCH_LN)}


class FusedNormFunction(torch.autograd.Function):
    """The eager autograd path of the fused norms (the custom ops' registered autograd is the
    traced one); kernels: the (forward, backward) pair, this module's or LayerNorm's. Returns (y,
    residual_out); residual_out is None without a residual, or when neither kept (keep) nor
    needed for a gradient."""

    @staticmethod
    def forward(ctx, kernels, x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, keep):
        need_grad = any(ctx.needs_input_grad[1:5])
        ctx.set_materialize_grads(False)  # an unused residual_out's gradient stays None: not read
        y, res_out, rstd, mean = launch_fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset,
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
    @R.first_order_only(lambda ctx: _EAGER_NAMES[ctx.kernel][0], lambda ctx: _EAGER_NAMES[ctx.kernel][1])
    def backward(ctx, dy, d_res_out):
        h, weight, rstd, mean = ctx.saved_tensors
        x_dtype, r_dtype = ctx.dtypes
        if dy is None:  # only residual_out was used
            dy = torch.zeros(h.shape, dtype=ctx.y_dtype, device=h.device)
        dx, dres, dw, db = launch_bwd(dy, h, weight, rstd, d_res_out if ctx.has_residual else None, ctx.bias_dtype,
                                ctx.weight_offset, x_dtype, r_dtype, mean=mean, kernel=ctx.kernel)
        need = ctx.needs_input_grad
        dres = dres if dres is not None else dx
        return (None, (dx if need[1] else None), (dres if ctx.has_residual and need[2] else None),
                (dw if need[3] else None), (db if need[4] else None), None, None, None, None, None)


def eager_forward(kernels, x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, keep):
    """The fused norms' eager forward: through FusedNormFunction where a gradient is needed, else
    the launch alone, storing no statistics (torch.no_grad, inference). Returns (y, residual_out)."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, residual, weight, bias)):
        return FusedNormFunction.apply(kernels, x, residual, weight, bias, eps, residual_dtype, out_dtype,
                                       weight_offset, keep)
    y, res_out, _, _ = launch_fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, False,
                                  keep, kernels[0])
    return y, res_out


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
