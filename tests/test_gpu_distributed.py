"""GPU tier: normir on torch.distributed on the H200. On one GPU (a process group of one rank,
NCCL): every op's sharding rule for every placement of tests/test_distributed_cpu.py's table
(a 1 x 1 mesh for two mesh dims; a shard of the normalized dim redistributed), autograd through
DTensors, FSDP2 (eager, Inductor, activation checkpointing), tensor + sequence parallelism and DDP
on a block of normir's four modules, and scripts/train_demo.py's model, each against the plain
call: y and dx bitwise, dw and db within 1e-5 relative (where a compiled or DTensor matmul is in
the way, the tolerance of the dtype). Marked multi_gpu: the rules on two GPUs (each rank's shard of
the rows bitwise, the summed column gradients within the dtype's rounding) and the demo under
torchrun for each mode. Every specialization launched here (and by the demo) is in
gpu_cases.distributed_specializations() (N = DIST_N, bf16 and fp32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gpu_cases import DIST_N as N
from gpu_helpers import TOL, rel_err
from test_distributed_cpu import (
    ABSENT,
    CASES,
    LEAD,
    SUM,
    Block,
    Checkpointed,
    demo_module,
    distribute,
    expected,
    op_of,
    shard_of,
    tensors,
    tp_plan,
    whole,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

import normir
from normir.ops.distributed import SequenceParallel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is absent")]

BF16, F32 = torch.bfloat16, torch.float32
DTYPES = {"bf16": BF16, "fp32": F32}
SHAPE = (4, 6, N)
ROOT = Path(__file__).resolve().parent.parent
# NVLink SHARP (multicast) off: the machines lent here refuse it (see the device notes).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


@pytest.fixture(scope="module")
def meshes(tmp_path_factory):
    """A process group of this process alone on GPU 0 (NCCL, through a FileStore: no network) for
    the module's one-GPU tests, and its meshes of one and two dims (1 and 1 x 1), by ndim."""
    os.environ.update(NCCL_ENV)
    torch.cuda.set_device(0)
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    yield {1: init_device_mesh("cuda", (1,)), 2: init_device_mesh("cuda", (1, 1))}
    dist.destroy_process_group()


def _check(kind: str, got: torch.Tensor, want: torch.Tensor, tol: float = 1e-5) -> None:
    """An output of a sharded call against the plain call's: rows bitwise, column sums within tol."""
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    if kind == SUM:
        assert rel_err(got, want) <= tol, rel_err(got, want)
    else:
        assert torch.equal(got, want)


# ---------------------------------------------------------------------------- the ops' rules

PLACEMENTS = ([Shard(0)], [Shard(1)], [Replicate()], [Shard(2)], [Shard(0), Shard(1)])


@pytest.mark.parametrize("placements", PLACEMENTS, ids=str)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_rules_on_one_gpu(meshes, case, dtype, placements):
    op_name, make, kinds = CASES[case]
    args = make(*tensors(shape=SHAPE, dtype=DTYPES[dtype], device="cuda"))
    want = op_of(op_name)(*args)
    last = placements == [Shard(2)]  # the normalized dim: redistributed first (the statistics replicated)
    dts = distribute(op_name, args, meshes[len(placements)], placements, stats=[Replicate()] if last else None)
    for out, w, kind in zip(op_of(op_name)(*dts), want, kinds):
        if not last:
            assert out.placements == expected(kind, placements), case
        _check(kind, out.full_tensor(), w)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_autograd_through_dtensors_on_one_gpu(meshes, dtype):
    x, r, dy, _, w, b, *_ = tensors(shape=SHAPE, dtype=DTYPES[dtype], device="cuda")

    def run(wrap):
        xs, rs = (wrap(t.clone(), [Shard(1)]).requires_grad_(True) for t in (x, r))
        ws, bs = (torch.nn.Parameter(wrap(t.clone(), [Replicate()])) for t in (w, b))
        y, h = normir.fused_add_layernorm(xs, rs, ws, bs)
        z = normir.rmsnorm(y, ws)
        torch.autograd.backward((z, h), (wrap(dy, [Shard(1)]),) * 2)
        return [whole(t).detach() for t in (z, h, xs.grad, rs.grad, ws.grad, bs.grad)]

    want = run(lambda t, placements: t)
    mesh = meshes[1]
    got = run(lambda t, placements: DTensor.from_local(t, mesh, placements))
    for g, e, kind in zip(got, want, (LEAD, LEAD, LEAD, LEAD, SUM, SUM)):
        _check(kind, g, e)


# ---------------------------------------------------------------------------- FSDP2, TP + SP, DDP


def _block():
    return Block(N).to(device="cuda", dtype=BF16)


def _step(module, x, dy):
    """Output, x's gradient and the parameters' (whole tensors) of one forward and backward."""
    xi = x.clone().requires_grad_(True)
    y = whole(module(xi))
    y.backward(dy)
    return [y.detach(), whole(xi.grad)] + [whole(p.grad) for p in module.parameters()]


def _compare(got, want, exact: bool, first_exact: int = 2):
    """The first first_exact results (y and dx) bitwise and the rest (the parameters' gradients)
    within 1e-5 relative where exact, else all within bf16's tolerance."""
    assert len(got) == len(want)
    for i, (g, e) in enumerate(zip(got, want)):
        assert g.shape == e.shape and g.dtype == e.dtype
        if exact and i < first_exact:
            assert torch.equal(g, e), i
        else:
            assert rel_err(g, e) <= (1e-5 if exact else TOL[BF16]), (i, rel_err(g, e))


def _inputs():
    x, _, dy, *_ = tensors(shape=SHAPE, dtype=BF16, device="cuda")
    return x, dy


@pytest.mark.parametrize("variant", ["eager", "compiled", "checkpointed"])
def test_fsdp2_on_one_gpu(meshes, variant):
    from torch.distributed.fsdp import fully_shard

    x, dy = _inputs()
    torch._dynamo.reset()
    plain = _block()
    want = _step(torch.compile(plain) if variant == "compiled" else plain, x, dy)
    block = _block()
    module = Checkpointed(block) if variant == "checkpointed" else block
    fully_shard(module, mesh=meshes[1])
    got = _step(torch.compile(module) if variant == "compiled" else module, x, dy)
    _compare(got, want, exact=variant != "compiled")  # Inductor's graphs differ around FSDP2's hooks


MODULES = {
    "RMSNorm": lambda: normir.RMSNorm(N),
    "FusedAddRMSNorm": lambda: normir.FusedAddRMSNorm(N, bias=True),
    "LayerNorm": lambda: normir.LayerNorm(N),
    "FusedAddLayerNorm": lambda: normir.FusedAddLayerNorm(N),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_sequence_parallel_modules_on_one_gpu(meshes, name):
    # Each module alone under normir's SequenceParallel: its rows on the sequence shard, bitwise.
    from torch.distributed.tensor.parallel import parallelize_module

    x, dy = _inputs()
    fused = name.startswith("FusedAdd")

    def run(module, wrap):
        xi, ri = (t.clone().requires_grad_(True) for t in (x, dy))
        outs = module(xi, ri) if fused else (module(xi),)
        torch.autograd.backward(outs, [wrap(dy)] * len(outs))
        rows = [xi.grad, ri.grad] if fused else [xi.grad]
        return [whole(o).detach() for o in outs] + rows + [whole(p.grad) for p in module.parameters()]

    want = run(MODULES[name]().to(device="cuda", dtype=BF16), lambda t: t)
    mesh = meshes[1]
    module = parallelize_module(MODULES[name]().to(device="cuda", dtype=BF16), mesh, SequenceParallel())
    got = run(module, lambda t: DTensor.from_local(t, mesh, [Shard(1)]))
    _compare(got, want, exact=True, first_exact=4 if fused else 2)


def test_tensor_and_sequence_parallel_block_on_one_gpu(meshes):
    from torch.distributed.tensor.parallel import parallelize_module

    x, dy = _inputs()
    want = _step(_block(), x, dy)
    got = _step(parallelize_module(_block(), meshes[1], tp_plan()), x, dy)
    _compare(got, want, exact=False)  # the linear layers through DTensor's matmuls


def test_ddp_on_one_gpu(meshes):
    x, dy = _inputs()
    want = _step(_block(), x, dy)
    got = _step(torch.nn.parallel.DistributedDataParallel(_block(), device_ids=[0]), x, dy)
    _compare(got, want, exact=True)


def test_replaced_norms_under_fsdp2_and_sequence_parallel_on_one_gpu(meshes):
    # torch's norms in a model, swapped by replace_norms (each probed on the GPU), then sharded:
    # the same as torch's own modules, to bf16's rounding.
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.RMSNorm(N, eps=1e-6), torch.nn.Linear(N, N),
                                   torch.nn.LayerNorm(N)).to(device="cuda", dtype=BF16)

    x, dy = _inputs()
    want = _step(model(), x, dy)
    sharded = model()
    assert [new.__name__ for _, _, new in normir.replace_norms(sharded, strict=True)] == ["RMSNorm", "LayerNorm"]
    _compare(_step(fully_shard(sharded, mesh=meshes[1]), x, dy), want, exact=False)
    parallel = model()
    normir.replace_norms(parallel, strict=True)
    # The linear layer between the norms takes the local rows (row-wise: no data moves).
    parallelize_module(parallel, meshes[1], {"0": SequenceParallel(use_local_output=True), "2": SequenceParallel()})
    _compare(_step(parallel, x, dy), want, exact=False)


# ---------------------------------------------------------------------------- the demo's model


@pytest.mark.parametrize("mode", ["ddp", "fsdp2", "tp"])
def test_demo_model_on_one_gpu(meshes, mode):
    # The demo's decoder (normir's norms, bf16) parallelized as the demo does, at world size 1:
    # its logits bitwise as the plain model's where no DTensor matmul is in the way, the gradients
    # within bf16's tolerance (attention's backward may add in another order from run to run).
    demo = demo_module()
    cfg = demo.Config(batch=2)
    assert cfg.hidden == N  # the norms' kernels are listed for it
    device = torch.device("cuda", 0)
    tokens, targets = demo.batch(cfg, 0, 0, device)

    def run(model):
        logits = whole(model(tokens))
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).backward()
        return [logits.detach()] + [whole(p.grad) for p in model.parameters()]

    torch.manual_seed(0)
    want = run(demo.Decoder(cfg, "normir").to(device=device, dtype=BF16))
    torch.manual_seed(0)
    got = run(demo.parallelize(demo.Decoder(cfg, "normir").to(device=device, dtype=BF16), mode, meshes[1], device))
    for i, (g, e) in enumerate(zip(got, want)):
        assert g.shape == e.shape
        if i == 0 and mode != "tp":
            assert torch.equal(g, e)
        else:
            assert rel_err(g, e) <= TOL[BF16], (i, rel_err(g, e))


# ---------------------------------------------------------------------------- two GPUs

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def _rules_worker(rank: int, world: int, store: str) -> None:
    """Each case of CASES on `world` GPUs, rows sharded on dim 1: this rank's rows bitwise as the
    plain call's on the whole tensors, the column sums (Partial, added by DTensor) within the
    dtype's rounding (two bf16 partial sums round twice)."""
    os.environ.update(NCCL_ENV)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cuda", (world,))
        for dtype in (BF16, F32):
            for case, (op_name, make, kinds) in sorted(CASES.items()):
                args = make(*tensors(shape=SHAPE, dtype=dtype, device=f"cuda:{rank}"))
                want = op_of(op_name)(*args)
                outs = op_of(op_name)(*distribute(op_name, args, mesh, [Shard(1)]))
                for out, w, kind in zip(outs, want, kinds):
                    assert out.placements == expected(kind, [Shard(1)]), case
                    if kind == LEAD:
                        _check(kind, out.to_local(), shard_of(w, mesh, [Shard(1)]))
                    elif kind == SUM:
                        _check(kind, out.full_tensor(), w, 1e-5 if dtype == F32 else TOL[BF16])
                    else:
                        assert kind == ABSENT and out.to_local().shape == (0,)
    finally:
        dist.destroy_process_group()


@pytest.mark.multi_gpu
@two_gpus
def test_rules_on_two_gpus(tmp_path):
    torch.multiprocessing.spawn(_rules_worker, args=(2, str(tmp_path / "store")), nprocs=2)


@pytest.mark.multi_gpu
@two_gpus
@pytest.mark.parametrize("mode", ["ddp", "fsdp2", "tp"])
def test_train_demo_on_two_gpus(tmp_path, mode):
    # bf16, both norms from one seed: normir's loss within the demo's tolerance (0.5%) of torch's
    # at every step (the exit status says so), its table and plot written.
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(ROOT / "scripts" / "train_demo.py"), "--mode", mode, "--steps", "20", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, **NCCL_ENV})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["world_size"], results["dtype"], len(results["runs"]["normir"]["loss"])) == (2, "bfloat16", 20)
    assert results["max_relative_gap"] <= 0.005
