"""normir's kernel launches emulated on the CPU: float32 torch math on CPU tensors in place of every
launch the public functions, the autograd paths and the custom ops make, and the checks' GPU test
answering True. The CPU tier's autograd, torch.func and distributed tests use it (the cpu_launches
fixture, conftest.py), and so does scripts/train_demo.py's CPU smoke run (tests/demo_cpu.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from normir.ops import _fused, _rows, fused_add_rmsnorm, layernorm, quant, rmsnorm, serving


def _rms_fwd(x, weight, eps, store_rstd):
    with torch.no_grad():
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        y = x.float() * rstd[..., None] * (weight.float() if weight is not None else 1.0)
        return y.to(x.dtype), (rstd if store_rstd else None)


def _rms_bwd(x, weight, dy, rstd, atomic_dw):
    with torch.no_grad():  # the kernels' outputs have no autograd history
        xh = x.float() * rstd[..., None]
        wdy = dy.float() * (weight.float() if weight is not None else 1.0)
        dx = (wdy - xh * (xh * wdy).mean(-1, keepdim=True)) * rstd[..., None]
        dw = (dy.float() * xh).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype) if weight is not None else None
        return dx.to(x.dtype), dw


def _launch_fwd(x, residual, weight, bias, eps, residual_dtype, out_dtype, weight_offset, store_rstd, store_residual,
                kernel):
    with torch.no_grad():
        h = (x.float() + residual.float()).to(residual_dtype or residual.dtype) if residual is not None else x
        hf, mean = h.float(), None
        if kernel.startswith("layernorm"):
            mean = hf.mean(-1)
            hf = hf - mean[..., None]
        rstd = torch.rsqrt(hf.pow(2).mean(-1) + eps)
        y = hf * rstd[..., None]
        if weight is not None:
            y = y * (weight.float() + weight_offset)
        if bias is not None:
            y = y + bias.float()
        stored = residual is not None and store_residual
        return (y.to(out_dtype or x.dtype), h if stored else None, rstd if store_rstd else None,
                mean if store_rstd else None)


def _launch_bwd(dy, residual_out, weight, rstd, d_residual_out, bias_dtype, weight_offset, dx_dtype, dres_dtype,
                atomic=False, *, kernel, mean=None, made_by=None):
    with torch.no_grad():
        hh = (residual_out.float() - (mean[..., None] if mean is not None else 0.0)) * rstd[..., None]
        wdy = dy.float() * ((weight.float() + weight_offset) if weight is not None else 1.0)
        c2 = (hh * wdy).mean(-1, keepdim=True)
        c1 = wdy.mean(-1, keepdim=True) if mean is not None else 0.0
        dh = (wdy - c1 - hh * c2) * rstd[..., None]
        if d_residual_out is not None:
            dh = dh + d_residual_out.float()
        rows = (-1, residual_out.shape[-1])
        dx = dh.to(dx_dtype or residual_out.dtype)
        dres = dh.to(dres_dtype) if dres_dtype is not None and dres_dtype != dx.dtype else None
        dw = (dy.float() * hh).reshape(rows).sum(0).to(weight.dtype) if weight is not None else None
        db = dy.float().reshape(rows).sum(0).to(bias_dtype) if bias_dtype is not None else None
        return dx, dres, dw, db


def _launch_quant(kernel, x, residual, weight, bias, scale, scale_ub, smooth, eps, weight_offset, q, residual_dtype,
                  return_y, store_stats, enable_pdl=None):
    """The quantized forwards: the norm as _launch_fwd's, then quant.quantize_ref (the checks first)."""
    eps, _, offset, _ = quant.quant_checks(x, residual, weight, bias, scale, scale_ub, smooth, eps, weight_offset, q,
                                           residual_dtype)
    y, h, rstd, mean = _launch_fwd(x, residual, weight, bias, eps, residual_dtype, torch.float32, offset, True, True,
                                   kernel)
    with torch.no_grad():
        qv, s = quant.quantize_ref(y * smooth if smooth is not None else y, q, scale, scale_ub)
    has_mean = kernel == quant.LN
    return (qv, s if scale is None else None, h, y.to(x.dtype) if return_y else None,
            mean if store_stats and has_mean else None, rstd if store_stats else None)


def _launch_rows(fields, m, x2, xs, r2, rs, o2, os_, s2, weight, bias, scale, scale_ub, enable_pdl=None):
    """The serving forms' kernels (serving.launch_rows): every output computed from the inputs
    first, then written into the caller's rows (x2 and o2, r2 and the residual_out, may be one
    tensor), as the in-place kernels order their reads and stores."""
    with torch.no_grad():
        hf = x2.float() + r2.float() if r2 is not None else x2.float()
        h = hf.to(r2.dtype) if r2 is not None else None
        hn = hf if (r2 is None or fields.get("sum_f32")) else h.float()
        if fields["kernel"].startswith("layernorm"):
            hn = hn - hn.mean(-1, keepdim=True)
        xh = hn * torch.rsqrt(hn.pow(2).mean(-1, keepdim=True) + fields["eps"])
        if fields.get("round_xhat"):
            xh = xh.to(x2.dtype).float()
        y = xh * weight.float() if weight is not None else xh
        y = y + bias.float() if bias is not None else y
        s = None
        if fields.get("qdtype"):
            y, s = quant.quantize_ref(y, "fp8" if fields["qdtype"] == "f8e4m3" else "int8", scale, scale_ub)
        if h is not None:
            r2.copy_(h)
        o2.copy_(y.to(o2.dtype))
        if s2 is not None:
            s2.copy_(s.reshape(-1))


def install(setattr_: Callable[[object, str, object], None] = setattr) -> None:
    """Replace the launches (and the GPU test) through setattr_: pytest's monkeypatch.setattr
    (undone after the test), or the builtin setattr for a whole process."""
    setattr_(_rows, "on_gpu", lambda t: True)
    setattr_(rmsnorm, "_fwd", _rms_fwd)
    setattr_(rmsnorm, "_bwd", _rms_bwd)
    for module in (_fused, fused_add_rmsnorm, layernorm):
        setattr_(module, "launch_fwd", _launch_fwd)
        setattr_(module, "launch_bwd", _launch_bwd)
    setattr_(quant, "launch_quant", _launch_quant)
    setattr_(serving, "launch_rows", _launch_rows)
