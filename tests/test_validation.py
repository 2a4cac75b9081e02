"""Argument checks of the torch entry points, row views and vector widths: no GPU needed."""

from __future__ import annotations

import math

import pytest
import torch

import normir
from normir import launch
from normir.ops import _rows as R
from normir.ops import rmsnorm
from normir.options import FLT_MIN, MAX_N

pytestmark = pytest.mark.cpu


class _CudaLooking(torch.Tensor):
    """A CPU tensor that claims to be on GPU 0, to reach the checks after the device check."""

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 0


def fake_cuda(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(_CudaLooking)


# ---------------------------------------------------------------------------- device


def test_public_names_bind_once():
    # The lazy package binds the API on first use, so later lookups skip the module hook.
    assert normir.rmsnorm_fwd is rmsnorm.rmsnorm_fwd
    for name in ("RMSNorm", "rmsnorm", "rmsnorm_bwd", "rmsnorm_fwd"):
        assert vars(normir)[name] is getattr(rmsnorm, name)
    with pytest.raises(AttributeError, match="module 'normir' has no attribute 'nope'"):
        normir.nope  # noqa: B018


def test_cpu_tensor_rejected():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"x is on cpu; .* x\.cuda\(\)"):
        normir.rmsnorm_fwd(x)
    with pytest.raises(ValueError, match=r"\.cuda\(\)"):
        normir.rmsnorm(x, torch.ones(64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"\.cuda\(\)"):
        normir.RMSNorm(64, dtype=torch.bfloat16)(x)
    with pytest.raises(ValueError, match=r"x is on cpu"):
        normir.rmsnorm_bwd(x, None, x, torch.ones(4))


# ---------------------------------------------------------------------------- check_input


def test_check_input_dtype():
    with pytest.raises(TypeError, match=r"^x has dtype torch\.int32; normir supports"):
        R.check_input(fake_cuda(torch.zeros(4, 8, dtype=torch.int32)), "x")
    with pytest.raises(TypeError, match=r"^dy has dtype torch\.float64"):
        R.check_input(fake_cuda(torch.zeros(4, 8, dtype=torch.float64)), "dy")
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16"), (torch.float32, "f32")):
        assert R.check_input(fake_cuda(torch.zeros(4, 8, dtype=dt)), "x") == name


def test_check_input_shape():
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor, got list"):
        R.check_input([1.0, 2.0], "x")
    with pytest.raises(ValueError, match="scalar"):
        R.check_input(fake_cuda(torch.tensor(1.0)), "x")
    with pytest.raises(ValueError, match=r"x\.shape\[-1\] = 0 is out of range"):
        R.check_input(fake_cuda(torch.zeros(4, 0)), "x")
    too_long = torch.zeros(1).expand(MAX_N + 1)  # no memory behind it
    with pytest.raises(ValueError, match=rf"x\.shape\[-1\] = {MAX_N + 1} is out of range"):
        R.check_input(fake_cuda(too_long), "x")
    assert R.check_input(fake_cuda(torch.zeros(1).expand(MAX_N)), "x") == "f32"


# ---------------------------------------------------------------------------- check_eps


@pytest.mark.parametrize("eps, exc, match", [
    (True, TypeError, "eps must be a float, got bool"),
    ("1e-6", TypeError, "eps must be a float, got str"),
    (None, TypeError, "got NoneType"),
    (torch.tensor(1e-6), TypeError, "got Tensor"),
    (math.nan, ValueError, r"^eps=nan must be"),
    (math.inf, ValueError, r"^eps=inf must be"),
    (0, ValueError, r"^eps=0\.0 must be"),
    (-1e-6, ValueError, r"^eps=-1e-06 must be"),
    (1e-40, ValueError, r"^eps=1e-40 must be"),
])
def test_check_eps_rejects(eps, exc, match):
    with pytest.raises(exc, match=match):
        R.check_eps(eps)


def test_check_eps_accepts():
    assert R.check_eps(1e-6) == 1e-6
    assert R.check_eps(1) == 1.0 and isinstance(R.check_eps(1), float)
    assert R.check_eps(FLT_MIN) == FLT_MIN


def test_eps_checked_before_device():
    with pytest.raises(TypeError, match="eps must be a float"):
        normir.rmsnorm_fwd(torch.zeros(2, 8), eps="1e-6")
    with pytest.raises(ValueError, match="eps=0.0"):
        normir.RMSNorm(8, eps=0.0)


# ---------------------------------------------------------------------------- check_weight


def test_check_weight():
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    assert R.check_weight(None, x, 16) is None
    with pytest.raises(TypeError, match=r"weight must be a torch\.Tensor or None, got list"):
        R.check_weight([1.0] * 16, x, 16)
    with pytest.raises(ValueError, match=r"^weight is on cpu but x is on .*; put both on one device"):
        R.check_weight(torch.ones(16, dtype=torch.bfloat16), fake_cuda(x), 16)
    w = fake_cuda(torch.ones(16, dtype=torch.bfloat16))
    assert R.check_weight(w, fake_cuda(x), 16) is w
    with pytest.raises(TypeError, match=r"weight has dtype torch\.float64; normir supports torch\.bfloat16, "
                                        r"torch\.float16 and torch\.float32"):
        R.check_weight(torch.ones(16, dtype=torch.float64), x, 16)
    w16 = torch.ones(16, dtype=torch.float16)
    assert R.check_weight(w16, x, 16) is w16  # each tensor in its own type: f16 weight with bf16 x
    with pytest.raises(ValueError, match=r"weight has shape \(17,\); it must be \(16,\)"):
        R.check_weight(torch.ones(17, dtype=torch.bfloat16), x, 16)
    with pytest.raises(ValueError, match=r"w2 has shape \(1, 16\); it must be \(16,\)"):
        R.check_weight(torch.ones(1, 16, dtype=torch.bfloat16), x, 16, name="w2")
    w32 = torch.ones(16, dtype=torch.float32)
    assert R.check_weight(w32, x, 16).data_ptr() == w32.data_ptr()  # fp32 weight with bf16 x: allowed, not copied
    strided = torch.arange(32, dtype=torch.bfloat16)[::2]
    w = R.check_weight(strided, x, 16)
    assert w.is_contiguous() and torch.equal(w, strided)


def test_bwd_argument_checks():
    x = fake_cuda(torch.zeros(4, 16, dtype=torch.bfloat16))
    rstd = torch.ones(4)
    with pytest.raises(ValueError, match=r"dy must match x in shape and device: dy is \(4, 8\)"):
        normir.rmsnorm_bwd(x, None, fake_cuda(torch.zeros(4, 8, dtype=torch.bfloat16)), rstd)
    # dy in another float dtype is read in its own (the backwards' dtype rule); an integer one is refused.
    with pytest.raises(TypeError, match=r"dy has dtype torch.int16; normir supports"):
        normir.rmsnorm_bwd(x, None, fake_cuda(torch.zeros(4, 16, dtype=torch.int16)), rstd)
    for bad in (torch.ones(4, dtype=torch.bfloat16), torch.ones(5), None):
        with pytest.raises(ValueError, match=r"rstd must be the float32 tensor"):
            normir.rmsnorm_bwd(x, None, x, bad)


# ---------------------------------------------------------------------------- rows_of


def _kernel_view(t2: torch.Tensor, stride: int, n: int) -> torch.Tensor:
    """The (M, N) matrix a kernel reads from t2's pointer with M = numel / N rows of pitch `stride`."""
    m = t2.numel() // n if n else 0
    return torch.as_strided(t2, (m, n), (stride, 1), t2.storage_offset())


def _check_rows(x: torch.Tensor, copied: bool) -> tuple[torch.Tensor, int]:
    n = x.shape[-1]
    x2, stride = R.rows_of(x)
    assert torch.equal(_kernel_view(x2, stride, n), x.reshape(-1, n))
    assert (x2.data_ptr() != x.data_ptr()) == copied
    return x2, stride


def test_rows_of_strided_view_keeps_stride():
    base = torch.arange(8 * 48, dtype=torch.float32).view(8, 48)
    x2, stride = _check_rows(base[:, :32], copied=False)
    assert stride == 48
    assert x2.data_ptr() == base.data_ptr()


def test_rows_of_offset_view():
    base = torch.arange(8 * 48, dtype=torch.float32).view(8, 48)
    _, stride = _check_rows(base[2:, 16:], copied=False)
    assert stride == 48


def test_rows_of_contiguous():
    x = torch.randn(4, 16)
    x2, stride = _check_rows(x, copied=False)
    assert stride == 16


def test_rows_of_transposed_is_copied():
    x = torch.arange(32 * 8, dtype=torch.float32).view(32, 8).t()  # (8, 32), last-dim stride 8
    x2, stride = _check_rows(x, copied=True)
    assert stride == 32


def test_rows_of_expanded():
    # Expanded along the last dim (stride 0 within a row): copied.
    x = torch.tensor([[1.0], [2.0]]).expand(2, 16)
    _, stride = _check_rows(x, copied=True)
    assert stride == 16
    # Expanded along rows (one row read M times): a zero row pitch, no copy; x and dy are only read.
    row = torch.arange(16, dtype=torch.float32)
    x2, stride = _check_rows(row.expand(5, 16), copied=False)
    assert stride == 0 and x2.data_ptr() == row.data_ptr()


def test_rows_of_flattens_leading_dims():
    x = torch.randn(2, 3, 4, 16)
    _, stride = _check_rows(x, copied=False)
    assert stride == 16
    # Leading dims that cannot merge into one strided dim: copied.
    _, ystride = _check_rows(torch.randn(2, 8, 16)[:, :4, :], copied=True)
    assert ystride == 16
    # Leading dims that merge into one with a row pitch: kept.
    _, zstride = _check_rows(torch.randn(2, 4, 32)[:, :, :16], copied=False)
    assert zstride == 32


def test_rows_of_single_row_and_1d():
    _, stride = _check_rows(torch.randn(64), copied=False)
    assert stride == 64
    _, stride = _check_rows(torch.randn(64, 128)[3:4, :64], copied=False)  # one row of a wider tensor
    col = torch.randn(1, 8).t()  # N=1 with a last-dim stride of 8: nothing to copy
    _check_rows(col, copied=False)
    x2, stride = R.rows_of(torch.randn(0, 16))
    assert x2.numel() == 0 and stride == 16


# ---------------------------------------------------------------------------- vector_width

A = 0x7F0000001000  # a 4096-aligned address


@pytest.mark.parametrize("n, eb, ptrs, strides, vec", [
    (1024, 2, ((A, 2), (A + 4096, 2)), (1024,), 8),  # aligned bf16: 16-byte vectors
    (1024, 2, ((A + 2, 2), (A, 2)), (1024,), 1),  # x offset by one element: scalar
    (1024, 2, ((A, 2), (A + 8, 2)), (1024,), 4),  # y 8-byte aligned: 4 bf16
    (1024, 2, ((A + 4, 2),), (1024,), 2),  # 4-byte aligned: 2 bf16
    (1024, 2, ((A, 2),), (4100,), 4),  # row pitch 4100 elements: 4 | 4100, 8 does not
    (1024, 2, ((A, 2),), (4098,), 2),
    (1024, 2, ((A, 2),), (0,), 8),  # zero pitch (expanded rows) restricts nothing
    (1023, 2, ((A, 2),), (1023,), 1),  # odd N
    (1028, 2, ((A, 2),), (1028,), 4),
    (1024, 4, ((A, 4), (A, 4)), (1024,), 4),  # f32: 4 per 16 bytes
    (1024, 2, ((A, 2), (A + 4, 4)), (1024,), 1),  # f32 weight only 4-aligned with bf16 x
    (1024, 2, ((A, 2), (A + 8, 4)), (1024,), 2),  # f32 weight 8-aligned: 2 elements (8 bytes)
    (1024, 2, ((A, 2), (A + 16, 4)), (1024,), 8),  # 16-aligned f32 weight: 8 bf16 x (two 16 B weight loads)
    (1024, 2, ((A, 2),), (1024, 1028), 4),  # every stride counts (x and dy)
    (4096, 4, (), (), 4),  # dw reduction: N alone
    (6, 2, (), (), 2),
    (1, 2, ((A, 2),), (1,), 1),
])
def test_vector_width(n, eb, ptrs, strides, vec):
    assert launch.vector_width(n, eb, ptrs, strides) == vec


def test_tpr_overrides(monkeypatch):
    assert launch.tpr_overrides() == {}
    monkeypatch.setenv("NORMIR_TPR", "rmsnorm_fwd:65536=512, rmsnorm_bwd:16384=256,rmsnorm_bwd:4096=0x4,a:2=0p0,"
                                     "a:3=1024x2p1s0,a:4=0m2,a:5=0h3,a:6=64v4,a:7=0o2,a:8=0o1r0,a:9=0x2r1,a:10=256r0b1,"
                                     "a:11=128m5d1,a:12=0m2d3n96,a:13=0w1,a:14=0n64w0t1,a:15=0r1g1")

    # The knobs an item gives, and vec (a narrower vector); 0 for tpr, cluster, min_blocks, max_regs
    # and vec is the policy's, as in the variant strings of docs/results/.
    assert launch.tpr_overrides() == {("rmsnorm_fwd", 65536): {"tpr": 512}, ("rmsnorm_bwd", 16384): {"tpr": 256},
                                      ("rmsnorm_bwd", 4096): {"cluster": 4}, ("a", 2): {"l2_prefetch": 0},
                                      ("a", 3): {"tpr": 1024, "cluster": 2, "l2_prefetch": 1, "stage": 0},
                                      ("a", 4): {"min_blocks": 2}, ("a", 5): {"hints": 3},
                                      ("a", 6): {"tpr": 64, "vec": 4}, ("a", 7): {"overlap": 2},
                                      ("a", 8): {"overlap": 1, "cache_row": 0}, ("a", 9): {"cluster": 2, "cache_row": 1},
                                      ("a", 10): {"tpr": 256, "cache_row": 0, "batch_reload": 1},
                                      ("a", 11): {"tpr": 128, "min_blocks": 5, "db_smem": 1},
                                      ("a", 12): {"min_blocks": 2, "db_smem": 3, "max_regs": 96},
                                      ("a", 13): {"cast_words": 1},
                                      ("a", 14): {"max_regs": 64, "cast_words": 0, "two_pass": 1},
                                      ("a", 15): {"cache_row": 1, "stage_dres": 1}}
    for bad in ("rmsnorm_fwd=512", "rmsnorm_fwd:65536", "rmsnorm_fwd:big=512", "a:1=2=3", "a:1=2x", "a:1=x2x2",
                "a:1=2p2", "a:1=2p", "a:1=2s1p1", "a:1=2m", "a:1=2m2s1", "a:1=2h", "a:1=2h1m2", "a:1=2v", "a:1=2v4h1",
                "a:1=2o", "a:1=2o1v4", "a:1=2r", "a:1=2r2", "a:1=2r1o1", "a:1=2a1",
                "a:1=2b", "a:1=2b2", "a:1=2b1r1", "a:1=2d", "a:1=2d4", "a:1=2d1b1", "a:1=2n", "a:1=2n64d1",
                "a:1=2w2", "a:1=2w1n64", "a:1=2t1w1", "a:1=2g2", "a:1=2g1t1"):
        monkeypatch.setenv("NORMIR_TPR", f"rmsnorm_bwd:16384=256,{bad}")
        with pytest.raises(ValueError, match=rf"^NORMIR_TPR item {bad!r} is not KERNEL:N=TPR\[xN\]\[pN\]"):
            launch.tpr_overrides()


def test_dtype_names():
    assert launch.dtype_name(torch.bfloat16, "x") == "bf16"
    assert launch.dtype_name(torch.float16, "x") == "f16"
    assert launch.dtype_name(torch.float32, "x") == "f32"
    with pytest.raises(TypeError, match=r"^w has dtype torch\.float64"):
        launch.dtype_name(torch.float64, "w")


def test_rmsnorm_module():
    m = normir.RMSNorm(16, eps=1e-5, dtype=torch.bfloat16)
    assert m.eps == 1e-5 and m.weight.shape == (16,) and m.weight.dtype == torch.bfloat16
    assert normir.RMSNorm(16, elementwise_affine=False).weight is None
