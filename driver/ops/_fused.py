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
from ._rows import BWD_KEY_EPS, check_eps, check_grad, check_input, check_stat, rows_of

# ---------------------------------------------------------------------------- checks


def check_dtype(dt: torch.dtype | None, name: str) -> str | None:
    if dt is None:
        return None
    if not isinstance(dt, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype or None, got {type(dt).__name__}")
    return L.dtype_name(dt, name)


def check_offset(weight_offset: float, weight: torch.Tensor | None, values: bool = True) -> float:
    """weight_offset as a float, checked; values=False: its type only (see _rows.check_eps)."""
    if isinstance(weight_offset, bool) or not isinstance(weight_offset, (int, float)):
        raise TypeError(f"weight_offset must be a finite float, got {weight_offset!r}")
    if not values:
        return weight_offset
    if not math.isfinite(float(weight_offset)):
        raise TypeError(f"weight_offset must be a finite float, got {weight_offset!r}")
    if weight_offset != 0.0 and weight is None:
        raise ValueError("weight_offset scales by (weight + weight_offset): it needs a weight; pass one or leave "
                         "weight_offset at 0.0")
    return float(weight_offset)


def fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, values=True, device=True):
    """The forward's checks; values=False leaves the floats' values to the custom op's fake
    implementation (a wrapper about to call the op: see _rows.check_eps), which passes
    device=False (see _rows.check_input)."""
    eps = check_eps(eps, values)
    check_input(x, "x", device)
    n = x.shape[-1]
    if residual is not None:
        check_input(residual, "residual", device)
        R.check_same_kind(residual, x, "residual")
        if residual.shape != x.shape or residual.device != x.device:
            raise ValueError(f"residual must match x in shape and device: residual is {tuple(residual.shape)} on "
                             f"{residual.device}, x is {tuple(x.shape)} on {x.device}")
    w = R.check_weight(weight, x, n)
    b = R.check_weight(bias, x, n, "bias")
    check_dtype(residual_dtype, "residual_dtype")
    check_dtype(out_dtype, "out_dtype")
    return eps, n, w, b, check_offset(weight_offset, weight, values)


# ---------------------------------------------------------------------------- launches


# Repeated eager calls take a fast path, as RMSNorm's do (rmsnorm.py): a call whose every property
# that the checks and the plan depend on matches one already checked and launched (the key:
# dtypes, N, devices, the weight's and bias's shapes, eps and the flags; besides it, contiguous
# rows of one shape, 16-byte aligned) skips the checks and the plan lookup and launches
# positionally. A miss, or anything unusual, takes the general path, which fills the table.
_FWD_SEEN: dict[tuple, tuple] = L.derived_cache({})
_BWD_SEEN: dict[tuple, tuple] = L.derived_cache({})


def _col_key(t: torch.Tensor | None) -> tuple:
    """A per-column tensor's part of a key (None: absent; else its dtype, shape and device)."""
    return (None, None, None) if t is None else (t.dtype, t.shape, t.get_device())


def _fwd_key(kernel, x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, store_rstd,
             store_residual) -> tuple:
    r = (None, None) if residual is None else (residual.dtype, residual.get_device())
    return (kernel, x.dtype, x.shape[-1], x.get_device(), *r, *_col_key(weight), *_col_key(bias), eps, residual_dtype,
            out_dtype, weight_offset, store_rstd, store_residual)


def _fwd_fast(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, store_rstd, store_residual,
              kernel):
    """launch_fwd's outputs for a call like one seen before, or None (take the general path)."""
    if not (type(x) is torch.Tensor and type(eps) is float and type(weight_offset) is float
            and type(store_rstd) is bool and type(store_residual) is bool and x.dim()
            and (residual is None or type(residual) is torch.Tensor) and (weight is None or type(weight) in R.PLAIN)
            and (bias is None or type(bias) in R.PLAIN)):
        return None
    hit = _FWD_SEEN.get(_fwd_key(kernel, x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset,
                                 store_rstd, store_residual))
    if hit is None or not x.is_contiguous() or (residual is not None and not (
            residual.shape == x.shape and residual.is_contiguous())) \
            or (weight is not None and not weight.is_contiguous()) or (bias is not None and not bias.is_contiguous()):
        return None
    p, y_dtype, h_dtype, has_mean = hit
    dev, n = x.get_device(), x.shape[-1]
    y = torch.empty_like(x) if y_dtype is None else torch.empty_like(x, dtype=y_dtype)
    res_out = None
    if store_residual and residual is not None:
        res_out = torch.empty_like(residual) if h_dtype is None else torch.empty_like(residual, dtype=h_dtype)
    xp, yp = x.data_ptr(), y.data_ptr()
    rp, hp = (residual.data_ptr() if residual is not None else 0), (res_out.data_ptr() if res_out is not None else 0)
    wp, bp = (weight.data_ptr() if weight is not None else 0), (bias.data_ptr() if bias is not None else 0)
    if (xp | yp | rp | hp | wp | bp) & 15:  # an unaligned tensor: the general path narrows the vector
        return None
    rstd = mean = None
    if store_rstd:
        rstd = R.empty_f32(x.shape, dev, per_row=True)
        mean = R.empty_f32(x.shape, dev, per_row=True) if has_mean else None
    m = x.numel() // n
    if m:
        p.launch(dev, p.grid(m), x=xp, residual=rp, w=wp, b=bp, y=yp, residual_out=hp,
                 rstd=rstd.data_ptr() if rstd is not None else 0, mean=mean.data_ptr() if mean is not None else 0,
                 rows=m, x_stride=n, residual_stride=n if residual is not None else 0, y_stride=n, residual_out_stride=n)
    return y, res_out, rstd, mean


def launch_fwd(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
         eps: float, residual_dtype: torch.dtype | None, out_dtype: torch.dtype | None, weight_offset: float,
         store_rstd: bool, store_residual: bool, kernel: str
         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The forward on real tensors (kernel: this op's or LayerNorm's): (y, residual_out, rstd,
    mean); residual_out only with a residual and store_residual, rstd (and, for an op with a
    mean, mean) only with store_rstd."""
    fast = _fwd_fast(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, store_rstd,
                     store_residual, kernel)
    if fast is not None:
        return fast
    eps, n, w, b, offset = fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset)
    x2, xs = rows_of(x)
    r2, rs = rows_of(residual) if residual is not None else (None, 0)
    m = x2.numel() // n
    h_dtype = (residual_dtype or residual.dtype) if residual is not None else x.dtype
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    stored = store_residual and residual is not None
    res_out = torch.empty(x.shape, dtype=h_dtype, device=x.device) if stored else None
    dev = x.get_device()
    rstd = R.empty_f32(x.shape, dev, per_row=True) if store_rstd else None
    has_mean = L.KERNELS[kernel].stats.has_mean
    mean = R.empty_f32(x.shape, dev, per_row=True) if store_rstd and has_mean else None
    if m:
        rows = (x2, r2, y, res_out)
        vec = R.vector_width(n, (*rows, w, b), (xs, rs) if r2 is not None else (xs,), rows=len(rows))
        dt = L.TORCH_DTYPES[x.dtype]
        p = R.plan(dev, kernel=kernel, n=n, dtype=dt, wdtype=L.TORCH_DTYPES[w.dtype] if w is not None else dt, eps=eps,
                   has_weight=w is not None, store_rstd=store_rstd, vec=vec,
                   rdtype=L.TORCH_DTYPES[residual.dtype] if residual is not None else "",
                   sdtype=L.TORCH_DTYPES[h_dtype] if residual is not None else "", odtype=L.TORCH_DTYPES[y.dtype],
                   bdtype=L.TORCH_DTYPES[b.dtype] if b is not None else "", store_residual=stored, weight_offset=offset)
        if vec == R.MAX_VECTOR_BYTES // min(t.element_size() for t in rows if t is not None) and x2 is x \
                and r2 is residual and w is weight and b is bias:
            _FWD_SEEN[_fwd_key(kernel, x, residual, weight, bias, eps, residual_dtype, out_dtype, offset, store_rstd,
                               store_residual)] = (
                p, None if y.dtype == x.dtype else y.dtype,
                None if res_out is None or res_out.dtype == residual.dtype else res_out.dtype, has_mean)
        p.launch(dev, p.grid(m), x=x2.data_ptr(), residual=r2.data_ptr() if r2 is not None else 0,
                 w=w.data_ptr() if w is not None else 0, b=b.data_ptr() if b is not None else 0, y=y.data_ptr(),
                 residual_out=res_out.data_ptr() if res_out is not None else 0,
                 rstd=rstd.data_ptr() if rstd is not None else 0, mean=mean.data_ptr() if mean is not None else 0,
                 rows=m, x_stride=xs, residual_stride=rs, y_stride=n, residual_out_stride=n)
    return y, res_out, rstd, mean


def bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype, dres_dtype,
                made_by: str = "fused_add_rmsnorm_fwd(..., store_rstd=True)", values: bool = True,
                row: str = "residual_out", device: bool = True):
    """The backward's checks (row: the normalized row's name in messages: x, or residual_out;
    values, device: as fwd_checks')."""
    check_input(residual_out, row, device)
    n = residual_out.shape[-1]
    check_grad(dy, residual_out, "dy", row, device)
    if d_residual_out is not None:
        check_grad(d_residual_out, residual_out, "d_residual_out", row, device)
    w = R.check_weight(weight, residual_out, n)
    check_stat(rstd, residual_out, "rstd", made_by, row)
    check_dtype(bias_dtype, "bias_dtype")
    check_dtype(dx_dtype, "dx_dtype")
    check_dtype(dres_dtype, "dresidual_dtype")
    return n, w, check_offset(weight_offset, weight, values)


def _bwd_key(kernel, dy, h, weight, d_residual_out, bias_dtype, weight_offset, dx_dtype, dres_dtype, atomic,
             mean) -> tuple:
    g = (None, None) if d_residual_out is None else (d_residual_out.dtype, d_residual_out.get_device())
    return (kernel, h.dtype, h.shape[-1], h.get_device(), dy.dtype, dy.get_device(), *g, *_col_key(weight),
            bias_dtype, weight_offset, dx_dtype, dres_dtype, atomic, mean is None)


def _stat_ok(t: torch.Tensor | None, dev: int, m: int) -> bool:
    """A per-row statistic as the fast path takes it: fp32, on dev, m elements, contiguous."""
    return t is None or (t.dtype is torch.float32 and t.get_device() == dev and t.numel() == m and t.is_contiguous())


def _bwd_fast(dy, h, weight, rstd, g, bias_dtype, weight_offset, dx_dtype, dres_dtype, atomic, kernel, mean):
    """launch_bwd's outputs for a call like one seen before, or None (take the general path)."""
    if not (type(dy) is torch.Tensor and type(h) is torch.Tensor and type(rstd) is torch.Tensor
            and (g is None or type(g) is torch.Tensor) and (mean is None or type(mean) is torch.Tensor)
            and (weight is None or type(weight) in R.PLAIN) and type(weight_offset) is float and type(atomic) is bool
            and h.dim()):
        return None
    hit = _BWD_SEEN.get(_bwd_key(kernel, dy, h, weight, g, bias_dtype, weight_offset, dx_dtype, dres_dtype, atomic,
                                 mean))
    if hit is None:
        return None
    shape, dev, n = h.shape, h.get_device(), h.shape[-1]
    m = h.numel() // n
    if not (m and dy.shape == shape and h.is_contiguous() and dy.is_contiguous()
            and (g is None or (g.shape == shape and g.is_contiguous())) and _stat_ok(rstd, dev, m)
            and _stat_ok(mean, dev, m) and (weight is None or weight.is_contiguous())):
        return None
    p, dx_dt, dres_dt, has_mean = hit
    dx = torch.empty_like(h) if dx_dt is None else torch.empty_like(h, dtype=dx_dt)
    dres = torch.empty_like(h, dtype=dres_dt) if dres_dt is not None else None
    hp, dyp, dxp = h.data_ptr(), dy.data_ptr(), dx.data_ptr()
    gp, wp = (g.data_ptr() if g is not None else 0), (weight.data_ptr() if weight is not None else 0)
    dresp = dres.data_ptr() if dres is not None else 0
    if (hp | dyp | dxp | gp | wp | dresp) & 15:  # an unaligned tensor: the general path narrows the vector
        return None
    dw = torch.empty_like(weight) if weight is not None else None
    db = None
    if bias_dtype is not None:
        db = torch.empty_like(weight, dtype=bias_dtype) if weight is not None else \
            torch.empty((n,), dtype=bias_dtype, device=h.device)
    _bwd_launch(p, dev, m, n, atomic, dw, db, x=hp, w=wp, dy=dyp, rstd=rstd.data_ptr(),
                mean=mean.data_ptr() if has_mean else 0, dres_out=gp, dx=dxp, dres=dresp, x_stride=n, dy_stride=n,
                dres_out_stride=n if g is not None else 0)
    return dx, dres, dw, db


def _bwd_launch(p: R.Plan, dev: int, m: int, n: int, atomic: bool, dw: torch.Tensor | None, db: torch.Tensor | None,
                **values: int) -> None:
    """Launch a backward kernel and the column sums of dw and db. values: the row tensors'
    pointers (x, w, dy, rstd, mean, dres_out, dx, dres) and the strides of x, dy and dres_out."""
    parts = p.clusters(m) * p.layout.rows if not atomic else 1
    # dw's partial rows, then db's, in one buffer: one launch of the column sums adds both.
    outs = [t for t in (dw, db) if t is not None]
    part = _partials(len(outs) * parts, n, dev, atomic) if outs else None
    dw_part = part if dw is not None else None
    db_part = (part[parts:] if dw is not None else part) if db is not None else None
    p.launch(dev, p.grid(m), **values, dw_part=dw_part.data_ptr() if dw_part is not None else 0,
             db_part=db_part.data_ptr() if db_part is not None else 0, rows=m, dx_stride=n, dres_stride=n)
    if part is not None:
        second = outs[1] if len(outs) == 2 else None
        R.column_sums(dev, n, outs[0].dtype, second.dtype if second is not None else None).launch(
            dev, part.data_ptr(), outs[0].data_ptr(), parts, second.data_ptr() if second is not None else 0)


def _partials(parts: int, n: int, dev: int, atomic: bool) -> torch.Tensor:
    """The (parts, N) fp32 partial column sums: zeroed for atomic adds, else each row written."""
    return torch.zeros((parts, n), dtype=torch.float32, device=torch.device("cuda", dev)) if atomic \
        else R.empty_f32((parts, n), dev)


def launch_bwd(dy: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
               d_residual_out: torch.Tensor | None, bias_dtype: torch.dtype | None, weight_offset: float,
               dx_dtype: torch.dtype | None, dres_dtype: torch.dtype | None, atomic: bool = False, *,
               kernel: str, mean: torch.Tensor | None = None,
               made_by: str = "fused_add_rmsnorm_fwd(..., store_rstd=True)", row: str = "residual_out",
               atomic_name: str = "atomic"
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The backward on real tensors (kernel: any backward of the skeleton; LayerNorm's with its
    mean): (dx, dresidual, dw, db). dx is dh in dx_dtype (default residual_out's); dresidual, the
    same values in dres_dtype, is None unless that type differs; dw None without a weight, db (in
    bias_dtype) None without a bias. made_by, row, atomic_name: the forward call whose statistics
    the checks ask for, and the names the caller's API gives the normalized row and the atomic
    flag (for messages)."""
    fast = _bwd_fast(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype, dres_dtype,
                     atomic, kernel, mean)
    if fast is not None:
        return fast
    n, w, offset = bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype,
                               dres_dtype, made_by, row=row)
    has_mean = L.KERNELS[kernel].stats.has_mean
    if has_mean:
        check_stat(mean, residual_out, "mean", made_by, row)
    has_bias = bias_dtype is not None
    h2, hs = rows_of(residual_out)
    dy2, dys = rows_of(dy)
    g2, gs = rows_of(d_residual_out) if d_residual_out is not None else (None, 0)
    rstd = rstd.contiguous()
    mean = mean.contiguous() if has_mean else None
    m = h2.numel() // n
    dx_dt = dx_dtype or residual_out.dtype
    dx = torch.empty(residual_out.shape, dtype=dx_dt, device=residual_out.device)
    dres = torch.empty(residual_out.shape, dtype=dres_dtype, device=dx.device) \
        if dres_dtype is not None and dres_dtype != dx_dt else None
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
    with R.on_device(dev):
        p = R.plan(dev, kernel=kernel, n=n, dtype=dt, wdtype=L.TORCH_DTYPES[w.dtype] if w is not None else dt,
                   eps=BWD_KEY_EPS, has_weight=w is not None, vec=vec, atomic_dw=atomic,
                   rdtype=L.TORCH_DTYPES[dres.dtype] if dres is not None else "", odtype=L.TORCH_DTYPES[dy.dtype],
                   xdtype=L.TORCH_DTYPES[dx_dt], bdtype="f32" if has_bias else "",  # db's sums in fp32
                   has_dres_out=g2 is not None, weight_offset=offset,
                   gdtype=L.TORCH_DTYPES[g2.dtype] if g2 is not None else "")  # d_residual_out in its own type
    if atomic and not p.layout.dw_regs:
        raise ValueError(f"{atomic_name}=True needs the column sums in registers; N={n} keeps them in memory: use the "
                         f"default {atomic_name}=False")
    if vec == R.MAX_VECTOR_BYTES // min(t.element_size() for t in rows if t is not None) and h2 is residual_out \
            and dy2 is dy and g2 is d_residual_out and w is weight:
        _BWD_SEEN[_bwd_key(kernel, dy, residual_out, weight, d_residual_out, bias_dtype, offset, dx_dtype, dres_dtype,
                           atomic, mean)] = (p, None if dx_dt == residual_out.dtype else dx_dt,
                                             dres.dtype if dres is not None else None, has_mean)
    _bwd_launch(p, dev, m, n, atomic, dw, db, x=h2.data_ptr(), w=w.data_ptr() if w is not None else 0,
                dy=dy2.data_ptr(), rstd=rstd.data_ptr(), mean=mean.data_ptr() if has_mean else 0,
                dres_out=g2.data_ptr() if g2 is not None else 0, dx=dx.data_ptr(),
                dres=dres.data_ptr() if dres is not None else 0, x_stride=hs, dy_stride=dys, dres_out_stride=gs)
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
    traced one), applied only where a gradient is needed (eager_forward): the statistics and
    residual_out are always stored. kernels: the (forward, backward) pair, this module's or
    LayerNorm's. Returns (y, residual_out); residual_out is None without a residual."""

    @staticmethod
    def forward(ctx, kernels, x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset):
        ctx.set_materialize_grads(False)  # an unused residual_out's gradient stays None: not read
        y, res_out, rstd, mean = launch_fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset,
                                            True, True, kernels[0])
        ctx.kernel = kernels[1]
        ctx.has_residual, ctx.bias_dtype, ctx.weight_offset = residual is not None, bias.dtype if bias is not None \
            else None, weight_offset
        ctx.dtypes = (x.dtype, residual.dtype if residual is not None else None)
        ctx.y_dtype = y.dtype
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
                (dw if need[3] else None), (db if need[4] else None), None, None, None, None)


_apply = R.c_apply(FusedNormFunction)


def eager_forward(kernels, x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, keep):
    """The fused norms' eager forward: through FusedNormFunction where a gradient is needed, else
    the launch alone, storing no statistics (torch.no_grad, inference). Returns (y, residual_out)."""
    if torch.is_grad_enabled() and (x.requires_grad or (residual is not None and residual.requires_grad)
                                    or (weight is not None and weight.requires_grad)
                                    or (bias is not None and bias.requires_grad)):
        return _apply(kernels, x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset)
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
