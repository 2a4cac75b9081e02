"""PyTorch integration without a GPU: the double backward's error on every autograd path (the
eager Functions and the custom ops' registered autograd, with the launches replaced by float32
torch math on CPU tensors), torch.func's transforms over every op (the same launches), the ops
defined by `import normir` alone, and the output dtypes under torch.autocast("cuda") against
torch's own norms on fake CUDA tensors (the dispatcher applies autocast's casts to them as to real
ones). The launches' CPU emulation is cpu_emulation.py's (the cpu_launches fixture, conftest.py).
tests/test_gpu_integration.py runs the same on the GPU, with torch.compile and CUDA graphs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import normir
from normir.ops import _rows

pytestmark = pytest.mark.cpu

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# ---------------------------------------------------------------------------- double backward

# Each autograd path: the eager Functions (RMSNormFunction, FusedNormFunction for both kernels)
# and the custom ops' registered autograd (what torch.compile traces). f(x, residual, weight, bias) -> y.
PATHS = {
    "rmsnorm": lambda x, r, w, b: normir.rmsnorm(x, w),
    "rmsnorm_fwd op": lambda x, r, w, b: torch.ops.normir.rmsnorm_fwd(x, w, 1e-6, True)[0],
    "fused_add_rmsnorm": lambda x, r, w, b: normir.fused_add_rmsnorm(x, r, w, bias=b)[0],
    "fused_add_rmsnorm_fwd op": lambda x, r, w, b: torch.ops.normir.fused_add_rmsnorm_fwd(
        x, r, w, b, 1e-6, None, None, 0.0, True, True)[0],
    "layernorm": lambda x, r, w, b: normir.layernorm(x, w, b),
    "fused_add_layernorm": lambda x, r, w, b: normir.fused_add_layernorm(x, r, w, b)[0],
    "layernorm_fwd op": lambda x, r, w, b: torch.ops.normir.layernorm_fwd(x, r, w, b, 1e-5, None, None, True,
                                                                          True)[0],
}


def _inputs(n=16):
    gen = torch.Generator().manual_seed(0)
    x, r = (torch.randn(3, 5, n, generator=gen).requires_grad_(True) for _ in range(2))
    w = (torch.randn(n, generator=gen) + 1).requires_grad_(True)
    b = torch.randn(n, generator=gen).requires_grad_(True)
    return x, r, w, b


@pytest.mark.parametrize("path", sorted(PATHS))
def test_double_backward_raises_naming_the_fix(cpu_launches, path):
    x, r, w, b = _inputs()
    f = PATHS[path]
    first = torch.autograd.grad(f(x, r, w, b).sum(), (x, w))
    # create_graph=True: the same first derivatives; y.sum()'s dy does not require grad (the case
    # torch's once_differentiable lets through, dropping the second-order terms silently).
    grads = torch.autograd.grad(f(x, r, w, b).sum(), (x, w), create_graph=True)
    for g, want in zip(grads, first):
        assert torch.equal(g.detach(), want) and g.requires_grad
    torch_op = "layer_norm" if "layer" in path else "rms_norm"
    with pytest.raises(RuntimeError, match=rf"has no double backward: normir's kernels compute first derivatives "
                                           rf"only.*use torch's own torch\.nn\.functional\.{torch_op}"):
        (grads[0].pow(2).sum() + grads[1].pow(2).sum()).backward()


def test_backward_ops_outputs_do_not_alias(cpu_launches):
    # No weight, bias or second gradient dtype: three absent outputs, each its own empty tensor
    # (torch refuses a custom op whose outputs alias; torch.compile's backward calls these ops).
    x, rstd, mean = torch.randn(4, 16), torch.rand(4) + 0.5, torch.randn(4)
    outs = torch.ops.normir.layernorm_bwd(x, x, None, mean, rstd, None, None, None, None)
    outs += torch.ops.normir.fused_add_rmsnorm_bwd(x, x, None, rstd, None, None, 0.0, None, None)
    assert [t.shape for t in outs] == [(4, 16), (0,), (0,), (0,)] * 2
    assert len({t.untyped_storage()._cdata for t in outs}) == len(outs)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_create_graph_elsewhere_still_works(cpu_launches, path):
    # A second derivative that does not pass through normir's gradients is not refused.
    x, r, w, b = _inputs()
    v = torch.randn(4, requires_grad=True)
    loss = PATHS[path](x, r, w, b).sum() + v.pow(3).sum()
    gx, gv = torch.autograd.grad(loss, (x, v), create_graph=True)
    (hv,) = torch.autograd.grad(gv.sum(), v)
    assert torch.allclose(hv, 6 * v.detach())


def test_first_derivatives_unchanged_by_create_graph(cpu_launches):
    # The first derivatives themselves (through the guard) match float64 torch math.
    x, r, w, b = _inputs()
    y, h = normir.fused_add_rmsnorm(x, r, w, bias=b)
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    got = torch.autograd.grad((y, h), (x, r, w, b), (dy, dh), create_graph=True)
    xd, rd, wd, bd = (t.detach().double().requires_grad_(True) for t in (x, r, w, b))
    hd = xd + rd
    yd = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-6) * wd + bd
    want = torch.autograd.grad((yd, hd), (xd, rd, wd, bd), (dy.double(), dh.double()))
    for g, e in zip(got, want):
        assert torch.allclose(g.double(), e, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- torch.func

# Each op family through torch.func: f(x, r, w, b) -> y, and its float64 reference in torch math
# (the launches above are float32 torch math, so results agree to float32 rounding).


def _rms_ref(h, w, b=None, offset=0.0, eps=1e-6):
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * (w + offset)
    return y + b if b is not None else y


def _ln_ref(h, w, b, eps=1e-5):
    return torch.nn.functional.layer_norm(h, h.shape[-1:], w, b, eps)


FUNC = {
    "rmsnorm": (lambda x, r, w, b: normir.rmsnorm(x, w), lambda x, r, w, b: _rms_ref(x, w)),
    "rmsnorm residual bias offset": (
        lambda x, r, w, b: normir.rmsnorm(x, w, residual=r, bias=b, weight_offset=0.5, prenorm=True)[0],
        lambda x, r, w, b: _rms_ref(x + r, w, b, 0.5)),
    "fused_add_rmsnorm residual_out": (lambda x, r, w, b: normir.fused_add_rmsnorm(x, r, w)[1] * 2,
                                       lambda x, r, w, b: (x + r) * 2),
    "layernorm": (lambda x, r, w, b: normir.layernorm(x, w, b), lambda x, r, w, b: _ln_ref(x, w, b)),
    "fused_add_layernorm": (lambda x, r, w, b: normir.fused_add_layernorm(x, r, w, b, prenorm=False),
                            lambda x, r, w, b: _ln_ref(x + r, w, b)),
    "RMSNorm module": (lambda x, r, w, b: torch.func.functional_call(normir.RMSNorm(16), {"weight": w}, (x,)),
                       lambda x, r, w, b: _rms_ref(x, w)),
    "LayerNorm module": (lambda x, r, w, b: torch.func.functional_call(normir.LayerNorm(16), {"weight": w, "bias": b},
                                                                       (x,)),
                         lambda x, r, w, b: _ln_ref(x, w, b)),
}


def _func_inputs(seed=0, shape=(3, 4, 16)):
    gen = torch.Generator().manual_seed(seed)
    x, r, dy = (torch.randn(shape, generator=gen) for _ in range(3))
    w, b = torch.randn(shape[-1], generator=gen) + 1, torch.randn(shape[-1], generator=gen)
    return x, r, w, b, dy


def _close(got, want):
    got, want = (g if isinstance(g, tuple) else (g,) for g in (got, want))
    return len(got) == len(want) and all(torch.allclose(g.double(), e.double(), rtol=1e-4, atol=1e-4)
                                         for g, e in zip(got, want))


def _f64(*ts):
    return tuple(t.double() for t in ts)


@pytest.mark.parametrize("name", sorted(FUNC))
def test_func_grad_vjp_jacrev(cpu_launches, name):
    f, ref = FUNC[name]
    x, r, w, b, dy = _func_inputs()
    args, args64 = (x, r, w, b), _f64(x, r, w, b)
    for nums in ((0,), (0, 1, 2, 3)):
        got = torch.func.grad(lambda *a: (f(*a) * dy).sum(), argnums=nums)(*args)
        want = torch.func.grad(lambda *a: (ref(*a) * dy.double()).sum(), argnums=nums)(*args64)
        assert _close(got, want), (name, nums)
    out, pull = torch.func.vjp(f, *args)
    out64, pull64 = torch.func.vjp(ref, *args64)
    assert _close(out, out64) and _close(pull(dy), pull64(dy.double()))
    for nums in (0, 2):  # one row's Jacobian: dx (a vmap of the backward over basis vectors), dw
        got = torch.func.jacrev(f, argnums=nums)(x[0, 0], r[0, 0], w, b)
        want = torch.func.jacrev(ref, argnums=nums)(x[0, 0].double(), r[0, 0].double(), w.double(), b.double())
        assert _close(got, want), (name, nums)


@pytest.mark.parametrize("name", sorted(FUNC))
def test_func_vmap(cpu_launches, name):
    f, ref = FUNC[name]
    x, r, w, b, dy = _func_inputs()
    # The vmapped dim leading or not, the residual batched or not (then a row of x's per-sample
    # shape), and per-sample weights and biases (one of each per element of the vmapped dim).
    ws, bs = w.expand(3, -1) + torch.randn(3, 16), b.expand(3, -1) + torch.randn(3, 16)
    for dims, args in (((0, 0, None, None), (x, r, w, b)), ((1, 1, None, None), (x, r, w, b)),
                       ((1, None, None, None), (x, r[:, 0], w, b)), ((0, 0, 0, 0), (x, r, ws, bs))):
        got = torch.func.vmap(f, in_dims=dims)(*args)
        assert _close(got, torch.func.vmap(ref, in_dims=dims)(*_f64(*args))), (name, dims)


@pytest.mark.parametrize("name", sorted(FUNC))
def test_func_per_sample_gradients(cpu_launches, name):
    # vmap(grad): each element of the vmapped dim has its own dw and db (not summed over it).
    f, ref = FUNC[name]
    x, r, w, b, dy = _func_inputs()

    def per_sample(fn, *args):
        loss = lambda x, r, w, b, dy: (fn(x, r, w, b) * dy).sum()  # noqa: E731
        return torch.func.vmap(torch.func.grad(loss, argnums=(0, 2, 3)), in_dims=(0, 0, None, None, 0))(*args)

    got = per_sample(f, x, r, w, b, dy)
    assert got[1].shape == (3, 16)
    assert _close(got, per_sample(ref, *_f64(x, r, w, b, dy)))
    loop = [torch.func.grad(lambda w, i=i: (f(x[i], r[i], w, b) * dy[i]).sum())(w) for i in range(3)]
    assert _close(got[1], torch.stack(loop))


def test_func_low_level_backwards_vmap(cpu_launches):
    # The backward ops themselves vmapped over dy (what jacrev does), dw per sample.
    x, r, w, b, dy = _func_inputs()
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6)
    dys = torch.randn(5, *x.shape)
    got = torch.func.vmap(lambda d: normir.rmsnorm_bwd(x, w, d, rstd))(dys)
    for i in range(5):
        want = normir.rmsnorm_bwd(x, w, dys[i], rstd)
        assert all(torch.allclose(g[i], e) for g, e in zip(got, want))
    got = torch.func.vmap(lambda d: normir.fused_add_layernorm_bwd(d, x, w, x.mean(-1), rstd, d, has_bias=True))(dys)
    for i in range(5):
        want = normir.fused_add_layernorm_bwd(dys[i], x, w, x.mean(-1), rstd, dys[i], has_bias=True)
        assert all(torch.allclose(g[i], e) for g, e in zip(got, want))


def test_func_forward_mode_and_second_derivatives_refused(cpu_launches):
    x, r, w, b, dy = _func_inputs()
    with pytest.raises(NotImplementedError, match=r"normir::rmsnorm_fwd has no forward-mode derivative .*jvp"):
        torch.func.jvp(lambda x: normir.rmsnorm(x, w), (x,), (dy,))
    with pytest.raises(NotImplementedError, match=r"normir::layernorm_fwd has no forward-mode derivative"):
        torch.func.jacfwd(lambda x: normir.layernorm(x, w, b))(x[0, 0])
    with pytest.raises(NotImplementedError, match=r"no forward-mode derivative"):  # hessian: jacfwd of jacrev
        torch.func.hessian(lambda x: normir.rmsnorm(x, w).sum())(x[0, 0])
    with pytest.raises(RuntimeError, match=r"has no double backward: normir's kernels compute first derivatives"):
        torch.func.jacrev(torch.func.jacrev(lambda x: normir.rmsnorm(x, w)))(x[0, 0])
    with pytest.raises(RuntimeError, match=r"has no double backward"):
        torch.func.grad(lambda x: torch.func.grad(lambda x: (normir.layernorm(x, w, b) * dy).sum())(x).sum())(x)


# ---------------------------------------------------------------------------- import normir


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("order", ["import torch, normir", "import normir, torch", "import normir, torch.nn",
                                   "from normir.ops.layernorm import layernorm", "import normir.ops.swap"])
def test_import_normir_defines_every_op(order):
    # A saved graph that names torch.ops.normir.*, loaded in a new process, finds its ops after
    # `import normir`, in either order of the imports; nothing else of normir is touched first.
    ops = ", ".join(repr(f"{o}") for o in ("rmsnorm_fwd", "rmsnorm_bwd", "fused_add_rmsnorm_fwd",
                                           "fused_add_rmsnorm_bwd", "layernorm_fwd", "layernorm_bwd"))
    r = _fresh(f"{order}\nimport torch\nfor op in ({ops},):\n    getattr(torch.ops.normir, op).default\n"
               "print('ok')")
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr


def test_import_normir_alone_loads_no_torch():
    r = _fresh("import sys, normir, normir.cli, normir.compiler, normir.options\n"
               "assert 'torch' not in sys.modules, 'torch was imported'")
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------- autocast

DTYPES = (F32, F16, BF16)


@pytest.fixture
def cuda_autocast():
    """torch.autocast("cuda")'s state, set directly (torch.autocast itself turns off without a GPU)."""
    torch.set_autocast_enabled("cuda", True)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", False)


def test_autocast_policy_read_from_torch():
    assert _rows.AUTOCAST_FP32["layernorm"]  # on autocast's fp32 list in every torch normir supports
    assert _rows.AUTOCAST_FP32["rmsnorm"] == torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm",
                                                                                            "AutocastCUDA")
    assert _rows.autocast_out_dtype("layernorm", 1.0) is None  # not a tensor: the checks report it later


@pytest.mark.parametrize("wdt", DTYPES + (None,))
@pytest.mark.parametrize("xdt", DTYPES)
def test_autocast_dtypes_follow_torch(fake, cuda_autocast, xdt, wdt):
    n = 256
    x = fake((2, 3, n), xdt)
    w = fake((n,), wdt) if wdt is not None else None
    b = fake((n,), wdt) if wdt is not None else None
    r = fake((2, 3, n), xdt)
    assert torch.is_autocast_enabled()
    want = torch.rms_norm(x, (n,), w, 1e-6).dtype
    assert normir.rmsnorm(x, w, 1e-6).dtype == want
    assert normir.rmsnorm(x, w, 1e-6, prenorm=True)[0].dtype == want  # the general form
    want = torch.nn.functional.layer_norm(x, (n,), w, b).dtype
    assert normir.layernorm(x, w, b).dtype == want
    # The fused adds: torch's norm of h = x + residual (autocast leaves the add alone); residual_out
    # stays in the residual's dtype.
    h = x + r
    y, res = normir.fused_add_rmsnorm(x, r, w)
    assert (y.dtype, res.dtype) == (torch.rms_norm(h, (n,), w, 1e-6).dtype, xdt)
    y, res = normir.fused_add_layernorm(x, r, w, b)
    assert (y.dtype, res.dtype) == (torch.nn.functional.layer_norm(h, (n,), w, b).dtype, xdt)
    # An explicit out_dtype is kept.
    assert normir.rmsnorm(x, w, 1e-6, out_dtype=BF16).dtype == BF16
    assert normir.layernorm(x, w, b, out_dtype=F16).dtype == F16


@pytest.mark.parametrize("xdt, pdt", [(F32, F32), (BF16, BF16), (BF16, F32), (F16, F32)])
def test_autocast_modules_follow_torch(fake, cuda_autocast, xdt, pdt):
    n = 256
    x = fake((4, n), xdt)
    kw = dict(device="cuda", dtype=pdt)
    assert normir.RMSNorm(n, 1e-6, **kw)(x).dtype == torch.nn.RMSNorm(n, 1e-6, **kw)(x).dtype
    assert normir.LayerNorm(n, **kw)(x).dtype == torch.nn.LayerNorm(n, **kw)(x).dtype
    assert normir.LayerNorm(n, elementwise_affine=False, **kw)(x).dtype == F32
    y, res = normir.FusedAddLayerNorm(n, **kw)(x, x)
    assert (y.dtype, res.dtype) == (F32, xdt)


@pytest.mark.parametrize("xdt, pdt", [(BF16, BF16), (BF16, F32), (F32, BF16)])
def test_autocast_leaves_swapped_hugging_face_norms_alone(fake, cuda_autocast, xdt, pdt):
    # Hugging Face's RMSNorms compute in fp32 and cast themselves: autocast does not change their
    # dtype, nor that of the SwappedRMSNorm replace_norms puts in their place.
    from test_swap_cpu import GemmaRMSNorm, LlamaRMSNorm

    x = fake((4, 256), xdt)
    for cls in (LlamaRMSNorm, GemmaRMSNorm):
        model = torch.nn.Sequential(cls(256, device="cuda", dtype=pdt))
        want = model(x).dtype
        normir.replace_norms(model, probe=False)
        assert type(model[0]).__name__ == "SwappedRMSNorm" and model(x).dtype == want, cls.__name__


def test_autocast_rmsnorm_before_torch_2_12(fake, cuda_autocast, monkeypatch):
    # Without an autocast rule for aten::rms_norm (torch 2.11 and earlier), RMSNorm's y keeps x's
    # dtype, as torch's rms_norm does there; LayerNorm's is float32 all the same.
    monkeypatch.setitem(_rows.AUTOCAST_FP32, "rmsnorm", False)
    x, w = fake((4, 256), BF16), fake((256,), F32)
    assert normir.rmsnorm(x, w).dtype == BF16 and normir.RMSNorm(256, device="cuda")(x).dtype == BF16
    assert normir.fused_add_rmsnorm(x, x, w)[0].dtype == BF16
    assert normir.layernorm(x, w, w).dtype == F32


def test_outside_autocast_nothing_changes(fake):
    x, w = fake((4, 256), BF16), fake((256,), F32)
    assert not torch.is_autocast_enabled()
    assert normir.rmsnorm(x, w).dtype == BF16 and normir.layernorm(x, w, w).dtype == BF16
    assert normir.RMSNorm(256, device="cuda")(x).dtype == BF16
