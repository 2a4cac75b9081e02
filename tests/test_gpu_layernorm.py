"""GPU tier: LayerNorm and fused residual-add LayerNorm against float64 references on the H200:
y, residual_out, mean, rstd, dx, dresidual, dw, db; precision on badly conditioned rows against
torch's own fp32 layer_norm; the modules against torch.nn.LayerNorm.

Every case draws fresh random inputs and poisons the memory the outputs will be allocated from
with NaN first, so an unwritten element fails the comparison."""

from __future__ import annotations

import math

import pytest
import torch
from gpu_cases import (
    DB_SMEM_CASES,
    DTYPE_NAMES,
    EPS,
    FWD_M,
    FWD_N,
    LN_ACCURACY_N,
    LN_BIT_N,
    LN_COMBO_N,
    LN_COMBOS,
    LN_EPS,
    LN_FUSED_COMBOS,
    LN_FUSED_N,
    LN_LAYOUT_N,
    LN_NO_WB_HELD_N,
    LN_STATS_N,
    MODEL_N,
    STAGE_DRES_CASES,
    TRAIN_N,
    tpr_value,
)
from gpu_helpers import TOL, TORCH, forced_layout, make, poison, rel_err, tensors

import normir
from normir.ops.layernorm import layernorm_bwd_ref, layernorm_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


def check(shape, x, r=None, w="", b=None, s=None, o=None, *, prenorm=True, eps=LN_EPS):
    """Forward and backward through normir.layernorm with autograd, against the float64
    references. With prenorm, residual_out is used downstream (d_residual_out given)."""
    xt, rt, wt, bt = tensors(shape, x, r, w, b)
    leaves = [t.requires_grad_(True) for t in (xt, rt, wt, bt) if t is not None]
    n, m = shape[-1], math.prod(shape[:-1])
    y_dtype, h_dtype = TORCH[o or x], TORCH[(s or r) if r else x]
    poison(((m, n), y_dtype), ((m, n), h_dtype), ((m, n), TORCH[x]), ((m,), torch.float32))
    out = normir.layernorm(xt, wt, bt, eps, residual=rt, prenorm=prenorm, residual_dtype=TORCH[s] if s else None,
                           out_dtype=TORCH[o] if o else None)
    y, h = out if prenorm else (out, None)
    y_ref, h_ref, _, _ = layernorm_ref(xt.detach(), wt, bt, eps, rt.detach() if rt is not None else None,
                                       TORCH[s] if s else None)
    assert y.dtype == y_dtype and y.shape == xt.shape
    assert rel_err(y, y_ref) <= TOL[y_dtype], f"y err {rel_err(y, y_ref)}"
    if prenorm and rt is not None:
        assert h.dtype == h_dtype and torch.equal(h, h_ref), "residual_out is not x + residual rounded once"
    dy = make(shape, y_dtype)
    dh = make(shape, h_dtype) if prenorm and rt is not None else None
    grads = torch.autograd.grad([y] + ([h] if dh is not None else []), leaves, [dy] + ([dh] if dh is not None else []))
    normed = h_ref if rt is not None else xt.detach()
    g_ref, dw_ref, db_ref = layernorm_bwd_ref(normed, wt, bt, eps, dy, dh)
    got = dict(zip([k for k, t in zip("xrwb", (xt, rt, wt, bt)) if t is not None], grads))
    # dx = (wdy - c1 - x_hat * c2) * rstd: its terms cancel exactly for N = 1.
    wdy = dy.double() * (wt.double() if wt is not None else 1.0)
    scale = wdy.norm().item() * float(torch.rsqrt(normed.double().var(-1, unbiased=False) + eps).max()) \
        if n == 1 else 0.0
    for key, ref in (("x", g_ref), ("r", g_ref if rt is not None else None), ("w", dw_ref), ("b", db_ref)):
        if ref is None:
            continue
        g = got[key]
        leaf = {"x": xt, "r": rt, "w": wt, "b": bt}[key]
        assert g.dtype == leaf.dtype and g.shape == leaf.shape, key
        tol = max(TOL[g.dtype], TOL[TORCH[x]]) if key in "wb" else TOL[g.dtype]
        err = rel_err(g, ref, scale if key in "xr" else 0.0)
        assert err <= tol, f"d{key} err {err}"
    return y, h, grads


@pytest.mark.parametrize("m", FWD_M)
@pytest.mark.parametrize("n", FWD_N + MODEL_N + LN_LAYOUT_N)
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_layernorm_matches_reference(dt, n, m):
    check((m, n), dt, b=dt)


@pytest.mark.parametrize("n", LN_STATS_N)
@pytest.mark.parametrize("dt", DTYPE_NAMES)
def test_stats_and_the_direct_api(dt, n):
    # layernorm_fwd's mean and rstd against float64, and layernorm_bwd from them (db in the
    # weight's dtype); without store_stats neither is returned and y is the same.
    x, _, w, b = tensors((199, n), dt, b=dt)
    poison(((199,), torch.float32), ((199,), torch.float32), ((199, n), TORCH[dt]))
    y, mean, rstd = normir.layernorm_fwd(x, w, b, store_stats=True)
    y_ref, _, mean_ref, rstd_ref = layernorm_ref(x, w, b, LN_EPS)
    assert rel_err(y, y_ref) <= TOL[TORCH[dt]]
    assert mean.dtype == rstd.dtype == torch.float32 and mean.shape == rstd.shape == (199,)
    # The mean of random rows is ~0: its error is measured against the rows' spread.
    spread = x.double().std().item() * 199 ** 0.5
    assert rel_err(mean, mean_ref, spread) <= 1e-5 and rel_err(rstd, rstd_ref) <= 1e-5
    y2, m2, r2 = normir.layernorm_fwd(x, w, b)
    assert m2 is None and r2 is None and torch.equal(y, y2)
    dy = make(x.shape, x.dtype)
    dx, dw, db = normir.layernorm_bwd(x, w, dy, mean, rstd, has_bias=True)
    g_ref, dw_ref, db_ref = layernorm_bwd_ref(x, w, b, LN_EPS, dy)
    t = TOL[TORCH[dt]]
    assert rel_err(dx, g_ref) <= t and rel_err(dw, dw_ref) <= max(t, 1e-4) and rel_err(db, db_ref) <= max(t, 1e-4)


@pytest.mark.parametrize("mean,std", ((1e4, 1.0), (1.0, 1e-3)))
@pytest.mark.parametrize("n", LN_ACCURACY_N)
def test_precision_on_offset_rows(n, mean, std):
    # fp32 rows far from zero (mean 1e4, std 1) or of a tiny spread (mean 1, std 1e-3): the
    # centered variance keeps normir's error within twice that of torch's fp32 layer_norm.
    x = torch.randn((512, n), device="cuda", dtype=torch.float64) * std + mean
    x32 = x.float()
    y_ref = torch.nn.functional.layer_norm(x32.double(), (n,), eps=LN_EPS)
    ours = rel_err(normir.layernorm(x32, eps=LN_EPS), y_ref)
    theirs = rel_err(torch.nn.functional.layer_norm(x32, (n,), eps=LN_EPS), y_ref)
    assert ours <= 2 * max(theirs, 1e-7), (ours, theirs)


@pytest.mark.parametrize("n", LN_COMBO_N)
@pytest.mark.parametrize("combo", LN_COMBOS, ids=lambda c: "-".join(str(v) for v in c))
def test_weight_bias_absent_and_mixed_dtypes(combo, n):
    x, w, b = combo
    check((199, n), x, w=w, b=b)


@pytest.mark.parametrize("n", LN_NO_WB_HELD_N)
def test_long_rows_without_w_and_b_held(n):
    check((199, n), "bf16", w=None)


@pytest.mark.parametrize("prenorm", (True, False), ids=("d_residual_out", "no_d_residual_out"))
@pytest.mark.parametrize("n", LN_FUSED_N)
@pytest.mark.parametrize("combo", LN_FUSED_COMBOS, ids=lambda c: "-".join(str(v) for v in c))
def test_fused_add(combo, n, prenorm):
    check((199, n), *combo, prenorm=prenorm)


@pytest.mark.parametrize("eps", EPS)
def test_eps_honored(eps):
    x, _, w, b = tensors((64, 4096), "bf16", b="bf16")
    x = x * 1e-3  # a spread small enough that eps matters
    y, _, _ = normir.layernorm_fwd(x, w, b, eps)
    y_ref = layernorm_ref(x, w, b, eps)[0]
    assert rel_err(y, y_ref) <= TOL[torch.bfloat16]
    other = layernorm_ref(x, w, b, eps * 10 if eps < 1e-2 else eps / 10)[0]
    assert rel_err(other, y_ref) > 4 * TOL[torch.bfloat16]  # eps is visible: the check can fail


def test_3d_empty_one_row_and_prenorm_without_residual():
    check((3, 5, 1024), "bf16", b="bf16")
    check((1, 1024), "bf16", b="bf16")
    x, _, w, b = tensors((0, 1024), "bf16", b="bf16")
    for t in (x, w, b):
        t.requires_grad_(True)
    y = normir.layernorm(x, w, b)
    assert y.shape == (0, 1024)
    dx, dw, db = torch.autograd.grad(y, [x, w, b], torch.ones_like(y))
    assert dx.shape == (0, 1024) and torch.equal(dw, torch.zeros_like(w)) and torch.equal(db, torch.zeros_like(b))
    x = make((3, 1024), torch.bfloat16)
    assert normir.layernorm(x, prenorm=True)[1] is x  # residual_out is x itself


@pytest.mark.parametrize("n", LN_BIT_N)
def test_dw_db_bit_identical_across_runs_and_atomic_mode(n):
    x, _, w, b = tensors((4096, n), "bf16", b="bf16")
    y, mean, rstd = normir.layernorm_fwd(x, w, b, store_stats=True)
    dy = make(y.shape, y.dtype)
    first = normir.layernorm_bwd(x, w, dy, mean, rstd, has_bias=True)
    for _ in range(3):
        again = normir.layernorm_bwd(x, w, dy, mean, rstd, has_bias=True)
        assert all(torch.equal(a, c) for a, c in zip(first, again))
    dx, dw, db = normir.layernorm_bwd(x, w, dy, mean, rstd, has_bias=True, atomic=True)
    g_ref, dw_ref, db_ref = layernorm_bwd_ref(x, w, b, LN_EPS, dy)
    assert torch.equal(dx, first[0])
    assert rel_err(dw, dw_ref) <= TOL[torch.bfloat16] and rel_err(db, db_ref) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("n,knobs", DB_SMEM_CASES, ids=lambda v: tpr_value(v) if isinstance(v, dict) else str(v))
def test_db_sums_in_shared_memory(monkeypatch, n, knobs):
    # db's column sums in shared memory (db_smem) forced on layouts the policy does not give it, with and without
    # d_residual_out; dw and db stay bit-identical from run to run.
    with forced_layout(monkeypatch, "layernorm_bwd", n, knobs):
        check((199, n), "bf16", b="bf16")
        check((199, n), "bf16", "f32", b="bf16")
        test_dw_db_bit_identical_across_runs_and_atomic_mode(n)


@pytest.mark.parametrize("kernel,n,knobs", [c for c in STAGE_DRES_CASES if c[0] == "layernorm_bwd"],
                         ids=lambda v: tpr_value(v) if isinstance(v, dict) else str(v))
def test_d_residual_out_staged(monkeypatch, kernel, n, knobs):
    # The fused add's LayerNorm with d_residual_out staged (stage_dres), forced; as test_gpu_fused_add.py's.
    with forced_layout(monkeypatch, kernel, n, knobs):
        for b in (None, "bf16"):
            check((199, n), "bf16", "bf16", b=b)


def test_gradcheck_against_finite_differences():
    # fp32 gradients of (y, residual_out) vs central differences of the float64 reference.
    x, r, w, b = tensors((8, 100), "f32", "f32", w="f32", b="f32")
    for t in (x, r, w, b):
        t.requires_grad_(True)
    y, h = normir.fused_add_layernorm(x, r, w, b)
    dy, dh = make(y.shape, y.dtype), make(h.shape, h.dtype)
    grads = torch.autograd.grad([y, h], [x, r, w, b], [dy, dh])
    base = [t.detach().double() for t in (x, r, w, b)]

    def f(xx, rr, ww, bb):
        hh = xx + rr
        return (layernorm_ref(hh, ww, bb, LN_EPS)[0] * dy.double()).sum() + (hh * dh.double()).sum()

    step = 1e-6
    for k, idx in ((0, (0, 0)), (0, (7, 99)), (1, (3, 57)), (2, (42,)), (3, (5,))):
        e = torch.zeros_like(base[k])
        e[idx] = step
        hi = [t + e if i == k else t for i, t in enumerate(base)]
        lo = [t - e if i == k else t for i, t in enumerate(base)]
        fd = ((f(*hi) - f(*lo)) / (2 * step)).item()
        assert abs(fd - grads[k][idx].item()) <= 1e-4 * max(1.0, abs(fd)), (k, idx)


def test_module_matches_torch_layernorm():
    # normir.LayerNorm loads torch.nn.LayerNorm's state_dict (and back), and its outputs and
    # gradients are within bf16 tolerance of float64, as torch's are.
    ref = torch.nn.LayerNorm(1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref.weight.copy_(make((1024,), torch.bfloat16) + 1)
        ref.bias.copy_(make((1024,), torch.bfloat16, 0.5))
    ours = normir.LayerNorm(1024, device="cuda", dtype=torch.bfloat16)
    ours.load_state_dict(ref.state_dict())
    back = torch.nn.LayerNorm(1024, device="cuda", dtype=torch.bfloat16)
    back.load_state_dict(ours.state_dict())
    assert all(torch.equal(a, c) for a, c in zip(back.state_dict().values(), ref.state_dict().values()))
    x = make((3, 64, 1024), torch.bfloat16).requires_grad_(True)
    dy = make(x.shape, torch.bfloat16)
    y_ref, _, _, _ = layernorm_ref(x.detach(), ref.weight.detach(), ref.bias.detach(), ref.eps)
    g_ref, dw_ref, db_ref = layernorm_bwd_ref(x.detach(), ref.weight, ref.bias, ref.eps, dy)
    for mod in (ours, ref):
        y = mod(x)
        grads = torch.autograd.grad(y, [x, mod.weight, mod.bias], dy)
        assert rel_err(y, y_ref) <= TOL[torch.bfloat16]
        for g, r in zip(grads, (g_ref, dw_ref, db_ref)):
            assert rel_err(g, r) <= TOL[torch.bfloat16]
    fused = normir.FusedAddLayerNorm(1024, device="cuda", dtype=torch.bfloat16)
    fused.load_state_dict(ref.state_dict())
    r = make((3, 64, 1024), torch.bfloat16)
    y, h = fused(x.detach(), r)
    y2, h2 = normir.fused_add_layernorm(x.detach(), r, ref.weight, ref.bias)
    assert torch.equal(y, y2) and torch.equal(h, h2)


def test_custom_ops_eager_and_compiled_agree():
    x, r, w, b = tensors((199, 1024), "bf16", "bf16", b="bf16")
    dy, dh = make(x.shape, torch.bfloat16), make(x.shape, torch.bfloat16)

    def run(fn):
        xa, ra, wa, ba = (t.clone().requires_grad_(True) for t in (x, r, w, b))
        y, h = fn(xa, ra, wa, ba)
        return (y, h, *torch.autograd.grad([y, h], [xa, ra, wa, ba], [dy, dh]))

    eager = run(lambda a, c, d, e: normir.fused_add_layernorm(a, c, d, e))
    op = run(lambda a, c, d, e: torch.ops.normir.layernorm_fwd(a, c, d, e, LN_EPS, None, None, True, True)[:2])
    compiled = run(torch.compile(lambda a, c, d, e: normir.fused_add_layernorm(a, c, d, e), fullgraph=True))
    for e, o, c in zip(eager, op, compiled):
        assert torch.equal(e, o) and torch.equal(e, c)


def test_custom_op_opcheck():
    x, r, w, b = tensors((37, 1024), "bf16", "f32", w="f32", b="bf16")
    torch.library.opcheck(torch.ops.normir.layernorm_fwd.default, (x, r, w, b, LN_EPS, None, None, True, True))
    y, h, mean, rstd = torch.ops.normir.layernorm_fwd(x, r, w, b, LN_EPS, None, None, True, True)
    torch.library.opcheck(torch.ops.normir.layernorm_bwd.default,
                          (make(y.shape, y.dtype), h, w, mean, rstd, make(h.shape, h.dtype), torch.bfloat16,
                           torch.bfloat16, torch.float32), test_utils=("test_schema", "test_faketensor"))


def test_training_matches_torch():
    """A small LayerNorm MLP (bf16) trained with normir.LayerNorm and with torch.nn.LayerNorm
    from one seed: the losses agree within bf16 tolerance."""

    def run(norm_cls) -> list[float]:
        torch.manual_seed(0)
        layers = []
        for _ in range(3):
            layers += [torch.nn.Linear(TRAIN_N, TRAIN_N), norm_cls(TRAIN_N), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(TRAIN_N, 10)).cuda().bfloat16()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator(device="cuda").manual_seed(1)
        losses = []
        for _ in range(30):
            x = torch.randn((64, TRAIN_N), device="cuda", generator=gen).bfloat16()
            target = torch.randint(0, 10, (64,), device="cuda", generator=gen)
            loss = torch.nn.functional.cross_entropy(model(x).float(), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ours, theirs = run(normir.LayerNorm), run(torch.nn.LayerNorm)
    assert all(math.isfinite(v) for v in ours)
    assert ours[-1] < ours[0]  # it trains
    for a, c in zip(ours, theirs):
        assert abs(a - c) <= 0.03 * max(1.0, abs(c)), (ours, theirs)
