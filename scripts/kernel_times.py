"""Each normir op's kernels on the GPU's timeline (torch.profiler, 20 calls after 5 warm-up ones,
medians; bench.py's inputs, bf16, M*N = 2^27): the row kernel's time, the column sums' kernel's
and the gap between them. Where the benchmark's per-call time goes beyond the row kernel.

    python3 scripts/kernel_times.py bwd,ln_bwd 1024,4096,65536
"""

import statistics as st
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench  # noqa: E402

CALLS = 20

if len(sys.argv) != 3:
    sys.exit(f"usage: kernel_times.py OP[,OP...] N[,N...] with OP one of {', '.join(bench.OPS)}")
provs = {p.name: p for p in bench.load_normir()}
for op in sys.argv[1].split(","):
    for n in [int(v) for v in sys.argv[2].split(",")]:
        t = bench.inputs((1 << 27) // n, n, torch.bfloat16)
        call = provs["normir"].ops[op](t)
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                call()
            torch.cuda.synchronize()
        kernels = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                          if e.device_type.name == "CUDA"), key=lambda k: k[1])
        rowk = [k[2] - k[1] for k in kernels if "reduce" not in k[0]]
        sums = [k[2] - k[1] for k in kernels if "reduce" in k[0]]
        gaps = [b[1] - a[2] for a, b in zip(kernels, kernels[1:]) if "reduce" in b[0]]
        print(f"{op} {n}: {len(kernels) / CALLS:g} kernels a call; row kernel {st.median(rowk):.1f} us, column sums "
              f"{st.median(sums) if sums else 0:.1f} us ({len(sums) / CALLS:g} a call), gap before them "
              f"{st.median(gaps) if gaps else 0:.1f} us", flush=True)
