"""Time layout variants (threads per row) of the RMSNorm kernels side by side on one GPU.

    python scripts/tune.py plan        # print the variants' Options (for `normir aot`)
    python scripts/tune.py run         # on the GPU: GB/s per variant, M*N = 2^27, bf16

Each variant is a NORMIR_TPR setting; 0 is the layout policy's own choice. For the backward the
policy's layout is also timed without a weight (no dw sums, no reduction kernel), which shows
what the dw work costs.
"""

from __future__ import annotations

import json
import os
import sys

VARIANTS = {  # (op, N, dtype): layouts to compare, as NORMIR_TPR values ("0": the policy's)
    ("fwd", 8192, "bf16"): ("0", "0s1"),
    ("fwd", 16384, "bf16"): ("0", "0s0"),
    ("fwd", 32768, "bf16"): ("0", "0s0"),
    ("fwd", 65536, "bf16"): ("0", "0s0"),
    ("fwd", 65536, "f32"): ("0", "0s1"),
    ("bwd", 2880, "bf16"): ("0", "0s1"),
    ("bwd", 7168, "bf16"): ("0", "0s0"),
    ("bwd", 16384, "bf16"): ("0", "0s0"),
    ("bwd", 32768, "bf16"): ("0", "0s1", "1024x2"),
    ("bwd", 65536, "bf16"): ("0", "0s1"),
}
KERNEL = {"fwd": "rmsnorm_fwd", "bwd": "rmsnorm_bwd"}


def _parse(variant: str) -> tuple[int, int, int, int]:
    from normir.launch import tpr_overrides

    os.environ["NORMIR_TPR"] = f"k:1={variant}"
    try:
        return tpr_overrides()[("k", 1)]
    finally:
        os.environ["NORMIR_TPR"] = ""


def plan() -> list[dict]:
    from normir.ops.rmsnorm import BWD_KEY_EPS
    from normir.specialize import DTYPES, max_vec

    out = []
    for (op, n, dt), variants in VARIANTS.items():
        for variant in variants:
            tpr, cluster, l2, stage = _parse(variant)
            vec = max_vec(n, DTYPES[dt])
            fwd = dict(kernel="rmsnorm_fwd", n=n, dtype=dt, wdtype=dt, eps=1e-6, target="sm_90",
                       vec=vec, tpr=tpr, cluster=cluster, l2_prefetch=l2 if op == "bwd" else -1, stage=stage)
            if op == "fwd":
                out += [{**fwd, "store_rstd": False}, {**fwd, "store_rstd": True}]
            else:
                bwd = dict(kernel="rmsnorm_bwd", n=n, dtype=dt, wdtype=dt, eps=BWD_KEY_EPS,
                           target="sm_90", vec=vec, tpr=tpr, cluster=cluster, l2_prefetch=l2, stage=stage)
                out += [bwd, {**bwd, "has_weight": False}]
                out.append({**fwd, "store_rstd": True, "tpr": 0, "cluster": 0, "l2_prefetch": -1, "stage": -1})
    return out


def run() -> None:
    import torch
    from triton.testing import do_bench

    import normir
    from normir import launch

    results = []
    for (op, n, dt), variants in VARIANTS.items():
        torch.cuda.empty_cache()
        m = (1 << 27) // n
        tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dt]
        x = torch.randn((m, n), device="cuda").to(tdt)
        w = torch.randn(n, device="cuda").to(tdt)
        dy = torch.randn_like(x)
        seen: dict[str, list[float]] = {}
        labels: dict[str, str] = {}
        # Two rounds, the second in reverse order, so that neither order nor drift favours a variant.
        for order in (list(variants), list(reversed(variants))):
            for variant in order:
                os.environ["NORMIR_TPR"] = "" if variant == "0" else f"{KERNEL[op]}:{n}={variant}"
                launch.clear_handles()
                _, rstd = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=True)
                if op == "fwd":
                    timed = {"": lambda x=x, w=w: normir.rmsnorm_fwd(x, w, 1e-6)}
                else:
                    timed = {"": lambda x=x, w=w, dy=dy, rstd=rstd: normir.rmsnorm_bwd(x, w, dy, rstd)}
                    if variant == "0":
                        timed["no-w"] = lambda x=x, dy=dy, rstd=rstd: normir.rmsnorm_bwd(x, None, dy, rstd)
                nbytes = (2 if op == "fwd" else 3) * m * n * x.element_size()
                h, lay = launch.handle(KERNEL[op], 0, n, dt, dt, 1e-6, True, False, 16 // x.element_size())
                for tag, fn in timed.items():
                    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    seen.setdefault(variant + tag, []).append(nbytes / ms / 1e6)
                    labels[variant + tag] = (
                        f"({lay.tpr}x{lay.cluster},k{lay.k},{'regs' if lay.cache_row else 'stream'}"
                        f"{',dw' if lay.dw_regs else ''}{',pf' if lay.l2_prefetch else ''}"
                        f"{',stage' if lay.stage else ''},res{h.resident(132)})")
                    results.append(dict(op=op, n=n, dtype=dt, variant=variant + tag, layout_tpr=lay.tpr,
                                        cluster=lay.cluster, l2_prefetch=lay.l2_prefetch, stage=lay.stage,
                                        k=lay.k, us=ms * 1e3, gbs=nbytes / ms / 1e6))
        row = [f"{v}{labels[v]} {'/'.join(f'{g:.0f}' for g in gs)}" for v, gs in seen.items()]
        print(f"{op} {dt} {m}x{n}: " + " | ".join(row), flush=True)
    os.environ["NORMIR_TPR"] = ""
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "tune.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1:] == ["plan"]:
        print(json.dumps(plan()))
    else:
        run()
