"""Time layout variants (threads per row) of the RMSNorm kernels side by side on one GPU.

    python scripts/tune.py plan        # print the variants' Options (for `normir aot`)
    python scripts/tune.py run         # on the GPU: GB/s per variant, M*N = 2^27, bf16

Each variant is a NORMIR_TPR setting; 0 is the layout policy's own choice.
"""

from __future__ import annotations

import json
import os
import sys

VARIANTS = {  # (op, N): thread-per-row choices to compare (0: the policy's own)
    ("fwd", 1024): (0, 64),
    ("fwd", 4096): (0, 256, 512),
    ("fwd", 8192): (0, 512, 1024),
    ("fwd", 16384): (0, 512, 1024),
    ("fwd", 32768): (0, 1024),
    ("fwd", 65536): (0, 512),
    ("bwd", 1024): (0, 128),
    ("bwd", 2048): (0, 256),
    ("bwd", 2880): (0, 192),
    ("bwd", 4096): (0, 256),
    ("bwd", 7168): (0, 448),
    ("bwd", 8192): (0, 512),
    ("bwd", 16384): (0, 1024),
    ("bwd", 32768): (0, 1024),
}
KERNEL = {"fwd": "rmsnorm_fwd", "bwd": "rmsnorm_bwd"}


def plan() -> list[dict]:
    from normir.ops.rmsnorm import BWD_KEY_EPS
    from normir.specialize import max_vec

    out = []
    for (op, n), tprs in VARIANTS.items():
        for tpr in tprs:
            if op == "fwd":
                for store in (False, True):
                    out.append(dict(kernel="rmsnorm_fwd", n=n, dtype="bf16", wdtype="bf16", eps=1e-6, target="sm_90",
                                    store_rstd=store, vec=max_vec(n, 2), tpr=tpr))
            else:
                out.append(dict(kernel="rmsnorm_bwd", n=n, dtype="bf16", wdtype="bf16", eps=BWD_KEY_EPS,
                                target="sm_90", vec=max_vec(n, 2), tpr=tpr))
                out.append(dict(kernel="rmsnorm_fwd", n=n, dtype="bf16", wdtype="bf16", eps=1e-6, target="sm_90",
                                store_rstd=True, vec=max_vec(n, 2)))
    return out


def run() -> None:
    import torch
    from triton.testing import do_bench

    import normir
    from normir import launch

    results = []
    for (op, n), tprs in VARIANTS.items():
        torch.cuda.empty_cache()
        m = (1 << 27) // n
        x = torch.randn((m, n), device="cuda").bfloat16()
        w = torch.randn(n, device="cuda").bfloat16()
        dy = torch.randn_like(x)
        row = []
        for tpr in tprs:
            os.environ["NORMIR_TPR"] = f"{KERNEL[op]}:{n}={tpr}" if tpr else ""
            launch.clear_handles()
            if op == "fwd":
                fn = lambda x=x, w=w: normir.rmsnorm_fwd(x, w, 1e-6)  # noqa: E731
                nbytes = 2 * m * n * 2
            else:
                _, rstd = normir.rmsnorm_fwd(x, w, 1e-6, store_rstd=True)
                fn = lambda x=x, w=w, dy=dy, rstd=rstd: normir.rmsnorm_bwd(x, w, dy, rstd)  # noqa: E731
                nbytes = 3 * m * n * 2
            ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
            _, lay = launch.handle(KERNEL[op], 0, n, "bf16", "bf16", 1e-6, True, False, 8)
            gbs = nbytes / ms / 1e6
            row.append(f"tpr={tpr or 'auto'}({lay.tpr},k{lay.k},{'regs' if lay.cache_row else 'stream'}"
                       f"{',dw' if lay.dw_regs else ''}) {gbs:.0f}")
            results.append(dict(op=op, n=n, tpr=tpr, layout_tpr=lay.tpr, k=lay.k, gbs=gbs))
        print(f"{op} {m}x{n}: " + " | ".join(row), flush=True)
    os.environ["NORMIR_TPR"] = ""
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "tune.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1:] == ["plan"]:
        print(json.dumps(plan()))
    else:
        run()
