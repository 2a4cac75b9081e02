"""The serving forms (normir.serving): RMSNorm and LayerNorm, with the fused residual add, writing
into the caller's tensors, in place where the API says so, and vLLM's fused quantized RMSNorms with
vLLM's argument order; each a mutating torch.library operator (torch.ops.normir.<name>, the
written arguments annotated Tensor(a!) in its schema, a fake implementation: torch.compile and CUDA
graphs take them), and a Python function of the same name and arguments that launches directly
when called eagerly.

    rms_norm(out, x, weight, eps)                       out <- rmsnorm(x) * weight
    fused_add_rms_norm(x, residual, weight, eps)        residual <- x + residual (rounded to
                                                        residual's dtype), x <- rmsnorm(residual) * weight
    layer_norm(out, x, weight, bias, eps)               out <- layernorm(x) * weight + bias
    fused_add_layer_norm(x, residual, weight, bias, eps)   as fused_add_rms_norm, LayerNorm's
    rms_norm_static_fp8_quant(out, x, weight, scale, eps)  out (float8_e4m3fn) <- fp8(y * (1 / scale))
    fused_add_rms_norm_static_fp8_quant(out, x, residual, weight, scale, eps)   residual in place
    rms_norm_dynamic_per_token_quant(out, x, weight, scales, eps, scale_ub=None, residual=None)
        out (float8_e4m3fn or int8: its dtype says which) and scales (float32, one a row) by the
        per-token rule, residual in place where given

The math of y: normir's rule (the norm of h = x + residual as residual stores it, y rounded
once), but in rms_norm_dynamic_per_token_quant, which follows vLLM's dynamic kernels: the norm of
the fp32 sum and x_hat rounded to x's dtype before a weight of x's dtype. The quantization is
normir.ops.quant's (its module docstring). out may be x itself in rms_norm and layer_norm (the
kernels' in-place variant); any other sharing of memory between a written argument and another
raises, as does a written tensor with overlapping elements. Nothing but the written arguments
changes. M = 0 rows is a no-op.
"""

from __future__ import annotations

import inspect

import torch

from .. import launch as L
from . import _rows as R
from ._fused import fwd_checks
from .quant import QUANTS, quant_checks

Tensor = torch.Tensor
Q_DTYPES = {torch.float8_e4m3fn: "fp8", torch.int8: "int8"}

# ---------------------------------------------------------------------------- aliasing


def _span(t: Tensor) -> tuple[int, int]:
    """The bytes [lo, hi) t's elements lie in."""
    extent = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def shares(a: Tensor, b: Tensor) -> str:
    """How a and b share memory: "" (not at all), "same" (the same elements, one tensor's
    view) or "partial" (any other overlap of their spans)."""
    if a.numel() == 0 or b.numel() == 0:
        return ""
    (a0, a1), (b0, b1) = _span(a), _span(b)
    if a1 <= b0 or b1 <= a0:
        return ""
    same = a0 == b0 and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
    return "same" if same else "partial"


def check_aliasing(op: str, written: dict[str, Tensor], read: dict[str, Tensor | None],
                   in_place: tuple[str, str] | None = None) -> bool:
    """Refuse a written tensor with overlapping elements, or one sharing memory with another
    argument, but the pair in_place (written, read) being one tensor, which the in-place kernels
    take. Returns whether that pair is one tensor."""
    same = False
    for w, t in written.items():
        if torch._debug_has_internal_overlap(t) == 1:
            raise ValueError(f"{op}: {w} has elements that share memory (an expanded or overlapping view); the "
                             f"kernel writes every element: pass a tensor of its own, e.g. {w}.contiguous()")
        for name, u in {**written, **read}.items():
            kind = shares(t, u) if u is not None and name != w else ""
            if kind == "same" and in_place in ((w, name), (name, w)):
                same = True
            elif kind:
                how = "are the same tensor" if kind == "same" else "overlap in memory"
                also = f" (or {in_place[0]} = {in_place[1]} itself: the op works in place)" if in_place else ""
                raise ValueError(f"{op}: {w} and {name} {how}; the kernel reads {name} while it writes {w}: pass "
                                 f"tensors that do not share memory{also}")
    return same


# ---------------------------------------------------------------------------- checks


def _check_out(out: object, x: Tensor, name: str, dtypes: tuple[torch.dtype, ...], device: bool = True) -> None:
    """A written row tensor: x's shape (and device), one of dtypes."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(out).__name__}")
    R.check_same_kind(out, x, name)
    if out.shape != x.shape or (device and out.device != x.device):
        raise ValueError(f"{name} must match x in shape and device: {name} is {tuple(out.shape)} on {out.device}, x "
                         f"is {tuple(x.shape)} on {x.device}")
    if out.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {out.dtype}; it must be one of {', '.join(map(str, dtypes))}")


def _check_scales(scales: object, x: Tensor, device: bool = True) -> None:
    """The dynamic form's per-row scales: float32, one element a row of x, on its device."""
    m = x.numel() // max(x.shape[-1], 1)
    if not isinstance(scales, torch.Tensor) or scales.dtype != torch.float32 or scales.numel() != m \
            or (device and scales.device != x.device):
        got = (f"{scales.dtype} of shape {tuple(scales.shape)} on {scales.device}" if isinstance(scales, torch.Tensor)
               else type(scales).__name__)
        raise ValueError(f"scales must be a float32 tensor of {m} elements (shape ({m}, 1): one a row of x) on x's "
                         f"device; got {got}")


FLOATS = tuple(L.TORCH_DTYPES)


def serving_checks(op: str, out, x, residual, weight, bias, eps, *, q: str = "", scale=None, scales=None,
                   scale_ub=None, values: bool = True, device: bool = True) -> str:
    """One serving op's checks (values, device: as _fused.fwd_checks'); q: "" (y written as out, a
    float), "fp8" or "int8" (out quantized; "dynamic": by out's dtype). Returns the quantization."""
    if q:
        if q == "dynamic":
            _check_out(out, x, "out", tuple(Q_DTYPES), device)
            q = Q_DTYPES[out.dtype]
            _check_scales(scales, x, device)
        else:
            _check_out(out, x, "out", (QUANTS[q][1],), device)
        quant_checks(x, residual, weight, bias, scale, scale_ub, None, eps, 0.0, q, None, values, device)
    else:
        fwd_checks(x, residual, weight, bias, eps, None, None, 0.0, values, device)
        if out is not None:
            _check_out(out, x, "out", FLOATS, device)
    return q


# ---------------------------------------------------------------------------- launches


def _written_rows(t: Tensor) -> tuple[Tensor, int, Tensor | None]:
    """A written tensor's (M, N) rows, their stride, and the tensor to copy back into t after the
    launch (None: the rows are t's own memory; else t's contents in a contiguous copy)."""
    n = t.shape[-1]
    if t.stride(-1) == 1 or n == 1:
        try:
            t2 = t.view(-1, n)
            return t2, (t2.stride(0) if t2.shape[0] > 1 else n), None
        except RuntimeError:
            pass
    c = t.contiguous()
    return c.view(-1, n), n, c


def problem(kernel: str, n: int, eps: float, dtype: torch.dtype, wdtype: torch.dtype | None,
            rdtype: torch.dtype | None, bdtype: torch.dtype | None, out_dtype: torch.dtype, *, q: str = "",
            static: bool = False, scale_ub: bool = False, in_place: bool = False, vllm_dynamic: bool = False) -> dict:
    """The kernel's problem (options.Problem's fields, less the vector) for a serving call: the
    tensors' dtypes (None: absent), the quantization q ("", "fp8", "int8"; static: a scale given),
    whether the kernel writes what it reads (in_place) and takes vLLM's dynamic rule."""
    dt = L.TORCH_DTYPES[dtype]
    fields = dict(kernel=kernel, n=n, dtype=dt, wdtype=L.TORCH_DTYPES[wdtype] if wdtype is not None else dt, eps=eps,
                  has_weight=wdtype is not None, inplace=in_place,
                  rdtype=L.TORCH_DTYPES[rdtype] if rdtype is not None else "", store_residual=rdtype is not None,
                  bdtype=L.TORCH_DTYPES[bdtype] if bdtype is not None else "")
    if q:
        fields |= dict(qdtype=QUANTS[q][0], qdynamic=not static, has_scale_ub=scale_ub, store_y=False)
        if vllm_dynamic:  # vLLM's rule: the fp32 sum's norm; x_hat in x's dtype before a weight of that dtype
            fields |= dict(sum_f32=rdtype is not None, round_xhat=wdtype == dtype and dt != "f32")
    elif kernel != "rmsnorm_fwd":
        fields["odtype"] = L.TORCH_DTYPES[out_dtype]
    return fields


def launch_rows(fields: dict, m: int, x2: Tensor, xs: int, r2: Tensor | None, rs: int, o2: Tensor, os_: int,
                s2: Tensor | None, weight: Tensor | None, bias: Tensor | None, scale: Tensor | None,
                scale_ub: Tensor | None, enable_pdl: bool | None = None) -> None:
    """The kernel of a problem (options.Problem's fields, less the vector and pdl) over m rows: x2
    (and r2, the residual, written in place as h) read, o2 written (y, or q where fields quantize),
    s2 the per-row scales of a dynamic form; each row tensor with its row stride. enable_pdl: as
    _rows.use_pdl's."""
    q = bool(fields.get("qdtype"))
    float_rows = (x2, r2) if q else (x2, r2, o2)
    strides = tuple(st for st, t in ((xs, x2), (rs, r2), (os_, o2)) if t is not None)
    vec = R.vector_width(fields["n"], (*float_rows, weight, bias, *((o2,) if q else ())), strides,
                         rows=len(float_rows))
    dev = x2.get_device()
    p = R.plan(dev, vec=vec, pdl=R.use_pdl(dev, enable_pdl), **fields)

    def ptr(t: Tensor | None) -> int:
        return t.data_ptr() if t is not None else 0

    y_ptr, q_ptr = (0, ptr(o2)) if q else (ptr(o2), 0)
    p.launch(dev, p.grid(m), x=ptr(x2), residual=ptr(r2), w=ptr(weight), b=ptr(bias), y=y_ptr, residual_out=ptr(r2),
             rstd=0, mean=0, q=q_ptr, scale=ptr(scale), scales=ptr(s2), scale_ub=ptr(scale_ub), smooth=0, rows=m,
             x_stride=xs, residual_stride=rs, y_stride=0 if q else os_, residual_out_stride=rs, q_stride=os_ if q else 0)


def launch_into(op: str, kernel: str, x: Tensor, residual: Tensor | None, weight: Tensor | None,
                bias: Tensor | None, eps: float, *, out: Tensor | None = None, q: str = "",
                scale: Tensor | None = None, scales: Tensor | None = None, scale_ub: Tensor | None = None,
                vllm_dynamic: bool = False, enable_pdl: bool | None = None) -> None:
    """The forward writing into the caller's tensors: out (y, or q with a quantization q; None:
    into x itself), residual <- h where a residual is given (in place), scales where dynamic."""
    q = serving_checks(op, out if out is not None else x, x, residual, weight, bias, eps, q=q, scale=scale,
                       scales=scales, scale_ub=scale_ub)
    eps = float(eps)
    weight = weight.contiguous() if weight is not None else None  # (N elements: a copy where strided)
    bias = bias.contiguous() if bias is not None else None
    written = {"out": out} if out is not None else {"x": x}
    if residual is not None:
        written["residual"] = residual
    if scales is not None:
        written["scales"] = scales
    read = {"x": x if out is not None else None, "weight": weight, "bias": bias, "scale": scale, "scale_ub": scale_ub}
    same = check_aliasing(op, written, read, ("out", "x") if not q and out is not None else None)
    in_place = out is None or same or residual is not None
    n = x.shape[-1]
    m = x.numel() // n
    if m == 0:
        return
    backs = []  # (the caller's tensor, the copy the kernel wrote) for rows not in the caller's memory

    def rows(t: Tensor | None, writes: bool) -> tuple[Tensor | None, int]:
        if t is None:
            return None, 0
        if not writes:
            return R.rows_of(t)
        t2, stride, copy = _written_rows(t)
        if copy is not None:
            backs.append((t, copy))
        return t2, stride

    x2, xs = rows(x, writes=out is None or same)
    o2, os_ = (x2, xs) if (out is None or same) else rows(out, writes=True)
    r2, rs = rows(residual, writes=True)
    s2 = scales.view(-1) if scales is not None and scales.is_contiguous() else None
    if scales is not None and s2 is None:
        s2 = torch.empty(m, dtype=torch.float32, device=x.device)
        backs.append((scales, s2))
    fields = problem(kernel, n, eps, x.dtype, weight.dtype if weight is not None else None,
                     residual.dtype if residual is not None else None, bias.dtype if bias is not None else None,
                     o2.dtype, q=q, static=scale is not None, scale_ub=scale_ub is not None, in_place=in_place,
                     vllm_dynamic=vllm_dynamic)
    launch_rows(fields, m, x2, xs, r2, rs, o2, os_, s2, weight, bias, scale, scale_ub, enable_pdl)
    for t, copy in backs:
        t.copy_(copy.view(t.shape))


# ---------------------------------------------------------------------------- the ops

RMS, LN, RMS_Q = "fused_add_rmsnorm_fwd", "layernorm_fwd", "rmsnorm_quant_fwd"


def _rms_kernel(out: Tensor | None, x: Tensor, residual: Tensor | None) -> str:
    """RMSNorm's own forward where it fits (y in x's dtype, no residual), else the fused add's."""
    return "rmsnorm_fwd" if residual is None and (out is None or out.dtype == x.dtype) else RMS


def _run(op: str, launch, fake, *args, enable_pdl: bool | None = None) -> None:
    """An eager call launches; a traced one (torch.compile, a FakeTensor) goes through the
    operator (the float values checked by its fake, see _rows.check_eps), whose launches take
    NORMIR_PDL's setting (enable_pdl changes no result, only how the kernel is launched)."""
    x = args[1] if op not in ("fused_add_rms_norm", "fused_add_layer_norm") else args[0]
    if R.eager(x):
        launch(*args, enable_pdl=enable_pdl)
        return
    fake(*args, values=False, device=True)
    getattr(torch.ops.normir, op).default(*args)


def _schema_of(fn):
    """fn as the operator's implementation: its signature without the trailing enable_pdl (the
    schema is vLLM's; the operator's launches take NORMIR_PDL's setting)."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.name != "enable_pdl"]

    def impl(*args):
        fn(*args)

    impl.__signature__ = sig.replace(parameters=params)
    impl.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "enable_pdl"}
    impl.__name__ = fn.__name__
    return impl


def _define(name: str, mutates: tuple[str, ...], impl, fake) -> R.Op:
    op = R.custom_op(name, mutates)(_schema_of(impl))
    op.register_fake(lambda *args: fake(*args, values=True, device=False))
    return op


# rms_norm(out, x, weight, eps)
def _rms_norm(result: Tensor, input: Tensor, weight: Tensor | None, epsilon: float, enable_pdl=None) -> None:
    launch_into("rms_norm", _rms_kernel(result, input, None), input, None, weight, None, epsilon, out=result,
                enable_pdl=enable_pdl)


def _rms_norm_checks(result, input, weight, epsilon, values=True, device=True) -> None:
    serving_checks("rms_norm", result, input, None, weight, None, epsilon, values=values, device=device)


# fused_add_rms_norm(x, residual, weight, eps)
def _fused_add_rms_norm(input: Tensor, residual: Tensor, weight: Tensor | None, epsilon: float,
                        enable_pdl=None) -> None:
    launch_into("fused_add_rms_norm", RMS, input, residual, weight, None, epsilon, enable_pdl=enable_pdl)


def _fused_add_rms_norm_checks(input, residual, weight, epsilon, values=True, device=True) -> None:
    serving_checks("fused_add_rms_norm", None, input, residual, weight, None, epsilon, values=values, device=device)


# layer_norm(out, x, weight, bias, eps)
def _layer_norm(result: Tensor, input: Tensor, weight: Tensor | None, bias: Tensor | None, epsilon: float,
                enable_pdl=None) -> None:
    launch_into("layer_norm", LN, input, None, weight, bias, epsilon, out=result, enable_pdl=enable_pdl)


def _layer_norm_checks(result, input, weight, bias, epsilon, values=True, device=True) -> None:
    serving_checks("layer_norm", result, input, None, weight, bias, epsilon, values=values, device=device)


# fused_add_layer_norm(x, residual, weight, bias, eps)
def _fused_add_layer_norm(input: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None,
                          epsilon: float, enable_pdl=None) -> None:
    launch_into("fused_add_layer_norm", LN, input, residual, weight, bias, epsilon, enable_pdl=enable_pdl)


def _fused_add_layer_norm_checks(input, residual, weight, bias, epsilon, values=True, device=True) -> None:
    serving_checks("fused_add_layer_norm", None, input, residual, weight, bias, epsilon, values=values,
                   device=device)


# rms_norm_static_fp8_quant(out, x, weight, scale, eps)
def _static_fp8(result: Tensor, input: Tensor, weight: Tensor, scale: Tensor, epsilon: float,
                enable_pdl=None) -> None:
    launch_into("rms_norm_static_fp8_quant", RMS_Q, input, None, weight, None, epsilon, out=result, q="fp8",
                scale=scale, enable_pdl=enable_pdl)


def _static_fp8_checks(result, input, weight, scale, epsilon, values=True, device=True) -> None:
    serving_checks("rms_norm_static_fp8_quant", result, input, None, weight, None, epsilon, q="fp8", scale=scale,
                   values=values, device=device)


# fused_add_rms_norm_static_fp8_quant(out, x, residual, weight, scale, eps)
def _fused_static_fp8(result: Tensor, input: Tensor, residual: Tensor, weight: Tensor, scale: Tensor,
                      epsilon: float, enable_pdl=None) -> None:
    launch_into("fused_add_rms_norm_static_fp8_quant", RMS_Q, input, residual, weight, None, epsilon, out=result,
                q="fp8", scale=scale, enable_pdl=enable_pdl)


def _fused_static_fp8_checks(result, input, residual, weight, scale, epsilon, values=True, device=True) -> None:
    serving_checks("fused_add_rms_norm_static_fp8_quant", result, input, residual, weight, None, epsilon, q="fp8",
                   scale=scale, values=values, device=device)


# rms_norm_dynamic_per_token_quant(out, x, weight, scales, eps, scale_ub, residual)
def _dynamic(result: Tensor, input: Tensor, weight: Tensor, scale: Tensor, epsilon: float,
             scale_ub: Tensor | None = None, residual: Tensor | None = None, enable_pdl=None) -> None:
    launch_into("rms_norm_dynamic_per_token_quant", RMS_Q, input, residual, weight, None, epsilon, out=result,
                q="dynamic", scales=scale, scale_ub=scale_ub, vllm_dynamic=True, enable_pdl=enable_pdl)


def _dynamic_checks(result, input, weight, scale, epsilon, scale_ub=None, residual=None, values=True,
                    device=True) -> None:
    serving_checks("rms_norm_dynamic_per_token_quant", result, input, residual, weight, None, epsilon, q="dynamic",
                   scales=scale, scale_ub=scale_ub, values=values, device=device)


# name: (implementation, checks, the arguments it writes): vLLM's schemas, argument names and order
SERVING = {
    "rms_norm": (_rms_norm, _rms_norm_checks, ("result",)),
    "fused_add_rms_norm": (_fused_add_rms_norm, _fused_add_rms_norm_checks, ("input", "residual")),
    "layer_norm": (_layer_norm, _layer_norm_checks, ("result",)),
    "fused_add_layer_norm": (_fused_add_layer_norm, _fused_add_layer_norm_checks, ("input", "residual")),
    "rms_norm_static_fp8_quant": (_static_fp8, _static_fp8_checks, ("result",)),
    "fused_add_rms_norm_static_fp8_quant": (_fused_static_fp8, _fused_static_fp8_checks, ("result", "residual")),
    "rms_norm_dynamic_per_token_quant": (_dynamic, _dynamic_checks, ("result", "scale", "residual")),
}
OPS = {name: _define(name, mutates, impl, checks) for name, (impl, checks, mutates) in SERVING.items()}


# ---------------------------------------------------------------------------- public API


def rms_norm(out: Tensor, x: Tensor, weight: Tensor | None, eps: float, *, enable_pdl: bool | None = None) -> None:
    """out <- rmsnorm(x) * weight (out may be x itself: in place). enable_pdl (every function
    here): programmatic dependent launch on sm_90+, None: NORMIR_PDL's setting (on by default)."""
    _run("rms_norm", _rms_norm, _rms_norm_checks, out, x, weight, eps, enable_pdl=enable_pdl)


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor | None, eps: float, *,
                       enable_pdl: bool | None = None) -> None:
    """In place: residual <- x + residual (rounded to residual's dtype), x <- rmsnorm(residual) * weight."""
    _run("fused_add_rms_norm", _fused_add_rms_norm, _fused_add_rms_norm_checks, x, residual, weight, eps,
         enable_pdl=enable_pdl)


def layer_norm(out: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, *,
               enable_pdl: bool | None = None) -> None:
    """out <- layernorm(x) * weight + bias (out may be x itself: in place)."""
    _run("layer_norm", _layer_norm, _layer_norm_checks, out, x, weight, bias, eps, enable_pdl=enable_pdl)


def fused_add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, *,
                         enable_pdl: bool | None = None) -> None:
    """In place: residual <- x + residual (rounded to residual's dtype), x <- layernorm(residual) * weight + bias."""
    _run("fused_add_layer_norm", _fused_add_layer_norm, _fused_add_layer_norm_checks, x, residual, weight, bias, eps,
         enable_pdl=enable_pdl)


def rms_norm_static_fp8_quant(out: Tensor, x: Tensor, weight: Tensor, scale: Tensor, eps: float, *,
                              enable_pdl: bool | None = None) -> None:
    """out (float8_e4m3fn) <- fp8(rmsnorm(x) * weight * (1 / scale)); scale: float32, one element."""
    _run("rms_norm_static_fp8_quant", _static_fp8, _static_fp8_checks, out, x, weight, scale, eps,
         enable_pdl=enable_pdl)


def fused_add_rms_norm_static_fp8_quant(out: Tensor, x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor,
                                        eps: float, *, enable_pdl: bool | None = None) -> None:
    """residual <- x + residual (in place), out <- fp8(rmsnorm(residual) * weight * (1 / scale))."""
    _run("fused_add_rms_norm_static_fp8_quant", _fused_static_fp8, _fused_static_fp8_checks, out, x, residual,
         weight, scale, eps, enable_pdl=enable_pdl)


def rms_norm_dynamic_per_token_quant(out: Tensor, x: Tensor, weight: Tensor, scales: Tensor, eps: float,
                                     scale_ub: Tensor | None = None, residual: Tensor | None = None, *,
                                     enable_pdl: bool | None = None) -> None:
    """out (float8_e4m3fn or int8) and scales (float32, one a row) <- the per-token form of
    rmsnorm(x [+ residual]) * weight by vLLM's dynamic rule; residual <- x + residual in place."""
    _run("rms_norm_dynamic_per_token_quant", _dynamic, _dynamic_checks, out, x, weight, scales, eps, scale_ub,
         residual, enable_pdl=enable_pdl)
