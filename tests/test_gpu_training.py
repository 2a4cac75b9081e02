"""GPU tier: what a training step meets off the plain call. torch.compile (Inductor, fullgraph)
of each op and keyword family with eps and weight_offset as arguments taking two values each,
outputs and gradients bitwise equal to eager, one graph per value and per rank while batch sizes
share one; torch.func (grad, vjp, jacrev, vmap, vmap of grad) against float64; the backwards'
dtype rule (dy and d_residual_out each in any float dtype, read in its own); LayerNorm's backward
at N <= 8 within twice torch's fp32 error. Every specialization launched here is in
gpu_cases.training_specializations()."""

from __future__ import annotations

import statistics

import pytest
import torch
from gpu_cases import FUNC_N, GRAD_DTYPE_N, TINY_N, TRAINING_FLOATS
from gpu_cases import INTEGRATION_N as N
from gpu_helpers import TOL, TORCH, make, poison, rel_err
from torch._dynamo.testing import CompileCounterWithBackend

import normir
from normir.ops.fused_add_rmsnorm import fused_add_rmsnorm_bwd_ref, fused_add_rmsnorm_ref
from normir.ops.layernorm import layernorm_bwd_ref
from normir.ops.rmsnorm import rmsnorm_bwd_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# ---------------------------------------------------------------------------- torch.compile

# f(x, r, w, b, eps, offset): the keyword families, each reading its floats as arguments.
FORMS = {
    "rmsnorm": lambda x, r, w, b, e, o: normir.rmsnorm(x, w, e),
    "rmsnorm residual bias offset prenorm": lambda x, r, w, b, e, o: normir.rmsnorm(
        x, w, e, residual=r, bias=b, weight_offset=o, prenorm=True),
    "rmsnorm residual_dtype out_dtype": lambda x, r, w, b, e, o: normir.rmsnorm(
        x, w, e, residual=r, prenorm=True, residual_dtype=F32, out_dtype=F32),
    "layernorm": lambda x, r, w, b, e, o: normir.layernorm(x, w, b, e),
    "fused_add_layernorm residual_dtype": lambda x, r, w, b, e, o: normir.fused_add_layernorm(
        x, r, w, b, e, residual_dtype=F32),
}


def _inputs(shape, seed):
    torch.manual_seed(seed)
    x, r = make(shape, BF16), make(shape, BF16)
    w, b = make(shape[-1:], BF16) + 1, make(shape[-1:], BF16, 0.5)
    return [t.requires_grad_(True) for t in (x, r, w, b)]


def _run(f, ts, floats, dys=None):
    out = f(*ts, *floats)
    outs = out if isinstance(out, tuple) else (out,)
    dys = dys or [make(o.shape, o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, ts, dys, allow_unused=True)
    return [o.detach() for o in outs], dys, [g for g in grads if g is not None]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_compiled_floats_ranks_and_batches(form):
    f = FORMS[form]
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend=counter)
    shapes = (((3, N), (5, N)), ((2, 3, N), (4, 3, N)))
    for pair in shapes:
        for floats in TRAINING_FLOATS:
            for shape in pair:
                ts = _inputs(shape, hash((form, shape, floats)) % 1000)
                outs, dys, grads = _run(f, ts, floats)  # eager: the direct launches
                tc = [t.detach().clone().requires_grad_(True) for t in ts]
                outs_c, _, grads_c = _run(compiled, tc, floats, dys)
                for e, c in zip(outs + grads, outs_c + grads_c):
                    assert e.dtype == c.dtype and torch.equal(e, c), (form, shape, floats)
    # Graphs that hold a normir op (AOTAutograd's first use in a process compiles empty frames too).
    assert sum("torch.ops.normir." in g.code for g in counter.graphs) == len(shapes) * len(TRAINING_FLOATS)


# ---------------------------------------------------------------------------- torch.func


def _rms_ref(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


FUNC = {
    "rmsnorm": (lambda x, r, w, b: normir.rmsnorm(x, w), lambda x, r, w, b: _rms_ref(x, w)),
    "fused_add_rmsnorm bias": (lambda x, r, w, b: normir.fused_add_rmsnorm(x, r, w, bias=b, prenorm=False),
                               lambda x, r, w, b: _rms_ref(x + r, w) + b),
    "layernorm": (lambda x, r, w, b: normir.layernorm(x, w, b),
                  lambda x, r, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b)),
    "fused_add_layernorm": (lambda x, r, w, b: normir.fused_add_layernorm(x, r, w, b)[0],
                            lambda x, r, w, b: torch.nn.functional.layer_norm(x + r, x.shape[-1:], w, b)),
}


def _close(got, want, tol=1e-5):
    got, want = (g if isinstance(g, tuple) else (g,) for g in (got, want))
    return len(got) == len(want) and all(rel_err(g, e) <= tol for g, e in zip(got, want))


@pytest.mark.parametrize("name", sorted(FUNC))
def test_func_transforms_against_float64(name):
    f, ref = FUNC[name]
    torch.manual_seed(0)
    x, r, dy = (make((3, 4, FUNC_N), F32) for _ in range(3))
    w, b = make((FUNC_N,), F32) + 1, make((FUNC_N,), F32, 0.5)
    args, args64 = (x, r, w, b), tuple(t.double() for t in (x, r, w, b))
    nums = (0, 1, 2, 3)
    got = torch.func.grad(lambda *a: (f(*a) * dy).sum(), argnums=nums)(*args)
    assert _close(got, torch.func.grad(lambda *a: (ref(*a) * dy.double()).sum(), argnums=nums)(*args64))
    out, pull = torch.func.vjp(f, *args)
    out64, pull64 = torch.func.vjp(ref, *args64)
    assert _close(out, out64) and _close(pull(dy), pull64(dy.double()))
    jac = torch.func.jacrev(f, argnums=(0, 2))(x[0, 0], r[0, 0], w, b)
    assert _close(jac, torch.func.jacrev(ref, argnums=(0, 2))(*(t.double() for t in (x[0, 0], r[0, 0], w, b))))
    for dims in ((0, 0, None, None), (1, 1, None, None), (0, 0, 0, 0)):
        vargs = args if dims[2] is None else (x, r, w.expand(3, -1) + make((3, FUNC_N), F32),
                                              b.expand(3, -1) + make((3, FUNC_N), F32))
        got = torch.func.vmap(f, in_dims=dims)(*vargs)
        assert _close(got, torch.func.vmap(ref, in_dims=dims)(*(t.double() for t in vargs))), dims
    # Per-sample gradients: dw and db of each element of the vmapped dim, not summed over it.
    loss = lambda fn: (lambda x, r, w, b, dy: (fn(x, r, w, b) * dy).sum())  # noqa: E731
    per = torch.func.vmap(torch.func.grad(loss(f), argnums=(0, 2, 3)), in_dims=(0, 0, None, None, 0))(*args, dy)
    per64 = torch.func.vmap(torch.func.grad(loss(ref), argnums=(0, 2, 3)), in_dims=(0, 0, None, None, 0))(
        *args64, dy.double())
    assert per[1].shape == (3, FUNC_N) and _close(per, per64)


# ---------------------------------------------------------------------------- the backwards' dtype rule

DTS = ("f32", "f16", "bf16")
MIXED = [(x, g) for x in DTS for g in DTS if g != x]


@pytest.mark.parametrize("n", GRAD_DTYPE_N)
@pytest.mark.parametrize("xdt, gdt", MIXED)
def test_rmsnorm_bwd_reads_dy_in_its_own_dtype(n, xdt, gdt):
    torch.manual_seed(n)
    x, w = make((199, n), TORCH[xdt]), make((n,), TORCH[xdt]) + 1
    dy = make((199, n), TORCH[gdt])
    _, rstd = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=True)
    poison(((199, n), TORCH[xdt]))
    dx, dw = normir.rmsnorm_bwd(x, w, dy, rstd)
    dx_ref, dw_ref = rmsnorm_bwd_ref(x, w, dy, 1e-6)
    t = TOL[TORCH[xdt]]
    assert dx.dtype == x.dtype and dw.dtype == w.dtype
    assert rel_err(dx, dx_ref) <= t and rel_err(dw, dw_ref) <= max(t, 1e-4)


@pytest.mark.parametrize("n", GRAD_DTYPE_N)
@pytest.mark.parametrize("hdt, gdt", MIXED)
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_fused_bwd_reads_d_residual_out_in_its_own_dtype(norm, n, hdt, gdt):
    # residual_out in one dtype, dy and d_residual_out in another each (dy in the third where
    # there is one): every gradient read in its own type, dx in residual_out's.
    torch.manual_seed(n)
    ht, gt = TORCH[hdt], TORCH[gdt]
    ydt = next(d for d in DTS if d not in (hdt, gdt))
    h, w, b = make((199, n), ht), make((n,), ht) + 1, make((n,), ht, 0.5)
    dy, g = make((199, n), TORCH[ydt]), make((199, n), gt)
    poison(((199, n), ht))
    if norm == "rmsnorm":
        _, _, rstd = normir.fused_add_rmsnorm_fwd(h, None, w, 1e-6, bias=b, store_rstd=True)
        dh, dw, db = normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, g, has_bias=True)
        want = fused_add_rmsnorm_bwd_ref(h, w, b, 1e-6, 0.0, dy, g)
    else:
        _, mean, rstd = normir.layernorm_fwd(h, w, b, store_stats=True)
        dh, dw, db = normir.fused_add_layernorm_bwd(dy, h, w, mean, rstd, g, has_bias=True)
        want = layernorm_bwd_ref(h, w, b, 1e-5, dy, g)
    t = TOL[ht]
    assert dh.dtype == ht and dw.dtype == ht and db.dtype == ht
    assert rel_err(dh, want[0]) <= t
    assert rel_err(dw, want[1]) <= max(t, 1e-4) and rel_err(db, want[2]) <= max(t, 1e-4)


def test_fused_forward_then_bwd_with_an_fp32_gradient_of_a_bf16_residual_out():
    # Mixed precision as a training loop meets it: bf16 activations, the upstream gradients in fp32.
    torch.manual_seed(1)
    x, r, w = make((64, 2048), BF16), make((64, 2048), BF16), make((2048,), BF16) + 1
    y, h, rstd = normir.fused_add_rmsnorm_fwd(x, r, w, 1e-6, store_rstd=True)
    _, h_ref, _ = fused_add_rmsnorm_ref(x, r, w, None, 1e-6)
    assert torch.equal(h, h_ref)
    dy, g = make(y.shape, F32), make(h.shape, F32)
    dh, dw, _ = normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, g)
    want = fused_add_rmsnorm_bwd_ref(h, w, None, 1e-6, 0.0, dy, g)
    assert rel_err(dh, want[0]) <= TOL[BF16] and rel_err(dw, want[1]) <= TOL[BF16]


# ---------------------------------------------------------------------------- LayerNorm at tiny N


def _dx_errors(n: int, rows: str, seed: int) -> tuple[float, float]:
    """(normir's, torch's) relative L2 error of LayerNorm's dx against float64 on 3 fp32 rows."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((3, n), generator=g, device="cuda", dtype=torch.float64)
    x = (x * 3 + 100 if rows == "mean 100, std 3" else x).float()
    dy = torch.randn((3, n), generator=g, device="cuda")
    xd = x.double().requires_grad_(True)
    (want,) = torch.autograd.grad(torch.nn.functional.layer_norm(xd, (n,), eps=1e-5), xd, dy.double())
    errs = []
    for norm in (normir.layernorm, lambda t: torch.nn.functional.layer_norm(t, (n,), eps=1e-5)):
        xt = x.clone().requires_grad_(True)
        (got,) = torch.autograd.grad(norm(xt), xt, dy)
        errs.append(rel_err(got, want))
    return errs[0], errs[1]


@pytest.mark.parametrize("rows", ["mean 100, std 3", "standard normal"])
@pytest.mark.parametrize("n", TINY_N)
def test_tiny_rows_backward_within_twice_torchs_error(n, rows):
    ours, theirs = zip(*(_dx_errors(n, rows, seed) for seed in range(20)))
    assert statistics.median(ours) <= 2 * statistics.median(theirs), (statistics.median(ours),
                                                                       statistics.median(theirs))
