"""Helpers of the GPU tier: tolerances, the error measure, NaN poisoning and random inputs."""

from __future__ import annotations

import contextlib
import math

import torch

TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# Relative L2 error allowed vs float64: the output's own rounding dominates (fp32 accumulation;
# rsqrt.approx is within 2^-22); dw sums thousands of rows, so it gets a little more room.
TOL = {torch.float32: 2e-5, torch.float16: 1.5e-3, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor, scale: float = 0.0) -> float:
    """||out - ref|| / max(||ref||, scale); scale is the size of the terms that cancel into ref
    where ref itself can be ~0 (dx of a one-element row is a difference of equal terms)."""
    out, ref = out.double(), ref.double()
    if out.shape != ref.shape:
        raise AssertionError(f"shape {tuple(out.shape)} != {tuple(ref.shape)}")
    if not torch.isfinite(out).all():
        return math.inf
    denom = max(ref.norm().item(), scale)
    return (out - ref).norm().item() / (denom if denom > 0 else 1.0)


def within_a_step(q: torch.Tensor, s: torch.Tensor, y64: torch.Tensor, quant: str) -> bool:
    """Whether the dequantized q * s is within one quantization step of the float64 y everywhere:
    s for int8; for fp8 e4m3fn 2^-3 of |y| (its 3 mantissa bits) plus s * 2^-9 (the subnormals'
    spacing). One whole step, not half: the kernel quantizes its own fp32 y, whose x_hat may round
    the other way than the float64 one's."""
    qf = q.float().double() * s.double()
    step = s.double() if quant == "int8" else y64.abs() * 2.0 ** -3 + s.double() * 2.0 ** -9
    return bool(((qf - y64).abs() <= step * 1.01 + 1e-30).all())


def poison(*specs: tuple[tuple[int, ...], torch.dtype]) -> None:
    """Fill blocks of the caching allocator with NaN so that the next allocations of these
    shapes (the launcher's outputs) start out as NaN rather than stale, valid-looking data."""
    blocks = [torch.full(shape, float("nan"), dtype=dt, device="cuda") for shape, dt in specs]
    del blocks


def make(shape, dt, scale=1.0, device="cuda"):
    return (torch.randn(shape, dtype=torch.float32, device=device) * scale).to(dt)


def tensors(shape, x, r=None, w="", b=None):
    """Random inputs of the given dtype names (w "": x's type; None: absent): x, residual, weight
    (around 1) and bias."""
    n = shape[-1]
    xt = make(shape, TORCH[x])
    rt = make(shape, TORCH[r]) if r else None
    wt = (make((n,), TORCH[w or x]) + 1) if w is not None else None
    bt = make((n,), TORCH[b], 0.5) if b else None
    return xt, rt, wt, bt


@contextlib.contextmanager
def forced_layout(monkeypatch, kernel: str, n: int, knobs: dict):
    """Within the block, `kernel` at `n` takes the layout knobs (NORMIR_TPR); handles cleared
    before and after, so no other test sees them."""
    from gpu_cases import tpr_value

    from normir import launch
    monkeypatch.setenv("NORMIR_TPR", f"{kernel}:{n}={tpr_value(knobs)}")
    launch.clear_handles()
    try:
        yield
    finally:
        launch.clear_handles()
