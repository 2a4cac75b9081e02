"""CPU tier: the serving forms (normir.serving, torch.ops.normir.<vLLM's names>). Their schemas are
vLLM's with the written arguments annotated; on the CPU emulation of the launches
(cpu_emulation.py: the kernels' math in torch, so these check the wiring, not the kernels) each
writes exactly the arguments its API names, in place (data_ptr kept), and nothing else; the rule
each takes reaches the kernel's problem (vLLM's dynamic rule only in its dynamic op); out = x
takes the in-place kernel; any other sharing of memory, a written tensor with overlapping
elements, and bad arguments are refused naming the fix; strided outputs are written back; M = 0
is a no-op; opcheck and torch.compile (one graph) pass; fake tensors give the same checks."""

from __future__ import annotations

import pytest
import torch

import normir
from normir.ops import quant, serving

pytestmark = pytest.mark.cpu

BF16, F32, FP8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn
S = normir.serving

# vLLM's schemas (csrc/torch_bindings.cpp), the written arguments annotated
SCHEMAS = {
    "rms_norm": "(Tensor(a0!) result, Tensor input, Tensor? weight, float epsilon) -> ()",
    "fused_add_rms_norm": "(Tensor(a0!) input, Tensor(a1!) residual, Tensor? weight, float epsilon) -> ()",
    "rms_norm_static_fp8_quant": "(Tensor(a0!) result, Tensor input, Tensor weight, Tensor scale, float epsilon) -> ()",
    "fused_add_rms_norm_static_fp8_quant": "(Tensor(a0!) result, Tensor input, Tensor(a2!) residual, Tensor weight, "
                                           "Tensor scale, float epsilon) -> ()",
    "rms_norm_dynamic_per_token_quant": "(Tensor(a0!) result, Tensor input, Tensor weight, Tensor(a3!) scale, "
                                        "float epsilon, Tensor? scale_ub=None, Tensor(a6!)? residual=None) -> ()",
    "layer_norm": "(Tensor(a0!) result, Tensor input, Tensor? weight, Tensor? bias, float epsilon) -> ()",
    "fused_add_layer_norm": "(Tensor(a0!) input, Tensor(a1!) residual, Tensor? weight, Tensor? bias, "
                            "float epsilon) -> ()",
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schemas_are_vllms_with_mutation_annotations(name):
    schema = getattr(torch.ops.normir, name).default._schema
    assert str(schema) == f"normir::{name}{SCHEMAS[name]}"
    assert name in S.__all__


@pytest.fixture
def fields(cpu_launches, monkeypatch):
    """The problems the serving forms launch (each launch's options.Problem fields), recorded."""
    seen = []
    run = serving.launch_rows

    def record(f, *args):
        seen.append(dict(f, enable_pdl=args[-1]))
        run(f, *args)

    monkeypatch.setattr(serving, "launch_rows", record)
    return seen


def _norm(h, kernel, eps, weight=None, bias=None):
    """The float64 norm of h's rows (RMSNorm's or LayerNorm's)."""
    h = h.double()
    if kernel == "layer":
        h = h - h.mean(-1, keepdim=True)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    y = y * weight.double() if weight is not None else y
    return y + bias.double() if bias is not None else y


def _inputs(m=5, n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g).to(BF16)
    r = torch.randn(m, n, generator=g).to(BF16)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(BF16)
    b = (0.1 * torch.randn(n, generator=g)).to(BF16)
    return x, r, w, b


def test_rms_norm_writes_out_only(fields):
    x, _, w, _ = _inputs()
    x0, w0 = x.clone(), w.clone()
    out = torch.full_like(x, float("nan"))
    ptr = out.data_ptr()
    assert S.rms_norm(out, x, w, 1e-6) is None
    assert out.data_ptr() == ptr and torch.equal(x, x0) and torch.equal(w, w0)
    torch.testing.assert_close(out, _norm(x, "rms", 1e-6, w).to(BF16), atol=2e-2, rtol=2e-2)
    assert fields[-1]["kernel"] == "rmsnorm_fwd" and not fields[-1]["inplace"]


@pytest.mark.parametrize("op", ("rms_norm", "layer_norm"))
def test_out_is_x_takes_the_in_place_kernel(fields, op):
    x, _, w, b = _inputs()
    want = _norm(x, op[:-5], 1e-5, w, b if op == "layer_norm" else None).to(BF16)
    ptr = x.data_ptr()
    getattr(S, op)(x, x, w, *((b,) if op == "layer_norm" else ()), 1e-5)
    assert x.data_ptr() == ptr and fields[-1]["inplace"]
    torch.testing.assert_close(x, want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("op", ("fused_add_rms_norm", "fused_add_layer_norm"))
@pytest.mark.parametrize("rdtype", (BF16, F32))
def test_fused_add_in_place(fields, op, rdtype):
    x, r, w, b = _inputs()
    r = r.to(rdtype)
    h = (x.float() + r.float()).to(rdtype)
    want = _norm(h, "layer" if "layer" in op else "rms", 1e-6, w, b if "layer" in op else None).to(BF16)
    ptrs, w0, b0 = (x.data_ptr(), r.data_ptr()), w.clone(), b.clone()
    getattr(S, op)(x, r, w, *((b,) if "layer" in op else ()), 1e-6)
    assert (x.data_ptr(), r.data_ptr()) == ptrs and torch.equal(w, w0) and torch.equal(b, b0)
    assert torch.equal(r, h)  # residual <- x + residual, rounded to residual's dtype
    torch.testing.assert_close(x, want, atol=2e-2, rtol=2e-2)
    f = fields[-1]
    assert f["inplace"] and f["store_residual"] and f["rdtype"] == {BF16: "bf16", F32: "f32"}[rdtype]


def test_static_fp8_forms(fields):
    x, r, w, _ = _inputs()
    scale = torch.tensor([0.02])
    x0, r0 = x.clone(), r.clone()
    out = torch.empty(x.shape, dtype=FP8)
    S.rms_norm_static_fp8_quant(out, x, w, scale, 1e-6)
    q, _ = quant.quantize_ref(_norm(x, "rms", 1e-6, w).float(), "fp8", scale)
    assert torch.equal(x, x0) and (out.float() - q.float()).abs().max() <= 16  # within a quant step or so
    assert not fields[-1]["inplace"] and not fields[-1].get("sum_f32") and not fields[-1].get("round_xhat")
    S.fused_add_rms_norm_static_fp8_quant(out, x, r, w, scale, 1e-6)
    h = (x0.float() + r0.float()).to(BF16)
    assert torch.equal(x, x0) and torch.equal(r, h)  # x read only, residual in place
    f = fields[-1]
    assert f["inplace"] and f["qdtype"] == "f8e4m3" and not f["qdynamic"] and not f.get("sum_f32")


@pytest.mark.parametrize("qdtype", (FP8, torch.int8))
@pytest.mark.parametrize("wdtype", (BF16, F32))
@pytest.mark.parametrize("residual", (False, True))
def test_dynamic_per_token_takes_vllms_rule(fields, qdtype, wdtype, residual):
    x, r, w, _ = _inputs()
    w = w.to(wdtype)
    out, scales = torch.empty(x.shape, dtype=qdtype), torch.full((x.shape[0], 1), float("nan"))
    r0 = r.clone()
    S.rms_norm_dynamic_per_token_quant(out, x, w, scales, 1e-6, None, r if residual else None)
    f = fields[-1]
    # vLLM's dynamic rule: the fp32 sum's norm; x_hat in x's dtype where the weight has x's dtype
    assert f["qdynamic"] and f["sum_f32"] == residual and f["round_xhat"] == (wdtype == BF16)
    hf = x.double() + r0.double() if residual else x.double()
    xh = _norm(hf, "rms", 1e-6)
    xh = xh.to(BF16).double() if wdtype == BF16 else xh
    _, s = quant.quantize_ref((xh * w.double()).float(), "fp8" if qdtype == FP8 else "int8")
    torch.testing.assert_close(scales, s, rtol=1e-5, atol=0)
    if residual:
        assert torch.equal(r, (x.float() + r0.float()).to(BF16))
    else:
        assert torch.equal(r, r0)


def test_scale_ub_caps_and_is_refused_for_int8(fields):
    x, _, w, _ = _inputs()
    out, scales = torch.empty(x.shape, dtype=FP8), torch.empty(x.shape[0], 1)
    S.rms_norm_dynamic_per_token_quant(out, x, w, scales, 1e-6, torch.tensor([0.5]))
    assert torch.equal(scales, torch.full_like(scales, 0.5 / 448)) and fields[-1]["has_scale_ub"]
    with pytest.raises(ValueError, match="scale_ub caps the dynamic fp8"):
        S.rms_norm_dynamic_per_token_quant(out.view(torch.int8), x, w, scales, 1e-6, torch.tensor([1e-3]))


def _aliasing_cases():
    x, r, w, b = _inputs(m=6)
    big = torch.randn(7, 256).to(BF16)
    q = torch.empty(x.shape, dtype=FP8)
    return [
        ("rms_norm", (big[1:], big[:6], w, 1e-6), "out and x overlap in memory"),
        ("rms_norm", (w.expand(6, 256), x, w, 1e-6), "out has elements that share memory"),
        ("rms_norm", (x[:, :1].expand(6, 256), x, w, 1e-6), "out has elements that share memory"),
        ("fused_add_rms_norm", (x, x, w, 1e-6), "x and residual are the same tensor"),
        ("fused_add_rms_norm", (big[1:], big[:6], w, 1e-6), "x and residual overlap in memory"),
        ("fused_add_rms_norm", (x, r, x[0], 1e-6), "x and weight overlap in memory"),
        ("layer_norm", (x, x, w, x[2], 1e-6), "out and bias overlap in memory"),
        ("fused_add_rms_norm_static_fp8_quant", (q, x, x, w, torch.tensor([1.0]), 1e-6),
         "residual and x are the same tensor"),
        ("rms_norm_dynamic_per_token_quant", (q, x, w, x[:, :1].float(), 1e-6), None),  # scales of x's values: fine
    ]


@pytest.mark.parametrize("case", range(len(_aliasing_cases())))
def test_aliasing_that_cannot_be_made_safe_raises(cpu_launches, case):
    op, args, words = _aliasing_cases()[case]
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    if words is None:
        getattr(S, op)(*args)
        return
    with pytest.raises(ValueError, match=words):
        getattr(S, op)(*args)
    for a, b0 in zip(args, before):  # refused before any write
        if isinstance(a, torch.Tensor) and a.dtype != FP8:
            assert torch.equal(a, b0)


def test_strided_outputs_are_written_back(fields):
    x, r, w, _ = _inputs(m=4)
    out = torch.empty(256, 4, dtype=BF16).t()  # a last dim of stride 4: written through a copy
    S.rms_norm(out, x, w, 1e-6)
    want = torch.empty_like(x)
    S.rms_norm(want, x, w, 1e-6)
    assert torch.equal(out, want)
    xs, rs = torch.randn(4, 2, 256).to(BF16)[:, 0], torch.randn(4, 512).to(BF16)[:, ::2]  # strided rows; stride 2
    xs0, rs0 = xs.clone(), rs.clone()
    S.fused_add_rms_norm(xs, rs, w, 1e-6)
    S.fused_add_rms_norm(xs0, rs0, w, 1e-6)
    assert torch.equal(xs, xs0) and torch.equal(rs, rs0)


def test_enable_pdl_reaches_the_launch(fields):
    x, r, w, _ = _inputs()
    S.fused_add_rms_norm(x, r, w, 1e-6)
    S.fused_add_rms_norm(x, r, w, 1e-6, enable_pdl=False)
    out, scales = torch.empty(x.shape, dtype=FP8), torch.empty(x.shape[0], 1)
    S.rms_norm_dynamic_per_token_quant(out, x, w, scales, 1e-6, enable_pdl=True)
    assert [f["enable_pdl"] for f in fields] == [None, False, True]  # None: NORMIR_PDL's setting


def test_no_rows_is_a_no_op(fields):
    x, r = torch.empty(0, 256, dtype=BF16), torch.empty(0, 256, dtype=BF16)
    w = torch.ones(256, dtype=BF16)
    S.fused_add_rms_norm(x, r, w, 1e-6)
    S.rms_norm_dynamic_per_token_quant(torch.empty(0, 256, dtype=FP8), x, w, torch.empty(0, 1), 1e-6)
    assert fields == []


def _bad_cases():
    x, r, w, _ = _inputs(m=4)
    q, s1 = torch.empty(x.shape, dtype=FP8), torch.tensor([0.1])
    return [
        ("rms_norm", (torch.empty(4, 128, dtype=BF16), x, w, 1e-6), ValueError, "out must match x in shape"),
        ("rms_norm", (torch.empty(4, 256, dtype=torch.int8), x, w, 1e-6), ValueError, "out has dtype torch.int8"),
        ("rms_norm", (torch.empty_like(x), x, w, -1.0), ValueError, "eps=-1.0 must be a finite float"),
        ("rms_norm_static_fp8_quant", (torch.empty_like(x), x, w, s1, 1e-6), ValueError,
         "out has dtype torch.bfloat16; it must be one of torch.float8_e4m3fn"),
        ("rms_norm_static_fp8_quant", (q, x, w, torch.tensor([0.1, 0.2]), 1e-6), ValueError,
         "scale must be a float32 tensor of one element"),
        ("rms_norm_dynamic_per_token_quant", (q, x, w, torch.empty(3, 1), 1e-6), ValueError,
         r"scales must be a float32 tensor of 4 elements \(shape \(4, 1\)"),
        ("rms_norm_dynamic_per_token_quant", (q, x, w, torch.empty(4, 1, dtype=BF16), 1e-6), ValueError,
         "scales must be a float32 tensor"),
        ("rms_norm_dynamic_per_token_quant", (torch.empty_like(x), x, w, torch.empty(4, 1), 1e-6), ValueError,
         "out has dtype torch.bfloat16; it must be one of torch.float8_e4m3fn, torch.int8"),
        ("fused_add_rms_norm", (x, r[:, :128], w, 1e-6), ValueError, "residual must match x"),
        ("fused_add_rms_norm", (x, r, w[:128], 1e-6), ValueError, r"weight has shape \(128,\)"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_arguments_raise_naming_the_fix(cpu_launches, case):
    op, args, error, words = _bad_cases()[case]
    with pytest.raises(error, match=words):
        getattr(S, op)(*args)


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_fakes_run_the_same_checks(fake, case):
    op, args, error, words = _bad_cases()[case]
    faked = [fake(a.shape, a.dtype) if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(error, match=words):
        getattr(torch.ops.normir, op).default(*faked)


def _op_args(name):
    x, r, w, b = _inputs(m=3)
    q, s1, scales = torch.empty(x.shape, dtype=FP8), torch.tensor([0.05]), torch.empty(3, 1)
    return {
        "rms_norm": (torch.empty_like(x), x, w, 1e-6),
        "fused_add_rms_norm": (x, r, w, 1e-6),
        "layer_norm": (torch.empty_like(x), x, w, b, 1e-5),
        "fused_add_layer_norm": (x, r, w, b, 1e-5),
        "rms_norm_static_fp8_quant": (q, x, w, s1, 1e-6),
        "fused_add_rms_norm_static_fp8_quant": (q, x, r, w, s1, 1e-6),
        "rms_norm_dynamic_per_token_quant": (q.view(torch.int8), x, w, scales, 1e-6, None, r),
    }[name]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_opcheck(cpu_launches, name):
    # the schema's mutations are the ones made (test_schema compares fp8 tensors by CPU math torch
    # lacks: the static fp8 ops' mutations are checked above), the fake matches, AOTAutograd's
    # dispatch functionalizes the op
    args = _op_args(name)
    fp8 = any(isinstance(a, torch.Tensor) and a.dtype == FP8 for a in args)
    torch.library.opcheck(getattr(torch.ops.normir, name).default, args,
                          test_utils=("test_faketensor", "test_aot_dispatch_dynamic", *(() if fp8 else ("test_schema",))))


def test_compiles_in_one_graph_with_the_mutations(cpu_launches):
    from torch._dynamo.testing import CompileCounter

    def step(x, r, w, eps):
        S.fused_add_rms_norm(x, r, w, eps)
        out, scales = torch.empty(x.shape, dtype=FP8), torch.empty(x.shape[0], 1)
        S.rms_norm_dynamic_per_token_quant(out, x, w, scales, eps)
        return out.float() * scales

    counter = CompileCounter()
    fn = torch.compile(step, backend=counter, fullgraph=True)
    x, r, w, _ = _inputs()
    xc, rc = x.clone(), r.clone()
    got = fn(xc, rc, w, 1e-6)
    want = step(x, r, w, 1e-6)
    assert counter.frame_count == 1 and torch.equal(got, want) and torch.equal(xc, x) and torch.equal(rc, r)
    fn(xc, rc, w, 1e-5)  # another eps: a graph of its own, never an error
    assert counter.frame_count == 2
