"""GPU tier: normir inside PyTorch's machinery on the H200. torch.compile(fullgraph=True) of every
op with a dynamic batch (one graph for batches 3, 5 and 9), outputs and gradients bitwise equal to
the eager launches; CUDA graphs (each op captured and replayed on new values, a training step
through make_graphed_callables, torch.compile's reduce-overhead mode, a kernel's first load inside
a capture in a fresh process); autocast against torch's own modules; the double backward's error
on every autograd path. Every specialization launched here is in
gpu_cases.integration_specializations() (one hidden size, N = INTEGRATION_N, bf16 unless said)."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import pytest
import torch
from gpu_cases import INTEGRATION_N as N
from gpu_helpers import TOL, make, rel_err
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import normir

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

BF16, F32 = torch.bfloat16, torch.float32

# Each op as (f(x, residual, weight, bias), takes a residual, a weight, a bias). RMSNorm's eps is
# 1e-6, LayerNorm's its default 1e-5 (the plan's).
OPS = {
    "rmsnorm": (lambda x, r, w, b: normir.rmsnorm(x, w, 1e-6), False, True, False),
    "rmsnorm_no_weight": (lambda x, r, w, b: normir.rmsnorm(x, None, 1e-6), False, False, False),
    "fused_add_rmsnorm": (lambda x, r, w, b: normir.fused_add_rmsnorm(x, r, w, 1e-6), True, True, False),
    "fused_add_rmsnorm_bias": (lambda x, r, w, b: normir.fused_add_rmsnorm(x, r, w, 1e-6, bias=b), True, True, True),
    "layernorm": (lambda x, r, w, b: normir.layernorm(x, w, b), False, True, True),
    "layernorm_plain": (lambda x, r, w, b: normir.layernorm(x), False, False, False),
    "fused_add_layernorm": (lambda x, r, w, b: normir.fused_add_layernorm(x, r, w, b), True, True, True),
}


def inputs(op: str, batch: int, grad: bool = True) -> tuple:
    """(x, residual, weight, bias) in bf16 for op, None where it takes none; x is (batch, N)."""
    _, residual, weight, bias = OPS[op]
    ts = (make((batch, N), BF16), make((batch, N), BF16) if residual else None,
          make((N,), BF16) + 1 if weight else None, make((N,), BF16, 0.5) if bias else None)
    return tuple(t.requires_grad_(True) if t is not None and grad else t for t in ts)


def fresh(ts: tuple) -> tuple:
    """The same values as new leaves that require grad."""
    return tuple(t.detach().clone().requires_grad_(True) if t is not None else None for t in ts)


def as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def run(f, ts: tuple, dys=None):
    """f's outputs, the output gradients (drawn when None) and the gradients of the inputs."""
    outs = as_tuple(f(*ts))
    if dys is None:
        dys = [make(o.shape, o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, [t for t in ts if t is not None], dys)
    return [o.detach() for o in outs], dys, list(grads)


# ---------------------------------------------------------------------------- torch.compile


@pytest.mark.parametrize("op", sorted(OPS))
def test_compile_one_graph_for_every_batch_bitwise_equal(op):
    # fullgraph=True fails on any graph break; the batch dimension is symbolic from the first call
    # (mark_dynamic: an error if anything specializes it) and a recompile is an error.
    f = OPS[op][0]
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(f, fullgraph=True, backend=counter)
    for batch in (3, 5, 9):
        ts = inputs(op, batch)
        outs, dys, grads = run(f, ts)  # eager: the direct launches
        tc = fresh(ts)
        for t in tc[:2]:  # x and residual
            if t is not None:
                torch._dynamo.mark_dynamic(t, 0)
        with torch._dynamo.config.patch(error_on_recompile=True):
            outs_c, _, grads_c = run(compiled, tc, dys)
        for e, c in zip(outs + grads, outs_c + grads_c):
            assert e.dtype == c.dtype and torch.equal(e, c), op
    assert counter.frame_count == 1


# ---------------------------------------------------------------------------- CUDA graphs


@pytest.mark.parametrize("op", ["fused_add_layernorm", "fused_add_rmsnorm", "layernorm", "rmsnorm"])
def test_cuda_graph_replays_on_new_inputs(op):
    f = OPS[op][0]
    static = inputs(op, 16, grad=False)
    f(*static)  # the warm-up torch.cuda.graph's documentation asks for (the first load is tested below)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = as_tuple(f(*static))
    for _ in range(2):
        new = inputs(op, 16, grad=False)
        for s, t in zip(static, new):
            if s is not None:
                s.copy_(t)
        graph.replay()
        want = as_tuple(f(*new))  # an eager call on the new values
        for o, e in zip(outs, want):
            assert torch.equal(o, e), op


class Block(torch.nn.Module):
    """normir's three modules in a pre-norm step: y, residual_out = FusedAddRMSNorm(RMSNorm(x), x),
    then LayerNorm(y); only normir's kernels, so that every path computes bitwise the same."""

    def __init__(self):
        super().__init__()
        kw = dict(device="cuda", dtype=BF16)
        self.rms = normir.RMSNorm(N, eps=1e-6, **kw)
        self.add = normir.FusedAddRMSNorm(N, eps=1e-6, **kw)
        self.ln = normir.LayerNorm(N, **kw)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(torch.randn_like(p) * 0.1)

    def forward(self, x):
        y, residual = self.add(self.rms(x), x)
        return self.ln(y), residual


def step(module, params, x, dys) -> list[torch.Tensor]:
    """One training step's outputs and gradients (x's, then the parameters'), copied."""
    for p in params:
        p.grad = None
    xi = x.clone().requires_grad_(True)
    outs = module(xi)
    torch.autograd.backward(outs, dys)
    return [o.detach().clone() for o in outs] + [xi.grad.clone()] + [p.grad.clone() for p in params]


def test_make_graphed_callables_training_step():
    torch.manual_seed(0)
    block = Block()
    eager = copy.deepcopy(block)
    graphed = torch.cuda.make_graphed_callables(block, (make((16, N), BF16).requires_grad_(True),))
    for _ in range(3):
        x, dys = make((16, N), BF16), (make((16, N), BF16), make((16, N), BF16))
        got = step(graphed, list(block.parameters()), x, dys)
        want = step(eager, list(eager.parameters()), x, dys)
        for g, w in zip(got, want):
            assert torch.equal(g, w)


def test_compile_reduce_overhead_matches_eager():
    torch.manual_seed(0)
    torch._dynamo.reset()
    counters.clear()
    block = Block()
    eager = copy.deepcopy(block)
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # warm-up, recording, then replays of the CUDA graphs
        torch.compiler.cudagraph_mark_step_begin()
        x, dys = make((16, N), BF16), (make((16, N), BF16), make((16, N), BF16))
        got = step(compiled, list(block.parameters()), x, dys)
        want = step(eager, list(eager.parameters()), x, dys)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


FIRST_CALL = """
import torch
import normir

x = torch.randn(8, {n}, device="cuda", dtype=torch.bfloat16)
w = torch.randn({n}, device="cuda", dtype=torch.bfloat16)
rmsnorm = normir.rmsnorm  # binds the API; no kernel is loaded yet
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):  # capture_error_mode "global", the default and the strictest
    y = rmsnorm(x, w, 1e-6)  # the first call: loads the kernel inside the capture
x.copy_(torch.randn_like(x))
graph.replay()
torch.cuda.synchronize()
assert torch.equal(y, rmsnorm(x, w, 1e-6)), "the replay differs from an eager call"
print("captured and replayed")
"""


def test_first_kernel_load_inside_a_capture():
    # In a fresh process, so that the captured call is the kernel's first use: it works (the load
    # runs with the thread's capture mode relaxed), or the error says how to fix it.
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(FIRST_CALL).format(n=N)], capture_output=True,
                       text=True, timeout=300)
    if r.returncode == 0:
        assert "captured and replayed" in r.stdout
    else:
        assert "run the call once before capturing" in r.stderr, r.stderr[-4000:]


# ---------------------------------------------------------------------------- autocast


@pytest.mark.parametrize("xdt, pdt", [(F32, F32), (BF16, BF16), (BF16, F32)])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_autocast_matches_torch_modules(norm, xdt, pdt):
    # Under torch.autocast("cuda", bf16): y in torch's module's dtype (LayerNorm: fp32; RMSNorm:
    # fp32 from torch 2.12, x's before), values within x's tolerance, gradients in each input's dtype.
    kw = dict(device="cuda", dtype=pdt)
    if norm == "rmsnorm":
        theirs, ours = torch.nn.RMSNorm(N, eps=1e-6, **kw), normir.RMSNorm(N, eps=1e-6, **kw)
    else:
        theirs, ours = torch.nn.LayerNorm(N, **kw), normir.LayerNorm(N, **kw)
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours.load_state_dict(theirs.state_dict())
    x = make((7, N), xdt)
    results = []
    for m in (theirs, ours):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=BF16):
            y = m(xi)
        if not results:
            dy = make(y.shape, y.dtype)
        y.backward(dy.to(y.dtype))
        results.append([y.detach(), xi.grad] + [p.grad for p in m.parameters()])
    tol = max(TOL[xdt], TOL[pdt])
    for t, o in zip(*results):
        assert o.dtype == t.dtype and o.shape == t.shape
        assert rel_err(o, t) <= tol, (norm, xdt, pdt, rel_err(o, t))


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_autocast_fused_add_matches_torch(norm):
    # The fused add under autocast: y in the dtype of torch's norm of h = x + residual there;
    # residual_out stays in the residual's dtype.
    x, r, w, b = make((7, N), BF16), make((7, N), BF16), make((N,), BF16) + 1, make((N,), BF16, 0.5)
    with torch.no_grad(), torch.autocast("cuda", dtype=BF16):
        if norm == "rmsnorm":
            y, h = normir.fused_add_rmsnorm(x, r, w, 1e-6)
            want = torch.rms_norm(x + r, (N,), w, 1e-6)
        else:
            y, h = normir.fused_add_layernorm(x, r, w, b)
            want = torch.nn.functional.layer_norm(x + r, (N,), w, b)
    assert y.dtype == want.dtype and h.dtype == BF16
    assert rel_err(h, x + r) <= TOL[BF16] and rel_err(y, want) <= TOL[BF16]


# ---------------------------------------------------------------------------- double backward

# Each autograd path: the eager Functions (RMSNormFunction; FusedNormFunction with both kernels)
# and the custom ops called directly (their registered autograd, what torch.compile traces).
DOUBLE = {
    "rmsnorm": OPS["rmsnorm"][0],
    "fused_add_rmsnorm": lambda x, r, w, b: normir.fused_add_rmsnorm(x, r, w, 1e-6)[0],
    "layernorm": OPS["layernorm"][0],
    "fused_add_layernorm": lambda x, r, w, b: normir.fused_add_layernorm(x, r, w, b)[0],
    "rmsnorm_fwd op": lambda x, r, w, b: torch.ops.normir.rmsnorm_fwd(x, w, 1e-6, True)[0],
    "fused_add_rmsnorm_fwd op": lambda x, r, w, b: torch.ops.normir.fused_add_rmsnorm_fwd(
        x, r, w, None, 1e-6, None, None, 0.0, True, True)[0],
    "layernorm_fwd op": lambda x, r, w, b: torch.ops.normir.layernorm_fwd(x, None, w, b, 1e-5, None, None, True,
                                                                          False)[0],
}


@pytest.mark.parametrize("path", sorted(DOUBLE))
def test_double_backward_raises_naming_the_fix(path):
    f = DOUBLE[path]
    ts = inputs("fused_add_layernorm", 4)
    x, _, w, _ = ts
    first = torch.autograd.grad(f(*ts).sum(), (x, w))
    grads = torch.autograd.grad(f(*ts).sum(), (x, w), create_graph=True)  # the same first derivatives
    for g, e in zip(grads, first):
        assert torch.equal(g.detach(), e)
    with pytest.raises(RuntimeError, match=r"has no double backward: .* use torch's own torch\.nn\.functional\."):
        (grads[0].float().pow(2).sum() + grads[1].float().pow(2).sum()).backward()


def test_double_backward_compiled_raises():
    # torch.compile's own autograd (AOTAutograd) refuses a double backward before normir's is reached.
    torch._dynamo.reset()
    f = torch.compile(OPS["rmsnorm"][0], fullgraph=True)
    ts = inputs("rmsnorm", 4)
    x, _, w, _ = ts
    with pytest.raises(RuntimeError, match="double backward"):
        grads = torch.autograd.grad(f(*ts).sum(), (x, w), create_graph=True)
        (grads[0].float().pow(2).sum() + grads[1].float().pow(2).sum()).backward()
