"""RMSNorm: the forward and backward launches, float64 references, the custom ops
(torch.ops.normir.rmsnorm_fwd / rmsnorm_bwd, with autograd and fake implementations), the public
functions and the nn.Module. The shared machinery is in _rows.py.

    y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps)  over the last dim, fp32 accumulation
    dx = (dy * w - x_hat * c1) * rstd,  c1 = mean(x_hat * dy * w),  dw = sum_rows(dy * x_hat)
"""

from __future__ import annotations

import torch

from . import _rows as R
from ._fused import bwd_checks, launch_bwd, launch_fwd
from ._rows import check_eps, check_input, check_weight
from .fused_add_rmsnorm import fused_norm

FWD, BWD = "rmsnorm_fwd", "rmsnorm_bwd"

# ---------------------------------------------------------------------------- launches


MADE_BY = "rmsnorm_fwd(..., store_rstd=True)"


def _fwd(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
         store_rstd: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward on real tensors: (y, rstd), rstd None unless store_rstd (the skeleton's
    launcher, every feature off, with its fast path for repeated calls)."""
    y, _, rstd, _ = launch_fwd(x, None, weight, None, eps, None, None, 0.0, store_rstd, False, FWD)
    return y, rstd


def _fwd_checks(x, weight, eps, values=True, device=True):
    """The forward's checks (values, device: as _fused.fwd_checks')."""
    check_eps(eps, values)
    check_input(x, "x", device)
    check_weight(weight, x, x.shape[-1])


def _bwd_checks(x, weight, dy, rstd, device=True):
    return bwd_checks(dy, x, weight, rstd, None, None, 0.0, None, None, MADE_BY, row="x", device=device)


def _bwd(x: torch.Tensor, weight: torch.Tensor | None, dy: torch.Tensor, rstd: torch.Tensor,
         atomic_dw: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The backward on real tensors: (dx, dw), dw None without a weight."""
    dx, _, dw, _ = launch_bwd(dy, x, weight, rstd, None, None, 0.0, None, None, atomic_dw, kernel=BWD,
                              made_by=MADE_BY, row="x", atomic_name="atomic_dw")
    return dx, dw


# ---------------------------------------------------------------------------- custom ops


@R.custom_op("rmsnorm_fwd")
def _fwd_op(x: torch.Tensor, weight: torch.Tensor | None, eps: float, store_rstd: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd); rstd has shape x.shape[:-1] when store_rstd, else (0,)."""
    y, rstd = _fwd(x, weight, eps, store_rstd)
    return y, (rstd if rstd is not None else R.stat_out(x, False))


@_fwd_op.register_fake
def _(x, weight, eps, store_rstd):
    _fwd_checks(x, weight, eps, device=False)
    return torch.empty_like(x), R.stat_out(x, store_rstd)


@R.custom_op("rmsnorm_bwd")
def _bwd_op(x: torch.Tensor, weight: torch.Tensor | None, dy: torch.Tensor, rstd: torch.Tensor,
            atomic_dw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw); dw has the weight's shape and dtype, or shape (0,) without a weight."""
    dx, dw = _bwd(x, weight, dy, rstd, atomic_dw)
    return dx, (dw if dw is not None else x.new_empty((0,)))


@_bwd_op.register_fake
def _(x, weight, dy, rstd, atomic_dw):
    _bwd_checks(x, weight, dy, rstd, device=False)
    dw = torch.empty_like(weight) if weight is not None else x.new_empty((0,))
    return torch.empty_like(x), dw


def _fwd_setup(ctx, inputs, output):
    x, weight, _, store_rstd = inputs
    ctx.store_rstd = store_rstd
    ctx.save_for_backward(x, weight, output[1])
    ctx.mark_non_differentiable(output[1])


@R.first_order_only("normir.rmsnorm (torch.ops.normir.rmsnorm_fwd)", R.TORCH_RMS)
def _fwd_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    if not ctx.store_rstd:
        raise RuntimeError("normir::rmsnorm_fwd was called with store_rstd=False, so it saved no rstd for the "
                           "backward: call it with store_rstd=True (normir.rmsnorm does) when a gradient is needed")
    dx, dw = torch.ops.normir.rmsnorm_bwd(x, weight, dy, rstd, False)
    need_x, need_w = ctx.needs_input_grad[:2]
    return (dx if need_x else None), (dw if need_w and weight is not None else None), None, None


_fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup)
_fwd_op.vmap_rows(("x",), lambda x, weight, eps, store_rstd: (True, store_rstd))


# ---------------------------------------------------------------------------- public API


def rmsnorm_fwd(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
                store_rstd: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, over the last dim; fp32 accumulation.

    Returns (y, rstd): y has x's shape and dtype; rstd (float32, shape x.shape[:-1]) only when
    store_rstd, else None. weight: None, or (N,) in x's dtype or float32. x is not modified.
    """
    if R.eager(x):  # launch directly
        return _fwd(x, weight, eps, store_rstd)
    _fwd_checks(x, weight, eps, values=False)  # the fake implementation leaves the device out
    y, rstd = _fwd_op(x, weight, eps, store_rstd)
    return y, (rstd if store_rstd else None)


def rmsnorm_bwd(x: torch.Tensor, weight: torch.Tensor | None, dy: torch.Tensor, rstd: torch.Tensor,
                atomic_dw: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of rmsnorm: (dx, dw). rstd is the forward's (store_rstd=True).

    dw is None without a weight, else in the weight's dtype, summed in fp32 in a fixed order
    (bit-identical across runs). atomic_dw=True adds block sums with fp32 atomics instead (not
    bit-reproducible; offered for comparison) and needs a row that fits the register mode.
    """
    if R.eager(x):
        return _bwd(x, weight, dy, rstd, atomic_dw)
    _bwd_checks(x, weight, dy, rstd)
    dx, dw = _bwd_op(x, weight, dy, rstd, atomic_dw)
    return dx, (dw if weight is not None else None)


class RMSNormFunction(torch.autograd.Function):
    """The eager autograd path (the custom op's registered autograd is the traced one)."""

    @staticmethod
    def forward(ctx, x, weight, eps):  # applied only where a gradient is needed: rstd always stored
        y, rstd = _fwd(x, weight, eps, True)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    @R.first_order_only("normir.rmsnorm", R.TORCH_RMS)
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = _bwd(x, weight, dy, rstd, False)
        need_x, need_w, _ = ctx.needs_input_grad
        return (dx if need_x else None), (dw if need_w else None), None


_apply = R.c_apply(RMSNormFunction)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6, *,
            bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, prenorm: bool = False,
            residual_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None,
            weight_offset: float = 0.0):
    """RMSNorm with autograd: y = x * rstd * (weight + weight_offset) + bias.

    With a residual, the residual add is fused: h = x + residual (fp32), residual_out = h in
    residual_dtype (default residual's), and y normalizes residual_out as stored. Returns y, or
    (y, residual_out) with prenorm (residual_out is x itself without a residual). y is in
    out_dtype (default x's). x, residual, weight and bias are each f32, f16 or bf16.

    Under torch.autocast("cuda"), y (without an out_dtype) has the dtype torch.rms_norm gives
    there: float32 where this torch puts aten::rms_norm on autocast's fp32 list (2.12 and later),
    else x's (autocast leaves it alone: torch 2.11). No input is cast; gradients come back in
    each input's dtype. First derivatives only: a second backward through it raises.
    """
    if out_dtype is None and torch.is_autocast_enabled():
        out_dtype = R.autocast_out_dtype("rmsnorm", x)
    if bias is None and residual is None and prenorm is False and residual_dtype is None and out_dtype is None \
            and weight_offset == 0.0:
        need_grad = torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad))
        if R.eager(x):  # without a gradient to take, the launch alone: no Function, no rstd stored
            return _apply(x, weight, eps) if need_grad else _fwd(x, weight, eps, False)[0]
        _fwd_checks(x, weight, eps, values=False)  # the fake implementation leaves the device out
        return _fwd_op(x, weight, eps, need_grad)[0]
    return fused_norm(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, prenorm)


# ---------------------------------------------------------------------------- references


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 reference: (y, rstd)."""
    xd = x.double()
    rstd = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    y = xd * rstd
    if weight is not None:
        y = y * weight.double()
    return y, rstd.squeeze(-1)


def rmsnorm_bwd_ref(x, weight, dy, eps):
    """float64 reference gradients (dx, dw) through autograd."""
    xd = x.detach().double().requires_grad_(True)
    wd = weight.detach().double().requires_grad_(True) if weight is not None else None
    y, _ = rmsnorm_ref(xd, wd, eps)
    grads = torch.autograd.grad(y, [xd] + ([wd] if wd is not None else []), dy.double())
    return grads[0], (grads[1] if wd is not None else None)


# ---------------------------------------------------------------------------- module


FP32_EPS = torch.finfo(torch.float32).eps  # torch.rms_norm's eps=None: its opmath type's epsilon


class RMSNorm(torch.nn.Module):
    """Drop-in for torch.nn.RMSNorm over the last dimension: eps=None means what torch.rms_norm
    takes then, the machine epsilon of its fp32 math (float32's, 1.19e-7, for float16, bfloat16
    and float32 inputs alike; torch's docs say the input dtype's, its code and an H200 with
    torch 2.11 say float32's); under torch.autocast("cuda") its output has torch.nn.RMSNorm's
    dtype there (see normir.rmsnorm)."""

    def __init__(self, hidden_size: int, eps: float | None = 1e-6, elementwise_affine: bool = True,
                 device=None, dtype=None):
        super().__init__()
        n = hidden_size[0] if isinstance(hidden_size, (tuple, list, torch.Size)) and len(hidden_size) == 1 \
            else hidden_size
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"hidden_size={hidden_size!r}: normir normalizes the last dimension only; pass an int "
                             "or a 1-tuple (the size of the last dimension)")
        self.normalized_shape = (n,)
        self.eps = None if eps is None else check_eps(eps)
        self.elementwise_affine = elementwise_affine
        self.register_parameter("weight", torch.nn.Parameter(torch.ones(n, device=device, dtype=dtype))
                                if elementwise_affine else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm(x, self.weight, self.eps if self.eps is not None else FP32_EPS)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
