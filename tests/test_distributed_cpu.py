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

import subprocess
import sys
from contextlib import contextmanager

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


def _tensors(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x, r, dy, g = (torch.randn(SHAPE, generator=gen) for _ in range(4))
    w, b = torch.randn(N, generator=gen) + 1, torch.randn(N, generator=gen)
    rstd, mean = torch.rand(SHAPE[:-1], generator=gen) + 0.5, torch.randn(SHAPE[:-1], generator=gen)
    return x, r, dy, g, w, b, rstd, mean


# op, its arguments from _tensors' (x, r, dy, g, w, b, rstd, mean), and what each output is.
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
        dy, x, None, rs, None, None, 0.0, BF16, F32), (LEAD, LEAD, ABSENT, ABSENT)),
    "layernorm_fwd": ("layernorm_fwd", lambda x, r, dy, g, w, b, rs, m: (
        x, r, w, b, 1e-5, None, None, True, True), (LEAD, LEAD, LEAD, LEAD)),
    "layernorm_fwd no residual": ("layernorm_fwd", lambda x, r, dy, g, w, b, rs, m: (
        x, None, None, b, 1e-5, None, BF16, False, True), (LEAD, ABSENT, ABSENT, ABSENT)),
    "layernorm_bwd": ("layernorm_bwd", lambda x, r, dy, g, w, b, rs, m: (
        dy, x, w, m, rs, g, F32, None, None), (LEAD, ABSENT, SUM, SUM)),
    "layernorm_bwd no weight": ("layernorm_bwd", lambda x, r, dy, g, w, b, rs, m: (
        dy, x, None, m, rs, None, None, None, None), (LEAD, ABSENT, ABSENT, ABSENT)),
}


def _op(name):
    return getattr(torch.ops.normir, name).default


def _local(t: torch.Tensor, mesh, placements, coord=None) -> torch.Tensor:
    """The shard of a whole tensor t under placements (evenly divisible sizes) at a mesh
    coordinate (default: this rank's)."""
    coord = coord or mesh.get_coordinate()
    for k, p in enumerate(placements):
        if isinstance(p, Shard):
            t = t.chunk(mesh.shape[k], p.dim)[coord[k]]
    return t


def _distribute(op_name, args, mesh, placements, stats=None):
    """The op's tensor arguments as DTensors: rows and statistics with `placements` (a shard of a
    leading dim means the same rows for both; stats: the statistics' own), weight and bias
    replicated."""
    names = [a.name for a in _op(op_name)._schema.arguments]
    out = []
    for name, a in zip(names, args):
        if isinstance(a, torch.Tensor):
            pl = [Replicate()] * mesh.ndim if name in COLUMNS else stats if stats and name in STATS else placements
            a = DTensor.from_local(_local(a, mesh, pl), mesh, pl, run_check=False)
        out.append(a)
    return out


def _expected(kind, placements):
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
            outs = _op(op_name)(*_distribute(op_name, args, mesh, placements))
            runs.append((mesh.get_coordinate(), outs))
    return runs, mesh


LEADING = ([Shard(0)], [Shard(1)], [Replicate()])  # of a 3-D x: batch, sequence, neither
MESH_2D = ([Shard(0), Shard(1)], [Shard(1), Replicate()], [Replicate(), Shard(0)], [Shard(0), Shard(0)])


@pytest.mark.parametrize("placements", LEADING + MESH_2D, ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_rules_run_each_shard_locally(cpu_launches, case, placements):
    op_name, make, kinds = CASES[case]
    args = make(*_tensors())
    want = _op(op_name)(*args)  # the plain call on the whole tensors
    mesh_shape = (2,) * len(placements)
    runs, mesh = _ranks(2 ** len(placements), mesh_shape, op_name, args, placements)
    for i, kind in enumerate(kinds):
        sums = torch.zeros_like(want[i])
        for coord, outs in runs:
            out = outs[i]
            assert isinstance(out, DTensor) and out.placements == _expected(kind, placements), (case, i)
            assert (out.shape, out.dtype) == (want[i].shape, want[i].dtype), (case, i)
            if kind == LEAD:  # this rank's rows, bitwise
                assert torch.equal(out.to_local(), _local(want[i], mesh, placements, coord)), (case, i)
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
    args = make(*_tensors())
    want = _op(op_name)(*args)
    with group(2):
        mesh = init_device_mesh("cpu", (2,))
        dts = _distribute(op_name, args, mesh, [Shard(2)], stats=[Replicate()])
        outs = _op(op_name)(*dts)
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
    x, _, _, _, w, *_ = _tensors()
    with group(2):
        mesh = init_device_mesh("cpu", (2,))
        xd, wd = _distribute("rmsnorm_fwd", (x, w), mesh, [Shard(0)])[:2]
        for store in (True, False, True, False):
            _, rstd = torch.ops.normir.rmsnorm_fwd(xd, wd, 1e-6, store)
            assert (rstd.shape, rstd.placements) == ((SHAPE[:-1], (Shard(0),)) if store else ((0,), (Replicate(),)))
            assert rstd.to_local().shape == ((2, 6) if store else (0,))


@pytest.mark.parametrize("placements", ([Shard(1)], [Shard(0), Shard(1)]), ids=str)
def test_autograd_through_dtensors(cpu_launches, placements):
    # The public functions on DTensors: the forward and the backward ops each run on the shards;
    # x's gradient follows x, the weight's and bias's are partial sums (DTensor adds them up).
    x, r, dy, _, w, b, *_ = _tensors()
    world = 2 ** len(placements)
    grads = []
    for rank in range(world):
        with group(world, rank):
            mesh = init_device_mesh("cpu", (2,) * len(placements))
            xd, rd = (DTensor.from_local(_local(t, mesh, placements), mesh, placements).requires_grad_(True)
                      for t in (x, r))
            wd, bd = (torch.nn.Parameter(DTensor.from_local(t, mesh, [Replicate()] * len(placements))) for t in (w, b))
            y, h = normir.fused_add_layernorm(xd, rd, wd, bd)
            z = normir.rmsnorm(y, wd)
            assert z.placements == h.placements == tuple(placements)
            torch.autograd.backward((z, h), (DTensor.from_local(_local(dy, mesh, placements), mesh, placements),) * 2)
            assert xd.grad.placements == tuple(placements)
            assert wd.grad.placements == bd.grad.placements == _expected(SUM, placements)
            grads.append((mesh.get_coordinate(), xd.grad.to_local(), wd.grad.to_local()))
    xw, rw, wl, bl = (t.clone().requires_grad_(True) for t in (x, r, w, b))
    y, h = normir.fused_add_layernorm(xw, rw, wl, bl)
    torch.autograd.backward((normir.rmsnorm(y, wl), h), (dy, dy))
    for coord, gx, _ in grads:
        assert torch.allclose(gx, _local(xw.grad, mesh, placements, coord), rtol=1e-5, atol=1e-5)
    assert torch.allclose(sum(g for _, _, g in grads), wl.grad, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- messages


def test_dtensor_on_a_cpu_mesh_names_the_mesh():
    x, _, _, _, w, *_ = _tensors()
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
    x, _, _, _, w, *_ = _tensors()
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
    x, r, dy, _, w, b, *_ = _tensors()
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
