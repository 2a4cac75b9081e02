"""GPU tier: RMSNorm forward and backward against float64 references on the H200.

Every case draws fresh random inputs and poisons the memory the outputs will be allocated from
with NaN first (see poison()), so an unwritten element fails the comparison."""

from __future__ import annotations

import math

import gpu_cases as cases
import pytest
import torch
from gpu_cases import (
    ALIGN_CASES,
    CLUSTER_CASES,
    DTYPE_NAMES,
    EPS,
    FORCED_CASES,
    FWD_M,
    FWD_N,
    LARGE_N,
    MODEL_N,
    TRAIN_N,
    tpr_value,
)
from gpu_helpers import TOL, TORCH, make, poison, rel_err

import normir
from normir import launch
from normir.layout import DTYPES, max_vec
from normir.ops._rows import BWD_KEY_EPS
from normir.ops.rmsnorm import rmsnorm_bwd_ref, rmsnorm_ref
from normir.options import Problem

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

def check_fwd(x, w, eps, *, tol=None):
    n = x.shape[-1]
    m = x.numel() // n if n else 0
    poison(((m, n), x.dtype), ((m,), torch.float32))
    y, rstd = normir.rmsnorm_fwd(x, w, eps, store_rstd=True)
    torch.cuda.synchronize()
    y_ref, rstd_ref = rmsnorm_ref(x, w, eps)
    assert y.shape == x.shape and y.dtype == x.dtype and rstd.shape == x.shape[:-1]
    t = tol or TOL[x.dtype]
    assert rel_err(y, y_ref) <= t, f"y err {rel_err(y, y_ref)}"
    assert rel_err(rstd, rstd_ref) <= 1e-5, f"rstd err {rel_err(rstd, rstd_ref)}"
    return y, rstd


def check_bwd(x, w, eps, *, atomic=False):
    n = x.shape[-1]
    m = x.numel() // n
    _, rstd = normir.rmsnorm_fwd(x, w, eps, store_rstd=True)
    dy = make(x.shape, x.dtype)
    poison(((m, n), x.dtype), ((n,), w.dtype if w is not None else x.dtype))
    dx, dw = normir.rmsnorm_bwd(x, w, dy, rstd, atomic_dw=atomic)
    torch.cuda.synchronize()
    dx_ref, dw_ref = rmsnorm_bwd_ref(x, w, dy, eps)
    t = TOL[x.dtype]
    assert dx.shape == x.shape and dx.dtype == x.dtype
    # dx = (wdy - x_hat * c1) * rstd: the two terms cancel exactly for N = 1.
    wdy = dy.double() * (w.double() if w is not None else 1.0)
    scale = (wdy * rstd.double().unsqueeze(-1)).norm().item()
    assert rel_err(dx, dx_ref, scale) <= t, f"dx err {rel_err(dx, dx_ref, scale)}"
    if w is None:
        assert dw is None
    else:
        assert dw.dtype == w.dtype and dw.shape == w.shape
        # dw is rounded to the weight's type, which may be coarser than x's.
        tw = max(t, TOL[w.dtype], 1e-4)
        assert rel_err(dw, dw_ref) <= tw, f"dw err {rel_err(dw, dw_ref)}"
    return dx, dw, dy, rstd


# ------------------------------------------------------------------------------------ forward


@pytest.mark.parametrize("m", FWD_M)
@pytest.mark.parametrize("n", FWD_N + MODEL_N)
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_fwd_matches_reference(dt, n, m):
    x = make((m, n), TORCH[dt])
    w = make((n,), TORCH[dt]) + 1
    check_fwd(x, w, 1e-6)


@pytest.mark.parametrize("eps", EPS)
@pytest.mark.parametrize("n", (100, 4096))
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_fwd_eps_honored(dt, n, eps):
    # Small inputs: mean(x^2) ~ 1e-4, so eps 1e-2 changes y by ~100x and 1e-5 by ~5%.
    x = make((64, n), TORCH[dt], scale=1e-2)
    w = make((n,), TORCH[dt]) + 1
    check_fwd(x, w, eps)


@pytest.mark.parametrize("n", (100, 2880, 65536))
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_fwd_fp32_weight_and_no_weight(dt, n):
    x = make((199, n), TORCH[dt])
    check_fwd(x, make((n,), torch.float32) + 1, 1e-6)
    check_fwd(x, None, 1e-6)


@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_fwd_3d_and_empty(dt):
    x = make((3, 67, 1024), TORCH[dt])
    check_fwd(x, make((1024,), TORCH[dt]), 1e-6)
    y, rstd = normir.rmsnorm_fwd(torch.empty((0, 1024), dtype=TORCH[dt], device="cuda"),
                                 make((1024,), TORCH[dt]), store_rstd=True)
    assert y.shape == (0, 1024) and rstd.shape == (0,)


def test_fwd_without_rstd_returns_none_and_leaves_x_alone():
    x = make((199, 4096), torch.bfloat16)
    x0 = x.clone()
    y, rstd = normir.rmsnorm_fwd(x, make((4096,), torch.bfloat16))
    assert rstd is None and torch.equal(x, x0)


@pytest.mark.parametrize("n", cases.SUMS_SPLIT_N)
@pytest.mark.parametrize("dt", ("bf16", "f16"))
def test_bwd_rows_split_for_their_sums(dt, n):
    # Rows whose dw sums fill a thread's share in one block of more than 512 threads go over a cluster.
    _, lay = launch.handle(Problem(kernel="rmsnorm_bwd", n=n, dtype=dt, wdtype=dt, eps=BWD_KEY_EPS,
                                   vec=max_vec(n, DTYPES[dt])), 0)
    assert lay.cluster > 1 and lay.block <= 512
    check_bwd(make((199, n), TORCH[dt]), make((n,), TORCH[dt]) + 1, 1e-6)


@pytest.mark.large
@pytest.mark.parametrize("n", LARGE_N)
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_fwd_long_rows(dt, n):
    x = make((33, n), TORCH[dt])
    check_fwd(x, make((n,), TORCH[dt]), 1e-6)


@pytest.mark.parametrize("n,pitch,offset", ALIGN_CASES)
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_unaligned_and_strided_rows(dt, n, pitch, offset):
    # Rows pitch elements apart, starting offset elements into an allocation: narrower
    # vectors where needed, the right bytes always.
    m = 97
    base = make((offset + m * pitch,), TORCH[dt])
    x = base[offset:].view(m, pitch)[:, :n]
    w = make((n,), TORCH[dt])
    check_fwd(x, w, 1e-6)
    check_bwd(x, w, 1e-6)


# ------------------------------------------------------------------------------------ backward


@pytest.mark.parametrize("m", FWD_M)
@pytest.mark.parametrize("n", FWD_N + MODEL_N)
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_bwd_matches_reference(dt, n, m):
    x = make((m, n), TORCH[dt])
    check_bwd(x, make((n,), TORCH[dt]) + 1, 1e-6)


@pytest.mark.parametrize("n", (100, 2880, 65536))
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_bwd_fp32_weight_and_no_weight(dt, n):
    x = make((199, n), TORCH[dt])
    check_bwd(x, make((n,), torch.float32) + 1, 1e-6)
    check_bwd(x, None, 1e-6)


@pytest.mark.parametrize("dt,wdt", (("bf16", "f16"), ("f16", "bf16"), ("f32", "bf16")))
@pytest.mark.parametrize("n", cases.OTHER_WEIGHT_N)
def test_weight_in_another_dtype(dt, wdt, n):
    # The family's dtype rule: the weight is read in its own type, whatever x's.
    x = make((199, n), TORCH[dt])
    w = make((n,), TORCH[wdt]) + 1
    check_fwd(x, w, 1e-6)
    check_bwd(x, w, 1e-6)


@pytest.mark.parametrize("n,dt", cases.NO_WEIGHT_CASES)
def test_bwd_no_weight_layouts(n, dt):
    # Without a weight the backward holds short rows in registers, stages longer ones and loads
    # all of pass 2 inside a cluster's barrier: each of those layouts against the reference.
    _, lay = launch.handle(Problem(kernel="rmsnorm_bwd", n=n, dtype=dt, wdtype=dt, eps=BWD_KEY_EPS, has_weight=False,
                                   vec=max_vec(n, DTYPES[dt])), 0)
    assert lay.cache_row or lay.stage or lay.overlap == lay.k
    check_bwd(make((1000, n), TORCH[dt]), None, 1e-6)


@pytest.mark.large
@pytest.mark.parametrize("n", LARGE_N)
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_bwd_long_rows(dt, n):
    check_bwd(make((33, n), TORCH[dt]), make((n,), TORCH[dt]), 1e-6)


@pytest.mark.parametrize("n", (1024, 2880, 65536))
def test_dw_bit_identical_across_runs(n):
    x = make((4096, n), torch.bfloat16)
    w = make((n,), torch.bfloat16)
    dx1, dw1, dy, rstd = check_bwd(x, w, 1e-6)
    dx2, dw2 = normir.rmsnorm_bwd(x, w, dy, rstd)
    assert torch.equal(dw1, dw2) and torch.equal(dx1, dx2)


@pytest.mark.parametrize("dt,n", (("bf16", 4096), ("f32", 1024), ("bf16", 32768)))
def test_bwd_atomic_mode(dt, n):
    check_bwd(make((4096, n), TORCH[dt]), make((n,), TORCH[dt]), 1e-6, atomic=True)


@pytest.mark.parametrize("n,cluster,dt", CLUSTER_CASES)
def test_rows_split_over_a_cluster(monkeypatch, n, cluster, dt):
    # The layout forced through NORMIR_TPR: each of `cluster` blocks takes N / cluster columns and
    # the blocks add their sums through distributed shared memory. 1000 rows: every cluster of
    # the persistent backward takes many rows, so both exchange slots are reused many times.
    monkeypatch.setenv("NORMIR_TPR", f"rmsnorm_fwd:{n}=0x{cluster},rmsnorm_bwd:{n}=0x{cluster}")
    launch.clear_handles()
    try:
        _, lay = launch.handle(Problem(kernel="rmsnorm_bwd", n=n, dtype=dt, wdtype=dt, eps=BWD_KEY_EPS,
                                   vec=max_vec(n, DTYPES[dt])), 0)
        assert lay.cluster == cluster
        x = make((1000, n), TORCH[dt])
        w = make((n,), TORCH[dt]) + 1
        check_fwd(x, w, 1e-6)
        check_fwd(x, None, 1e-6)
        _, dw1, dy, rstd = check_bwd(x, w, 1e-6)
        assert torch.equal(normir.rmsnorm_bwd(x, w, dy, rstd)[1], dw1)  # the fixed order holds
        check_bwd(x, None, 1e-6)
        if cluster > 1:
            check_bwd(x, w, 1e-6, atomic=True)
    finally:
        launch.clear_handles()


@pytest.mark.parametrize("n,dt,fwd,bwd", FORCED_CASES)
def test_forced_layouts(monkeypatch, n, dt, fwd, bwd):
    # Staging, prefetching, clusters, register caps and L2 hints forced against the policy: the
    # other paths of each kernel.
    monkeypatch.setenv("NORMIR_TPR", f"rmsnorm_fwd:{n}={tpr_value(fwd)},rmsnorm_bwd:{n}={tpr_value(bwd)}")
    launch.clear_handles()
    try:
        vec = max_vec(n, DTYPES[dt])
        for kernel, forced in (("rmsnorm_fwd", fwd), ("rmsnorm_bwd", bwd)):
            _, lay = launch.handle(Problem(kernel=kernel, n=n, dtype=dt, wdtype=dt, store_rstd=kernel == "rmsnorm_fwd",
                                           vec=vec), 0)
            for name, value in forced.items():
                assert getattr(lay, name) == (bool(value) if name in ("stage", "l2_prefetch") else value)
        x = make((1000, n), TORCH[dt])
        w = make((n,), TORCH[dt]) + 1
        check_fwd(x, w, 1e-6)
        check_fwd(x, None, 1e-6)
        check_bwd(x, w, 1e-6)
        check_bwd(x, None, 1e-6)
    finally:
        launch.clear_handles()


def test_bwd_empty_and_one_row():
    w = make((1024,), torch.bfloat16)
    x = torch.empty((0, 1024), dtype=torch.bfloat16, device="cuda")
    dx, dw = normir.rmsnorm_bwd(x, w, x, torch.empty((0,), device="cuda"))
    assert dx.shape == (0, 1024) and torch.equal(dw, torch.zeros_like(dw))
    check_bwd(make((1, 1024), torch.bfloat16), w, 1e-6)


@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_autograd_3d(dt):
    x = make((3, 67, 2880), TORCH[dt]).requires_grad_(True)
    w = (make((2880,), TORCH[dt]) + 1).requires_grad_(True)
    y = normir.rmsnorm(x, w, 1e-5)
    dy = make(y.shape, y.dtype)
    dx, dw = torch.autograd.grad(y, [x, w], dy)
    dx_ref, dw_ref = rmsnorm_bwd_ref(x, w, dy, 1e-5)
    assert rel_err(y, rmsnorm_ref(x, w, 1e-5)[0]) <= TOL[x.dtype]
    assert rel_err(dx, dx_ref) <= TOL[x.dtype] and rel_err(dw, dw_ref) <= TOL[x.dtype]


def test_autograd_gradcheck_double_precision_reference():
    # gradcheck-style: our fp32 gradients vs finite differences of the float64 reference.
    x = make((8, 100), torch.float32).requires_grad_(True)
    w = (make((100,), torch.float32) + 1).requires_grad_(True)
    y = normir.rmsnorm(x, w, 1e-6)
    dy = make(y.shape, y.dtype)
    dx, dw = torch.autograd.grad(y, [x, w], dy)
    xd, wd = x.detach().double(), w.detach().double()

    def f(xx, ww):
        return (rmsnorm_ref(xx, ww, 1e-6)[0] * dy.double()).sum()

    h = 1e-6
    for idx in ((0, 0), (3, 57), (7, 99)):
        e = torch.zeros_like(xd)
        e[idx] = h
        fd = (f(xd + e, wd) - f(xd - e, wd)) / (2 * h)
        assert abs(fd.item() - dx[idx].item()) <= 1e-4 * max(1.0, abs(fd.item()))
    for j in (0, 42):
        e = torch.zeros_like(wd)
        e[j] = h
        fd = (f(xd, wd + e) - f(xd, wd - e)) / (2 * h)
        assert abs(fd.item() - dw[j].item()) <= 1e-4 * max(1.0, abs(fd.item()))


def test_no_rstd_without_grad():
    x = make((16, TRAIN_N), torch.bfloat16)
    with torch.no_grad():
        y = normir.rmsnorm(x, make((TRAIN_N,), torch.bfloat16))
    assert y.grad_fn is None


def test_training_matches_torch():
    """A few linear layers with RMSNorm between, trained with normir and with
    torch.nn.functional.rms_norm from one seed: the losses agree within bf16 tolerance."""

    def run(norm) -> list[float]:
        torch.manual_seed(0)
        layers = torch.nn.ModuleList(torch.nn.Linear(TRAIN_N, TRAIN_N) for _ in range(3)).cuda().bfloat16()
        weights = torch.nn.ParameterList(torch.nn.Parameter(torch.ones(TRAIN_N, device="cuda",
                                                                         dtype=torch.bfloat16)) for _ in range(3))
        head = torch.nn.Linear(TRAIN_N, 10).cuda().bfloat16()
        opt = torch.optim.SGD([*layers.parameters(), *weights.parameters(), *head.parameters()], lr=0.05)
        gen = torch.Generator(device="cuda").manual_seed(1)
        losses = []
        for _ in range(30):
            x = torch.randn((64, TRAIN_N), device="cuda", generator=gen).bfloat16()
            target = torch.randint(0, 10, (64,), device="cuda", generator=gen)
            h = x
            for lin, w in zip(layers, weights):
                h = torch.nn.functional.gelu(norm(lin(h), w))
            loss = torch.nn.functional.cross_entropy(head(h).float(), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ours = run(lambda h, w: normir.rmsnorm(h, w, 1e-6))
    theirs = run(lambda h, w: torch.nn.functional.rms_norm(h, (TRAIN_N,), w, 1e-6))
    assert all(math.isfinite(v) for v in ours)
    assert ours[-1] < ours[0]  # it trains
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 0.03 * max(1.0, abs(b)), (ours, theirs)


# ------------------------------------------------------------------------------------ devices


@pytest.mark.multi_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_in_one_process():
    for dev in ("cuda:1", "cuda:0", "cuda:1"):
        x = make((199, 4096), torch.bfloat16, device=dev).requires_grad_(True)
        w = (make((4096,), torch.bfloat16, device=dev) + 1).requires_grad_(True)
        y = normir.rmsnorm(x, w, 1e-6)
        dy = make(y.shape, y.dtype, device=dev)
        dx, dw = torch.autograd.grad(y, [x, w], dy)
        assert y.device == x.device == dx.device == dw.device
        dx_ref, dw_ref = rmsnorm_bwd_ref(x, w, dy, 1e-6)
        assert rel_err(y, rmsnorm_ref(x, w, 1e-6)[0]) <= TOL[torch.bfloat16]
        assert rel_err(dx, dx_ref) <= TOL[torch.bfloat16] and rel_err(dw, dw_ref) <= TOL[torch.bfloat16]


def test_wrong_device_weight_rejected():
    x = make((4, 128), torch.bfloat16)
    with pytest.raises(ValueError, match="weight"):
        normir.rmsnorm_fwd(x, torch.ones(128, dtype=torch.bfloat16))


@pytest.mark.parametrize("store_rstd", (False, True))
def test_repeated_calls_take_the_fast_path_correctly(store_rstd):
    # The second call of a seen specialization skips the checks (rmsnorm_fwd's _FWD_SEEN); it must
    # still compute on the new tensors, and fall back for an unaligned tensor of the same key.
    w = make((4096,), torch.bfloat16)
    for _ in range(3):
        x = make((7, 4096), torch.bfloat16)
        poison(((7, 4096), torch.bfloat16))
        y, rstd = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=store_rstd)
        assert rel_err(y, rmsnorm_ref(x, w, 1e-6)[0]) <= TOL[torch.bfloat16]
        assert (rstd is not None) == store_rstd
    base = make((7 * 4096 + 1,), torch.bfloat16)
    x = base[1:].view(7, 4096)  # 2-byte aligned: contiguous, but not for 16-byte vectors
    y, _ = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=store_rstd)
    assert rel_err(y, rmsnorm_ref(x, w, 1e-6)[0]) <= TOL[torch.bfloat16]


# ------------------------------------------------------------------------------------ custom ops


def test_custom_ops_and_eager_launches_are_bitwise_equal():
    # Eager calls launch directly; traced ones go through torch.ops.normir (the dispatcher, the
    # registered autograd, torch.compile). The same kernels: bitwise-equal outputs and gradients.
    x = make((199, 2880), torch.bfloat16)
    w = make((2880,), torch.bfloat16) + 1
    dy = make((199, 2880), torch.bfloat16)
    y1, r1 = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=True)
    y2, r2 = torch.ops.normir.rmsnorm_fwd(x, w, 1e-6, True)
    assert torch.equal(y1, y2) and torch.equal(r1, r2)
    assert torch.ops.normir.rmsnorm_fwd(x, None, 1e-6, False)[1].shape == (0,)
    dx1, dw1 = normir.rmsnorm_bwd(x, w, dy, r1)
    dx2, dw2 = torch.ops.normir.rmsnorm_bwd(x, w, dy, r1, False)
    assert torch.equal(dx1, dx2) and torch.equal(dw1, dw2)

    def grads(fn):
        xa, wa = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        y = fn(xa, wa)
        return (y, *torch.autograd.grad(y, [xa, wa], dy))

    eager = grads(lambda a, b: normir.rmsnorm(a, b, 1e-6))
    op = grads(lambda a, b: torch.ops.normir.rmsnorm_fwd(a, b, 1e-6, True)[0])
    compiled = grads(torch.compile(lambda a, b: normir.rmsnorm(a, b, 1e-6), fullgraph=True))
    for e, o, c in zip(eager, op, compiled):
        assert torch.equal(e, o) and torch.equal(e, c)


def test_custom_op_opcheck():
    x = make((37, 1024), torch.bfloat16)
    w = make((1024,), torch.bfloat16) + 1
    _, rstd = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=True)
    torch.library.opcheck(torch.ops.normir.rmsnorm_fwd.default, (x, w, 1e-6, True))
    torch.library.opcheck(torch.ops.normir.rmsnorm_fwd.default, (x, None, 1e-6, False))
    torch.library.opcheck(torch.ops.normir.rmsnorm_bwd.default, (x, w, make((37, 1024), torch.bfloat16), rstd, False),
                          test_utils=("test_schema", "test_faketensor"))
