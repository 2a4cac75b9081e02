"""GPU tier: the quantized forwards (normir.rmsnorm_quant, normir.layernorm_quant) on the H200.

Each case draws fresh random inputs and poisons the memory the outputs will be allocated from
first (q with bytes no kernel writes: fp8's NaN, int8's -128 in the dynamic form; floats with
NaN). The reference follows the kernel's operation order from the kernel's own rstd (and mean,
stored by the custom op's store_stats) in fp32 torch (ops.quant.quantize_ref): RMSNorm's scales
must match it bit for bit; LayerNorm's within a few ulp (its x_hat is one fma of the row less its
first element with a shifted mean the kernel does not store); q within one quantization step on
at most 0.1% of the elements; residual_out bit for bit. A second, looser check compares the
dequantized q with the float64 reference's y (one step)."""

from __future__ import annotations

import pytest
import torch
from gpu_cases import (
    QUANT_BATCH_M,
    QUANT_BATCH_N,
    QUANT_KERNELS,
    QUANT_M,
    QUANT_N,
    QUANT_OFFSET_N,
    QUANT_ROW_N,
)
from gpu_helpers import TOL, make, rel_err, within_a_step

import normir
from normir.ops.fused_add_rmsnorm import fused_add_rmsnorm_ref
from normir.ops.layernorm import layernorm_ref
from normir.ops.quant import QUANTS, quantize_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

RMS, LN = QUANT_KERNELS
BF16 = torch.bfloat16


def poison_q(shape, quant: str) -> None:
    """The next allocations of q's shape start as bytes a kernel never writes (fp8: NaN, 0x7f;
    int8: -128, which only a saturating static scale could give), and fp32 ones as NaN."""
    blocks = [torch.full(shape, 0x7F if quant == "fp8" else -128, dtype=torch.int8, device="cuda"),
              torch.full((*shape[:-1], 1), float("nan"), device="cuda"),
              torch.full(shape, float("nan"), dtype=BF16, device="cuda"),
              torch.full(shape, float("nan"), dtype=BF16, device="cuda")]
    del blocks


def inputs(m, n, kernel, residual=False):
    x = make((m, n), BF16)
    r = make((m, n), BF16) if residual else None
    w = make((n,), BF16) + 1
    b = make((n,), BF16, 0.5) if kernel == LN else None
    return x, r, w, b


def run(kernel, x, r, w, b, quant, scale=None, scale_ub=None, smooth=None):
    """The custom op with y and the statistics: (q, scales, residual_out, y, mean, rstd)."""
    op = getattr(torch.ops.normir, kernel)
    eps = 1e-5 if kernel == LN else 1e-6
    return op(x, r, w, b, scale, scale_ub, smooth, eps, 0.0, quant, None, True, True)


def kernel_order_y(kernel, h, w, b, mean, rstd, smooth=None):
    """y in fp32 as the kernel computes it, from its rstd (and mean): x_hat = h * rstd (RMSNorm),
    y = x_hat * w (+ b), then * smooth; separate roundings, as in the kernel (no contraction)."""
    hf = h.float()
    xh = hf * rstd[..., None] if kernel == RMS else (hf - mean[..., None]) * rstd[..., None]
    y = xh * w.float()
    if b is not None:
        y = y + b.float()
    return y * smooth if smooth is not None else y


def steps_apart(a: torch.Tensor, b: torch.Tensor, quant: str) -> torch.Tensor:
    """How many representable values apart two quantized tensors are, element by element."""
    if quant == "int8":
        return (a.to(torch.int16) - b.to(torch.int16)).abs()
    ia, ib = a.view(torch.int8).to(torch.int16), b.view(torch.int8).to(torch.int16)
    # e4m3fn's magnitude bits are monotonic in the value: map sign-magnitude to a line
    la = torch.where(ia < 0, -(ia & 0x7F), ia)
    lb = torch.where(ib < 0, -(ib & 0x7F), ib)
    return (la - lb).abs()


def check_q(kernel, quant, q, scales, y_ref, scale=None, scale_ub=None):
    """q and the scales against quantize_ref of the kernel-order y."""
    q_ref, s_ref = quantize_ref(y_ref, quant, scale, scale_ub)
    if scale is None:
        if kernel == RMS:
            assert torch.equal(scales, s_ref), (scales - s_ref).abs().max().item()
        else:
            torch.testing.assert_close(scales, s_ref, rtol=5e-7, atol=0.0)
    far = steps_apart(q, q_ref, quant)
    assert far.max().item() <= 1, f"q {far.max().item()} steps from the reference"
    assert (far > 0).float().mean().item() <= 1e-3, f"{(far > 0).sum().item()} of {far.numel()} elements differ"


@pytest.mark.parametrize("residual", (False, True), ids=("plain", "fused"))
@pytest.mark.parametrize("n", QUANT_N)
@pytest.mark.parametrize("dynamic", (False, True), ids=("static", "dynamic"))
@pytest.mark.parametrize("quant", ("fp8", "int8"))
@pytest.mark.parametrize("kernel", QUANT_KERNELS)
def test_matches_the_kernel_order_reference(kernel, quant, dynamic, n, residual):
    m = QUANT_M
    x, r, w, b = inputs(m, n, kernel, residual)
    scale = None if dynamic else torch.tensor([0.02], device="cuda")
    poison_q((m, n), quant)
    q, scales, res_out, y, mean, rstd = run(kernel, x, r, w, b, quant, scale)
    assert q.dtype == QUANTS[quant][1] and q.shape == x.shape
    h = (x.float() + r.float()).to(BF16) if residual else x
    if residual:
        assert torch.equal(res_out, h)
    check_q(kernel, quant, q, scales if dynamic else None, kernel_order_y(kernel, h, w, b, mean, rstd), scale)
    # y (return_y) and the dequantized q against the float64 reference
    if kernel == RMS:
        y64 = fused_add_rmsnorm_ref(x, r, w, None, 1e-6)[0]
    else:
        y64 = layernorm_ref(x, w, b, 1e-5, residual=r)[0]
    assert rel_err(y, y64) < TOL[BF16]
    s = scales if dynamic else scale.reshape(1, 1)
    if not dynamic:  # a static scale may saturate: compare where it does not
        keep = (y64.abs() / s.double()) < QUANTS[quant][2]
        assert within_a_step(q[keep], s.expand_as(q)[keep], y64[keep], quant)
    else:
        assert within_a_step(q, s, y64, quant)


@pytest.mark.parametrize("dynamic", (False, True), ids=("static", "dynamic"))
@pytest.mark.parametrize("quant", ("fp8", "int8"))
@pytest.mark.parametrize("kernel", QUANT_KERNELS)
def test_special_rows(kernel, quant, dynamic):
    # A zero row (the floor scale, q = 0), one huge value in a row, a NaN, +inf and -inf: the
    # kernel follows the documented rule (NaN ignored by the amax, +448 / 0 in q), as the reference.
    n = QUANT_ROW_N
    x, _, w, b = inputs(8, n, kernel)
    x[0] = 0
    x[1, 17] = 3e4
    x[2, 5] = float("nan")
    x[3, 9] = float("inf")
    x[4, 9] = float("-inf")
    scale = None if dynamic else torch.tensor([0.05], device="cuda")
    poison_q((8, n), quant)
    q, scales, _, _, mean, rstd = run(kernel, x, None, w, b, quant, scale)
    y_ref = kernel_order_y(kernel, x, w, b, mean, rstd)
    q_ref, s_ref = quantize_ref(y_ref, quant, scale)
    assert torch.equal(q.view(torch.int8), q_ref.view(torch.int8)) if kernel == RMS else \
        steps_apart(q, q_ref, quant).max().item() <= 1
    if dynamic:
        assert torch.isfinite(scales).all()  # NaN rows take the floor: their amax ignores NaN
    if dynamic and kernel == RMS:  # a zero row (LayerNorm's is its bias) takes the floor, q = 0
        floor = torch.tensor(QUANTS[quant][3], dtype=torch.float32).item()
        assert scales[0].item() == floor and not q[0].float().any()


@pytest.mark.parametrize("quant", ("fp8", "int8"))
@pytest.mark.parametrize("kernel", QUANT_KERNELS)
def test_smooth_and_scale_ub(kernel, quant):
    n, m = QUANT_BATCH_N, 64
    x, _, w, b = inputs(m, n, kernel)
    smooth = torch.rand(n, device="cuda") + 0.5
    ubs = (None, torch.tensor([0.5], device="cuda")) if quant == "fp8" else (None,)
    for ub in ubs:
        q, scales, _, _, mean, rstd = run(kernel, x, None, w, b, quant, None, ub, smooth)
        check_q(kernel, quant, q, scales, kernel_order_y(kernel, x, w, b, mean, rstd, smooth), None, ub)
        if ub is not None:
            assert (scales <= 0.5 / 448 * (1 + 1e-6)).all()


@pytest.mark.parametrize("kernel", QUANT_KERNELS)
@pytest.mark.parametrize("quant", ("fp8", "int8"))
def test_batch_invariance(kernel, quant):
    # Row i's q and scale are the same bits whatever the batch it is in.
    n = QUANT_BATCH_N
    x, _, w, b = inputs(max(QUANT_BATCH_M), n, kernel)
    fn = normir.rmsnorm_quant if kernel == RMS else normir.layernorm_quant
    args = (x, w) if kernel == RMS else (x, w, b)
    q_all, s_all = fn(*args, quant=quant)
    for m in QUANT_BATCH_M:
        part = (x[:m], w) if kernel == RMS else (x[:m], w, b)
        q, s = fn(*part, quant=quant)
        assert torch.equal(q.view(torch.int8), q_all[:m].view(torch.int8)) and torch.equal(s, s_all[:m])


@pytest.mark.parametrize("kernel", QUANT_KERNELS)
def test_offsets_strides_and_empty_batches(kernel):
    fn = normir.rmsnorm_quant if kernel == RMS else normir.layernorm_quant
    for n in QUANT_OFFSET_N:
        w = make((n,), BF16) + 1
        b = make((n,), BF16) if kernel == LN else None
        buf = make((5 * n + 1,), BF16)
        x = buf[1:].view(5, n)  # 2 bytes past an aligned start: one element a vector
        args = (w,) if kernel == RMS else (w, b)
        for quant in ("fp8", "int8"):
            q, s = fn(x, *args, quant=quant)
            q2, s2 = fn(x.contiguous(), *args, quant=quant)
            assert torch.equal(q.view(torch.int8), q2.view(torch.int8)) and torch.equal(s, s2)
    n = QUANT_BATCH_N
    big = make((6, n + 8), BF16)
    w = make((n,), BF16) + 1
    args = (w,) if kernel == RMS else (w, make((n,), BF16))
    q, s = fn(big[:, :n], *args)  # strided rows
    q2, s2 = fn(big[:, :n].contiguous(), *args)
    assert torch.equal(q.view(torch.int8), q2.view(torch.int8)) and torch.equal(s, s2)
    q, s = fn(big[:0, :n], *args)
    assert q.shape == (0, n) and s.shape == (0, 1)


@pytest.mark.parametrize("kernel", QUANT_KERNELS)
def test_fused_residual_and_y_outputs(kernel):
    n, m = QUANT_BATCH_N, 33
    x, r, w, b = inputs(m, n, kernel, residual=True)
    fn = normir.rmsnorm_quant if kernel == RMS else normir.layernorm_quant
    args = (x, w) if kernel == RMS else (x, w, b)
    q, s, res_out, y = fn(*args, residual=r, return_y=True)
    assert torch.equal(res_out, (x.float() + r.float()).to(BF16))
    y64 = fused_add_rmsnorm_ref(x, r, w, None, 1e-6)[0] if kernel == RMS else layernorm_ref(x, w, b, 1e-5, r)[0]
    assert rel_err(y, y64) < TOL[BF16]
    q2, s2, _ = fn(*args, residual=r)
    assert torch.equal(q.view(torch.int8), q2.view(torch.int8)) and torch.equal(s, s2)


@pytest.mark.parametrize("kernel", QUANT_KERNELS)
def test_cuda_graph_with_device_scales(kernel):
    # The static scale and scale_ub are read on the device: a replay after new values are copied in
    # gives what an eager call with them gives.
    n, m = QUANT_BATCH_N, 16
    x, _, w, b = inputs(m, n, kernel)
    fn = normir.rmsnorm_quant if kernel == RMS else normir.layernorm_quant
    args = (x, w) if kernel == RMS else (x, w, b)
    scale, ub = torch.tensor([0.02], device="cuda"), torch.tensor([1.0], device="cuda")
    fn(*args, scale=scale)
    fn(*args, scale_ub=ub)  # loaded before the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q_static, _ = fn(*args, scale=scale)
        q_dyn, s_dyn = fn(*args, scale_ub=ub)
    x.copy_(make((m, n), BF16))
    scale.fill_(0.03)
    ub.fill_(0.25)
    g.replay()
    q1, _ = fn(*args, scale=scale)
    q2, s2 = fn(*args, scale_ub=ub)
    assert torch.equal(q_static.view(torch.int8), q1.view(torch.int8))
    assert torch.equal(q_dyn.view(torch.int8), q2.view(torch.int8)) and torch.equal(s_dyn, s2)


@pytest.mark.parametrize("kernel", QUANT_KERNELS)
def test_compiled_matches_eager(kernel):
    n, m = QUANT_BATCH_N, 8
    x, _, w, b = inputs(m, n, kernel)
    fn = normir.rmsnorm_quant if kernel == RMS else normir.layernorm_quant
    args = (x, w) if kernel == RMS else (x, w, b)
    for quant in ("fp8", "int8"):
        compiled = torch.compile(lambda *a, quant=quant: fn(*a, quant=quant), fullgraph=True)
        q, s = compiled(*args)
        q2, s2 = fn(*args, quant=quant)
        assert torch.equal(q.view(torch.int8), q2.view(torch.int8)) and torch.equal(s, s2)


@pytest.mark.large
def test_more_than_two_to_the_31_elements():
    # M * N > 2^31: row offsets past 32 bits; the last rows against a slice run alone.
    n, m = 32768, (1 << 31) // 32768 + 3
    x = torch.randn(m, n, device="cuda", dtype=BF16)
    w = torch.ones(n, device="cuda", dtype=BF16)
    q, s = normir.rmsnorm_quant(x, w)
    q2, s2 = normir.rmsnorm_quant(x[-3:].clone(), w)
    assert torch.equal(q[-3:].view(torch.int8), q2.view(torch.int8)) and torch.equal(s[-3:], s2)
