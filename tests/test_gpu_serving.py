"""GPU tier: the serving forms (normir.serving) on the H200. The in-place kernels against the
out-of-place ones bit for bit (the same math and layout; only the stores move), and both against
float64; every output poisoned first and followed by canary bytes that must survive; out = x and
the in-place residual keep their data_ptr; vLLM's dynamic rule against a float64 reference of that
rule; CUDA graphs with device-side scale and scale_ub changed between replays; batch invariance."""

from __future__ import annotations

import pytest
import torch
from gpu_cases import SERVING_BATCH_M, SERVING_M, SERVING_N
from gpu_helpers import TOL, make, rel_err, within_a_step

import normir
from normir.ops.quant import quantize_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

S = normir.serving
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
CANARY = 64  # bytes after every output


def canaried(shape, dtype, fill=float("nan")):
    """A tensor of shape followed in its buffer by CANARY bytes of 0x5a; (tensor, check)."""
    numel = 1
    for s in shape:
        numel *= s
    eb = torch.empty((), dtype=dtype).element_size()
    buf = torch.full((numel * eb + CANARY,), 0x5A, dtype=torch.uint8, device="cuda")
    t = buf[: numel * eb].view(dtype).view(shape)
    if dtype.is_floating_point and dtype != FP8:
        t.fill_(fill)
    else:
        t.view(torch.uint8).fill_(0x7F)  # fp8 NaN, int8 127: bytes the poisoned output starts as

    def intact() -> bool:
        return bool((buf[numel * eb:] == 0x5A).all())

    return t, intact


def norm64(h, layer, eps, w=None, b=None, round_xhat=None):
    h = h.double()
    if layer:
        h = h - h.mean(-1, keepdim=True)
    xh = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if round_xhat is not None:
        xh = xh.to(round_xhat).double()
    y = xh * w.double() if w is not None else xh
    return y + b.double() if b is not None else y


@pytest.mark.parametrize("n", SERVING_N)
@pytest.mark.parametrize("layer", (False, True), ids=("rms", "layer"))
def test_fused_add_in_place_equals_out_of_place(n, layer):
    m, eps = SERVING_M, 1e-6
    x, r, w = make((m, n), BF16), make((m, n), BF16), make((n,), BF16) + 1
    b = make((n,), BF16, 0.5) if layer else None
    if layer:
        y0, h0, _, _ = normir.fused_add_layernorm_fwd(x, r, w, b, eps)
    else:
        y0, h0, _ = normir.fused_add_rmsnorm_fwd(x, r, w, eps)
    xi, xok = canaried((m, n), BF16)
    ri, rok = canaried((m, n), BF16)
    xi.copy_(x)
    ri.copy_(r)
    ptrs = (xi.data_ptr(), ri.data_ptr())
    if layer:
        S.fused_add_layer_norm(xi, ri, w, b, eps)
    else:
        S.fused_add_rms_norm(xi, ri, w, eps)
    torch.cuda.synchronize()
    assert (xi.data_ptr(), ri.data_ptr()) == ptrs and xok() and rok()
    assert torch.equal(ri, h0) and torch.equal(xi, y0)
    assert rel_err(xi, norm64(h0, layer, eps, w, b)) < TOL[BF16]


@pytest.mark.parametrize("n", SERVING_N)
@pytest.mark.parametrize("layer", (False, True), ids=("rms", "layer"))
def test_out_and_out_is_x(n, layer):
    m, eps = SERVING_M, 1e-5
    x, w = make((m, n), BF16), make((n,), BF16) + 1
    b = make((n,), BF16, 0.5) if layer else None
    y0 = normir.layernorm_fwd(x, w, b, eps)[0] if layer else normir.rmsnorm_fwd(x, w, eps)[0]
    out, ok = canaried((m, n), BF16)
    (S.layer_norm(out, x, w, b, eps) if layer else S.rms_norm(out, x, w, eps))
    xi = x.clone()
    (S.layer_norm(xi, xi, w, b, eps) if layer else S.rms_norm(xi, xi, w, eps))
    torch.cuda.synchronize()
    assert ok() and torch.equal(out, y0) and torch.equal(xi, y0)


@pytest.mark.parametrize("n", SERVING_N)
@pytest.mark.parametrize("residual", (False, True), ids=("plain", "fused"))
def test_static_fp8_equals_rmsnorm_quant(n, residual):
    m, eps = SERVING_M, 1e-6
    x, r, w = make((m, n), BF16), make((m, n), BF16), make((n,), BF16) + 1
    scale = torch.tensor([0.02], device="cuda")
    want = normir.rmsnorm_quant(x, w, eps, scale=scale, residual=r if residual else None)
    out, ok = canaried((m, n), FP8)
    ri = r.clone()
    if residual:
        S.fused_add_rms_norm_static_fp8_quant(out, x, ri, w, scale, eps)
    else:
        S.rms_norm_static_fp8_quant(out, x, w, scale, eps)
    torch.cuda.synchronize()
    assert ok() and torch.equal(out.view(torch.int8), want[0].view(torch.int8))
    assert torch.equal(ri, want[2] if residual else r)


@pytest.mark.parametrize("n", SERVING_N)
@pytest.mark.parametrize("residual", (False, True), ids=("plain", "fused"))
@pytest.mark.parametrize("qdtype", (FP8, torch.int8), ids=("fp8", "int8"))
def test_dynamic_per_token_follows_vllms_rule(n, residual, qdtype):
    m, eps = SERVING_M, 1e-6
    x, r, w = make((m, n), BF16), make((m, n), BF16), make((n,), BF16) + 1
    out, ok = canaried((m, n), qdtype)
    scales, sok = canaried((m, 1), torch.float32)
    ri = r.clone()
    S.rms_norm_dynamic_per_token_quant(out, x, w, scales, eps, None, ri if residual else None)
    torch.cuda.synchronize()
    assert ok() and sok()
    h = x.double() + r.double() if residual else x.double()  # the fp32 sum, not its rounding
    y = norm64(h, False, eps, w, round_xhat=BF16)
    q, s = quantize_ref(y.float(), "fp8" if qdtype == FP8 else "int8")
    # x_hat's rounding may fall the other way where rstd differs in its last bit: one bf16 ulp
    assert ((scales - s).abs() <= s * 2 ** -7).all()
    assert within_a_step(out, scales, y, "fp8" if qdtype == FP8 else "int8")
    if residual:
        assert torch.equal(ri, (x.float() + r.float()).to(BF16))


def test_cuda_graphs_read_device_side_scales():
    n, eps = 4096, 1e-6
    x, r, w = make((64, n), BF16), make((64, n), BF16), make((n,), BF16) + 1
    scale, ub = torch.tensor([0.02], device="cuda"), torch.tensor([1.0], device="cuda")
    q_s, q_d = torch.empty((64, n), dtype=FP8, device="cuda"), torch.empty((64, n), dtype=FP8, device="cuda")
    scales = torch.empty(64, 1, device="cuda")
    S.rms_norm_static_fp8_quant(q_s, x, w, scale, eps)  # loaded before the capture
    S.rms_norm_dynamic_per_token_quant(q_d, x, w, scales, eps, ub)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        S.rms_norm_static_fp8_quant(q_s, x, w, scale, eps)
        S.rms_norm_dynamic_per_token_quant(q_d, x, w, scales, eps, ub)
    for sv, uv in ((0.05, 0.5), (0.01, 0.01)):
        scale.fill_(sv)
        ub.fill_(uv)
        g.replay()
        want_s, want_d, want_scales = torch.empty_like(q_s), torch.empty_like(q_d), torch.empty_like(scales)
        S.rms_norm_static_fp8_quant(want_s, x, w, scale, eps)
        S.rms_norm_dynamic_per_token_quant(want_d, x, w, want_scales, eps, ub)
        torch.cuda.synchronize()
        assert torch.equal(q_s.view(torch.int8), want_s.view(torch.int8))
        assert torch.equal(q_d.view(torch.int8), want_d.view(torch.int8)) and torch.equal(scales, want_scales)
    x0, r0 = x.clone(), r.clone()
    g2 = torch.cuda.CUDAGraph()
    S.fused_add_rms_norm(x0.clone(), r0.clone(), w, eps)
    xi, ri = x0.clone(), r0.clone()
    with torch.cuda.graph(g2):
        S.fused_add_rms_norm(xi, ri, w, eps)
    xi.copy_(x0)
    ri.copy_(r0)
    g2.replay()
    y0, h0, _ = normir.fused_add_rmsnorm_fwd(x0, r0, w, eps)
    torch.cuda.synchronize()
    assert torch.equal(xi, y0) and torch.equal(ri, h0)


@pytest.mark.parametrize("op", ("fused_add_rms_norm", "dynamic"))
def test_batch_invariance(op):
    n, eps = 4096, 1e-6
    big = max(SERVING_BATCH_M)
    x, r, w = make((big, n), BF16), make((big, n), BF16), make((n,), BF16) + 1
    rows = {}
    for m in SERVING_BATCH_M:
        xi, ri = x[:m].clone(), r[:m].clone()
        if op == "dynamic":
            q, s = torch.empty((m, n), dtype=FP8, device="cuda"), torch.empty(m, 1, device="cuda")
            S.rms_norm_dynamic_per_token_quant(q, xi, w, s, eps, None, ri)
            rows[m] = (q[0].view(torch.int8).clone(), s[0].clone(), ri[0].clone())
        else:
            S.fused_add_rms_norm(xi, ri, w, eps)
            rows[m] = (xi[0].clone(), ri[0].clone())
    first = rows[SERVING_BATCH_M[0]]
    assert all(all(torch.equal(a, b) for a, b in zip(first, v)) for v in rows.values())


@pytest.mark.parametrize("m", (1, 128))
def test_pdl_on_and_off_agree(m):
    # Programmatic dependent launch changes how a kernel is launched, never what it computes:
    # every serving form bitwise equal with it on and off, eagerly and inside a CUDA graph.
    n, eps = 4096, 1e-6
    x, r, w, b = make((m, n), BF16), make((m, n), BF16), make((n,), BF16) + 1, make((n,), BF16, 0.5)
    scale = torch.tensor([0.02], device="cuda")

    def all_forms(pdl):
        xi, ri, xl, rl = x.clone(), r.clone(), x.clone(), r.clone()
        out = torch.empty_like(x)
        q_s, q_d = torch.empty((m, n), dtype=FP8, device="cuda"), torch.empty((m, n), dtype=torch.int8, device="cuda")
        scales, rd = torch.empty(m, 1, device="cuda"), r.clone()
        S.fused_add_rms_norm(xi, ri, w, eps, enable_pdl=pdl)
        S.fused_add_layer_norm(xl, rl, w, b, eps, enable_pdl=pdl)
        S.rms_norm(out, x, w, eps, enable_pdl=pdl)
        S.fused_add_rms_norm_static_fp8_quant(q_s, x, r.clone(), w, scale, eps, enable_pdl=pdl)
        S.rms_norm_dynamic_per_token_quant(q_d, x, w, scales, eps, None, rd, enable_pdl=pdl)
        qq, ss = normir.rmsnorm_quant(x, w, eps, enable_pdl=pdl)
        return [xi, ri, xl, rl, out, q_s.view(torch.int8), q_d, scales, rd, qq.view(torch.int8), ss]

    on, off = all_forms(True), all_forms(False)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(on, off))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = all_forms(True)
    g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(captured, off))


@pytest.mark.large
def test_more_than_two_to_the_31_elements():
    # M * N > 2^31, in place: row offsets past 32 bits; the last rows against a slice run alone.
    n, m = 32768, (1 << 31) // 32768 + 3
    x, r = torch.randn(m, n, device="cuda", dtype=BF16), torch.randn(m, n, device="cuda", dtype=BF16)
    w = torch.ones(n, device="cuda", dtype=BF16)
    x3, r3 = x[-3:].clone(), r[-3:].clone()
    S.fused_add_rms_norm(x, r, w, 1e-6)
    S.fused_add_rms_norm(x3, r3, w, 1e-6)
    assert torch.equal(x[-3:], x3) and torch.equal(r[-3:], r3)
