"""CPU tier: the quantized forwards' Python side. Outputs on fake CUDA tensors (shapes, dtypes, the
forms' optional outputs), every bad argument refused naming the fix, the problems the driver
refuses, the layout (one block a row with the dynamic amax, no rule measured for it), and the
custom ops through torch.library.opcheck and torch.compile on the CPU emulation of the launches
(cpu_emulation.py: the kernels' math in torch, so these check the wiring, not the kernels)."""

from __future__ import annotations

import pytest
import torch

import normir
from normir.options import build

pytestmark = pytest.mark.cpu

BF16 = torch.bfloat16


@pytest.mark.parametrize("fn", ("rmsnorm_quant", "layernorm_quant"))
def test_outputs_on_fake_tensors(fake, fn):
    f = getattr(normir, fn)
    x, w, r = fake((3, 5, 4096)), fake((4096,)), fake((3, 5, 4096))
    one = fake((1,), torch.float32)
    q, s = f(x, w)
    assert (q.shape, q.dtype, s.shape, s.dtype) == ((3, 5, 4096), torch.float8_e4m3fn, (3, 5, 1), torch.float32)
    q, s = f(x, w, quant="int8", scale=one)
    assert q.dtype == torch.int8 and s is one  # the static scale comes back as the scales
    q, s, res_out, y = f(x, w, residual=r, residual_dtype=torch.float32, return_y=True)
    assert res_out.dtype == torch.float32 and res_out.shape == x.shape and y.dtype == BF16
    q, s, y = f(x, w, smooth=fake((4096,), torch.float32), scale_ub=one, return_y=True)
    assert y.shape == x.shape


def _bad_cases(fake):
    x, w = fake((4, 1024)), fake((1024,))
    one = fake((1,), torch.float32)
    return [
        (dict(quant="int4"), ValueError, "choose 'fp8'"),
        (dict(scale=fake((2,), torch.float32)), ValueError, "scale must be a float32 tensor of one element"),
        (dict(scale=fake((1,), BF16)), ValueError, "scale must be a float32 tensor of one element"),
        (dict(scale=0.5), TypeError, "scale must be a float32 tensor"),
        (dict(scale_ub=one, quant="int8"), ValueError, "scale_ub caps the dynamic fp8"),
        (dict(scale_ub=one, scale=one), ValueError, "no static scale"),
        (dict(smooth=fake((1024,), BF16)), ValueError, "smooth must be a float32 tensor of shape (1024,)"),
        (dict(smooth=fake((512,), torch.float32)), ValueError, "smooth must be a float32 tensor of shape (1024,)"),
        (dict(return_y=1), TypeError, "return_y must be a bool"),
        (dict(residual=fake((4, 512))), ValueError, "residual must match x"),
        (dict(residual_dtype=torch.int8), TypeError, "residual_dtype has dtype torch.int8"),
    ], x, w


@pytest.mark.parametrize("fn", ("rmsnorm_quant", "layernorm_quant"))
def test_bad_arguments_raise_naming_the_fix(fake, fn):
    cases, x, w = _bad_cases(fake)
    for kwargs, error, words in cases:
        with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
            getattr(normir, fn)(x, w, **kwargs)


def test_the_driver_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="give qdtype"):
        build(kernel="rmsnorm_quant_fwd", n=4096)
    with pytest.raises(ValueError, match="sm_80 has no OCP fp8"):
        build(kernel="rmsnorm_quant_fwd", n=4096, qdtype="f8e4m3", target="sm_80")
    with pytest.raises(ValueError, match="gfx942 has no OCP fp8"):
        build(kernel="layernorm_quant_fwd", n=4096, qdtype="i8", target="gfx942")
    with pytest.raises(ValueError, match="takes no quant"):
        build(kernel="rmsnorm_fwd", n=4096, qdtype="i8")
    with pytest.raises(ValueError, match="has no cluster exchange"):
        build(kernel="rmsnorm_quant_fwd", n=65536, qdtype="f8e4m3", qdynamic=True, cluster=2)
    with pytest.raises(ValueError, match="needs qdynamic=True"):
        build(kernel="rmsnorm_quant_fwd", n=4096, qdtype="f8e4m3", has_scale_ub=True)


@pytest.mark.parametrize("n", (4096, 65536, 262144))
def test_dynamic_scales_keep_a_row_in_one_block_and_take_no_rule(n):
    # The amax has no cluster exchange; the static form may split (it reduces nothing more).
    dyn = build(kernel="rmsnorm_quant_fwd", n=n, qdtype="f8e4m3", qdynamic=True)
    assert dyn.layout.cluster == 1 and dyn.rules == ()
    static = build(kernel="rmsnorm_quant_fwd", n=n, qdtype="f8e4m3")
    assert static.rules == ()  # no rule was measured with a 1-byte output
    plain = build(kernel="fused_add_rmsnorm_fwd", n=n)
    if n == 262144:
        assert plain.layout.cluster > 1 and static.layout.cluster == plain.layout.cluster
        assert not dyn.layout.cache_row  # read again for the amax's pass and the stores


@pytest.fixture
def emulated(cpu_launches):
    yield


def _args(kernel, quant, static, residual):
    n = 256
    x = torch.randn(3, n, dtype=BF16)
    r = torch.randn(3, n, dtype=BF16) if residual else None
    w = torch.randn(n, dtype=BF16)
    b = torch.randn(n, dtype=BF16) if kernel == "layernorm_quant_fwd" else None
    scale = torch.tensor([0.05]) if static else None
    return (x, r, w, b, scale, None, None, 1e-6, 0.0, quant, None, True, True)


@pytest.mark.parametrize("residual", (False, True))
@pytest.mark.parametrize("static", (False, True))
@pytest.mark.parametrize("quant", ("fp8", "int8"))
@pytest.mark.parametrize("kernel", ("rmsnorm_quant_fwd", "layernorm_quant_fwd"))
def test_opcheck(emulated, kernel, quant, static, residual):
    torch.library.opcheck(getattr(torch.ops.normir, kernel).default, _args(kernel, quant, static, residual))


def test_compiles_in_one_graph(emulated):
    x, w = torch.randn(4, 256, dtype=BF16), torch.randn(256, dtype=BF16)
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    fn = torch.compile(lambda x, w: normir.rmsnorm_quant(x, w, quant="int8"), backend=counter, fullgraph=True)
    q, s = fn(x, w)
    q2, s2 = normir.rmsnorm_quant(x, w, quant="int8")
    assert counter.frame_count == 1 and torch.equal(q, q2) and torch.equal(s, s2)


def test_no_gradient_flows(emulated):
    x = torch.randn(2, 256, dtype=BF16, requires_grad=True)
    w = torch.randn(256, dtype=BF16, requires_grad=True)
    q, s, y = normir.rmsnorm_quant(x, w, return_y=True)
    assert not (q.requires_grad or s.requires_grad or y.requires_grad)
