"""Fused residual-add RMSNorm without a GPU: the custom ops' schemas and fake implementations
(output shapes and dtypes for every dtype rule), the argument checks, the kernels' feature
options, and torch.compile tracing the public API on fake CUDA tensors."""

from __future__ import annotations

import pytest
import torch

import normir
from normir.kernels import KERNELS
from normir.options import build
from normir.specialize import values_for

pytestmark = pytest.mark.cpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def test_schemas():
    normir.fused_add_rmsnorm  # noqa: B018  (binds the API, registering the ops)
    assert str(torch.ops.normir.fused_add_rmsnorm_fwd.default._schema) == (
        "normir::fused_add_rmsnorm_fwd(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, float eps, "
        "ScalarType? residual_dtype, ScalarType? out_dtype, float weight_offset, bool store_rstd, "
        "bool store_residual) -> (Tensor, Tensor, Tensor)")
    assert str(torch.ops.normir.fused_add_rmsnorm_bwd.default._schema) == (
        "normir::fused_add_rmsnorm_bwd(Tensor dy, Tensor residual_out, Tensor? weight, Tensor rstd, "
        "Tensor? d_residual_out, ScalarType? bias_dtype, float weight_offset, ScalarType? dx_dtype, "
        "ScalarType? dres_dtype) -> (Tensor, Tensor, Tensor, Tensor)")


@pytest.mark.parametrize("xdt, rdt, res_dtype, out_dtype, want_h, want_y", [
    (BF16, BF16, None, None, BF16, BF16),
    (BF16, F32, None, None, F32, BF16),  # residual_out keeps the residual's type
    (BF16, BF16, F32, None, F32, BF16),  # the fp32 residual stream
    (F32, F32, BF16, F16, BF16, F16),
])
def test_fake_forward_dtypes(fake, xdt, rdt, res_dtype, out_dtype, want_h, want_y):
    x, r, w = fake((3, 5, 1024), xdt), fake((3, 5, 1024), rdt), fake((1024,), F32)
    y, h, rstd = torch.ops.normir.fused_add_rmsnorm_fwd(x, r, w, None, 1e-6, res_dtype, out_dtype, 0.0, True, True)
    assert (y.shape, y.dtype, h.shape, h.dtype) == (x.shape, want_y, x.shape, want_h)
    assert (rstd.shape, rstd.dtype) == ((3, 5), F32)
    y, h, rstd = torch.ops.normir.fused_add_rmsnorm_fwd(x, r, w, None, 1e-6, res_dtype, out_dtype, 0.0, False, False)
    assert h.shape == (0,) and rstd.shape == (0,)
    # The public forms trace through the custom ops with fake tensors.
    y, h, rstd = normir.fused_add_rmsnorm_fwd(x, r, w, residual_dtype=res_dtype, out_dtype=out_dtype)
    assert (y.dtype, h.dtype, rstd) == (want_y, want_h, None)
    y, h = normir.rmsnorm(x, w, residual=r, prenorm=True, residual_dtype=res_dtype, out_dtype=out_dtype)
    assert (y.dtype, h.dtype, h.shape) == (want_y, want_h, x.shape)
    assert normir.rmsnorm(x, w, residual=r, residual_dtype=res_dtype, out_dtype=out_dtype).dtype == want_y


def test_fake_prenorm_without_residual_returns_x(fake):
    x, w = fake((4, 256)), fake((256,))
    y, h = normir.rmsnorm(x, w, prenorm=True)
    assert h is x and y.shape == x.shape
    y, h = normir.fused_add_rmsnorm(x, None, w, residual_dtype=F32)
    assert h.dtype == F32 and h.shape == x.shape
    y, h, _ = normir.fused_add_rmsnorm_fwd(x, None, w)
    assert h is x


def test_fake_backward_dtypes(fake):
    h, w, rstd = fake((7, 1024), F32), fake((1024,), BF16), fake((7,), F32)
    dy = fake((7, 1024), BF16)
    dx, dres, dw, db = torch.ops.normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, None, None, 0.0, BF16, F32)
    assert (dx.dtype, dres.dtype, dres.shape) == (BF16, F32, (7, 1024))  # two dtypes: both written
    assert (dw.dtype, dw.shape, db.shape) == (BF16, (1024,), (0,))
    dx, dres, dw, db = torch.ops.normir.fused_add_rmsnorm_bwd(dy, h, None, rstd, h, F16, 0.0, F32, F32)
    assert (dx.dtype, dres.shape, dw.shape, db.dtype, db.shape) == (F32, (0,), (0,), F16, (1024,))
    dh, dw, db = normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, has_bias=True)
    assert (dh.dtype, dw.dtype, db.dtype) == (F32, BF16, BF16)
    (dx, dres), _, _ = normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, dx_dtype=BF16, dresidual_dtype=F32)
    assert (dx.dtype, dres.dtype) == (BF16, F32)


def test_fake_checks(fake):
    x = fake((4, 256))
    with pytest.raises(ValueError, match=r"residual must match x in shape and device: residual is \(4, 128\)"):
        normir.fused_add_rmsnorm(x, fake((4, 128)), None)
    with pytest.raises(TypeError, match=r"residual has dtype torch\.float64"):
        normir.fused_add_rmsnorm(x, fake((4, 256), torch.float64), None)
    with pytest.raises(ValueError, match=r"bias has shape \(3,\); it must be \(256,\)"):
        normir.rmsnorm(x, fake((256,)), bias=fake((3,)))
    with pytest.raises(TypeError, match=r"out_dtype has dtype torch\.float64"):
        normir.rmsnorm(x, None, out_dtype=torch.float64)
    with pytest.raises(TypeError, match=r"residual_dtype must be a torch\.dtype or None, got str"):
        normir.rmsnorm(x, None, residual=x, residual_dtype="float32")
    with pytest.raises(ValueError, match=r"weight_offset scales by \(weight \+ weight_offset\): it needs a weight"):
        normir.rmsnorm(x, None, weight_offset=1.0)
    with pytest.raises(TypeError, match=r"weight_offset must be a finite float, got nan"):
        normir.rmsnorm(x, fake((256,)), weight_offset=float("nan"))
    with pytest.raises(TypeError, match=r"prenorm must be a bool, got int"):
        normir.rmsnorm(x, None, residual=x, prenorm=1)
    h, rstd = fake((4, 256), F32), fake((4,), F32)
    with pytest.raises(ValueError, match=r"dy must match residual_out in shape and device: dy is \(4, 128\)"):
        normir.fused_add_rmsnorm_bwd(fake((4, 128)), h, None, rstd)
    with pytest.raises(ValueError, match=r"d_residual_out must match residual_out in shape and device: d_residual_out "
                                         r"is \(4, 128\)"):
        normir.fused_add_rmsnorm_bwd(x, h, None, rstd, fake((4, 128)))
    with pytest.raises(TypeError, match=r"d_residual_out has dtype torch.int32; normir supports"):
        normir.fused_add_rmsnorm_bwd(x, h, None, rstd, fake((4, 256), torch.int32))
    with pytest.raises(ValueError, match=r"rstd must be the float32 tensor of shape residual_out\.shape\[:-1\]"):
        normir.fused_add_rmsnorm_bwd(x, h, None, fake((5,), F32))
    with pytest.raises(TypeError, match=r"has_bias must be a bool, got NoneType"):
        normir.fused_add_rmsnorm_bwd(x, h, None, rstd, has_bias=None)


def test_module_parameters():
    m = normir.FusedAddRMSNorm(256, eps=1e-5, bias=True, residual_dtype=F32, weight_offset=1.0, dtype=BF16)
    assert torch.equal(m.weight, torch.zeros(256, dtype=BF16))  # w + weight_offset starts at 1
    assert torch.equal(m.bias, torch.zeros(256, dtype=BF16))
    assert torch.equal(normir.FusedAddRMSNorm(8).weight, torch.ones(8)) and normir.FusedAddRMSNorm(8).bias is None


def test_module_forward(fake):
    m = normir.FusedAddRMSNorm(256, residual_dtype=F32, device="cuda", dtype=BF16)
    y, h = m(fake((2, 256)), fake((2, 256)))
    assert (y.dtype, h.dtype) == (BF16, F32)


# ---------------------------------------------------------------------------- the kernels' options


def test_features_only_where_a_kernel_takes_them():
    with pytest.raises(ValueError, match=r"rmsnorm_fwd takes no residual \(kernels that do: "
                                         r"fused_add_rmsnorm_fwd, layernorm_fwd, layernorm_quant_fwd, "
                                         r"rmsnorm_quant_fwd\)"):
        build(kernel="rmsnorm_fwd", n=1024, rdtype="f32")
    with pytest.raises(ValueError, match=r"rmsnorm_bwd takes no dres out \(kernels that do: "
                                         r"fused_add_rmsnorm_bwd, layernorm_bwd\)"):
        build(kernel="rmsnorm_bwd", n=1024, has_dres_out=True)
    with pytest.raises(ValueError, match=r"fused_add_rmsnorm_fwd takes no xdtype"):
        build(kernel="fused_add_rmsnorm_fwd", n=1024, xdtype="f32")
    with pytest.raises(ValueError, match=r"store_residual=True needs a residual"):
        build(kernel="fused_add_rmsnorm_fwd", n=1024, store_residual=True)
    with pytest.raises(ValueError, match=r"sdtype='f32': residual_out's type needs a residual"):
        build(kernel="fused_add_rmsnorm_fwd", n=1024, sdtype="f32")
    with pytest.raises(ValueError, match=r"bdtype='f64': choose one of"):
        build(kernel="fused_add_rmsnorm_fwd", n=1024, bdtype="f64")
    with pytest.raises(ValueError, match=r"layernorm_fwd takes no weight offset"):
        build(kernel="layernorm_fwd", n=1024, weight_offset=1.0)


def test_features_have_one_spelling():
    # A type equal to its default is the default: one kernel, one key.
    base = build(kernel="fused_add_rmsnorm_fwd", n=1024, rdtype="f32")
    same = build(kernel="fused_add_rmsnorm_fwd", n=1024, rdtype="f32", sdtype="f32", odtype="bf16")
    assert same.digest() == base.digest() and same.held_dtype == "f32"
    bwd = build(kernel="fused_add_rmsnorm_bwd", n=1024, bdtype="bf16", xdtype="bf16")
    assert bwd == build(kernel="fused_add_rmsnorm_bwd", n=1024, bdtype="f16") and bwd.bdtype == "f32"
    assert bwd.xdtype == "" and bwd.held_dtype == "bf16"


def test_vector_from_the_narrowest_row_tensor():
    # bf16 x with an fp32 residual: 16-byte vectors of the bf16 tensors (8 elements).
    assert build(kernel="fused_add_rmsnorm_fwd", n=1024, dtype="f32", sdtype="", rdtype="f32",
                   odtype="bf16").vec == 8
    assert build(kernel="fused_add_rmsnorm_fwd", n=1024, dtype="f32", rdtype="f32").vec == 4


@pytest.mark.parametrize("kernel", sorted(k for k in KERNELS if k.startswith("fused")))
def test_flags_follow_the_features(kernel):
    plain = values_for(build(kernel=kernel, n=1024))
    assert plain["HAS_RESIDUAL"] == plain["HAS_BIAS"] == plain["HAS_OFFSET"] == "false"
    fwd = kernel.endswith("fwd")
    on = values_for(build(kernel=kernel, n=1024, rdtype="f32", bdtype="bf16", weight_offset=1.0,
                            **(dict(store_residual=True) if fwd else dict(has_dres_out=True))))
    assert on["HAS_BIAS"] == on["HAS_OFFSET"] == "true"
    assert on["HAS_RESIDUAL" if fwd else "STORE_DRES"] == "true"
    assert on["STORE_RESIDUAL" if fwd else "HAS_DRES_OUT"] == "true"


def test_stage_dres_forced_and_refused():
    # d_residual_out copied into shared memory in pass 1 (the stage_dres knob): its slots follow what
    # the dynamic shared memory holds already; only a backward reading it, with asynchronous copies.
    from normir.specialize import specialize

    on = build(kernel="fused_add_rmsnorm_bwd", n=65536, has_dres_out=True, stage_dres=1)
    lay = on.layout
    assert lay.stage_dres and lay.dres_at == 0 and lay.smem_bytes == lay.k * lay.block * 16
    text = specialize(on)
    assert "%stage_dres = arith.constant true" in text and "nvvm.cp.async.shared.global" in text
    slots = build(kernel="layernorm_bwd", n=65536, bdtype="f32", has_dres_out=True, stage_dres=1).layout
    assert slots.dyn_slots and slots.dres_at == slots.slot_bytes
    assert slots.smem_bytes == slots.slot_bytes + slots.k * slots.block * 16
    off = build(kernel="fused_add_rmsnorm_bwd", n=65536, has_dres_out=True, stage_dres=0)
    assert not off.layout.stage_dres and off.layout.smem_bytes == 0
    assert "%stage_dres = arith.constant false" in specialize(off)
    for bad in (dict(kernel="fused_add_rmsnorm_bwd", has_dres_out=False), dict(kernel="rmsnorm_bwd"),
                dict(kernel="fused_add_rmsnorm_bwd", has_dres_out=True, target="gfx950"),
                dict(kernel="fused_add_rmsnorm_bwd", has_dres_out=True, stage=1, n=16384),
                dict(kernel="fused_add_rmsnorm_fwd")):
        with pytest.raises(ValueError, match="stage_dres=1 needs a backward reading d_residual_out"):
            build(**{"n": 65536, **bad, "stage_dres": 1})
    with pytest.raises(ValueError, match="stage_dres"):
        build(kernel="fused_add_rmsnorm_bwd", n=65536, has_dres_out=True, stage_dres=2)
