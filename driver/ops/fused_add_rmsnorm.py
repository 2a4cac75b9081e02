"""Fused residual-add RMSNorm (and RMSNorm with a bias, an output dtype or a weight offset): the
launches, float64 references, custom ops (torch.ops.normir.fused_add_rmsnorm_fwd / _bwd, with
fake implementations and registered autograd), the public functions and the module. What the
fused norms share (checks, launches, the eager autograd Function) is in _fused.py, what every
row op shares in _rows.py; the kernels are the family's skeletons with the residual, bias and
offset flags on.

    h = x + residual (fp32), residual_out = h stored in residual_dtype (default: residual's)
    y = rmsnorm(residual_out as stored) * (w + weight_offset) + b, in out_dtype (default: x's)
    dh = (dy * w' - h_hat * c1) * rstd + d_residual_out;  dx = dresidual = dh
    dw = sum_rows(dy * h_hat),  db = sum_rows(dy)

The norm is taken of residual_out as stored, which is exactly what the backward reads, so forward
and backward differentiate one function. Without a residual, the normalized row is x itself.
"""

from __future__ import annotations

import torch

from . import _rows as R
from ._fused import (
    bwd_checks,
    bwd_outputs,
    eager_forward,
    fake_bwd_outputs,
    fwd_checks,
    grads_ref,
    launch_bwd,
    launch_fwd,
)
from ._rows import check_eps

FWD, BWD = "fused_add_rmsnorm_fwd", "fused_add_rmsnorm_bwd"


# ---------------------------------------------------------------------------- custom ops


@R.custom_op("fused_add_rmsnorm_fwd")
def _fwd_op(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
            eps: float, residual_dtype: torch.dtype | None, out_dtype: torch.dtype | None, weight_offset: float,
            store_rstd: bool, store_residual: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, residual_out, rstd); residual_out and rstd have shape (0,) where not stored."""
    y, res_out, rstd, _ = launch_fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset,
                                     store_rstd, store_residual, FWD)
    return y, (res_out if res_out is not None else x.new_empty((0,))), \
        (rstd if rstd is not None else R.stat_out(x, False))


@_fwd_op.register_fake
def _(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, store_rstd, store_residual):
    fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, device=False)
    y = x.new_empty(x.shape, dtype=out_dtype or x.dtype)
    stored = store_residual and residual is not None
    res_out = x.new_empty(x.shape if stored else (0,), dtype=(residual_dtype or residual.dtype) if stored else x.dtype)
    return y, res_out, R.stat_out(x, store_rstd)


@R.custom_op("fused_add_rmsnorm_bwd")
def _bwd_op(dy: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
            d_residual_out: torch.Tensor | None, bias_dtype: torch.dtype | None, weight_offset: float,
            dx_dtype: torch.dtype | None, dres_dtype: torch.dtype | None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dresidual, dw, db); dresidual has shape (0,) unless its dtype differs from dx's (then
    dx is both gradients), dw and db (0,) without a weight or bias."""
    return bwd_outputs(*launch_bwd(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset,
                                   dx_dtype, dres_dtype, kernel=BWD))


@_bwd_op.register_fake
def _(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype, dres_dtype):
    n = bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype, dres_dtype,
                   device=False)[0]
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


@R.first_order_only("normir.rmsnorm with a residual, bias, weight offset or out_dtype "
                     "(torch.ops.normir.fused_add_rmsnorm_fwd)", R.TORCH_RMS)
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
_fwd_op.vmap_rows(("x", "residual"), lambda x, residual, *args: (
    True, args[-1] and residual is not None, args[-2]))  # y; residual_out, rstd where stored


# ---------------------------------------------------------------------------- public API


def fused_norm(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, prenorm):
    """normir.rmsnorm's general form, with autograd: y, or (y, residual_out) with prenorm. The
    eager Function or, while tracing, the custom op. Without a residual, residual_out is x itself
    (x.to(residual_dtype) where that type is given and differs). Under torch.autocast("cuda"), y
    (without an out_dtype) has torch.rms_norm's dtype there (see normir.rmsnorm)."""
    if out_dtype is None and torch.is_autocast_enabled():
        out_dtype = R.autocast_out_dtype("rmsnorm", x)
    if not isinstance(prenorm, bool):
        raise TypeError(f"prenorm must be a bool, got {type(prenorm).__name__}")
    if R.eager(x):
        y, res_out = eager_forward((FWD, BWD), x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset,
                                   prenorm)
    else:  # the checks first: the dispatcher's own type errors name no fix
        fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, values=False)
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, residual, weight, bias))
        y, res_out, _ = _fwd_op(x, residual, weight, bias, eps, residual_dtype,
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
        y, res_out, rstd, _ = launch_fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset,
                                         store_rstd, True, FWD)
    else:
        fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, values=False)
        y, res_out, rstd = _fwd_op(x, residual, weight, bias, eps, residual_dtype,
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
        dx, dres, dw, db = launch_bwd(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset,
                                      dx_dtype, dresidual_dtype, atomic, kernel=BWD)
    else:
        bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype,
                   dresidual_dtype, values=False)
        dx, dres, dw, db = _bwd_op(dy, residual_out, weight, rstd, d_residual_out,
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
