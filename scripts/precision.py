"""LayerNorm's backward at tiny N (N <= 8) against torch's fp32 layer_norm, both against float64:
the median over 20 seeds of the relative L2 error of dx on 3 fp32 rows, for rows of mean 100 and
std 3 (drawn, and standardized to exactly that mean and std) and standard normal rows. The GPU
tier's test_gpu_training.py asserts the drawn rows' ratio; this prints the whole table.

    python3 scripts/precision.py [--out DIR]   (on a GPU machine; writes DIR/precision.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

import normir

NS = (2, 3, 4, 5, 8)
ROWS = ("mean 100, std 3", "mean 100, std 3 (standardized)", "standard normal")


def rows(kind: str, n: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn((3, n), generator=gen, device="cuda", dtype=torch.float64)
    if "standardized" in kind:
        x = (x - x.mean(-1, keepdim=True)) / x.std(-1, unbiased=False, keepdim=True)
    return (x * 3 + 100 if kind.startswith("mean 100") else x).float()


def errors(n: int, kind: str, seed: int) -> tuple[float, float]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = rows(kind, n, gen)
    dy = torch.randn((3, n), generator=gen, device="cuda")
    xd = x.double().requires_grad_(True)
    (want,) = torch.autograd.grad(torch.nn.functional.layer_norm(xd, (n,), eps=1e-5), xd, dy.double())
    out = []
    for norm in (normir.layernorm, lambda t: torch.nn.functional.layer_norm(t, (n,), eps=1e-5)):
        xt = x.clone().requires_grad_(True)
        (got,) = torch.autograd.grad(norm(xt), xt, dy)
        out.append(((got.double() - want).norm() / want.norm()).item())
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    table = []
    print(f"{'rows':34} {'N':>2} {'normir':>10} {'torch':>10} {'ratio':>6}")
    for kind in ROWS:
        for n in NS:
            ours, theirs = zip(*(errors(n, kind, s) for s in range(20)))
            o, t = statistics.median(ours), statistics.median(theirs)
            table.append({"rows": kind, "n": n, "normir": o, "torch": t, "ratio": o / t})
            print(f"{kind:34} {n:>2} {o:10.3e} {t:10.3e} {o / t:6.2f}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "precision.json").write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
