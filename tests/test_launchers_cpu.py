"""The skeletons' launchers without a GPU: every kernel of the catalogue launched through
_fused.launch_fwd / launch_bwd (the general path, then the fast path of a repeated call) on CPU
tensors, with the loaded kernel replaced by a recorder. The kernel gets its arguments in its own
order (the catalogue's), each the right pointer, row count and stride, on both paths; the column
sums get the partial rows and dw's and db's pointers."""

from __future__ import annotations

import pytest
import torch

from normir.kernels import KERNELS
from normir.ops import _fused, _rows
from normir.options import Problem, build

pytestmark = pytest.mark.cpu

BF16, F32 = torch.bfloat16, torch.float32


@pytest.fixture
def recorder(monkeypatch):
    """Launches recorded as {kernel: [named arguments, ...]}; the plans' layouts are the policy's
    on sm_90; outputs and partial rows allocated on the CPU."""
    calls: dict[str, list[dict]] = {}

    class Handle:
        def __init__(self, kernel):
            self.kernel = kernel

        def resident(self, sm_count):
            return 132

    def plan(dev, **fields):
        b = build(**fields, target="sm_90")
        persistent = KERNELS[b.kernel].grid == "persistent"
        return _rows.Plan(Handle(b.kernel), b.layout, persistent, 132 if persistent else 0, _rows.picker(b.kernel))

    def launch(dev, handle, grid, *args):
        names = [a.name for a in KERNELS[handle.kernel].args if a.name != "grid"]
        assert len(args) == len(names), (handle.kernel, names, args)
        calls.setdefault(handle.kernel, []).append(dict(zip(names, args), grid=grid))

    monkeypatch.setattr(_rows, "on_gpu", lambda t: True)
    monkeypatch.setattr(_rows, "plan", plan)
    monkeypatch.setattr(_rows, "launch", launch)
    monkeypatch.setattr(_rows, "current_device", lambda: -1)
    monkeypatch.setattr(_rows, "empty_f32", lambda shape, dev, per_row=False: torch.empty(
        shape[:-1] if per_row else shape, dtype=F32))
    monkeypatch.setattr(_fused, "_partials", lambda parts, n, dev, atomic: torch.zeros((parts, n), dtype=F32))
    for table in (_fused._FWD_SEEN, _fused._BWD_SEEN, _rows._sums):
        table.clear()
    yield calls
    for table in (_fused._FWD_SEEN, _fused._BWD_SEEN, _rows._sums):
        table.clear()


def _ptr(t):
    return t.data_ptr() if t is not None else 0


FWD_CASES = [("rmsnorm_fwd", False, False, False), ("fused_add_rmsnorm_fwd", True, True, True),
             ("fused_add_rmsnorm_fwd", False, True, False), ("layernorm_fwd", False, True, True),
             ("layernorm_fwd", True, False, True)]


@pytest.mark.parametrize("kernel, residual, weight, bias", FWD_CASES)
def test_forward_launch_arguments(recorder, kernel, residual, weight, bias):
    m, n = 6, 256
    x = torch.randn(m, n).to(BF16)
    r = torch.randn(m, n).to(BF16) if residual else None
    w = torch.randn(n).to(BF16) if weight else None
    b = torch.randn(n).to(BF16) if bias else None
    mean = KERNELS[kernel].stats.has_mean
    for _ in range(2):  # the general path, then the fast path
        y, h, rstd, mu = _fused.launch_fwd(x, r, w, b, 1e-5, None, None, 0.0, True, residual, kernel)
        got = recorder[kernel][-1]
        want = dict(x=x.data_ptr(), residual=_ptr(r), w=_ptr(w), b=_ptr(b), y=y.data_ptr(), residual_out=_ptr(h),
                    rstd=rstd.data_ptr(), mean=_ptr(mu), rows=m, x_stride=n, residual_stride=n if residual else 0,
                    y_stride=n, residual_out_stride=n)
        assert {k: v for k, v in got.items() if k != "grid"} == {k: want[k] for k in got if k != "grid"}
        assert (mu is not None) == mean and got["grid"] > 0
    assert len(recorder[kernel]) == 2 and len(_fused._FWD_SEEN) == 1


BWD_CASES = [("rmsnorm_bwd", False, True, False), ("fused_add_rmsnorm_bwd", True, True, True),
             ("fused_add_rmsnorm_bwd", False, False, True), ("layernorm_bwd", True, True, True),
             ("layernorm_bwd", False, True, False)]


@pytest.mark.parametrize("kernel, dres_out, weight, bias", BWD_CASES)
def test_backward_launch_arguments(recorder, kernel, dres_out, weight, bias):
    m, n = 6, 256
    h, dy = torch.randn(m, n).to(BF16), torch.randn(m, n).to(F32)  # dy in its own dtype
    g = torch.randn(m, n).to(F32) if dres_out else None
    w = torch.randn(n).to(BF16) if weight else None
    rstd, mu = torch.rand(m) + 0.5, torch.randn(m)
    mean = mu if KERNELS[kernel].stats.has_mean else None
    for _ in range(2):
        dx, dres, dw, db = _fused.launch_bwd(dy, h, w, rstd, g, BF16 if bias else None, 0.0, None, None, False,
                                             kernel=kernel, mean=mean)
        got = recorder[kernel][-1]
        want = dict(x=h.data_ptr(), w=_ptr(w), dy=dy.data_ptr(), rstd=rstd.data_ptr(), mean=_ptr(mean),
                    dres_out=_ptr(g), dx=dx.data_ptr(), dres=_ptr(dres), rows=m, x_stride=n, dy_stride=n,
                    dres_out_stride=n if dres_out else 0, dx_stride=n, dres_stride=n)
        assert {k: got[k] for k in got if k in want} == {k: want[k] for k in got if k in want}
        assert bool(got["dw_part"]) == weight and (not bias or got["db_part"])
        assert (dw is not None) == weight and (db is not None) == bias and dres is None
        if weight or bias:
            sums = recorder["rmsnorm_dw_reduce"][-1]
            first = dw if weight else db
            assert sums["out"] == first.data_ptr() and sums["db"] == (db.data_ptr() if weight and bias else 0)
            assert sums["part"] == (got["dw_part"] or got["db_part"])
    assert len(recorder[kernel]) == 2 and len(_fused._BWD_SEEN) == 1
    assert Problem(kernel=kernel, n=n, odtype="f32", has_dres_out=dres_out,  # the plan's problem builds
                   gdtype="f32" if dres_out else "", bdtype="f32" if bias else "").kernel == kernel
