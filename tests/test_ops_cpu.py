"""The op layer without a GPU: the custom ops' schemas, their fake implementations (shapes,
dtypes and the same argument checks as the real ones) on fake CUDA tensors, and the switch
between eager launches and the custom ops."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import normir
from normir.ops import _rows

pytestmark = pytest.mark.cpu


def test_ops_are_registered_with_their_schemas():
    normir.rmsnorm  # noqa: B018  (binds the API, registering the ops)
    assert str(torch.ops.normir.rmsnorm_fwd.default._schema) == (
        "normir::rmsnorm_fwd(Tensor x, Tensor? weight, float eps, bool store_rstd) -> (Tensor, Tensor)")
    assert str(torch.ops.normir.rmsnorm_bwd.default._schema) == (
        "normir::rmsnorm_bwd(Tensor x, Tensor? weight, Tensor dy, Tensor rstd, bool atomic_dw) -> (Tensor, Tensor)")


def test_fake_forward_shapes(fake):
    x, w = fake((3, 5, 4096)), fake((4096,))
    y, rstd = torch.ops.normir.rmsnorm_fwd(x, w, 1e-6, True)
    assert (y.shape, y.dtype, y.device) == (x.shape, x.dtype, x.device)
    assert (rstd.shape, rstd.dtype) == ((3, 5), torch.float32)
    assert torch.ops.normir.rmsnorm_fwd(x, None, 1e-6, False)[1].shape == (0,)
    y32, _ = torch.ops.normir.rmsnorm_fwd(x, fake((4096,), torch.float32), 1e-6, False)
    assert y32.dtype == torch.bfloat16  # the output keeps x's dtype
    # The public functions trace through the custom ops with fake tensors.
    y, rstd = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=False)
    assert y.shape == x.shape and rstd is None
    assert normir.rmsnorm(x, w).shape == x.shape


def test_fake_backward_shapes(fake):
    x, w = fake((7, 1024), torch.float16), fake((1024,), torch.float32)
    dx, dw = torch.ops.normir.rmsnorm_bwd(x, w, fake((7, 1024), torch.float16), fake((7,), torch.float32), False)
    assert (dx.shape, dx.dtype) == (x.shape, x.dtype) and (dw.shape, dw.dtype) == ((1024,), torch.float32)
    dx, dw = normir.rmsnorm_bwd(x, None, fake((7, 1024), torch.float16), fake((7,), torch.float32))
    assert dx.shape == x.shape and dw is None


def test_fake_implementations_run_the_checks(fake):
    x = fake((4, 4096))
    with pytest.raises(ValueError, match=r"weight has shape \(17,\); it must be \(4096,\)"):
        torch.ops.normir.rmsnorm_fwd(x, fake((17,)), 1e-6, False)
    with pytest.raises(TypeError, match=r"weight has dtype torch\.float64; normir supports"):
        torch.ops.normir.rmsnorm_fwd(x, fake((4096,), torch.float64), 1e-6, False)
    with pytest.raises(ValueError, match=r"eps=0\.0 must be a finite float"):
        torch.ops.normir.rmsnorm_fwd(x, None, 0.0, False)
    with pytest.raises(TypeError, match=r"x has dtype torch\.float64"):
        torch.ops.normir.rmsnorm_fwd(fake((4, 8), torch.float64), None, 1e-6, False)
    with pytest.raises(ValueError, match=r"dy must match x in shape"):
        torch.ops.normir.rmsnorm_bwd(x, None, fake((4, 2048)), fake((4,), torch.float32), False)
    with pytest.raises(ValueError, match=r"rstd must be the float32 tensor of shape x\.shape\[:-1\]"):
        torch.ops.normir.rmsnorm_bwd(x, None, x, fake((5,), torch.float32), False)


def test_eager_or_custom_op():
    assert _rows.eager(torch.zeros(2))
    mode = FakeTensorMode()
    fake = FakeTensor(mode, torch.empty((2,), device="meta"), torch.device("cuda", 0))
    assert not _rows.eager(fake)


def test_launch_switches_the_device_only_for_another(monkeypatch):
    # _rows.launch: on the current device straight to the handle (no guard); on another, the thread's
    # device switched around the launch and back. Each on the device's own current stream.
    cur, switched, calls = [0], [], []

    class Handle:
        def launch(self, grid, stream, *args):
            calls.append((grid, stream, args, cur[0]))

    monkeypatch.setattr(_rows, "current_device", lambda: cur[0])
    monkeypatch.setattr(_rows, "raw_stream", lambda dev: 100 + dev)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: (switched.append(d), cur.__setitem__(0, d)))
    _rows.launch(0, Handle(), 4, 1, 2)
    assert calls == [(4, 100, (1, 2), 0)] and switched == []
    # The column sums' plan packs its arguments by name, in the catalogue's order (part, out, db, parts).
    plan = _rows.Plan(Handle(), None, False, 0, _rows.picker("rmsnorm_dw_reduce"))
    _rows.ColumnSums(plan, 3).launch(1, 7, 8, 9)  # part, out, parts; no second output (db): 0
    assert calls[1] == (3, 101, (7, 8, 0, 9), 1) and switched == [1, 0] and cur[0] == 0
