"""normir on torch.distributed without a GPU: the sharding rules of every custom op on DTensors (each
op and input placement, a 2-D mesh, a shard of the normalized dim redistributed), the messages of
the checks for DTensor, meta and fake inputs, and normir's modules under FSDP2 (fully_shard, with
torch.compile and activation checkpointing), tensor and sequence parallelism, and DDP.

Launches are emulated on the CPU (cpu_emulation.py). A fake process group (torch's "fake"
backend) holds no other rank's data: each rank's local outputs are computed in turn, one fake group
per rank, and checked against the plain call on the whole tensors (rows on that rank's shard,
column sums added over the ranks); what needs another rank's data (a redistribution, FSDP2's
all-gathers) is checked in placements and shapes, and in values at world size 1 on a real gloo
group. tests/test_gpu_distributed.py runs the same on the GPU."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

import normir
from normir.ops import _rows
from normir.ops.distributed import SequenceParallel

pytestmark = [pytest.mark.cpu, pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is absent")]

F32, BF16 = torch.float32, torch.bfloat16
N = 16
SHAPE = (4, 6, N)  # leading sizes divisible by every mesh size here: torch.chunk gives DTensor's shards


@contextmanager
def group(world: int, rank: int = 0, backend: str = "fake"):
    """A process group of `world` ranks seen from `rank` ("fake": no data moves; "gloo" at world
    size 1: a real one), destroyed after the block."""
    store = FakeStore() if backend == "fake" else dist.HashStore()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- the ops' rules

# What each argument is: a row tensor (or a per-row statistic), or per-column (weight, bias).
COLUMNS, STATS = ("weight", "bias"), ("rstd", "mean")
LEAD, SUM, ABSENT = "lead", "sum", "absent"


def tensors(seed=0, shape=SHAPE, dtype=F32, device="cpu"):
    """x, residual, dy, d_residual_out (rows), weight, bias in dtype; rstd and mean in float32."""
    gen = torch.Generator().manual_seed(seed)
    x, r, dy, g = (torch.randn(shape, generator=gen) for _ in range(4))
    w, b = torch.randn(shape[-1], generator=gen) + 1, torch.randn(shape[-1], generator=gen)
    rstd, mean = torch.rand(shape[:-1], generator=gen) + 0.5, torch.randn(shape[:-1], generator=gen)
    return (*(t.to(device, dtype) for t in (x, r, dy, g, w, b)), rstd.to(device), mean.to(device))


OTHER = {F32: BF16, BF16: F32}  # dresidual in another dtype than dx (residual_out's)
# op, its arguments from tensors()' (x, r, dy, g, w, b, rstd, mean), and what each output is
# (tests/test_gpu_distributed.py runs the same, in bf16 and fp32: gpu_cases.distributed_specializations()).
CASES = {
    "rmsnorm_fwd": ("rmsnorm_fwd", lambda x, r, dy, g, w, b, rs, m: (x, w, 1e-6, True), (LEAD, LEAD)),
    "rmsnorm_fwd no rstd": ("rmsnorm_fwd", lambda x, r, dy, g, w, b, rs, m: (x, w, 1e-6, False), (LEAD, ABSENT)),
    "rmsnorm_bwd": ("rmsnorm_bwd", lambda x, r, dy, g, w, b, rs, m: (x, w, dy, rs, False), (LEAD, SUM)),
    "rmsnorm_bwd no weight": ("rmsnorm_bwd", lambda x, r, dy, g, w, b, rs, m: (x, None, dy, rs, False),
                              (LEAD, ABSENT)),
    "fused_add_rmsnorm_fwd": ("fused_add_rmsnorm_fwd", lambda x, r, dy, g, w, b, rs, m: (
        x, r, w, b, 1e-6, None, None, 0.5, True, True), (LEAD, LEAD, LEAD)),
    "fused_add_rmsnorm_fwd inference": ("fused_add_rmsnorm_fwd", lambda x, r, dy, g, w, b, rs, m: (
        x, r, w, None, 1e-6, BF16, None, 0.0, False, False), (LEAD, ABSENT, ABSENT)),
    "fused_add_rmsnorm_bwd": ("fused_add_rmsnorm_bwd", lambda x, r, dy, g, w, b, rs, m: (
        dy, x, w, rs, g, F32, 0.5, None, None), (LEAD, ABSENT, SUM, SUM)),
    "fused_add_rmsnorm_bwd two dtypes": ("fused_add_rmsnorm_bwd", lambda x, r, dy, g, w, b, rs, m: (
        dy, x, w, rs, None, None, 0.0, None, OTHER[x.dtype]), (LEAD, LEAD, SUM, ABSENT)),
    "layernorm_fwd": ("layernorm_fwd", lambda x, r, dy, g, w, b, rs, m: (
        x, r, w, b, 1e-5, None, None, True, True), (LEAD, LEAD, LEAD, LEAD)),
    "layernorm_fwd no residual": ("layernorm_fwd", lambda x, r, dy, g, w, b, rs, m: (
        x, None, None, b, 1e-5, None, BF16, False, True), (LEAD, ABSENT, ABSENT, ABSENT)),
    "layernorm_bwd": ("layernorm_bwd", lambda x, r, dy, g, w, b, rs, m: (
        dy, x, w, m, rs, g, F32, None, None), (LEAD, ABSENT, SUM, SUM)),
    "layernorm_bwd no weight": ("layernorm_bwd", lambda x, r, dy, g, w, b, rs, m: (
        dy, x, None, m, rs, None, None, None, None), (LEAD, ABSENT, ABSENT, ABSENT)),
}


def op_of(name):
    return getattr(torch.ops.normir, name).default


def shard_of(t: torch.Tensor, mesh, placements, coord=None) -> torch.Tensor:
    """The shard of a whole tensor t under placements (evenly divisible sizes) at a mesh
    coordinate (default: this rank's)."""
    coord = coord or mesh.get_coordinate()
    for k, p in enumerate(placements):
        if isinstance(p, Shard):
            t = t.chunk(mesh.shape[k], p.dim)[coord[k]]
    return t


def distribute(op_name, args, mesh, placements, stats=None):
    """The op's tensor arguments as DTensors: rows and statistics with `placements` (a shard of a
    leading dim means the same rows for both; stats: the statistics' own), weight and bias
    replicated."""
    names = [a.name for a in op_of(op_name)._schema.arguments]
    out = []
    for name, a in zip(names, args):
        if isinstance(a, torch.Tensor):
            pl = [Replicate()] * mesh.ndim if name in COLUMNS else stats if stats and name in STATS else placements
            a = DTensor.from_local(shard_of(a, mesh, pl), mesh, pl, run_check=False)
        out.append(a)
    return out


def expected(kind, placements):
    if kind == ABSENT:
        return (Replicate(),) * len(placements)
    if kind == SUM:
        return tuple(Partial() if isinstance(p, Shard) else Replicate() for p in placements)
    return tuple(placements)


def _ranks(world: int, mesh_shape: tuple[int, ...], op_name, args, placements):
    """Each rank's (mesh coordinate, outputs) for the op on DTensors of the whole args, and the
    mesh (its shape: the group behind it is gone)."""
    runs = []
    for rank in range(world):
        with group(world, rank):
            mesh = init_device_mesh("cpu", mesh_shape)
            outs = op_of(op_name)(*distribute(op_name, args, mesh, placements))
            runs.append((mesh.get_coordinate(), outs))
    return runs, mesh


LEADING = ([Shard(0)], [Shard(1)], [Replicate()])  # of a 3-D x: batch, sequence, neither
MESH_2D = ([Shard(0), Shard(1)], [Shard(1), Replicate()], [Replicate(), Shard(0)], [Shard(0), Shard(0)])


@pytest.mark.parametrize("placements", LEADING + MESH_2D, ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_rules_run_each_shard_locally(cpu_launches, case, placements):
    op_name, make, kinds = CASES[case]
    args = make(*tensors())
    want = op_of(op_name)(*args)  # the plain call on the whole tensors
    mesh_shape = (2,) * len(placements)
    runs, mesh = _ranks(2 ** len(placements), mesh_shape, op_name, args, placements)
    for i, kind in enumerate(kinds):
        sums = torch.zeros_like(want[i])
        for coord, outs in runs:
            out = outs[i]
            assert isinstance(out, DTensor) and out.placements == expected(kind, placements), (case, i)
            assert (out.shape, out.dtype) == (want[i].shape, want[i].dtype), (case, i)
            if kind == LEAD:  # this rank's rows, bitwise
                assert torch.equal(out.to_local(), shard_of(want[i], mesh, placements, coord)), (case, i)
            elif kind == ABSENT:
                assert out.to_local().shape == (0,)
            elif all(coord[k] == 0 for k, p in enumerate(placements) if not isinstance(p, Shard)):
                sums += out.to_local()  # one replica of each partial sum
        if kind == SUM:
            assert torch.allclose(sums, want[i], rtol=1e-5, atol=1e-5), case


@pytest.mark.parametrize("case", ["rmsnorm_fwd", "fused_add_rmsnorm_bwd", "layernorm_fwd", "layernorm_bwd"])
def test_shard_of_the_normalized_dim_is_redistributed(cpu_launches, case):
    # As torch's own norms: no rule shards the last dim, so DTensor redistributes the input first
    # (the values need other ranks' data: placements and shapes only), to what torch's layer_norm
    # redistributes the same input to.
    op_name, make, kinds = CASES[case]
    args = make(*tensors())
    want = op_of(op_name)(*args)
    with group(2):
        mesh = init_device_mesh("cpu", (2,))
        dts = distribute(op_name, args, mesh, [Shard(2)], stats=[Replicate()])
        outs = op_of(op_name)(*dts)
        x = next(t for t in dts if isinstance(t, DTensor))
        torch_ln = torch.nn.functional.layer_norm(x, (N,))
    assert torch_ln.placements != (Shard(2),)
    for out, w, kind in zip(outs, want, kinds):
        assert out.shape == w.shape
        if kind == LEAD:
            assert out.placements == torch_ln.placements, case


def test_rules_follow_every_flag_of_a_call(cpu_launches):
    # DTensor caches a sharding decision per call signature: store_rstd (rmsnorm_fwd's only
    # non-tensor argument that decides a shape) is part of it, so rstd is x's rows or a placeholder.
    x, _, _, _, w, *_ = tensors()
    with group(2):
        mesh = init_device_mesh("cpu", (2,))
        xd, wd = distribute("rmsnorm_fwd", (x, w), mesh, [Shard(0)])[:2]
        for store in (True, False, True, False):
            _, rstd = torch.ops.normir.rmsnorm_fwd(xd, wd, 1e-6, store)
            assert (rstd.shape, rstd.placements) == ((SHAPE[:-1], (Shard(0),)) if store else ((0,), (Replicate(),)))
            assert rstd.to_local().shape == ((2, 6) if store else (0,))


@pytest.mark.parametrize("placements", ([Shard(1)], [Shard(0), Shard(1)]), ids=str)
def test_autograd_through_dtensors(cpu_launches, placements):
    # The public functions on DTensors: the forward and the backward ops each run on the shards;
    # x's gradient follows x, the weight's and bias's are partial sums (DTensor adds them up).
    x, r, dy, _, w, b, *_ = tensors()
    world = 2 ** len(placements)
    grads = []
    for rank in range(world):
        with group(world, rank):
            mesh = init_device_mesh("cpu", (2,) * len(placements))
            xd, rd = (DTensor.from_local(shard_of(t, mesh, placements), mesh, placements).requires_grad_(True)
                      for t in (x, r))
            wd, bd = (torch.nn.Parameter(DTensor.from_local(t, mesh, [Replicate()] * len(placements))) for t in (w, b))
            y, h = normir.fused_add_layernorm(xd, rd, wd, bd)
            z = normir.rmsnorm(y, wd)
            assert z.placements == h.placements == tuple(placements)
            torch.autograd.backward((z, h), (DTensor.from_local(shard_of(dy, mesh, placements), mesh, placements),) * 2)
            assert xd.grad.placements == tuple(placements)
            assert wd.grad.placements == bd.grad.placements == expected(SUM, placements)
            grads.append((mesh.get_coordinate(), xd.grad.to_local(), wd.grad.to_local()))
    xw, rw, wl, bl = (t.clone().requires_grad_(True) for t in (x, r, w, b))
    y, h = normir.fused_add_layernorm(xw, rw, wl, bl)
    torch.autograd.backward((normir.rmsnorm(y, wl), h), (dy, dy))
    for coord, gx, _ in grads:
        assert torch.allclose(gx, shard_of(xw.grad, mesh, placements, coord), rtol=1e-5, atol=1e-5)
    assert torch.allclose(sum(g for _, _, g in grads), wl.grad, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- messages


def test_dtensor_on_a_cpu_mesh_names_the_mesh():
    x, _, _, _, w, *_ = tensors()
    with group(2):
        mesh = init_device_mesh("cpu", (2,))
        xd, wd = DTensor.from_local(x, mesh, [Shard(0)]), DTensor.from_local(w, mesh, [Replicate()])
        for f in (lambda: normir.rmsnorm(xd, wd), lambda: normir.fused_add_rmsnorm(xd, xd, wd),
                  lambda: normir.layernorm(xd, wd, wd), lambda: normir.rmsnorm_bwd(xd, wd, xd, xd[..., 0])):
            with pytest.raises(ValueError, match=r"^x is a DTensor on a cpu device mesh; normir runs on GPUs: make the "
                                                 r"mesh on them \(init_device_mesh\(\"cuda\""):
                f()


def test_mixed_dtensor_and_tensor_arguments_name_the_fix(monkeypatch):
    monkeypatch.setattr(_rows, "on_gpu", lambda t: True)  # CPU tensors reach the checks past the device's
    x, _, _, _, w, *_ = tensors()
    with group(2):
        mesh = init_device_mesh("cpu", (2,))
        xd, wd = DTensor.from_local(x, mesh, [Shard(0)]), DTensor.from_local(w, mesh, [Replicate()])
        with pytest.raises(ValueError, match=r"^weight is a torch\.Tensor but x is a DTensor: pass both as DTensors"):
            normir.rmsnorm(xd, w)
        with pytest.raises(ValueError, match=r"^residual is a torch\.Tensor but x is a DTensor"):
            normir.fused_add_rmsnorm(xd, x, wd)
        for f in (lambda: normir.layernorm(x, wd, None), lambda: normir.rmsnorm(x, wd)):
            # The eager path: its launch would read the DTensor's wrapper, which has no data.
            with pytest.raises(ValueError, match=r"^weight is a DTensor but x is a torch\.Tensor: .*SequenceParallel"):
                f()
        with pytest.raises(ValueError, match=r"^rstd is a torch\.Tensor but x is a DTensor"):
            normir.rmsnorm_bwd(xd, wd, xd, x[..., 0])


def test_meta_tensors_name_the_meta_device():
    x = torch.empty(4, N, device="meta")
    for f in (lambda: normir.rmsnorm(x), lambda: normir.RMSNorm(N, device="meta")(x),
              lambda: normir.fused_add_layernorm(x, x, None, None)):
        with pytest.raises(ValueError, match=r"^x is on the meta device \(a shape without data\); .*to_empty"):
            f()


def test_plain_cpu_tensors_keep_their_message():
    x = torch.randn(4, N)
    with pytest.raises(ValueError, match=r"^x is on cpu; normir runs on GPUs: move it with x\.cuda\(\)$"):
        normir.rmsnorm(x)


def test_fake_implementations_leave_the_device_to_the_callers():
    # DTensor's sharding propagation runs an op's fake implementation on fake tensors of its own
    # (in torch 2.11 without a device: CPU ones, for DTensors on GPUs). The fake implementations
    # check everything else; the public functions check the device on what they are given.
    with FakeTensorMode():
        x = torch.empty(4, 6, N)
        y, rstd = torch.ops.normir.rmsnorm_fwd(x, None, 1e-6, True)
        assert isinstance(y, FakeTensor) and rstd.shape == (4, 6)
        assert torch.ops.normir.layernorm_bwd(x, x, None, rstd, rstd, None, F32, None, None)[3].shape == (N,)
        with pytest.raises(ValueError, match=r"^x\.shape\[-1\] = 0 is out of range"):
            torch.ops.normir.rmsnorm_fwd(torch.empty(4, 0), None, 1e-6, True)
        with pytest.raises(ValueError, match=r"^x is on cpu; normir runs on GPUs"):
            normir.rmsnorm(x)
        with pytest.raises(ValueError, match=r"^x is on cpu; normir runs on GPUs"):
            normir.fused_add_rmsnorm_fwd(x, x, None)


def test_gpu_dtensors_with_device_less_fakes(cpu_launches, monkeypatch):
    # torch 2.11's case on the GPU: the DTensors (here: every real tensor) pass the GPU test, the
    # fake tensors the propagation makes do not; every op still runs on the shards.
    monkeypatch.setattr(_rows, "on_gpu", lambda t: not isinstance(t, FakeTensor))
    x, r, dy, _, w, b, *_ = tensors()
    with group(2):
        mesh = init_device_mesh("cpu", (2,))
        xd, rd = (DTensor.from_local(t, mesh, [Shard(1)]).requires_grad_(True) for t in (x, r))
        wd = DTensor.from_local(w, mesh, [Replicate()]).requires_grad_(True)
        y, h = normir.fused_add_rmsnorm(xd, rd, wd)
        torch.autograd.backward((normir.layernorm(y, wd, wd), h), (DTensor.from_local(dy, mesh, [Shard(1)]),) * 2)
        assert xd.grad.placements == (Shard(1),) and wd.grad.placements == (Partial(),)


# ---------------------------------------------------------------------------- import


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("order", ["import normir, torch, torch.distributed.tensor",
                                   "import torch.distributed.tensor, normir",
                                   "import normir; normir.rmsnorm; import torch.distributed.fsdp"])
def test_rules_registered_once_dtensor_is_imported(order):
    # `import normir` leaves torch.distributed.tensor alone (half a second); the program's own
    # import of it (or of what imports it) registers every op's rule.
    code = ("import sys, torch, normir\nassert 'torch.distributed.tensor' not in sys.modules\n"
            "assert 'normir.ops.distributed' not in sys.modules\n") if order.startswith("import normir,") else ""
    code += (f"{order}\nimport torch\nfrom torch.distributed.tensor import DTensor\n"
             "funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
             "ops = [getattr(torch.ops.normir, n).default for n in ('rmsnorm_fwd', 'rmsnorm_bwd', "
             "'fused_add_rmsnorm_fwd', 'fused_add_rmsnorm_bwd', 'layernorm_fwd', 'layernorm_bwd')]\n"
             "assert all(op in funcs for op in ops), [op for op in ops if op not in funcs]\nprint('ok')")
    r = _fresh(code)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr[-3000:]


# ---------------------------------------------------------------------------- FSDP2, TP + SP, DDP


class Block(torch.nn.Module):
    """A pre-norm block with each of normir's modules: RMSNorm before a linear layer (the
    attention's stand-in), the fused add after it, LayerNorm before another (the MLP's) and the
    fused-add LayerNorm after that. Tensor parallelism shards the linear layers' features."""

    def __init__(self, n: int = N, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.attn_norm, self.attn = normir.RMSNorm(n), torch.nn.Linear(n, n)
        self.attn_add = normir.FusedAddRMSNorm(n, bias=True)
        self.mlp_norm, self.mlp = normir.LayerNorm(n), torch.nn.Linear(n, n)
        self.mlp_add = normir.FusedAddLayerNorm(n)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(torch.randn_like(p) * 0.1)

    def forward(self, h):
        x, h = self.attn_add(self.attn(self.attn_norm(h)), h)
        y, h = self.mlp_add(self.mlp(self.mlp_norm(x)), h)
        return y + h


class Checkpointed(torch.nn.Module):
    """Activation checkpointing: the module's activations recomputed in the backward."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, h):
        return torch.utils.checkpoint.checkpoint(self.module, h, use_reentrant=False)


def whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _step(module, x, dy):
    """Output, x's gradient and the parameters' (whole tensors), of one forward and backward."""
    xi = x.clone().requires_grad_(True)
    y = whole(module(xi))
    y.backward(dy)
    return [y.detach(), whole(xi.grad)] + [whole(p.grad) for p in module.parameters()]


def _same(got, want, exact=True):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(g, w) if exact else torch.allclose(g, w, rtol=1e-5, atol=1e-5), (g - w).abs().max()


FSDP_VARIANTS = {"eager": (False, False), "compiled": (True, False), "checkpointed": (False, True),
                 "compiled and checkpointed": (True, True)}


def _fsdp2(block, mesh, compiled, checkpointed):
    from torch.distributed.fsdp import fully_shard

    module = Checkpointed(block) if checkpointed else block
    fully_shard(module, mesh=mesh)
    return torch.compile(module, backend="aot_eager") if compiled else module


@pytest.mark.parametrize("variant", sorted(FSDP_VARIANTS))
def test_fsdp2_matches_the_plain_block(cpu_launches, variant):
    # World size 1 on a real gloo group: the all-gathers and reduce-scatters move real data.
    x, _, dy, *_ = tensors()
    want = _step(Block(), x, dy)
    torch._dynamo.reset()
    with group(1, backend="gloo"):
        module = _fsdp2(Block(), init_device_mesh("cpu", (1,)), *FSDP_VARIANTS[variant])
        _same(_step(module, x, dy), want, exact=not FSDP_VARIANTS[variant][0])


@pytest.mark.parametrize("variant", sorted(FSDP_VARIANTS))
def test_fsdp2_shards_normir_parameters(cpu_launches, variant):
    # World size 2 on a fake group: each parameter (the norms' weights and biases too) is a
    # Shard(0) DTensor between steps, its gradient too (values need the other rank: shapes only).
    x, _, dy, *_ = tensors()
    torch._dynamo.reset()
    with group(2):
        block = Block()
        module = _fsdp2(block, init_device_mesh("cpu", (2,)), *FSDP_VARIANTS[variant])
        y = module(x.clone().requires_grad_(True))
        y.backward(dy)
        assert y.shape == SHAPE
        for name, p in block.named_parameters():
            assert isinstance(p, DTensor) and p.placements == (Shard(0),), name
            assert p.grad.placements == (Shard(0),) and p.grad.to_local().shape == (p.shape[0] // 2, *p.shape[1:])


def tp_plan(style=SequenceParallel):
    """Sequence parallelism on the norms (their rows sharded on the sequence, dim 1); the linear
    layers gather the rows, split the features (column-wise) and scatter back (row-wise)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    seq = Shard(1)
    return {"attn_norm": style(), "attn_add": SequenceParallel(), "mlp_norm": style(), "mlp_add": SequenceParallel(),
            "attn": ColwiseParallel(input_layouts=seq, output_layouts=seq, use_local_output=False),
            "mlp": RowwiseParallel(input_layouts=seq, output_layouts=seq, use_local_output=False)}


@pytest.mark.parametrize("torch_style", [False, True], ids=["normir's SequenceParallel", "torch's on RMSNorm, LayerNorm"])
def test_tensor_and_sequence_parallel_match_the_plain_block(cpu_launches, torch_style):
    from torch.distributed.tensor.parallel import SequenceParallel as TorchSP
    from torch.distributed.tensor.parallel import parallelize_module

    x, _, dy, *_ = tensors()
    want = _step(Block(), x, dy)
    with group(1, backend="gloo"):
        mesh = init_device_mesh("cpu", (1,))
        module = parallelize_module(Block(), mesh, tp_plan(TorchSP if torch_style else SequenceParallel))
        _same(_step(module, x, dy), want, exact=False)  # DTensor's matmuls: the same math, not the same code


def test_sequence_parallel_shards_both_inputs_of_the_fused_adds(cpu_launches):
    from torch.distributed.tensor.parallel import SequenceParallel as TorchSP
    from torch.distributed.tensor.parallel import parallelize_module

    x, _, dy, *_ = tensors()
    with group(2):
        mesh = init_device_mesh("cpu", (2,))
        block = parallelize_module(Block(), mesh, tp_plan())
        y = block(x)  # each rank's 6 positions of 12
        assert y.placements == (Shard(1),) and y.shape == (4, 12, N)
        y.backward(DTensor.from_local(dy, mesh, [Shard(1)]))
        for name in ("attn_norm", "attn_add", "mlp_norm", "mlp_add"):
            for p in getattr(block, name).parameters():  # replicated, their gradients summed by DTensor
                assert p.placements == (Replicate(),) and p.grad.placements == (Partial(),), name
        add = normir.FusedAddRMSNorm(N)
        parallelize_module(add, mesh, SequenceParallel(use_local_output=True))
        out = add(x, x)
        assert all(type(t) is torch.Tensor and t.shape == SHAPE for t in out)
        # torch's own style passes the first input alone: the residual is dropped.
        parallelize_module(add := normir.FusedAddRMSNorm(N), mesh, TorchSP())
        with pytest.raises(TypeError, match="residual"):
            add(x, x)


def test_fsdp2_over_tensor_parallel_on_a_2d_mesh(cpu_launches):
    # DP x TP (2 x 2, fake group): FSDP2 shards over dp what TP+SP laid out over tp; the norms'
    # parameters are dp shards of tp replicas, their gradients reduced to the same (TP's partial
    # sums added up by FSDP2).
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    x, _, dy, *_ = tensors()
    with group(4):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        block = parallelize_module(Block(), mesh["tp"], tp_plan())
        fully_shard(block, mesh=mesh["dp"])
        y = block(x)
        assert y.placements == (Shard(1),) and y.shape == (4, 12, N)
        y.backward(DTensor.from_local(dy, mesh["tp"], [Shard(1)]))
        for name in ("attn_norm", "attn_add", "mlp_norm", "mlp_add"):
            for p in getattr(block, name).parameters():
                assert p.device_mesh.mesh_dim_names == ("dp", "tp")
                assert p.placements == p.grad.placements == (Shard(0), Replicate()), name
                assert p.grad.to_local().shape == (N // 2,)


def test_ddp_matches_the_plain_block(cpu_launches):
    x, _, dy, *_ = tensors()
    want = _step(Block(), x, dy)
    with group(1, backend="gloo"):
        ddp = torch.nn.parallel.DistributedDataParallel(Block())
        got = _step(ddp, x, dy)
    _same(got, want)


def test_replaced_norms_under_fsdp2_and_tensor_parallel(cpu_launches):
    # A model of torch's norms, swapped by replace_norms (probe=False: the probe needs a GPU), then
    # sharded: the same as torch's own modules, to float32 rounding.
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.RMSNorm(N, eps=1e-6), torch.nn.Linear(N, N), torch.nn.LayerNorm(N))

    x, _, dy, *_ = tensors()
    want = _step(model(), x, dy)
    with group(1, backend="gloo"):
        mesh = init_device_mesh("cpu", (1,))
        sharded = model()
        assert [new.__name__ for _, _, new in normir.replace_norms(sharded, probe=False)] == ["RMSNorm", "LayerNorm"]
        _same(_step(fully_shard(sharded, mesh=mesh), x, dy), want, exact=False)
        parallel = model()
        normir.replace_norms(parallel, probe=False)
        # The linear layer between the norms takes the local rows (row-wise: no data moves).
        parallelize_module(parallel, mesh, {"0": SequenceParallel(use_local_output=True), "2": SequenceParallel()})
        _same(_step(parallel, x, dy), want, exact=False)


# ---------------------------------------------------------------------------- the demo

ROOT = Path(__file__).resolve().parent.parent
DEMO_CPU = str(ROOT / "tests" / "demo_cpu.py")


@pytest.mark.parametrize("world, mode", [(1, "ddp"), (2, "fsdp2"), (2, "tp")])
def test_train_demo_runs_on_cpu(tmp_path, world, mode):
    # scripts/train_demo.py end to end with the launches emulated: both norms from one seed, a few
    # steps of a tiny model, its table (markdown, JSON) and plot; the two losses agree (fp32).
    run = [sys.executable, DEMO_CPU] if world == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", DEMO_CPU]
    r = subprocess.run(run + ["--device", "cpu", "--mode", mode, "--steps", "3", "--layers", "1", "--seq", "16",
                              "--batch", "2", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["mode"], results["world_size"], results["dtype"]) == (mode, world, "float32")
    assert sorted(results["runs"]) == ["normir", "torch"]
    for run in results["runs"].values():
        assert len(run["loss"]) == 3 and all(math.isfinite(v) for v in run["loss"]) and run["tokens_per_s"] > 0
    assert results["max_relative_gap"] <= 1e-5
    assert "| step | normir loss | torch loss | relative gap |" in (tmp_path / "results.md").read_text()
    try:
        import matplotlib  # noqa: F401  (the demo's plot; pyproject's test extra installs it)
    except ImportError:
        assert "no matplotlib, so no loss.png" in r.stdout
    else:
        assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------- the GPU tier's kernels


class _NoLaunch:
    """A loaded kernel's stand-in: launches nothing (the outputs keep what the allocator gave)."""

    def resident(self, sm_count):
        return sm_count

    def launch(self, *args):
        pass

    def launch_named(self, *args, **kwargs):
        pass


@pytest.fixture
def requested(monkeypatch):
    """The kernels normir's real launch paths ask for (as Problems for sm_90, as an H200 would), on
    CPU tensors, with nothing launched: their set (key strings)."""
    from normir import launch
    from normir.options import build

    asked = set()

    def handle(problem, device):
        asked.add(problem.key_string())
        return _NoLaunch(), build(problem).layout

    monkeypatch.setattr(launch, "device_target", lambda device: "sm_90")
    monkeypatch.setattr(launch, "handle", handle)
    monkeypatch.setattr(launch, "stream", lambda device: 0)
    for name, value in (("on_gpu", lambda t: True), ("sm_count", lambda device: 132), ("raw_stream", lambda d: 0),
                        ("current_device", lambda: -1),  # a CPU tensor's get_device(): no device switch
                        ("empty_f32", lambda shape, dev, per_row=False: torch.empty(shape[:-1] if per_row else shape))):
        monkeypatch.setattr(_rows, name, value)
    launch.clear_handles()  # no plan made before is reused, and none made of the stand-ins after
    yield asked
    launch.clear_handles()


def _listed() -> set[str]:
    from gpu_cases import distributed_specializations

    from normir.options import split

    return {split(spec)[0].key_string() for spec in distributed_specializations()}


def demo_module():
    """scripts/train_demo.py as a module (its model, data and parallelize)."""
    if "train_demo" not in sys.modules:
        spec = importlib.util.spec_from_file_location("train_demo", ROOT / "scripts" / "train_demo.py")
        sys.modules["train_demo"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["train_demo"]


def test_gpu_tier_asks_for_listed_kernels_only(requested):
    # The GPU machine loads kernels from gpu_cases' ahead-of-time list only: every path of
    # test_gpu_distributed.py and the demo, run here with nothing launched, asks for listed ones.
    from gpu_cases import DIST_N
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    shape = (4, 6, DIST_N)
    for dtype in (BF16, F32):
        for op_name, make, _ in CASES.values():
            args = make(*tensors(shape=shape, dtype=dtype))
            op_of(op_name)(*args)
            with group(1, backend="gloo"):
                op_of(op_name)(*distribute(op_name, args, init_device_mesh("cpu", (1,)), [Shard(1)]))
        x, r, dy, _, w, b, *_ = (t.requires_grad_(True) for t in tensors(shape=shape, dtype=dtype))
        y, h = normir.fused_add_layernorm(x, r, w, b)
        torch.autograd.backward((normir.rmsnorm(y, w), h), (dy, dy))
    x, _, dy, *_ = tensors(shape=shape, dtype=BF16)
    with group(1, backend="gloo"):
        mesh = init_device_mesh("cpu", (1,))
        for make in (lambda: Block(DIST_N), lambda: fully_shard(Checkpointed(Block(DIST_N).to(BF16)), mesh=mesh),
                     lambda: parallelize_module(Block(DIST_N).to(BF16), mesh, tp_plan()),
                     lambda: torch.nn.parallel.DistributedDataParallel(Block(DIST_N).to(BF16))):
            whole(make().to(BF16)(x.clone().requires_grad_(True))).backward(dy)
        swapped = torch.nn.Sequential(torch.nn.RMSNorm(DIST_N, eps=1e-6), torch.nn.Linear(DIST_N, DIST_N),
                                      torch.nn.LayerNorm(DIST_N)).to(BF16)
        normir.replace_norms(swapped, probe=False)  # (the probes' kernels: gpu_cases.swap_specializations())
        whole(fully_shard(swapped, mesh=mesh)(x.clone().requires_grad_(True))).backward(dy)
        demo = demo_module()
        cfg = demo.Config(batch=2)
        tokens, targets = demo.batch(cfg, 0, 0, torch.device("cpu"))
        for dtype in (BF16, F32):
            for mode in ("ddp", "fsdp2", "tp"):
                model = demo.parallelize(demo.Decoder(cfg, "normir").to(dtype), mode, mesh, torch.device("cpu"))
                whole(model(tokens)).float().sum().backward()
    assert requested and requested <= _listed(), sorted(requested - _listed())
