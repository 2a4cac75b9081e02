"""LayerNorm and fused residual-add LayerNorm: custom ops (torch.ops.normir.layernorm_fwd / _bwd,
with fake implementations and registered autograd), the public functions, float64 references and
the modules. The launches and the eager autograd Function are the fused norms' (_fused.py) with
LayerNorm's kernels, which are the family's skeletons with the
LayerNorm statistics piece (mlir/common/stats_layer.mlir).

    h = x + residual (fp32; optional), residual_out = h stored in residual_dtype
    mean = mean(h), var = mean((h - mean)^2) (centered, merged by Chan's update)
    y = (h - mean) * rstd * w + b, in out_dtype (default x's)
    dh = (wdy - c1 - h_hat * c2) * rstd + d_residual_out, c1 = mean(wdy), c2 = mean(wdy * h_hat)
    dw = sum_rows(dy * h_hat),  db = sum_rows(dy)
"""

from __future__ import annotations

import torch

from . import _rows as R
from ._fused import (
    bwd_checks,
    bwd_outputs,
    check_dtype,
    eager_forward,
    fake_bwd_outputs,
    fwd_checks,
    grads_ref,
    launch_bwd,
    launch_fwd,
)
from ._rows import check_eps, check_stat

FWD, BWD = "layernorm_fwd", "layernorm_bwd"
MADE_BY = "layernorm_fwd(..., store_stats=True)"


def _check_mean(mean, h, name="residual_out"):
    check_stat(mean, h, "mean", MADE_BY, name)


# ---------------------------------------------------------------------------- custom ops


@R.custom_op("layernorm_fwd")
def _fwd_op(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
            eps: float, residual_dtype: torch.dtype | None, out_dtype: torch.dtype | None, store_stats: bool,
            store_residual: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, residual_out, mean, rstd); residual_out, mean and rstd have shape (0,) where not stored."""
    y, res_out, rstd, mean = launch_fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, 0.0, store_stats,
                                  store_residual, FWD)
    return y, (res_out if res_out is not None else x.new_empty((0,))), \
        (mean if mean is not None else R.stat_out(x, False)), (rstd if rstd is not None else R.stat_out(x, False))


@_fwd_op.register_fake
def _(x, residual, weight, bias, eps, residual_dtype, out_dtype, store_stats, store_residual):
    fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, 0.0, device=False)
    y = x.new_empty(x.shape, dtype=out_dtype or x.dtype)
    stored = store_residual and residual is not None
    res_out = x.new_empty(x.shape if stored else (0,), dtype=(residual_dtype or residual.dtype) if stored else x.dtype)
    return y, res_out, R.stat_out(x, store_stats), R.stat_out(x, store_stats)


@R.custom_op("layernorm_bwd")
def _bwd_op(dy: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor,
            rstd: torch.Tensor, d_residual_out: torch.Tensor | None, bias_dtype: torch.dtype | None,
            dx_dtype: torch.dtype | None, dres_dtype: torch.dtype | None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dresidual, dw, db); dresidual has shape (0,) unless its dtype differs from dx's (then
    dx is both gradients), dw and db (0,) without a weight or bias."""
    return bwd_outputs(*launch_bwd(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, 0.0, dx_dtype, dres_dtype,
                                   mean=mean, kernel=BWD, made_by=MADE_BY))


@_bwd_op.register_fake
def _(dy, residual_out, weight, mean, rstd, d_residual_out, bias_dtype, dx_dtype, dres_dtype):
    n = bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, 0.0, dx_dtype, dres_dtype, MADE_BY,
                   device=False)[0]
    _check_mean(mean, residual_out)
    return fake_bwd_outputs(residual_out, weight, n, bias_dtype, dx_dtype, dres_dtype)


def _fwd_setup(ctx, inputs, output):
    x, residual, weight, bias, _, _, _, store_stats, store_residual = inputs
    y, res_out, mean, rstd = output
    ctx.has_residual, ctx.bias_dtype = residual is not None, bias.dtype if bias is not None else None
    ctx.dtypes = (x.dtype, residual.dtype if residual is not None else None)
    ctx.ready = store_stats and (store_residual or residual is None)
    ctx.save_for_backward(res_out if residual is not None else x, weight, mean, rstd)
    ctx.mark_non_differentiable(mean, rstd)


@R.first_order_only("normir.layernorm (torch.ops.normir.layernorm_fwd)", R.TORCH_LN)
def _fwd_backward(ctx, dy, d_res_out, _dmean, _drstd):
    if not ctx.ready:
        raise RuntimeError("normir::layernorm_fwd saved no mean, rstd or residual_out for the backward: call it "
                           "with store_stats=True and store_residual=True (normir.layernorm does) when a gradient "
                           "is needed")
    h, weight, mean, rstd = ctx.saved_tensors
    x_dtype, r_dtype = ctx.dtypes
    g = d_res_out if ctx.has_residual and d_res_out is not None and d_res_out.numel() else None
    dx, dres, dw, db = torch.ops.normir.layernorm_bwd(dy, h, weight, mean, rstd, g, ctx.bias_dtype, x_dtype, r_dtype)
    need = ctx.needs_input_grad
    dres = dres if dres.numel() or not ctx.has_residual else dx
    return ((dx if need[0] else None), (dres if ctx.has_residual and need[1] else None),
            (dw if weight is not None and need[2] else None), (db if ctx.bias_dtype and need[3] else None),
            None, None, None, None, None)


_fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup)
_fwd_op.vmap_rows(("x", "residual"), lambda x, residual, *args: (
    True, args[-1] and residual is not None, args[-2], args[-2]))  # y; residual_out, mean, rstd where stored


# ---------------------------------------------------------------------------- public API


def layernorm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
              eps: float = 1e-5, *, residual: torch.Tensor | None = None, prenorm: bool = False,
              residual_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None):
    """LayerNorm over the last dimension with autograd: y = (x - mean) * rstd * weight + bias.

    With a residual, the residual add is fused: h = x + residual (fp32), residual_out = h in
    residual_dtype (default residual's), and y normalizes residual_out as stored. Returns y, or
    (y, residual_out) with prenorm (residual_out is x itself without a residual). y is in
    out_dtype (default x's). x, residual, weight and bias are each f32, f16 or bf16.

    Under torch.autocast("cuda"), y (without an out_dtype) is float32, as torch's layer_norm
    gives there (aten::layer_norm is on autocast's fp32 list). No input is cast: the kernels read
    each in its own type, which is what the casts would give, and write y in float32; gradients
    come back in each input's dtype. First derivatives only: a second backward through it raises.
    """
    if out_dtype is None and torch.is_autocast_enabled():
        out_dtype = R.autocast_out_dtype("layernorm", x)
    if not isinstance(prenorm, bool):
        raise TypeError(f"prenorm must be a bool, got {type(prenorm).__name__}")
    if R.eager(x):
        y, res_out = eager_forward((FWD, BWD), x, residual, weight, bias, eps, residual_dtype, out_dtype, 0.0,
                                   prenorm)
    else:  # the checks first: the dispatcher's own type errors name no fix
        fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, 0.0, values=False)
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, residual, weight, bias))
        y, res_out, _, _ = _fwd_op(x, residual, weight, bias, eps, residual_dtype, out_dtype,
                                                          grad, grad or prenorm)
    if not prenorm:
        return y
    if residual is None:
        res_out = x if residual_dtype is None or residual_dtype == x.dtype else x.to(residual_dtype)
    return y, res_out


def fused_add_layernorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
                        bias: torch.Tensor | None, eps: float = 1e-5, prenorm: bool = True, *,
                        residual_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None):
    """h = x + residual; y = layernorm(h) * weight + bias, with autograd. Returns (y,
    residual_out) with prenorm (the default), else y; see normir.layernorm."""
    return layernorm(x, weight, bias, eps, residual=residual, prenorm=prenorm, residual_dtype=residual_dtype,
                     out_dtype=out_dtype)


def fused_add_layernorm_fwd(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
                            bias: torch.Tensor | None, eps: float = 1e-5, *,
                            residual_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None,
                            store_stats: bool = False):
    """The forward alone: (y, residual_out, mean, rstd). residual_out is x itself without a
    residual; mean and rstd (fp32, x.shape[:-1]) only with store_stats, else None."""
    if R.eager(x):
        y, res_out, rstd, mean = launch_fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, 0.0, store_stats,
                                      True, FWD)
    else:
        fwd_checks(x, residual, weight, bias, eps, residual_dtype, out_dtype, 0.0, values=False)
        y, res_out, mean, rstd = _fwd_op(x, residual, weight, bias, eps, residual_dtype,
                                                                out_dtype, store_stats, True)
    stats = (mean, rstd) if store_stats else (None, None)
    return y, (res_out if residual is not None else x), *stats


def fused_add_layernorm_bwd(dy: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor | None,
                            mean: torch.Tensor, rstd: torch.Tensor, d_residual_out: torch.Tensor | None = None, *,
                            has_bias: bool = False, dx_dtype: torch.dtype | None = None,
                            dresidual_dtype: torch.dtype | None = None, db_dtype: torch.dtype | None = None,
                            atomic: bool = False):
    """The backward alone: (dh, dw, db). dh = (wdy - c1 - h_hat * c2) * rstd (+ d_residual_out)
    is the gradient of both x and residual, in dx_dtype (default residual_out's); where
    dresidual_dtype differs from it, dh is the pair (dx, dresidual), both written in one pass. dw
    is None without a weight, db None unless has_bias (in db_dtype, default the weight's); both
    summed in fp32 in a fixed order (atomic=True: fp32 atomics)."""
    if not isinstance(has_bias, bool):
        raise TypeError(f"has_bias must be a bool, got {type(has_bias).__name__}")
    check_dtype(db_dtype, "db_dtype")
    bias_dtype = (db_dtype or (weight.dtype if isinstance(weight, torch.Tensor) else None) or dx_dtype
                  or residual_out.dtype) if has_bias else None
    if R.eager(dy):
        dx, dres, dw, db = launch_bwd(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, 0.0, dx_dtype,
                                      dresidual_dtype, atomic, mean=mean, kernel=BWD, made_by=MADE_BY)
    else:
        bwd_checks(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, 0.0, dx_dtype, dresidual_dtype, MADE_BY)
        _check_mean(mean, residual_out)
        dx, dres, dw, db = _bwd_op(dy, residual_out, weight, mean, rstd, d_residual_out,
                                                          bias_dtype, dx_dtype, dresidual_dtype)
        dres = dres if dres.numel() else None
        dw, db = (dw if weight is not None else None), (db if has_bias else None)
    return (dx if dres is None else (dx, dres)), dw, db


def layernorm_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5, *,
                  store_stats: bool = False):
    """The forward alone: (y, mean, rstd); mean and rstd (fp32, x.shape[:-1]) only with
    store_stats, else None."""
    if R.eager(x):  # straight to the launch: small calls are host-bound
        y, _, rstd, mean = launch_fwd(x, None, weight, bias, eps, None, None, 0.0, store_stats, True, FWD)
        return y, mean, rstd
    y, _, mean, rstd = fused_add_layernorm_fwd(x, None, weight, bias, eps, store_stats=store_stats)
    return y, mean, rstd


def layernorm_bwd(x: torch.Tensor, weight: torch.Tensor | None, dy: torch.Tensor, mean: torch.Tensor,
                  rstd: torch.Tensor, *, has_bias: bool = False, atomic: bool = False):
    """The backward alone: (dx, dw, db) of y = layernorm(x) * weight + bias, from the mean and
    rstd layernorm_fwd(..., store_stats=True) returned; dw None without a weight, db None unless
    has_bias."""
    return fused_add_layernorm_bwd(dy, x, weight, mean, rstd, has_bias=has_bias, atomic=atomic)


# ---------------------------------------------------------------------------- references


def layernorm_ref(x, weight, bias, eps, residual=None, residual_dtype=None):
    """float64 reference: (y, residual_out, mean, rstd). With a residual, h = x + residual in fp32,
    rounded to residual_dtype as the kernel stores it, and normalized as stored."""
    if residual is not None:
        h = (x.float() + residual.float()).to(residual_dtype or residual.dtype)
    else:
        h = x if residual_dtype is None else x.to(residual_dtype)
    y, mean, rstd = _norm_ref((h if residual is not None else x).double(), weight, bias, eps)
    return y, h, mean, rstd


def _norm_ref(hd, weight, bias, eps):
    mean = hd.mean(-1, keepdim=True)
    var = (hd - mean).pow(2).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = (hd - mean) * rstd
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y, mean.squeeze(-1), rstd.squeeze(-1)


def layernorm_bwd_ref(h, weight, bias, eps, dy, d_residual_out=None):
    """float64 reference gradients (dh, dw, db) of y = layernorm(h) * w + b and of residual_out =
    h, given dy and d_residual_out, through autograd; dw, db None where absent."""
    return grads_ref(lambda hd, w, b: _norm_ref(hd, w, b, eps)[0], h, weight, bias, dy, d_residual_out)


# ---------------------------------------------------------------------------- modules


def _hidden(normalized_shape) -> int:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or isinstance(shape[0], bool) or not isinstance(shape[0], int) or shape[0] < 1:
        raise ValueError(f"normalized_shape={normalized_shape!r}: normir normalizes the last dimension only; pass "
                         "an int or a 1-tuple (the size of the last dimension)")
    return shape[0]


class LayerNorm(torch.nn.Module):
    """Drop-in for torch.nn.LayerNorm over the last dimension: the same arguments (normalized_shape
    an int or a 1-tuple), parameters and state_dict keys (weight, bias); under
    torch.autocast("cuda") its output is float32, as torch.nn.LayerNorm's (see normir.layernorm)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        n = _hidden(normalized_shape)
        self.normalized_shape = (n,)
        self.eps = check_eps(eps)
        self.elementwise_affine = elementwise_affine
        kw = {"device": device, "dtype": dtype}
        self.register_parameter("weight", torch.nn.Parameter(torch.empty(n, **kw)) if elementwise_affine else None)
        self.register_parameter("bias", torch.nn.Parameter(torch.empty(n, **kw)) if elementwise_affine and bias
                                else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class FusedAddLayerNorm(LayerNorm):
    """forward(x, residual) -> (y, residual_out): h = x + residual, y = layernorm(h) * weight +
    bias, residual_out = h in residual_dtype (default: residual's)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 residual_dtype: torch.dtype | None = None, device=None, dtype=None):
        super().__init__(hidden_size, eps, elementwise_affine, bias, device, dtype)
        self.residual_dtype = residual_dtype

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_add_layernorm(x, residual, self.weight, self.bias, self.eps, residual_dtype=self.residual_dtype)
