"""Time layout variants (threads per row) of the RMSNorm kernels (fwd, bwd), the fused
residual add's (add_fwd, add_bwd: residual in x's type, d_residual_out given) and LayerNorm's
(ln_fwd, ln_bwd: a weight and a bias, eps 1e-5; add_ln_fwd, add_ln_bwd: its fused add, the
residual in x's type, d_residual_out given) side by side on one GPU.

    python scripts/tune.py plan        # print the variants' problems and knobs (for `normir aot`)
    python scripts/tune.py run         # on the GPU: GB/s per variant, M*N = 2^27, bf16
    PLACEMENTS=3 python scripts/tune.py run   # each variant on 3 tensor placements
    REF_DIR=/tmp/ref python scripts/tune.py run   # also the policy's outputs against the first run's
                                                  # (two builds of the templates: NORMIR_INCLUDE)

Each variant is a NORMIR_TPR setting; "0" is the layout policy's own choice. For the backward the
policy's layout is also timed without a weight (no dw sums, no reduction kernel; LayerNorm's also
without a bias: no db sums), which shows what the column sums cost; LayerNorm's forward without a
weight and a bias, which shows what reading them costs.
"""

from __future__ import annotations

import json
import os
import sys

VARIANTS = {  # (op, N, dtype): layouts to compare, as NORMIR_TPR values ("0": the policy's)
    # v170: LayerNorm's forward at 65536 in 16-byte chunks without w's and b's early chunks, with x
    # kept in shared memory between the passes (build B, v169's +1.5%) or in registers (build 0);
    # templates from NORMIR_INCLUDE, not committed.
    ("ln_fwd", 65536, "bf16"): ("0", "0o0", "256x4m4v8o0", "256x4m3v8o0", "128x8m8v8o0", "128x8m6v8o0", "512x2m2v8o0"),
}
KERNEL = {"fwd": "rmsnorm_fwd", "bwd": "rmsnorm_bwd", "add_fwd": "fused_add_rmsnorm_fwd",
          "add_bwd": "fused_add_rmsnorm_bwd", "ln_fwd": "layernorm_fwd", "ln_bwd": "layernorm_bwd",
          "add_ln_fwd": "layernorm_fwd", "add_ln_bwd": "layernorm_bwd"}
# The fused kernels' feature options (the bf16 residual, d_residual_out; LayerNorm's bias, whose
# column sums the backward keeps in fp32) as the Problem's fields.
EXTRA = {"add_fwd": (("rdtype", "bf16"), ("store_residual", True)), "add_bwd": (("has_dres_out", True),),
         "ln_fwd": (("bdtype", "bf16"),), "ln_bwd": (("bdtype", "f32"),),
         "add_ln_bwd": (("bdtype", "f32"), ("has_dres_out", True)),
         "add_ln_fwd": (("rdtype", "bf16"), ("sdtype", "bf16"), ("bdtype", "bf16"), ("store_residual", True))}
BYTES = {"fwd": 2, "bwd": 3, "add_fwd": 4, "add_bwd": 4, "ln_fwd": 2, "ln_bwd": 3, "add_ln_fwd": 4, "add_ln_bwd": 4}
EPS, LN_EPS = 1e-6, 1e-5  # RMSNorm's and LayerNorm's (a backward's kernel is keyed on BWD_KEY_EPS)


def _parse(variant: str) -> dict[str, int]:
    from normir.launch import tpr_overrides

    os.environ["NORMIR_TPR"] = f"k:1={variant}"
    try:
        return tpr_overrides()[("k", 1)]
    finally:
        os.environ["NORMIR_TPR"] = ""


def plan() -> list[dict]:
    from normir.layout import DTYPES, max_vec
    from normir.ops._rows import BWD_KEY_EPS

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from gpu_cases import fused_bwd, fused_fwd

    out = []
    for (op, n, dt), variants in VARIANTS.items():
        for variant in variants:
            knobs = _parse(variant)
            vec = min(max_vec(n, DTYPES[dt]), knobs.pop("vec", 64))
            if op == "add_fwd":
                out += [{**fused_fwd(n, dt, dt, store_rstd=s, vec=vec), **knobs} for s in (False, True)]
                continue
            if op == "add_bwd":
                out += [{**d, **knobs} if d["kernel"] != "rmsnorm_dw_reduce" else d
                        for d in fused_bwd(n, dt, dt, vec=vec)] + [fused_fwd(n, dt, dt, vec=vec)]
                continue
            if op in ("ln_fwd", "ln_bwd", "add_ln_fwd", "add_ln_bwd"):
                out += _ln_plan(op, n, dt, vec, knobs)
                continue
            fwd = dict(kernel="rmsnorm_fwd", n=n, dtype=dt, wdtype=dt, eps=1e-6, target="sm_90", vec=vec)
            if op == "fwd":
                out += [{**fwd, **knobs, "store_rstd": False}, {**fwd, **knobs, "store_rstd": True}]
            else:
                bwd = dict(kernel="rmsnorm_bwd", n=n, dtype=dt, wdtype=dt, eps=BWD_KEY_EPS,
                           target="sm_90", vec=vec, **knobs)
                out += [bwd, {**bwd, "has_weight": False}]
                out.append(dict(kernel="rmsnorm_dw_reduce", n=n, dtype="f32", wdtype=dt, eps=BWD_KEY_EPS,
                                target="sm_90", vec=max_vec(n, 4)))
                out.append({**fwd, "store_rstd": True})
    return out


def _ln_plan(op: str, n: int, dt: str, vec: int, knobs: dict) -> list[dict]:
    """LayerNorm's specializations for one variant (a weight and a bias of x's type): the forward
    without and with mean and rstd stored; or the backward with dw and db (the column sums of both
    in the weight's type) and without either, and the forward that feeds it (the policy's)."""
    from normir.layout import max_vec
    from normir.ops._rows import BWD_KEY_EPS

    fwd = dict(kernel="layernorm_fwd", n=n, dtype=dt, wdtype=dt, eps=LN_EPS, target="sm_90", vec=vec, bdtype=dt)
    if op == "add_ln_fwd":  # the residual in x's type, residual_out stored, no statistics
        return [{**fwd, **knobs, "rdtype": dt, "sdtype": dt, "store_residual": True, "store_rstd": False}]
    if op == "ln_fwd":  # also without a weight and a bias (what reading them costs)
        return [{**fwd, **knobs, "store_rstd": False}, {**fwd, **knobs, "store_rstd": True},
                {**fwd, **knobs, "store_rstd": False, "has_weight": False, "bdtype": ""}]
    bwd = dict(kernel="layernorm_bwd", n=n, dtype=dt, wdtype=dt, eps=BWD_KEY_EPS, target="sm_90", vec=vec,
               bdtype="f32", **knobs)
    sums = dict(kernel="rmsnorm_dw_reduce", n=n, dtype="f32", wdtype=dt, eps=BWD_KEY_EPS, target="sm_90",
                vec=max_vec(n, 4))  # dw's and db's column sums in one launch, or dw's alone
    if op == "add_ln_bwd":  # d_residual_out read; the forward stores residual_out and the statistics
        return [{**bwd, "has_dres_out": True}, {**sums, "bdtype": dt},
                {**fwd, "rdtype": dt, "sdtype": dt, "store_residual": True, "store_rstd": True}]
    return [bwd, {**bwd, "has_weight": False, "bdtype": ""}, {**sums, "bdtype": dt}, {**fwd, "store_rstd": True}]


def _outputs(normir, op: str, x, w, dy, bias) -> tuple:
    if op == "ln_fwd":
        return (normir.layernorm_fwd(x, w, bias, LN_EPS)[0],)
    if op == "add_ln_fwd":
        return normir.fused_add_layernorm_fwd(x, dy, w, bias, LN_EPS)[:2]  # dy stands in for the residual
    if op == "ln_bwd":
        _, mean, rstd = normir.layernorm_fwd(x, w, bias, LN_EPS, store_stats=True)
        return normir.layernorm_bwd(x, w, dy, mean, rstd, has_bias=True)
    if op == "add_ln_bwd":  # dy stands in for the residual, x for d_residual_out
        _, h, mean, rstd = normir.fused_add_layernorm_fwd(x, dy, w, bias, LN_EPS, store_stats=True)
        return normir.fused_add_layernorm_bwd(dy, h, w, mean, rstd, x, has_bias=True)
    if op == "fwd":
        return (normir.rmsnorm_fwd(x, w, 1e-6)[0],)
    if op == "add_fwd":
        return normir.fused_add_rmsnorm_fwd(x, dy, w, 1e-6)[:2]  # dy stands in for the residual
    if op == "add_bwd":
        _, h, rstd = normir.fused_add_rmsnorm_fwd(x, dy, w, 1e-6, store_rstd=True)
        return normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, x)[:2]  # x stands in for d_residual_out
    _, rstd = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=True)
    return normir.rmsnorm_bwd(x, w, dy, rstd)


def _timed(normir, op: str, x, w, dy, bias) -> dict:
    """The calls to time for one placement: {tag: fn}."""
    if op == "ln_fwd":
        return {"": lambda: normir.layernorm_fwd(x, w, bias, LN_EPS),
                "no-wb": lambda: normir.layernorm_fwd(x, None, None, LN_EPS)}
    if op == "add_ln_fwd":
        return {"": lambda: normir.fused_add_layernorm_fwd(x, dy, w, bias, LN_EPS)}
    if op == "ln_bwd":
        _, mean, rstd = normir.layernorm_fwd(x, w, bias, LN_EPS, store_stats=True)
        return {"": lambda: normir.layernorm_bwd(x, w, dy, mean, rstd, has_bias=True),
                "no-w": lambda: normir.layernorm_bwd(x, None, dy, mean, rstd)}
    if op == "add_ln_bwd":
        _, h, mean, rstd = normir.fused_add_layernorm_fwd(x, dy, w, bias, LN_EPS, store_stats=True)
        return {"": lambda: normir.fused_add_layernorm_bwd(dy, h, w, mean, rstd, x, has_bias=True)}
    if op == "fwd":
        return {"": lambda: normir.rmsnorm_fwd(x, w, 1e-6)}
    if op == "add_fwd":
        return {"": lambda: normir.fused_add_rmsnorm_fwd(x, dy, w, 1e-6)}
    if op == "add_bwd":
        _, h, rstd = normir.fused_add_rmsnorm_fwd(x, dy, w, 1e-6, store_rstd=True)
        return {"": lambda: normir.fused_add_rmsnorm_bwd(dy, h, w, rstd, x)}
    _, rstd = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=True)
    return {"": lambda: normir.rmsnorm_bwd(x, w, dy, rstd),
            "no-w": lambda: normir.rmsnorm_bwd(x, None, dy, rstd)}


def _placements(m: int, n: int, tdt, count: int) -> list[tuple]:
    """count (x, w, dy, bias) sets (the bias: LayerNorm's), with spacers of odd sizes between them
    so that each pair of x and dy sits at a different offset: some backward layouts are fast or
    slow by where the tensors sit (docs/results/*16384-address-probe*), so a variant is timed at
    several."""
    import torch

    sets, spacers = [], []
    for i in range(count):
        if i:
            spacers.append(torch.empty((3, 7, 1, 10, 5, 2, 9)[(i - 1) % 7] << 20, dtype=torch.uint8, device="cuda"))
        x = torch.randn((m, n), device="cuda").to(tdt)
        dy = torch.randn_like(x)
        sets.append((x, torch.randn(n, device="cuda").to(tdt), dy, torch.randn(n, device="cuda").to(tdt)))
    return sets


def run() -> None:
    import torch
    from triton.testing import do_bench

    import normir
    from normir import launch
    from normir.options import Problem

    count = int(os.environ.get("PLACEMENTS", "1"))
    results = []
    for (op, n, dt), variants in VARIANTS.items():
        torch.cuda.empty_cache()
        m = (1 << 27) // n
        tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dt]
        torch.manual_seed(n)  # the same inputs in every run: REF_DIR compares builds
        sets = _placements(m, n, tdt, count)
        seen: dict[str, list[str]] = {}
        labels: dict[str, str] = {}
        # Each variant's outputs against the policy's: "=" bit-identical, else the largest difference
        # (a different reduction order may change the last bits; a broken variant shows here).
        os.environ["NORMIR_TPR"] = ""
        launch.clear_handles()
        ref = _outputs(normir, op, *sets[0])
        diffs: dict[str, str] = {}
        # REF_DIR: the policy's outputs against those of the first build run with the same
        # directory (two builds of the templates, NORMIR_INCLUDE), saved there on the first.
        ref_dir = os.environ.get("REF_DIR")
        if ref_dir:
            path = os.path.join(ref_dir, f"{op}-{n}-{dt}.pt")
            if os.path.exists(path):
                first = torch.load(path)
                diffs["build"] = "=" if all(torch.equal(a, b) for a, b in zip(ref, first)) else "max diff " + "/".join(
                    f"{(a.float() - b.float()).abs().max().item():.2g}" for a, b in zip(ref, first))
            else:
                os.makedirs(ref_dir, exist_ok=True)
                torch.save(list(ref), path)
        # Two rounds, the second in reverse order, so that neither order nor drift favours a variant.
        for order in (list(variants), list(reversed(variants))):
            for variant in order:
                os.environ["NORMIR_TPR"] = "" if variant == "0" else f"{KERNEL[op]}:{n}={variant}"
                launch.clear_handles()
                nbytes = BYTES[op] * m * n * sets[0][0].element_size()
                eps = LN_EPS if op in ("ln_fwd", "add_ln_fwd") else EPS  # EPS is BWD_KEY_EPS too
                try:  # a layout the driver refuses (a non-portable cluster) is reported, not fatal
                    h, lay = launch.handle(Problem(kernel=KERNEL[op], n=n, dtype=dt, wdtype=dt, eps=eps,
                                                   vec=16 // sets[0][0].element_size(), **dict(EXTRA.get(op, ()))), 0)
                    got = _outputs(normir, op, *sets[0])
                except (RuntimeError, ValueError) as e:
                    diffs[variant] = f"failed: {e}"
                    continue
                same = all(torch.equal(a, b) for a, b in zip(got, ref))
                diffs[variant] = "=" if same else "max diff " + "/".join(
                    f"{(a.float() - b.float()).abs().max().item():.2g}" for a, b in zip(got, ref))
                per: dict[str, list[float]] = {}
                for p, (x, w, dy, bias) in enumerate(sets):
                    for tag, fn in _timed(normir, op, x, w, dy, bias).items():
                        try:
                            fn()
                        except ValueError:  # the knobs do not apply without w (and b)
                            continue
                        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                        per.setdefault(variant + tag, []).append(nbytes / ms / 1e6)
                        labels[variant + tag] = (
                            f"({lay.tpr}x{lay.cluster},k{lay.k},{'regs' if lay.cache_row else 'stream'}"
                            f"{',dw' if lay.dw_regs else ''}{',pf' if lay.l2_prefetch else ''}"
                            f"{',stage' if lay.stage else ''},res{h.resident(132)})")
                        results.append(dict(op=op, n=n, dtype=dt, variant=variant + tag, layout_tpr=lay.tpr,
                                            cluster=lay.cluster, l2_prefetch=lay.l2_prefetch, stage=lay.stage,
                                            k=lay.k, placement=p, x_mib=x.data_ptr() >> 20,
                                            dy_mib=dy.data_ptr() >> 20, us=ms * 1e3, gbs=nbytes / ms / 1e6))
                for key, gs in per.items():
                    seen.setdefault(key, []).append(",".join(f"{g:.0f}" for g in gs))
        row = [f"{v}{labels[v]} {' / '.join(gs)}" for v, gs in seen.items()]
        row.append("outputs vs policy: " + ", ".join(f"{v} {d}" for v, d in diffs.items()))
        print(f"{op} {dt} {m}x{n}: " + " | ".join(row), flush=True)
        del sets
    os.environ["NORMIR_TPR"] = ""
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "tune.json"), "w") as f:
        json.dump(results, f, indent=1)


def _valid(specs: list[dict]) -> list[dict]:
    """The specializations that build (a variant's knobs may not apply to the
    policy's no-weight layout: that timing is skipped at run time)."""
    from normir.options import build

    out = []
    for d in specs:
        try:
            build(**d)  # decides the layout: a knob that does not apply raises
        except ValueError:
            continue
        out.append(d)
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["plan"]:
        print(json.dumps(_valid(plan())))
    else:
        run()
