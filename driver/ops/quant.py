"""Quantized-output norms for serving: RMSNorm and LayerNorm (each with the fused residual add)
writing y as fp8 e4m3fn or int8 for the next GEMM, in one read of the inputs: custom ops
(torch.ops.normir.rmsnorm_quant_fwd, layernorm_quant_fwd, with fake implementations), the public
functions and the references. Forward only: no gradient flows through them.

    h = x + residual (fp32; optional), residual_out = h stored in residual_dtype
    y = norm(residual_out as stored) * (w + weight_offset) + b        (normir's fused-add rule)
    v = y * smooth (SmoothQuant; optional)
    static scale s (a 1-element fp32 tensor):   q = quantize(v * (1 / s)), 1 / s an IEEE divide
    dynamic, per row: a = max |v| over the row (NaN ignored), a = min(a, scale_ub) (fp8, optional)
      fp8:  s = max(a / 448, 1 / (448 * 512)),  q = quantize(v / s) (a true divide)
      int8: s = max(a / 127, FLT_EPSILON),      q = quantize(v * (1 / s))
    quantize, fp8:  clamp to [-448, 448] (NaN -> +448, inf -> +-448), round to nearest even
    quantize, int8: round to nearest even, saturate to [-128, 127], NaN -> 0

The kernels are the forward skeleton's with the QUANT flags (mlir/norm_fwd.mlir): the dynamic
scale's amax is a pass of its own over the row held in registers, then the stores.
"""

from __future__ import annotations

import functools

import torch

from .. import launch as L
from . import _rows as R
from ._fused import check_dtype, fwd_checks
from ._rows import rows_of

RMS, LN = "rmsnorm_quant_fwd", "layernorm_quant_fwd"
QUANTS = {"fp8": ("f8e4m3", torch.float8_e4m3fn, 448.0, 1.0 / (448.0 * 512.0)),
          "int8": ("i8", torch.int8, 127.0, torch.finfo(torch.float32).eps)}


# ---------------------------------------------------------------------------- checks


def _check_scalar(t: torch.Tensor | None, name: str, x: torch.Tensor) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a float32 tensor of one element (or None), got {type(t).__name__}")
    if t.dtype != torch.float32 or t.numel() != 1 or t.device != x.device:
        raise ValueError(f"{name} must be a float32 tensor of one element on x's device ({x.device}); got "
                         f"{t.dtype} of shape {tuple(t.shape)} on {t.device}")


def quant_checks(x, residual, weight, bias, scale, scale_ub, smooth, eps, weight_offset, quant, residual_dtype,
                 values=True, device=True):
    """The quantized forwards' checks (values, device: as _fused.fwd_checks'): the norm's, then the
    quantization's arguments. Returns (eps, n, weight offset, q's torch dtype)."""
    eps, n, _, _, offset = fwd_checks(x, residual, weight, bias, eps, residual_dtype, None, weight_offset, values,
                                      device)
    if quant not in QUANTS:
        raise ValueError(f"quant={quant!r}: choose 'fp8' (float8_e4m3fn) or 'int8'")
    _check_scalar(scale, "scale", x)
    _check_scalar(scale_ub, "scale_ub", x)
    if scale_ub is not None and (scale is not None or quant != "fp8"):
        raise ValueError("scale_ub caps the dynamic fp8 scales' amax: it needs quant='fp8' and no static scale "
                         "(scale=None)")
    if smooth is not None:
        if not isinstance(smooth, torch.Tensor):
            raise TypeError(f"smooth must be a float32 tensor of shape ({n},) or None, got {type(smooth).__name__}")
        if smooth.dtype != torch.float32 or tuple(smooth.shape) != (n,) or smooth.device != x.device:
            raise ValueError(f"smooth must be a float32 tensor of shape ({n},) on x's device ({x.device}) "
                             f"(SmoothQuant's per-channel factors); got {smooth.dtype} of shape "
                             f"{tuple(smooth.shape)} on {smooth.device}")
    return eps, n, offset, QUANTS[quant][1]


# ---------------------------------------------------------------------------- launches


def launch_quant(kernel, x, residual, weight, bias, scale, scale_ub, smooth, eps, weight_offset, quant,
                 residual_dtype, return_y, store_stats, enable_pdl=None):
    """The quantized forward on real tensors: (q, scales, residual_out, y, mean, rstd), those not
    asked for None (scales: the per-row ones of the dynamic form); enable_pdl as _rows.use_pdl's."""
    eps, n, offset, q_dtype = quant_checks(x, residual, weight, bias, scale, scale_ub, smooth, eps, weight_offset,
                                           quant, residual_dtype)
    x2, xs = rows_of(x)
    r2, rs = rows_of(residual) if residual is not None else (None, 0)
    m = x2.numel() // n
    dev = x.get_device()
    h_dtype = (residual_dtype or residual.dtype) if residual is not None else x.dtype
    q = torch.empty(x.shape, dtype=q_dtype, device=x.device)
    dynamic = scale is None
    scales = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device) if dynamic else None
    res_out = torch.empty(x.shape, dtype=h_dtype, device=x.device) if residual is not None else None
    y = torch.empty_like(x) if return_y else None
    has_mean = L.KERNELS[kernel].stats.has_mean
    rstd = R.empty_f32(x.shape, dev, per_row=True) if store_stats else None
    mean = R.empty_f32(x.shape, dev, per_row=True) if store_stats and has_mean else None
    if m:
        rows = (x2, r2, y, res_out)  # the float rows set the vector; q's chunk is as many bytes
        vec = R.vector_width(n, (*rows, weight, bias, smooth, q), (xs, rs) if r2 is not None else (xs,),
                             rows=len(rows))
        dt = L.TORCH_DTYPES[x.dtype]
        p = R.plan(dev, kernel=kernel, n=n, dtype=dt, wdtype=L.TORCH_DTYPES[weight.dtype] if weight is not None else dt,
                   eps=eps, has_weight=weight is not None, store_rstd=store_stats, vec=vec,
                   rdtype=L.TORCH_DTYPES[residual.dtype] if residual is not None else "",
                   sdtype=L.TORCH_DTYPES[h_dtype] if residual is not None else "",
                   bdtype=L.TORCH_DTYPES[bias.dtype] if bias is not None else "", store_residual=residual is not None,
                   weight_offset=offset, qdtype=QUANTS[quant][0], qdynamic=dynamic, has_smooth=smooth is not None,
                   has_scale_ub=scale_ub is not None, store_y=return_y, pdl=R.use_pdl(dev, enable_pdl))

        def ptr(t):
            return t.data_ptr() if t is not None else 0

        p.launch(dev, p.grid(m), x=x2.data_ptr(), residual=ptr(r2), w=ptr(weight), b=ptr(bias), y=ptr(y),
                 residual_out=ptr(res_out), rstd=ptr(rstd), mean=ptr(mean), q=q.data_ptr(), scale=ptr(scale),
                 scales=ptr(scales), scale_ub=ptr(scale_ub), smooth=ptr(smooth), rows=m, x_stride=xs,
                 residual_stride=rs, y_stride=n, residual_out_stride=n, q_stride=n)
    return q, scales, res_out, y, mean, rstd


def _outputs(x, q, scales, res_out, y, mean, rstd):
    """The custom op's outputs: absent ones as (0,)-shaped placeholders."""
    return (q, scales if scales is not None else R.stat_out(x, False),
            res_out if res_out is not None else x.new_empty((0,)), y if y is not None else x.new_empty((0,)),
            mean if mean is not None else R.stat_out(x, False), rstd if rstd is not None else R.stat_out(x, False))


def _fake(has_mean, x, residual, weight, bias, scale, scale_ub, smooth, eps, weight_offset, quant, residual_dtype,
          return_y, store_stats):
    q_dtype = quant_checks(x, residual, weight, bias, scale, scale_ub, smooth, eps, weight_offset, quant,
                           residual_dtype, device=False)[3]
    h_dtype = (residual_dtype or residual.dtype) if residual is not None else x.dtype
    return (x.new_empty(x.shape, dtype=q_dtype),
            x.new_empty((*x.shape[:-1], 1) if scale is None else (0,), dtype=torch.float32),
            x.new_empty(x.shape if residual is not None else (0,), dtype=h_dtype),
            x.new_empty(x.shape if return_y else (0,)), R.stat_out(x, store_stats and has_mean),
            R.stat_out(x, store_stats))


# ---------------------------------------------------------------------------- custom ops

def _op(kernel: str) -> R.Op:
    """normir::<kernel>: (q, scales, residual_out, y, mean, rstd), the absent ones (0,)-shaped
    (scales: the dynamic form's; mean: LayerNorm's); its fake runs the same checks."""

    def impl(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
             scale: torch.Tensor | None, scale_ub: torch.Tensor | None, smooth: torch.Tensor | None, eps: float,
             weight_offset: float, quant: str, residual_dtype: torch.dtype | None, return_y: bool, store_stats: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return _outputs(x, *launch_quant(kernel, x, residual, weight, bias, scale, scale_ub, smooth, eps,
                                         weight_offset, quant, residual_dtype, return_y, store_stats))

    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(*output)

    def backward(ctx, *grads):  # nothing to differentiate: every output is marked non-differentiable
        return (None,) * 13

    has_mean = L.KERNELS[kernel].stats.has_mean
    op = R.custom_op(kernel)(impl)
    op.register_fake(functools.partial(_fake, has_mean))
    op.register_autograd(backward, setup_context=setup_context)
    # q batched; scales where dynamic; residual_out with a residual; y with return_y; mean, rstd stored
    op.vmap_rows(("x", "residual"), lambda x, residual, weight, bias, scale, *rest: (
        True, scale is None, residual is not None, rest[-2], rest[-1] and has_mean, rest[-1]))
    return op


rmsnorm_quant_op, layernorm_quant_op = _op(RMS), _op(LN)
_OPS = {RMS: rmsnorm_quant_op, LN: layernorm_quant_op}


# ---------------------------------------------------------------------------- public API


def _quantized(kernel, x, weight, bias, eps, quant, scale, scale_ub, smooth, residual, residual_dtype,
               weight_offset, return_y, enable_pdl):
    if not isinstance(return_y, bool):
        raise TypeError(f"return_y must be a bool, got {type(return_y).__name__}")
    check_dtype(residual_dtype, "residual_dtype")
    args = (x, residual, weight, bias, scale, scale_ub, smooth, eps, weight_offset, quant, residual_dtype, return_y,
            False)
    if R.eager(x):
        q, scales, res_out, y, _, _ = launch_quant(kernel, *args, enable_pdl=enable_pdl)
    else:
        quant_checks(*args[:11], values=False)
        q, scales, res_out, y, _, _ = _OPS[kernel](*args)
    out = (q, scale if scale is not None else scales)
    out += (res_out,) if residual is not None else ()
    return out + ((y,) if return_y else ())


def rmsnorm_quant(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6, *, quant: str = "fp8",
                  scale: torch.Tensor | None = None, scale_ub: torch.Tensor | None = None,
                  smooth: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None, residual_dtype: torch.dtype | None = None,
                  weight_offset: float = 0.0, return_y: bool = False, enable_pdl: bool | None = None):
    """RMSNorm with its output quantized, in one read of x: (q, scales[, residual_out][, y]).

    quant: "fp8" (q in torch.float8_e4m3fn) or "int8". A `scale` (float32, one element) selects the
    static form, q = quantize(y / scale), and is returned as the scales; without one the scales are
    per row (float32, x.shape[:-1] + (1,)) from each row's amax, capped at `scale_ub` (fp8 only).
    `smooth` (float32, (N,)): SmoothQuant's factors, y * smooth quantized. With a residual, h = x +
    residual is normalized as stored in residual_dtype and returned as residual_out; return_y adds
    y in x's dtype (before smooth). enable_pdl: programmatic dependent launch on sm_90+ (None:
    NORMIR_PDL's setting, on by default; a traced call takes that setting); results are bitwise
    equal either way. The module docstring has the math; no gradient flows.
    """
    return _quantized(RMS, x, weight, bias, eps, quant, scale, scale_ub, smooth, residual, residual_dtype,
                      weight_offset, return_y, enable_pdl)


def layernorm_quant(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                    eps: float = 1e-5, *, quant: str = "fp8", scale: torch.Tensor | None = None,
                    scale_ub: torch.Tensor | None = None, smooth: torch.Tensor | None = None,
                    residual: torch.Tensor | None = None, residual_dtype: torch.dtype | None = None,
                    return_y: bool = False, enable_pdl: bool | None = None):
    """LayerNorm with its output quantized, in one read of x: (q, scales[, residual_out][, y]);
    the arguments as rmsnorm_quant's (LayerNorm's order: weight, bias, eps)."""
    return _quantized(LN, x, weight, bias, eps, quant, scale, scale_ub, smooth, residual, residual_dtype, 0.0,
                      return_y, enable_pdl)


# ---------------------------------------------------------------------------- references


def quantize_ref(v: torch.Tensor, quant: str, scale: torch.Tensor | None = None,
                 scale_ub: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales) of fp32 values v in the kernels' order of operations (module docstring), in
    torch: the reference the GPU tier compares the kernels with, given their own y."""
    _, q_dtype, qmax, floor = QUANTS[quant]
    v = v.float()
    if scale is None:
        a = torch.nan_to_num(v.abs(), nan=0.0).amax(-1, keepdim=True)
        if scale_ub is not None:
            a = torch.minimum(a, scale_ub.float())
        # a / qmax as a true division: torch's CUDA division by a Python scalar multiplies by its
        # reciprocal, one rounding more than the kernel's division
        s = torch.clamp_min(a / torch.full_like(a, qmax), floor)
    else:
        s = scale.float().reshape((1,) * v.dim())
    scaled = v / s if (scale is None and quant == "fp8") else v * (1.0 / s)
    if quant == "fp8":
        q = torch.nan_to_num(scaled, nan=qmax).clamp(-qmax, qmax).to(q_dtype)
    else:
        q = torch.nan_to_num(torch.round(scaled), nan=0.0).clamp(-128.0, 127.0).to(q_dtype)
    return q, s
