"""torch.compile over every public function, module and keyword family, on fake CUDA tensors (no
GPU). eps and weight_offset are compile-time constants of a kernel: a float given as an argument
specializes the graph (one graph per value, never an error), as a constant too; a change of rank
recompiles, and under dynamic=True the batch sizes (the leading dims) share one graph while N
specializes. A bad value raises the message the eager call gives. Dynamo traces the public
functions and AOTAutograd's inference path runs the custom ops' fake implementations; the
backward through a compiled graph needs a GPU (tests/test_gpu_integration.py runs Inductor end to
end, bitwise against eager)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import normir

pytestmark = pytest.mark.cpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
N = 64
# Two shapes per rank (2-D, 3-D, 4-D): the same graph for both under dynamic=True. No size is 1
# (Dynamo specializes sizes 0 and 1).
SHAPES = (((6, N), (10, N)), ((2, 3, N), (4, 5, N)), ((2, 2, 2, N), (3, 2, 4, N)))
FLOATS = ((1e-6, 0.5), (1e-5, 1.0))  # (eps, weight_offset) pairs: one graph for each


def _stats(x):
    return x.new_empty(x.shape[:-1], dtype=F32)


# Each form: f(x, r, w, b, dy, eps, offset) -> outputs. Every public function and keyword family:
# weight/bias present or None, residual, prenorm, residual_dtype, out_dtype, weight_offset, eps.
FORMS = {
    "rmsnorm": lambda x, r, w, b, dy, e, o: normir.rmsnorm(x, w, e),
    "rmsnorm no weight": lambda x, r, w, b, dy, e, o: normir.rmsnorm(x, None, e),
    "rmsnorm residual": lambda x, r, w, b, dy, e, o: normir.rmsnorm(x, w, e, residual=r),
    "rmsnorm residual prenorm": lambda x, r, w, b, dy, e, o: normir.rmsnorm(x, w, e, residual=r, prenorm=True),
    "rmsnorm prenorm no residual": lambda x, r, w, b, dy, e, o: normir.rmsnorm(x, w, e, prenorm=True),
    "rmsnorm bias": lambda x, r, w, b, dy, e, o: normir.rmsnorm(x, w, e, bias=b),
    "rmsnorm weight_offset": lambda x, r, w, b, dy, e, o: normir.rmsnorm(x, w, e, weight_offset=o),
    "rmsnorm residual_dtype": lambda x, r, w, b, dy, e, o: normir.rmsnorm(
        x, w, e, residual=r, prenorm=True, residual_dtype=F32),
    "rmsnorm out_dtype": lambda x, r, w, b, dy, e, o: normir.rmsnorm(x, w, e, out_dtype=F32),
    "rmsnorm everything": lambda x, r, w, b, dy, e, o: normir.rmsnorm(
        x, w, e, bias=b, residual=r, prenorm=True, residual_dtype=F32, out_dtype=F16, weight_offset=o),
    "fused_add_rmsnorm": lambda x, r, w, b, dy, e, o: normir.fused_add_rmsnorm(x, r, w, e),
    "fused_add_rmsnorm no prenorm": lambda x, r, w, b, dy, e, o: normir.fused_add_rmsnorm(
        x, r, w, e, prenorm=False, bias=b, weight_offset=o),
    "rmsnorm_fwd": lambda x, r, w, b, dy, e, o: normir.rmsnorm_fwd(x, w, e, store_rstd=True),
    "fused_add_rmsnorm_fwd": lambda x, r, w, b, dy, e, o: normir.fused_add_rmsnorm_fwd(
        x, r, w, e, bias=b, weight_offset=o, store_rstd=True),
    "layernorm": lambda x, r, w, b, dy, e, o: normir.layernorm(x, w, b, e),
    "layernorm plain": lambda x, r, w, b, dy, e, o: normir.layernorm(x, None, None, e),
    "layernorm residual prenorm": lambda x, r, w, b, dy, e, o: normir.layernorm(
        x, w, b, e, residual=r, prenorm=True, residual_dtype=F32),
    "layernorm out_dtype": lambda x, r, w, b, dy, e, o: normir.layernorm(x, w, None, e, out_dtype=F32),
    "fused_add_layernorm": lambda x, r, w, b, dy, e, o: normir.fused_add_layernorm(x, r, w, b, e),
    "fused_add_layernorm no prenorm": lambda x, r, w, b, dy, e, o: normir.fused_add_layernorm(
        x, r, None, b, e, prenorm=False),
    "layernorm_fwd": lambda x, r, w, b, dy, e, o: normir.layernorm_fwd(x, w, b, e, store_stats=True),
    "fused_add_layernorm_fwd": lambda x, r, w, b, dy, e, o: normir.fused_add_layernorm_fwd(
        x, r, w, b, e, store_stats=True),
    # The backwards, with dy in another dtype than the row (the dtype rule).
    "rmsnorm_bwd": lambda x, r, w, b, dy, e, o: normir.rmsnorm_bwd(x, w, dy, _stats(x)),
    "fused_add_rmsnorm_bwd": lambda x, r, w, b, dy, e, o: normir.fused_add_rmsnorm_bwd(
        dy, x, w, _stats(x), r, has_bias=True, weight_offset=o),
    "layernorm_bwd": lambda x, r, w, b, dy, e, o: normir.layernorm_bwd(x, w, dy, _stats(x), _stats(x), has_bias=True),
    "fused_add_layernorm_bwd": lambda x, r, w, b, dy, e, o: normir.fused_add_layernorm_bwd(
        dy, x, w, _stats(x), _stats(x), r, has_bias=True, dresidual_dtype=F32),
}
# Which forms read weight_offset (the others make one graph per eps alone).
TAKES_OFFSET = {"rmsnorm weight_offset", "rmsnorm everything", "fused_add_rmsnorm no prenorm", "fused_add_rmsnorm_fwd",
                "fused_add_rmsnorm_bwd"}
TAKES_EPS = {f for f in FORMS if not f.endswith("_bwd")}


@pytest.fixture
def fake():
    """make(shape, dtype): a fake CUDA tensor; the fake mode is entered and grad is off (the
    autograd engine wants a real CUDA device)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def make(shape, dtype=BF16):
        return FakeTensor(mode, torch.empty(shape, dtype=dtype, device="meta"), torch.device("cuda", 0))

    torch._dynamo.reset()
    with mode, torch.no_grad():
        yield make


def _args(make, shape):
    x, r = make(shape), make(shape, F32)
    return x, r, make((N,)), make((N,), F32), make(shape, F16)


def _graphs(counter: CompileCounterWithBackend) -> int:
    """Graphs compiled that hold a normir op (AOTAutograd's first use in a process compiles empty
    frames of its own, which the counter counts too)."""
    return sum("torch.ops.normir." in g.code for g in counter.graphs)


def _meta(out):
    outs = out if isinstance(out, tuple) else (out,)
    return [None if t is None else (tuple(t.shape), t.dtype) for t in
            (u for o in outs for u in (o if isinstance(o, tuple) else (o,)))]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_floats_as_arguments_specialize_batches_share(fake, form):
    f = FORMS[form]
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend=counter)
    for pair in SHAPES:
        for eps, offset in FLOATS:
            for shape in pair:
                args = _args(fake, shape)
                assert _meta(compiled(*args, eps, offset)) == _meta(f(*args, eps, offset)), (form, shape)
    floats = len(FLOATS) if form in TAKES_EPS | TAKES_OFFSET else 1
    assert _graphs(counter) == len(SHAPES) * floats


@pytest.mark.parametrize("dynamic", [False, None])
@pytest.mark.parametrize("form", ["rmsnorm residual", "rmsnorm weight_offset", "layernorm", "fused_add_layernorm_fwd"])
def test_floats_specialize_without_dynamic_shapes(fake, form, dynamic):
    # Under dynamic=False (and the default, static first) a new float recompiles too, and never fails.
    f = FORMS[form]
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic, backend=counter)
    args = _args(fake, (6, N))
    for eps, offset in (*FLOATS, FLOATS[0]):
        assert _meta(compiled(*args, eps, offset)) == _meta(f(*args, eps, offset))
    assert _graphs(counter) == len(FLOATS)


@pytest.mark.parametrize("form", ["rmsnorm everything", "layernorm residual prenorm"])
def test_floats_as_constants(fake, form):
    f = FORMS[form]

    def bound(eps, offset):  # the floats as the closure's constants, not arguments
        return lambda x, r, w, b, dy: f(x, r, w, b, dy, eps, offset)

    for eps, offset in FLOATS:
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(bound(eps, offset), fullgraph=True, dynamic=True, backend=counter)
        for shape in SHAPES[0]:
            args = _args(fake, shape)
            assert _meta(compiled(*args)) == _meta(f(*args, eps, offset))
        assert _graphs(counter) == 1


def test_n_specializes_under_dynamic_shapes(fake):
    # N is a kernel's compile-time constant: a new N is a new graph, a new batch size is not.
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda x, w: normir.rmsnorm(x, w), fullgraph=True, dynamic=True, backend=counter)
    for shape in ((4, 64), (8, 64), (4, 128), (8, 128)):
        compiled(fake(shape), fake(shape[-1:]))
    assert _graphs(counter) == 2


MODULES = {
    "RMSNorm": (lambda: normir.RMSNorm(N, device="cuda", dtype=BF16), False),
    "RMSNorm eps=None": (lambda: normir.RMSNorm(N, eps=None, device="cuda", dtype=BF16), False),
    "FusedAddRMSNorm": (lambda: normir.FusedAddRMSNorm(N, bias=True, residual_dtype=F32, weight_offset=1.0,
                                                       device="cuda", dtype=BF16), True),
    "LayerNorm": (lambda: normir.LayerNorm(N, device="cuda", dtype=BF16), False),
    "LayerNorm no affine": (lambda: normir.LayerNorm(N, elementwise_affine=False, device="cuda"), False),
    "FusedAddLayerNorm": (lambda: normir.FusedAddLayerNorm(N, residual_dtype=F32, device="cuda", dtype=BF16), True),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_compile_and_recompile_for_a_new_eps(fake, name):
    make_module, takes_residual = MODULES[name]
    module = make_module()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend=counter)
    for pair in SHAPES:
        for shape in pair:
            args = (fake(shape), fake(shape, F32)) if takes_residual else (fake(shape),)
            assert _meta(compiled(*args)) == _meta(module(*args))
    assert _graphs(counter) == len(SHAPES)
    module.eps = 1e-3  # an attribute the graph read: a guard, then one graph more
    compiled(*args)
    assert _graphs(counter) == len(SHAPES) + 1


# A bad float gives the eager call's message (the exception type may be Dynamo's under fullgraph).
BAD = [
    ("rmsnorm residual", float("nan"), 0.0),
    ("rmsnorm", -1.0, 0.0),
    ("layernorm", 0.0, 0.0),
    ("fused_add_layernorm_fwd", float("inf"), 0.0),
    ("rmsnorm weight_offset", 1e-6, float("inf")),
    ("fused_add_rmsnorm_bwd", 1e-6, float("nan")),
]


@pytest.mark.parametrize("form, eps, offset", BAD)
def test_bad_floats_raise_the_eager_message(fake, form, eps, offset):
    f = FORMS[form]
    args = _args(fake, (6, N))
    with pytest.raises((ValueError, TypeError)) as eager:
        f(*args, eps, offset)
    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    with pytest.raises(Exception) as traced:
        compiled(*args, eps, offset)
    assert str(eager.value) in str(traced.value)
