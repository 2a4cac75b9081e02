"""A short fwd + bwd workload for compute-sanitizer (memcheck, racecheck): every kernel layout
(several rows per block, multi-warp rows with tails, register and streaming modes, rows split
over thread-block clusters, the dw reduction, atomics) on small M, the fused residual add
(mixed dtypes, a bias, d_residual_out), LayerNorm (with and without a weight and a bias, its
fused add with an fp32 residual and d_residual_out, atomics), and the backwards with dy and
d_residual_out in other dtypes than the row, each checked against the float64 reference.

    compute-sanitizer --tool memcheck python scripts/sanitize.py [layernorm [N ...]]

With `layernorm`, only the LayerNorm cases (after a change to LayerNorm's layouts alone); with N
too, only SANITIZE_LN's cases of those N, the policy's layouts. With `gradients`, only the
backwards with gradients in their own dtypes. With `serving`, only the quantized and in-place
forwards (normir.rmsnorm_quant, normir.layernorm_quant, normir.serving): racecheck there covers the
dynamic scales' second reduction through shared memory and the in-place stores.
"""

import os
import sys
from pathlib import Path

import torch

import normir
from normir import launch
from normir.ops.fused_add_rmsnorm import fused_add_rmsnorm_bwd_ref, fused_add_rmsnorm_ref
from normir.ops.layernorm import layernorm_bwd_ref, layernorm_ref
from normir.ops.rmsnorm import rmsnorm_bwd_ref, rmsnorm_ref

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_cases import (  # noqa: E402
    DB_SMEM_CASES,
    GRAD_DTYPE_N,
    SANITIZE_FUSED,
    SANITIZE_LN,
    SANITIZE_LN_ATOMIC_N,
    SANITIZE_LN_COMBOS,
    SANITIZE_SERVING_N,
    STAGE_DRES_CASES,
    sanitize_combos,
    tpr_value,
)
from gpu_helpers import within_a_step  # noqa: E402

TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

# 768: one chunk a thread (the backward's rows split evenly); 32768 / 65536 / 131072: rows over
# clusters of 2 / 4 / 8 blocks (sm_90); M=200 reuses the backward's exchange slots many times per
# cluster. Every case runs the backward without a weight too, whose policy differs (rows in
# registers at 4096, staged at 16384, all of pass 2 inside the cluster barrier at 32768 / 65536).
CASES = [(100, torch.bfloat16), (768, torch.bfloat16), (1024, torch.float32), (2880, torch.bfloat16),
         (4096, torch.float16), (16384, torch.bfloat16), (32768, torch.bfloat16), (65536, torch.bfloat16),
         (131072, torch.float32)]


LN_EPS = 1e-5


def err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# Layouts the policy does not pick, forced (NORMIR_TPR): the forward over a 2-block cluster, the
# staged backward over 2-block clusters, and every cache hint in both kernels at N=4096.
FORCED = "rmsnorm_fwd:4096=0h23,rmsnorm_fwd:32768=0x2,rmsnorm_bwd:32768=0s1,rmsnorm_bwd:4096=0h23"
# LayerNorm's backward with db's sums in shared memory, forced where the policy does not give it, at
# SANITIZE_LN's N.
LN_FORCED = ",".join(f"layernorm_bwd:{n}={tpr_value(k)}" for n, k in dict(reversed(DB_SMEM_CASES)).items()
                     if n in dict(SANITIZE_LN))  # the first case of each N
# Both fused adds' backwards with d_residual_out copied into shared memory (stage_dres), forced.
STAGE_DRES_FORCED = ",".join(f"{kernel}:{n}={tpr_value(k)}" for kernel, n, k in STAGE_DRES_CASES)


def main() -> None:
    if sys.argv[1:2] == ["serving"]:
        atomic_and_report(serving_cases())
    if sys.argv[1:2] == ["gradients"]:
        atomic_and_report(gradient_dtype_cases())
    if sys.argv[1:2] == ["layernorm"]:
        ns = {int(n) for n in sys.argv[2:]}
        if ns:
            atomic_and_report(layernorm_cases([c for c in SANITIZE_LN if c[0] in ns]))
        atomic_and_report(layernorm_cases() + layernorm_forced() + layernorm_atomic())
    bad = 0
    for forced in ("", FORCED):
        os.environ["NORMIR_TPR"] = forced
        launch.clear_handles()
        bad += run_cases([(4096, torch.bfloat16), (32768, torch.bfloat16)] if forced else CASES, forced)
    os.environ["NORMIR_TPR"] = ""
    launch.clear_handles()
    bad += fused_cases()
    bad += layernorm_cases()
    bad += layernorm_forced()
    bad += layernorm_atomic()
    bad += stage_dres_forced()
    bad += gradient_dtype_cases()
    bad += serving_cases()
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


def layernorm_forced() -> int:
    """layernorm_cases under LN_FORCED."""
    os.environ["NORMIR_TPR"] = LN_FORCED
    launch.clear_handles()
    try:
        return layernorm_cases()
    finally:
        os.environ["NORMIR_TPR"] = ""
        launch.clear_handles()


def stage_dres_forced() -> int:
    """STAGE_DRES_CASES under STAGE_DRES_FORCED: each fused add's forward and backward through
    autograd (bf16, a bias, d_residual_out), against the float64 references."""
    os.environ["NORMIR_TPR"] = STAGE_DRES_FORCED
    launch.clear_handles()
    bad = 0
    try:
        for kernel, n, _ in STAGE_DRES_CASES:
            layer = kernel == "layernorm_bwd"
            for m in (1, 37):
                x, r = (torch.randn((m, n), device="cuda").bfloat16().requires_grad_(True) for _ in range(2))
                w = (torch.randn(n, device="cuda") + 1).bfloat16().requires_grad_(True)
                b = torch.randn(n, device="cuda").bfloat16().requires_grad_(True)
                if layer:
                    y, h = normir.layernorm(x, w, b, LN_EPS, residual=r, prenorm=True)
                    y_ref, h_ref, _, _ = layernorm_ref(x.detach(), w, b, LN_EPS, r.detach())
                else:
                    y, h = normir.fused_add_rmsnorm(x, r, w, bias=b)
                    y_ref, h_ref, _ = fused_add_rmsnorm_ref(x.detach(), r.detach(), w, b, 1e-6, None, 0.0)
                dy, dh = torch.randn_like(y), torch.randn_like(h)
                grads = torch.autograd.grad([y, h], [x, r, w, b], [dy, dh])
                g_ref, dw_ref, db_ref = layernorm_bwd_ref(h_ref, w, b, LN_EPS, dy, dh) if layer else \
                    fused_add_rmsnorm_bwd_ref(h_ref, w, b, 1e-6, 0.0, dy, dh)
                e = [err(y, y_ref)] + [err(g, ref) for g, ref in zip(grads, (g_ref, g_ref, dw_ref, db_ref))]
                ok = all(v < 2e-2 for v in e) and torch.equal(h, h_ref)
                bad += not ok
                print(f"stage_dres {kernel} n={n} m={m}: " + " ".join(f"{v:.2e}" for v in e)
                      + (" ok" if ok else " FAIL"))
    finally:
        os.environ["NORMIR_TPR"] = ""
        launch.clear_handles()
    return bad


def layernorm_cases(cases=SANITIZE_LN) -> int:
    """LayerNorm through autograd: forward y (and residual_out with a residual), backward dx
    (dresidual), dw and db from dy (and d_residual_out), at `cases` (N, x's dtype)."""
    bad = 0
    for n, dt in cases:
        for name, has_w, has_b, r_t in SANITIZE_LN_COMBOS:
            r_t = dt if r_t == "x" else r_t
            for m in (1, 37):
                x = torch.randn((m, n), device="cuda").to(TORCH[dt]).requires_grad_(True)
                r = torch.randn((m, n), device="cuda").to(TORCH[r_t]).requires_grad_(True) if r_t else None
                w = (torch.randn(n, device="cuda") + 1).to(TORCH[dt]).requires_grad_(True) if has_w else None
                b = torch.randn(n, device="cuda").to(TORCH[dt]).requires_grad_(True) if has_b else None
                leaves = [t for t in (x, r, w, b) if t is not None]
                if r is not None:
                    y, h = normir.layernorm(x, w, b, LN_EPS, residual=r, prenorm=True)
                    dy, dh = torch.randn_like(y), torch.randn_like(h)
                    grads = torch.autograd.grad([y, h], leaves, [dy, dh])
                else:
                    y = normir.layernorm(x, w, b, LN_EPS)
                    dy, dh = torch.randn_like(y), None
                    grads = torch.autograd.grad(y, leaves, dy)
                y_ref, h_ref, _, _ = layernorm_ref(x.detach(), w, b, LN_EPS, r.detach() if r is not None else None)
                g_ref, dw_ref, db_ref = layernorm_bwd_ref(h_ref, w, b, LN_EPS, dy, dh)
                refs = [g_ref] + [ref for ref, t in ((g_ref, r), (dw_ref, w), (db_ref, b)) if t is not None]
                e = [err(y, y_ref)] + [err(g, ref) for g, ref in zip(grads, refs)]
                ok = all(v < 2e-2 for v in e) and (r is None or torch.equal(h, h_ref))
                bad += not ok
                print(f"layernorm {name} n={n} m={m} x {dt}: " + " ".join(f"{v:.2e}" for v in e)
                      + (" ok" if ok else " FAIL"))
    return bad


def layernorm_atomic() -> int:
    """LayerNorm's backward with atomic column sums (dw, db) through the direct API, mean and rstd
    checked too: plain (a weight and a bias), and the fused add with an fp32 residual and
    d_residual_out (dx bf16 and dresidual fp32 from one pass)."""
    bad = 0
    for n in SANITIZE_LN_ATOMIC_N:
        for r_t in (None, "f32"):
            x = torch.randn((64, n), device="cuda").bfloat16()
            r = torch.randn((64, n), device="cuda").to(TORCH[r_t]) if r_t else None
            w = (torch.randn(n, device="cuda") + 1).bfloat16()
            b = torch.randn(n, device="cuda").bfloat16()
            if r is not None:
                y, h, mean, rstd = normir.fused_add_layernorm_fwd(x, r, w, b, LN_EPS, store_stats=True)
                dy, dh = torch.randn_like(y), torch.randn_like(h)
                (dx, dres), dw, db = normir.fused_add_layernorm_bwd(dy, h, w, mean, rstd, dh, has_bias=True,
                                                                    dx_dtype=x.dtype, dresidual_dtype=r.dtype,
                                                                    atomic=True)
            else:
                y, mean, rstd = normir.layernorm_fwd(x, w, b, LN_EPS, store_stats=True)
                h, dy, dh = x, torch.randn_like(y), None
                dx, dw, db = normir.layernorm_bwd(x, w, dy, mean, rstd, has_bias=True, atomic=True)
                dres = dx
            y_ref, h_ref, mean_ref, rstd_ref = layernorm_ref(x, w, b, LN_EPS, r)
            g_ref, dw_ref, db_ref = layernorm_bwd_ref(h_ref, w, b, LN_EPS, dy, dh)
            e = [err(y, y_ref), err(mean, mean_ref), err(rstd, rstd_ref), err(dx, g_ref), err(dres, g_ref),
                 err(dw, dw_ref), err(db, db_ref)]
            ok = all(v < 2e-2 for v in e) and torch.equal(h, h_ref)
            bad += not ok
            print(f"layernorm atomic n={n}{' residual ' + r_t if r_t else ''}: y mean rstd dx dres dw db "
                  + " ".join(f"{v:.2e}" for v in e) + (" ok" if ok else " FAIL"))
    return bad


def gradient_dtype_cases() -> int:
    """The backwards' dtype rule: dy and d_residual_out each in another float dtype than the row
    (gpu_cases.training_specializations' GRAD_DTYPE_N)."""
    bad = 0
    dts = (torch.float32, torch.float16, torch.bfloat16)
    for n in GRAD_DTYPE_N:
        for ht in dts:
            for gt in (t for t in dts if t != ht):
                yt = next(t for t in dts if t not in (ht, gt))
                h, w, b = torch.randn((37, n), device="cuda").to(ht), torch.randn(n, device="cuda").to(ht) + 1, \
                    torch.randn(n, device="cuda").to(ht)
                dy, g = torch.randn((37, n), device="cuda").to(yt), torch.randn((37, n), device="cuda").to(gt)
                _, rstd = normir.rmsnorm_fwd(h, w, store_rstd=True)
                dx, dw = normir.rmsnorm_bwd(h, w, g, rstd)
                e = [err(a, r) for a, r in zip((dx, dw), rmsnorm_bwd_ref(h, w, g, 1e-6))]
                _, _, rstd = normir.fused_add_rmsnorm_fwd(h, None, w, 1e-6, bias=b, store_rstd=True)
                got = normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, g, has_bias=True)
                e += [err(a, r) for a, r in zip(got, fused_add_rmsnorm_bwd_ref(h, w, b, 1e-6, 0.0, dy, g))]
                _, mean, rstd = normir.layernorm_fwd(h, w, b, LN_EPS, store_stats=True)
                got = normir.fused_add_layernorm_bwd(dy, h, w, mean, rstd, g, has_bias=True)
                e += [err(a, r) for a, r in zip(got, layernorm_bwd_ref(h, w, b, LN_EPS, dy, g))]
                ok = all(v < 2e-2 for v in e)
                bad += not ok
                print(f"gradient dtypes n={n} row {ht} dy {yt} g {gt}: " + " ".join(f"{v:.2e}" for v in e)
                      + (" ok" if ok else " FAIL"))
    return bad


def serving_cases() -> int:
    """The quantized forwards (static and dynamic, fp8 and int8, with the fused add) and the
    serving forms in place, at N of every layout (rows a warp, multi-warp rows with tails, one
    1024-thread row), each dequantized q against the float64 y (one quantization step)."""
    bad = 0
    S = normir.serving
    for n in SANITIZE_SERVING_N:
        x, r = torch.randn((37, n), device="cuda").bfloat16(), torch.randn((37, n), device="cuda").bfloat16()
        w, b = torch.randn(n, device="cuda").bfloat16() + 1, torch.randn(n, device="cuda").bfloat16()
        for fn, args, ref in ((normir.rmsnorm_quant, (x, w, 1e-6), fused_add_rmsnorm_ref(x, r, w, None, 1e-6)),
                              (normir.layernorm_quant, (x, w, b, LN_EPS), layernorm_ref(x, w, b, LN_EPS, r))):
            for quant in ("fp8", "int8"):
                for scale in (None, torch.tensor([0.02], device="cuda")):
                    q, s_ = fn(*args, quant=quant, scale=scale, residual=r)[:2]
                    e = err(q.float() * s_, ref[0])
                    ok = within_a_step(q, s_, ref[0], quant) or scale is not None
                    bad += not ok
                    print(f"{fn.__name__} n={n} {quant} {'static' if scale is not None else 'dynamic'}: "
                          f"dequantized {e:.2e} {'ok' if ok else 'FAIL'}")
        xi, ri = x.clone(), r.clone()
        S.fused_add_rms_norm(xi, ri, w, 1e-6)
        xl, rl = x.clone(), r.clone()
        S.fused_add_layer_norm(xl, rl, w, b, LN_EPS)
        out, scales = torch.empty((37, n), device="cuda", dtype=torch.int8), torch.empty((37, 1), device="cuda")
        rd = r.clone()
        S.rms_norm_dynamic_per_token_quant(out, x, w, scales, 1e-6, None, rd)
        y64 = fused_add_rmsnorm_ref(x, r, w, None, 1e-6)[0]
        e = (err(xi, y64), err(xl, layernorm_ref(x, w, b, LN_EPS, r)[0]), err(out.float() * scales, y64))
        ok = e[0] < 2e-2 and e[1] < 2e-2 and within_a_step(out, scales, y64, "int8") and torch.equal(ri, rd)
        bad += not ok
        print(f"serving in place n={n}: fused add rms {e[0]:.2e} layer {e[1]:.2e} dynamic int8 {e[2]:.2e} "
              f"{'ok' if ok else 'FAIL'}")
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
