"""Train a small Llama-style decoder on synthetic tokens with normir's norms (RMSNorm, and the
fused residual-add RMSNorm in each block) and with torch.nn.RMSNorm from the same seed, under DDP,
FSDP2 or tensor + sequence parallelism; write each one's loss per step and tokens/s as a table
(markdown and JSON) and a plot (PNG) into --out.

    torchrun --nproc-per-node 2 scripts/train_demo.py --mode fsdp2 --steps 100 --out demo
    torchrun --nproc-per-node 2 scripts/train_demo.py --mode tp --out demo-tp   # TP + SP
    python3 scripts/train_demo.py --mode ddp --device cpu --norm torch --steps 5 --out /tmp/demo  # one process

Without torchrun it runs as one process (world size 1). Data parallelism (ddp, fsdp2) gives each
rank its own sequences; tensor parallelism shards the heads and the MLP over the ranks, and the
norms' rows over the sequence (normir.ops.distributed.SequenceParallel: torch's, with the fused
add's two inputs). The exit status is 1 when normir's loss leaves torch's by more than
--tolerance (relative) at any step.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module

import normir
from normir.ops.distributed import SequenceParallel


@dataclass(frozen=True)
class Config:
    vocab: int = 512
    hidden: int = 256  # the norms' N (tests/gpu_cases.py lists their kernels at this size)
    layers: int = 2
    heads: int = 8  # tensor parallelism splits them: --mode tp needs a world size dividing 8
    ffn: int = 768
    seq: int = 128
    batch: int = 8  # sequences per data-parallel rank and step
    eps: float = 1e-6


# ---------------------------------------------------------------------------- the model


class TorchAddRMSNorm(nn.RMSNorm):
    """torch's counterpart of normir.FusedAddRMSNorm: h = x + residual; (rmsnorm(h), h)."""

    def forward(self, x, residual):
        h = x + residual
        return super().forward(h), h


NORMS = {  # (plain, fused add) for each --norm
    "normir": (normir.RMSNorm, normir.FusedAddRMSNorm),
    "torch": (nn.RMSNorm, TorchAddRMSNorm),
}


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.head_dim = cfg.hidden // cfg.heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(cfg.hidden, cfg.hidden, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        # -1: the heads on this rank (tensor parallelism gives each a share)
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):  # SwiGLU
    def __init__(self, cfg: Config):
        super().__init__()
        self.w1, self.w3 = (nn.Linear(cfg.hidden, cfg.ffn, bias=False) for _ in range(2))
        self.w2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: Config, norm: str):
        super().__init__()
        plain, fused_add = NORMS[norm]
        self.attn_norm, self.attn = plain(cfg.hidden, eps=cfg.eps), Attention(cfg)
        self.mlp_norm, self.mlp = fused_add(cfg.hidden, eps=cfg.eps), MLP(cfg)

    def forward(self, h):
        x, h = self.mlp_norm(self.attn(self.attn_norm(h)), h)  # h += attention; x = norm(h): one kernel
        return h + self.mlp(x)


class Decoder(nn.Module):
    def __init__(self, cfg: Config, norm: str):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg, norm) for _ in range(cfg.layers))
        self.norm = NORMS[norm][0](cfg.hidden, eps=cfg.eps)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


# ---------------------------------------------------------------------------- parallelism


def tensor_parallel(model: Decoder, mesh) -> Decoder:
    """Megatron-style TP with sequence parallelism: the norms' rows are sharded over the sequence
    (dim 1), attention and the MLP gather them and shard heads and hidden units instead."""
    seq = Shard(1)
    parallelize_module(model, mesh, {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq, use_local_output=False),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
    })
    for block in model.layers:
        parallelize_module(block, mesh, {
            "attn_norm": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=seq, use_local_output=False),
            "mlp_norm": SequenceParallel(),  # normir's: shards both x and the residual
            "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "mlp.w1": ColwiseParallel(), "mlp.w3": ColwiseParallel(),
            "mlp.w2": RowwiseParallel(output_layouts=seq, use_local_output=False),
        })
    return model


def parallelize(model: Decoder, mode: str, mesh, device: torch.device) -> nn.Module:
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if mode == "fsdp2":
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return tensor_parallel(model, mesh)


# ---------------------------------------------------------------------------- data and training


def batch(cfg: Config, step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic sequences with something to learn: each token is a fixed function of the one
    before (a random permutation of the vocabulary), 1 time in 10 a random token. Seeded by step
    and rank: the same for both norms."""
    follow = torch.randperm(cfg.vocab, generator=torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(step * 10007 + rank)
    tokens = torch.empty(cfg.batch, cfg.seq + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(cfg.vocab, (cfg.batch,), generator=gen)
    noise = torch.randint(cfg.vocab, (cfg.batch, cfg.seq), generator=gen)
    keep = torch.rand(cfg.batch, cfg.seq, generator=gen) < 0.9
    for i in range(cfg.seq):
        tokens[:, i + 1] = torch.where(keep[:, i], follow[tokens[:, i]], noise[:, i])
    tokens = tokens.to(device)
    return tokens[:, :-1], tokens[:, 1:]


def train(cfg: Config, norm: str, args, mesh, device: torch.device) -> dict:
    """Train one model from args.seed; returns its mean loss per step (over the data-parallel
    ranks) and tokens/s (after the first step, which loads kernels and warms the allocator)."""
    torch.manual_seed(args.seed)
    model = Decoder(cfg, norm).to(device=device, dtype=args.dtype)
    model = parallelize(model, args.mode, mesh, device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data_rank, data_ranks = (0, 1) if args.mode == "tp" else (dist.get_rank(), dist.get_world_size())
    losses, times = [], []
    for step in range(args.steps):
        tokens, targets = batch(cfg, step, data_rank, device)
        start = time.perf_counter()
        loss = F.cross_entropy(model(tokens).float().flatten(0, 1), targets.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # ends the step on every rank, the GPU's work included
        times.append(time.perf_counter() - start)
        losses.append(mean.item() / dist.get_world_size())
    timed = times[1:] or times
    return {"loss": losses, "tokens_per_s": cfg.batch * cfg.seq * data_ranks * len(timed) / sum(timed)}


# ---------------------------------------------------------------------------- report


def report(out: Path, cfg: Config, args, world: int, runs: dict) -> float | None:
    """results.json, results.md and loss.png in out; returns the largest relative gap of
    normir's loss from torch's over the steps (None unless both ran)."""
    out.mkdir(parents=True, exist_ok=True)
    gaps = None
    if len(runs) == 2:
        gaps = [abs(a - b) / abs(b) for a, b in zip(runs["normir"]["loss"], runs["torch"]["loss"])]
    dtype = str(args.dtype).removeprefix("torch.")
    summary = {"mode": args.mode, "world_size": world, "device": args.device, "dtype": dtype,
               "steps": args.steps, "config": asdict(cfg), "runs": runs, "relative_gap": gaps,
               "max_relative_gap": max(gaps) if gaps else None, "tolerance": args.tolerance}
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# {args.mode}, {world} rank(s), {args.device}, {dtype}, {args.steps} steps", "",
             "| norm | final loss | tokens/s |", "|---|---|---|"]
    lines += [f"| {name} | {r['loss'][-1]:.4f} | {r['tokens_per_s']:.0f} |" for name, r in runs.items()]
    if gaps:
        lines += ["", f"Largest relative gap of normir's loss from torch's: {max(gaps):.2e} "
                  f"(tolerance {args.tolerance:g})"]
    lines += ["", "| step | " + " | ".join(f"{n} loss" for n in runs) + (" | relative gap |" if gaps else " |"),
              "|---" * (len(runs) + 1 + bool(gaps)) + "|"]
    for i in range(args.steps):
        cells = [f"{r['loss'][i]:.4f}" for r in runs.values()] + ([f"{gaps[i]:.2e}"] if gaps else [])
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
    except ImportError:
        print("train_demo: no matplotlib, so no loss.png (pip install matplotlib)")
        return max(gaps) if gaps else None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, 2 if gaps else 1, figsize=(11 if gaps else 6, 4), squeeze=False)
    for name, r in runs.items():
        axes[0][0].plot(range(1, args.steps + 1), r["loss"], label=f"{name} ({r['tokens_per_s']:.0f} tokens/s)")
    axes[0][0].set(xlabel="step", ylabel="loss", title=f"{args.mode}, {world} rank(s), {dtype}")
    axes[0][0].legend()
    if gaps:
        axes[0][1].plot(range(1, args.steps + 1), gaps)
        axes[0][1].axhline(args.tolerance, color="red", linestyle="--", label="tolerance")
        axes[0][1].set(xlabel="step", ylabel="|normir - torch| / torch", title="relative gap of the losses")
        axes[0][1].legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=100)
    return max(gaps) if gaps else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("ddp", "fsdp2", "tp"), default="fsdp2")
    p.add_argument("--norm", choices=("both", "normir", "torch"), default="both")
    p.add_argument("--steps", type=int, default=100)
    for knob in ("layers", "seq", "batch"):  # the norms' size (hidden) stays: their kernels are listed for it
        p.add_argument(f"--{knob}", type=int, default=getattr(Config, knob))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("bf16", "fp32"), help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=0.005, help="largest relative gap of the losses accepted")
    p.add_argument("--out", type=Path, default=Path("train_demo_out"))
    args = p.parse_args()
    args.dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if args.device == "cuda"
                                                                               else "fp32")]
    cfg = Config(layers=args.layers, seq=args.seq, batch=args.batch)
    backend = "nccl" if args.device == "cuda" else "gloo"
    if "RANK" in os.environ:  # torchrun
        device = torch.device(args.device, int(os.environ["LOCAL_RANK"]) if args.device == "cuda" else None)
        if args.device == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend)
    else:
        device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    world = dist.get_world_size()
    if args.mode == "tp" and cfg.heads % world:
        raise SystemExit(f"--mode tp shards the {cfg.heads} heads: run on a number of ranks that divides it")
    mesh, rank = init_device_mesh(args.device, (world,)), dist.get_rank()
    try:
        names = ("normir", "torch") if args.norm == "both" else (args.norm,)
        runs = {name: train(cfg, name, args, mesh, device) for name in names}
        gap = report(args.out, cfg, args, world, runs) if rank == 0 else None
        dist.barrier()  # the ranks leave together (one torn down while another still writes can abort it)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        finals = ", ".join(f"{name} {r['loss'][-1]:.4f}" for name, r in runs.items())
        print(f"train_demo: final loss {finals}; results in {args.out}")
    if gap is not None and gap > args.tolerance:
        print(f"train_demo: normir's loss left torch's by {gap:.2e} (relative) at a step; tolerance {args.tolerance:g}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
