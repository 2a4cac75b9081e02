"""A short fwd + bwd workload for compute-sanitizer (memcheck, racecheck): every kernel layout
(several rows per block, multi-warp rows with tails, register and streaming modes, rows split
over thread-block clusters, the dw reduction, atomics) on small M, and the fused residual add
(mixed dtypes, a bias, d_residual_out), each checked against the float64 reference.

    compute-sanitizer --tool memcheck python scripts/sanitize.py
"""

import os
import sys
from pathlib import Path

import torch

import normir
from normir import launch
from normir.ops.fused_add_rmsnorm import fused_add_rmsnorm_bwd_ref, fused_add_rmsnorm_ref
from normir.ops.rmsnorm import rmsnorm_bwd_ref, rmsnorm_ref

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_cases import SANITIZE_FUSED, sanitize_combos  # noqa: E402

TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

# 32768 / 65536 / 131072: rows over clusters of 2 / 4 / 8 blocks (sm_90); M=200 reuses the
# backward's exchange slots many times per cluster. Every case runs the backward without a weight
# too, whose policy differs (rows in registers at 4096, staged at 16384, all of pass 2 inside the
# cluster barrier at 32768 / 65536).
CASES = [(100, torch.bfloat16), (1024, torch.float32), (2880, torch.bfloat16), (4096, torch.float16),
         (16384, torch.bfloat16), (32768, torch.bfloat16), (65536, torch.bfloat16), (131072, torch.float32)]


def err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# Layouts the policy does not pick, forced (NORMIR_TPR): the forward over a 2-block cluster, the
# staged backward over 2-block clusters, and every cache hint in both kernels at N=4096.
FORCED = "rmsnorm_fwd:4096=0h23,rmsnorm_fwd:32768=0x2,rmsnorm_bwd:32768=0s1,rmsnorm_bwd:4096=0h23"


def main() -> None:
    bad = 0
    for forced in ("", FORCED):
        os.environ["NORMIR_TPR"] = forced
        launch.clear_handles()
        bad += run_cases([(4096, torch.bfloat16), (32768, torch.bfloat16)] if forced else CASES, forced)
    os.environ["NORMIR_TPR"] = ""
    launch.clear_handles()
    bad += fused_cases()
    atomic_and_report(bad)


def run_cases(cases, forced: str) -> int:
    bad = 0
    for n, dt in cases:
        for m in (1, 37) if n != 32768 else (200,):
            x = torch.randn((m, n), device="cuda").to(dt)
            w = (torch.randn(n, device="cuda") + 1).to(dt)
            dy = torch.randn((m, n), device="cuda").to(dt)
            y, rstd = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=True)
            dx, dw = normir.rmsnorm_bwd(x, w, dy, rstd)
            dx_ref, dw_ref = rmsnorm_bwd_ref(x, w, dy, 1e-6)
            dx0, _ = normir.rmsnorm_bwd(x, None, dy, rstd)  # rstd does not depend on w
            dx0_ref, _ = rmsnorm_bwd_ref(x, None, dy, 1e-6)
            e = (err(y, rmsnorm_ref(x, w, 1e-6)[0]), err(dx, dx_ref), err(dw, dw_ref), err(dx0, dx0_ref))
            ok = all(v < 2e-2 for v in e)
            bad += not ok
            print(f"n={n} m={m} {dt}{' ' + forced if forced else ''}: y {e[0]:.2e} dx {e[1]:.2e} "
                  f"dw {e[2]:.2e} dx without w {e[3]:.2e} {'ok' if ok else 'FAIL'}")
    return bad


def fused_cases() -> int:
    """The fused residual add: forward (y, residual_out) and backward (dx, dresidual, dw, db) with
    d_residual_out, through autograd."""
    bad = 0
    for n, dt in SANITIZE_FUSED:
        for x_t, r_t, w_t, b_t, _, _, offset in sanitize_combos(dt):
            for m in (1, 37):
                x, r = (torch.randn((m, n), device="cuda").to(TORCH[t]).requires_grad_(True) for t in (x_t, r_t))
                w = (torch.randn(n, device="cuda") + 1).to(TORCH[w_t]).requires_grad_(True)
                b = torch.randn(n, device="cuda").to(TORCH[b_t]).requires_grad_(True) if b_t else None
                y, h = normir.fused_add_rmsnorm(x, r, w, bias=b, weight_offset=offset)
                dy, dh = torch.randn_like(y), torch.randn_like(h)
                leaves = [t for t in (x, r, w, b) if t is not None]
                grads = torch.autograd.grad([y, h], leaves, [dy, dh])
                y_ref, h_ref, _ = fused_add_rmsnorm_ref(x.detach(), r.detach(), w, b, 1e-6, None, offset)
                g_ref, dw_ref, db_ref = fused_add_rmsnorm_bwd_ref(h_ref, w, b, 1e-6, offset, dy, dh)
                refs = [g_ref, g_ref, dw_ref] + ([db_ref] if b is not None else [])
                e = [err(y, y_ref)] + [err(g, ref) for g, ref in zip(grads, refs)]
                ok = all(v < 2e-2 for v in e) and torch.equal(h, h_ref)
                bad += not ok
                print(f"fused n={n} m={m} x {x_t} residual {r_t}{' bias' if b_t else ''}: "
                      + " ".join(f"{v:.2e}" for v in e) + (" ok" if ok else " FAIL"))
    return bad


def atomic_and_report(bad: int) -> None:
    x = torch.randn((64, 4096), device="cuda").bfloat16()
    w = torch.randn(4096, device="cuda").bfloat16()
    y, rstd = normir.rmsnorm_fwd(x, w, store_rstd=True)
    normir.rmsnorm_bwd(x, w, torch.randn_like(x), rstd, atomic_dw=True)
    torch.cuda.synchronize()
    print("sanitize workload:", "FAIL" if bad else "all ok")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
