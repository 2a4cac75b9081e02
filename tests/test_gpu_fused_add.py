"""GPU tier: fused residual-add RMSNorm (and RMSNorm with a bias, an output dtype or a weight
offset) against float64 references on the H200: y, residual_out, rstd, dx, dresidual, dw, db.

Every case draws fresh random inputs and poisons the memory the outputs will be allocated from
with NaN first, so an unwritten element fails the comparison."""

from __future__ import annotations

import math

import pytest
import torch
from gpu_cases import (
    DTYPE_NAMES,
    EPS,
    FUSED_ATOMIC_N,
    FUSED_COMBOS,
    FUSED_EPS_N,
    FUSED_N,
    FWD_M,
    FWD_N,
    STAGE_DRES_CASES,
    SUMS_SPLIT_N,
    TRAIN_N,
    tpr_value,
)
from gpu_helpers import TOL, TORCH, forced_layout, make, poison, rel_err, tensors

import normir
from normir.ops.fused_add_rmsnorm import fused_add_rmsnorm_bwd_ref, fused_add_rmsnorm_ref
from normir.ops.layernorm import layernorm_bwd_ref, layernorm_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


def check(shape, x, r=None, w="", b=None, s=None, o=None, offset=0.0, *, prenorm=True, eps=1e-6):
    """Forward and backward through normir.rmsnorm with autograd, against the float64 references.
    With prenorm, residual_out is used downstream (d_residual_out given); without, it is not."""
    xt, rt, wt, bt = tensors(shape, x, r, w, b)
    leaves = [t.requires_grad_(True) for t in (xt, rt, wt, bt) if t is not None]
    n, m = shape[-1], math.prod(shape[:-1])
    y_dtype, h_dtype = TORCH[o or x], TORCH[(s or r) if r else (s or x)]
    poison(((m, n), y_dtype), ((m, n), h_dtype), ((m, n), TORCH[x]), ((m,), torch.float32))
    out = normir.rmsnorm(xt, wt, eps, bias=bt, residual=rt, prenorm=prenorm, residual_dtype=TORCH[s] if s else None,
                         out_dtype=TORCH[o] if o else None, weight_offset=offset)
    y, h = out if prenorm else (out, None)
    y_ref, h_ref, _ = fused_add_rmsnorm_ref(xt.detach(), rt.detach() if rt is not None else None, wt, bt, eps,
                                            TORCH[s] if s else None, offset)
    assert y.dtype == y_dtype and y.shape == xt.shape
    assert rel_err(y, y_ref) <= TOL[y_dtype], f"y err {rel_err(y, y_ref)}"
    if prenorm:
        assert h.dtype == h_dtype and h.shape == xt.shape
        assert torch.equal(h, h_ref), "residual_out is not x + residual rounded once"
    if rt is None and prenorm:
        assert h is xt  # residual_out is x itself: its gradient is the caller's to add
    dy = make(shape, y_dtype)
    dh = make(shape, h_dtype) if prenorm and rt is not None else None
    grads = torch.autograd.grad([y] + ([h] if dh is not None else []), leaves, [dy] + ([dh] if dh is not None else []))
    normed = h_ref if rt is not None else xt.detach()
    g_ref, dw_ref, db_ref = fused_add_rmsnorm_bwd_ref(normed, wt, bt, eps, offset, dy, dh)
    got = dict(zip([k for k, t in zip("xrwb", (xt, rt, wt, bt)) if t is not None], grads))
    for key, ref in (("x", g_ref), ("r", g_ref if rt is not None else None), ("w", dw_ref), ("b", db_ref)):
        if ref is None:
            continue
        g = got[key]
        leaf = {"x": xt, "r": rt, "w": wt, "b": bt}[key]
        assert g.dtype == leaf.dtype and g.shape == leaf.shape, key
        assert rel_err(g, ref) <= TOL[g.dtype], f"d{key} err {rel_err(g, ref)}"
    return y, h, grads


@pytest.mark.parametrize("m", FWD_M)
@pytest.mark.parametrize("n", FWD_N)
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_fused_add_matches_reference(dt, n, m):
    check((m, n), dt, dt)


@pytest.mark.parametrize("prenorm", (True, False), ids=("d_residual_out", "no_d_residual_out"))
@pytest.mark.parametrize("n", FUSED_N)
@pytest.mark.parametrize("combo", FUSED_COMBOS, ids=lambda c: "-".join(str(v) for v in c))
def test_dtypes_and_features(combo, n, prenorm):
    check((199, n), *combo, prenorm=prenorm)


@pytest.mark.parametrize("n", SUMS_SPLIT_N)
@pytest.mark.parametrize("dt", ("bf16", "f16"))
def test_rows_split_for_their_sums(dt, n):
    # Past 16384 the backward's rows whose dw sums fill a thread's share go over a cluster (layout.geometry.bwd_layout).
    check((199, n), dt, dt)


@pytest.mark.parametrize("kernel,n,knobs", [c for c in STAGE_DRES_CASES if c[0] == "fused_add_rmsnorm_bwd"],
                         ids=lambda v: tpr_value(v) if isinstance(v, dict) else str(v))
def test_d_residual_out_staged(monkeypatch, kernel, n, knobs):
    # d_residual_out copied into shared memory in pass 1 and read there (stage_dres), forced.
    with forced_layout(monkeypatch, kernel, n, knobs):
        for b in (None, "bf16"):
            check((199, n), "bf16", "bf16", b=b)


@pytest.mark.parametrize("eps", EPS)
def test_eps_honored(eps):
    x, r, w, _ = tensors((64, FUSED_EPS_N), "bf16", "bf16")
    x = x * 1e-2  # rows small enough that eps matters
    y, h, _ = normir.fused_add_rmsnorm_fwd(x, r * 1e-2, w, eps)
    y_ref, h_ref, _ = fused_add_rmsnorm_ref(x, r * 1e-2, w, None, eps)
    assert rel_err(y, y_ref) <= TOL[torch.bfloat16] and torch.equal(h, h_ref)


def test_prenorm_without_residual_and_no_weight():
    check((199, 1024), "bf16", w=None)
    check((199, 1024), "bf16")
    x = make((3, 1024), torch.bfloat16)
    assert normir.rmsnorm(x, None, prenorm=True)[1] is x  # residual_out is x itself


def test_only_the_residual_requires_grad():
    x, r, w, _ = tensors((199, 1024), "bf16", "bf16")
    r.requires_grad_(True)
    y, h = normir.fused_add_rmsnorm(x, r, w)
    dy, dh = make(y.shape, y.dtype), make(h.shape, h.dtype)
    (dr,) = torch.autograd.grad([y, h], [r], [dy, dh])
    g_ref = fused_add_rmsnorm_bwd_ref(h, w, None, 1e-6, 0.0, dy, dh)[0]
    assert rel_err(dr, g_ref) <= TOL[torch.bfloat16]


def test_3d_and_empty_and_one_row():
    check((3, 5, 1024), "bf16", "bf16")
    check((1, 1024), "bf16", "bf16")
    x, r, w, _ = tensors((0, 1024), "bf16", "bf16")
    for t in (x, r, w):
        t.requires_grad_(True)
    y, h = normir.fused_add_rmsnorm(x, r, w)
    assert y.shape == h.shape == (0, 1024)
    dx, dr, dw = torch.autograd.grad([y, h], [x, r, w], [torch.ones_like(y), torch.ones_like(h)])
    assert dx.shape == dr.shape == (0, 1024) and torch.equal(dw, torch.zeros_like(w))


@pytest.mark.parametrize("n,pitch,offset", ((4096, 4096, 1), (4096, 4100, 0), (4096, 4104, 0)))
def test_strided_and_unaligned_rows(n, pitch, offset):
    m = 37
    base_x, base_r = make((m * pitch + offset,), torch.bfloat16), make((m * pitch + offset,), torch.bfloat16)
    x = base_x[offset:].view(m, pitch)[:, :n]
    r = base_r[offset:].view(m, pitch)[:, :n]
    keep_x, keep_r = x.clone(), r.clone()
    w = make((n,), torch.bfloat16) + 1
    x.requires_grad_(True)
    r.requires_grad_(True)
    y, h = normir.fused_add_rmsnorm(x, r, w)
    y_ref, h_ref, _ = fused_add_rmsnorm_ref(keep_x, keep_r, w, None, 1e-6)
    assert rel_err(y, y_ref) <= TOL[torch.bfloat16] and torch.equal(h, h_ref)
    dy, dh = make(y.shape, y.dtype), make(h.shape, h.dtype)
    dx, dr = torch.autograd.grad([y, h], [x, r], [dy, dh])
    g_ref = fused_add_rmsnorm_bwd_ref(h_ref, w, None, 1e-6, 0.0, dy, dh)[0]
    assert rel_err(dx, g_ref) <= TOL[torch.bfloat16] and torch.equal(dx, dr)
    assert torch.equal(x.detach(), keep_x) and torch.equal(r.detach(), keep_r)  # inputs untouched


def test_inputs_and_gradients_left_alone():
    # Nothing the user passed is modified; dy survives the backward (Liger's in-place backward
    # overwrote it); dx and dresidual are one tensor where their dtypes match.
    x, r, w, b = tensors((199, 2880), "bf16", "bf16", b="bf16")
    keep = [t.clone() for t in (x, r, w, b)]
    h_ref = fused_add_rmsnorm_ref(x, r, w, b, 1e-6)[1]
    y, h, rstd = normir.fused_add_rmsnorm_fwd(x, r, w, bias=b, store_rstd=True)
    dy, dh = make(y.shape, y.dtype), make(h.shape, h.dtype)
    dy_keep, dh_keep = dy.clone(), dh.clone()
    dx, dw, db = normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, dh, has_bias=True)
    for t, k in zip((x, r, w, b, dy, dh), (*keep, dy_keep, dh_keep)):
        assert torch.equal(t, k)
    assert torch.equal(h, h_ref)
    g_ref, dw_ref, db_ref = fused_add_rmsnorm_bwd_ref(h, w, b, 1e-6, 0.0, dy, dh)
    assert rel_err(dx, g_ref) <= TOL[torch.bfloat16]
    assert rel_err(dw, dw_ref) <= TOL[torch.bfloat16] and rel_err(db, db_ref) <= TOL[torch.bfloat16]


def test_two_gradient_dtypes_written_in_one_pass():
    x, r, w, _ = tensors((199, 2880), "bf16", "f32")
    y, h, rstd = normir.fused_add_rmsnorm_fwd(x, r, w, store_rstd=True)
    dy = make(y.shape, y.dtype)
    poison(((199, 2880), torch.bfloat16), ((199, 2880), torch.float32))
    (dx, dres), dw, db = normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, dx_dtype=torch.bfloat16,
                                                      dresidual_dtype=torch.float32)
    assert (dx.dtype, dres.dtype, db) == (torch.bfloat16, torch.float32, None)
    g_ref = fused_add_rmsnorm_bwd_ref(h, w, None, 1e-6, 0.0, dy)[0]
    assert rel_err(dres, g_ref) <= TOL[torch.float32] and rel_err(dx, g_ref) <= TOL[torch.bfloat16]
    assert torch.equal(dx, dres.to(torch.bfloat16))  # one value, rounded twice


def test_dw_db_bit_identical_across_runs_and_atomic_mode():
    n = FUSED_ATOMIC_N
    x, r, w, b = tensors((4096, n), "bf16", "bf16", b="bf16")
    y, h, rstd = normir.fused_add_rmsnorm_fwd(x, r, w, bias=b, store_rstd=True)
    dy, dh = make(y.shape, y.dtype), make(h.shape, h.dtype)
    first = normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, dh, has_bias=True)
    for _ in range(3):
        again = normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, dh, has_bias=True)
        assert all(torch.equal(a, c) for a, c in zip(first, again))
    dx, dw, db = normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, dh, has_bias=True, atomic=True)
    g_ref, dw_ref, db_ref = fused_add_rmsnorm_bwd_ref(h, w, b, 1e-6, 0.0, dy, dh)
    assert torch.equal(dx, first[0])
    assert rel_err(dw, dw_ref) <= TOL[torch.bfloat16] and rel_err(db, db_ref) <= TOL[torch.bfloat16]


def test_forward_and_backward_agree_with_a_16bit_residual_out():
    # fp32 x and residual, residual_out stored in bf16: y normalizes the stored bf16 row, so y
    # matches the reference of the rounded row at fp32 precision (normalizing the unrounded sum
    # would be off by bf16's rounding, ~1e-3), and the backward differentiates that same function.
    check((199, 2880), "f32", "f32", s="bf16")
    x, r, w, _ = tensors((199, 2880), "f32", "f32")
    y, h, _ = normir.fused_add_rmsnorm_fwd(x, r, w, residual_dtype=torch.bfloat16)
    plain, _ = normir.rmsnorm_fwd(h.float(), w)
    assert rel_err(y, plain) <= 2 * TOL[torch.float32]
    unrounded = fused_add_rmsnorm_ref(x, r, w, None, 1e-6, torch.float32)[0]
    assert rel_err(y, unrounded) > 10 * TOL[torch.float32]  # the rounding is visible: the check can fail


def test_gradcheck_against_finite_differences():
    # fp32 gradients of (y, residual_out) vs central differences of the float64 reference.
    x, r, w, b = tensors((8, 100), "f32", "f32", w="f32", b="f32")
    for t in (x, r, w, b):
        t.requires_grad_(True)
    y, h = normir.rmsnorm(x, w, 1e-6, bias=b, residual=r, prenorm=True, weight_offset=1.0)
    dy, dh = make(y.shape, y.dtype), make(h.shape, h.dtype)
    grads = torch.autograd.grad([y, h], [x, r, w, b], [dy, dh])
    base = [t.detach().double() for t in (x, r, w, b)]

    def f(xx, rr, ww, bb):
        hh = xx + rr
        yy = fused_add_rmsnorm_ref(hh, None, ww, bb, 1e-6, None, 1.0)[0]
        return (yy * dy.double()).sum() + (hh * dh.double()).sum()

    step = 1e-6
    for k, idx in ((0, (0, 0)), (0, (7, 99)), (1, (3, 57)), (2, (42,)), (3, (5,))):
        e = torch.zeros_like(base[k])
        e[idx] = step
        hi = [t + e if i == k else t for i, t in enumerate(base)]
        lo = [t - e if i == k else t for i, t in enumerate(base)]
        fd = ((f(*hi) - f(*lo)) / (2 * step)).item()
        assert abs(fd - grads[k][idx].item()) <= 1e-4 * max(1.0, abs(fd)), (k, idx)


def test_custom_ops_eager_and_compiled_agree():
    x, r, w, b = tensors((199, 1024), "bf16", "bf16", b=None)
    dy, dh = make(x.shape, torch.bfloat16), make(x.shape, torch.bfloat16)

    def run(fn):
        xa, ra, wa = (t.clone().requires_grad_(True) for t in (x, r, w))
        y, h = fn(xa, ra, wa)
        return (y, h, *torch.autograd.grad([y, h], [xa, ra, wa], [dy, dh]))

    eager = run(lambda a, c, d: normir.fused_add_rmsnorm(a, c, d))
    op = run(lambda a, c, d: torch.ops.normir.fused_add_rmsnorm_fwd(a, c, d, None, 1e-6, None, None, 0.0, True,
                                                                   True)[:2])
    compiled = run(torch.compile(lambda a, c, d: normir.fused_add_rmsnorm(a, c, d), fullgraph=True))
    for e, o, c in zip(eager, op, compiled):
        assert torch.equal(e, o) and torch.equal(e, c)


def test_custom_op_opcheck():
    x, r, w, b = tensors((37, 1024), "bf16", "f32", b="bf16")
    torch.library.opcheck(torch.ops.normir.fused_add_rmsnorm_fwd.default,
                          (x, r, w, b, 1e-6, None, None, 1.0, True, True))
    y, h, rstd = torch.ops.normir.fused_add_rmsnorm_fwd(x, r, w, b, 1e-6, None, None, 0.0, True, True)
    torch.library.opcheck(torch.ops.normir.fused_add_rmsnorm_bwd.default,
                          (make(y.shape, y.dtype), h, w, rstd, make(h.shape, h.dtype), torch.bfloat16, 0.0,
                           torch.bfloat16, torch.float32), test_utils=("test_schema", "test_faketensor"))


def test_training_matches_torch():
    """A small pre-norm residual model (fp32 residual stream, bf16 activations) trained with
    normir's fused add and with torch ops from one seed: the losses agree within bf16 tolerance."""

    def run(fused) -> list[float]:
        torch.manual_seed(0)
        blocks = torch.nn.ModuleList(torch.nn.Linear(TRAIN_N, TRAIN_N) for _ in range(3)).cuda().bfloat16()
        norms = torch.nn.ParameterList(torch.nn.Parameter(torch.ones(TRAIN_N, device="cuda", dtype=torch.bfloat16))
                                       for _ in range(3))
        head = torch.nn.Linear(TRAIN_N, 10).cuda().bfloat16()
        opt = torch.optim.SGD([*blocks.parameters(), *norms.parameters(), *head.parameters()], lr=0.05)
        gen = torch.Generator(device="cuda").manual_seed(1)
        losses = []
        for _ in range(30):
            x = torch.randn((64, TRAIN_N), device="cuda", generator=gen).bfloat16()
            target = torch.randint(0, 10, (64,), device="cuda", generator=gen)
            residual = x.float()
            out = x
            for lin, w in zip(blocks, norms):
                out, residual = fused(out, residual, w)
                out = torch.nn.functional.gelu(lin(out))
            loss = torch.nn.functional.cross_entropy(head(out + residual.bfloat16()).float(), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    def reference(x, residual, w):
        h = x.float() + residual
        return torch.nn.functional.rms_norm(h, (TRAIN_N,), w.float(), 1e-6).to(x.dtype), h

    ours = run(lambda x, residual, w: normir.fused_add_rmsnorm(x, residual, w, 1e-6))
    theirs = run(reference)
    assert all(math.isfinite(v) for v in ours)
    assert ours[-1] < ours[0]  # it trains
    for a, c in zip(ours, theirs):
        assert abs(a - c) <= 0.03 * max(1.0, abs(c)), (ours, theirs)


# The fused forwards and backwards of both norms share one fast path for repeated eager calls
# (_fused.py): each op's forward and backward as (fwd(x, r, w, b, store) -> (y, h, stats...),
# bwd(dy, h, w, stats, dh) -> (dx, dw, db)), its float64 references, and its statistics' count.
FAST_OPS = {
    "fused_add_rmsnorm": (
        lambda x, r, w, b, store: normir.fused_add_rmsnorm_fwd(x, r, w, 1e-6, bias=b, store_rstd=store),
        lambda dy, h, w, st, dh: normir.fused_add_rmsnorm_bwd(dy, h, w, st[0], dh, has_bias=True),
        lambda x, r, w, b: fused_add_rmsnorm_ref(x, r, w, b, 1e-6)[:2],
        lambda h, w, b, dy, dh: fused_add_rmsnorm_bwd_ref(h, w, b, 1e-6, 0.0, dy, dh), 1),
    "fused_add_layernorm": (
        lambda x, r, w, b, store: normir.fused_add_layernorm_fwd(x, r, w, b, 1e-5, store_stats=store),
        lambda dy, h, w, st, dh: normir.fused_add_layernorm_bwd(dy, h, w, *st, dh, has_bias=True),
        lambda x, r, w, b: layernorm_ref(x, w, b, 1e-5, residual=r)[:2],
        lambda h, w, b, dy, dh: layernorm_bwd_ref(h, w, b, 1e-5, dy, dh), 2),
}


@pytest.mark.parametrize("op", FAST_OPS)
def test_repeated_fused_calls_take_the_fast_path_correctly(op):
    # Calls after the first of a specialization skip the checks and the plan lookup: each must
    # still compute on its own new tensors (fresh M, poisoned outputs), fall back for what the key
    # does not cover (an unaligned row, a strided one) and still raise on bad arguments.
    fwd, bwd, ref, bwd_ref, nstats = FAST_OPS[op]
    n = 4096
    w, b = make((n,), torch.bfloat16) + 1, make((n,), torch.bfloat16, 0.5)

    def run(x, r, dy, dh):
        m = x.numel() // n
        poison(((m, n), torch.bfloat16), ((m, n), torch.bfloat16), ((m,), torch.float32))
        y, h, *stats = fwd(x, r, w, b, True)
        y_ref, h_ref = ref(x, r, w, b)
        assert rel_err(y, y_ref) <= TOL[torch.bfloat16] and torch.equal(h, h_ref)
        assert len(stats) == nstats and all(s.shape == x.shape[:-1] for s in stats)
        poison(((m, n), torch.bfloat16), ((n,), torch.bfloat16), ((n,), torch.bfloat16))
        dx, dw, db = bwd(dy, h, w, stats, dh)
        for got, want in zip((dx, dw, db), bwd_ref(h, w, b, dy, dh)):
            assert rel_err(got, want) <= TOL[torch.bfloat16]
        return h, stats

    for m in (7, 1, 64, 7):
        x, r, dy, dh = (make((m, n), torch.bfloat16) for _ in range(4))
        h, stats = run(x, r, dy, dh)
    base = make((7 * n + 1,), torch.bfloat16)
    x = base[1:].view(7, n)  # contiguous but 2-byte aligned: the general path narrows the vector
    run(x, *(make((7, n), torch.bfloat16) for _ in range(3)))
    wide = make((7, 2 * n), torch.bfloat16)
    run(wide[:, :n], *(make((7, n), torch.bfloat16) for _ in range(3)))  # strided rows
    with pytest.raises(ValueError, match="residual must match x"):
        fwd(make((7, n), torch.bfloat16), make((8, n), torch.bfloat16), w, b, True)
    with pytest.raises(ValueError, match="rstd"):
        bwd(dy, h, w, (stats[0][:3],) + tuple(stats[1:]) if nstats == 1 else (stats[0], stats[1][:3]), dh)
    with pytest.raises(ValueError, match="dy must match"):
        bwd(make((8, n), torch.bfloat16), h, w, stats, dh)
