"""Profile target for ncu: normir's forward and torch.compile's side by side at the given N
(bf16, M*N = 2^27), warmed up first; the profiled calls sit inside the NVTX range "measure".

    ncu --nvtx --nvtx-include "measure/" --section SpeedOfLight python3 scripts/ncu_fwd.py 7168 8192
"""

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench  # noqa: E402

provs = {p.name: p for p in bench.load_normir() + bench.load_compile()}
for n in map(int, sys.argv[1:]):
    x = torch.randn((1 << 27) // n, n, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, device="cuda").to(torch.bfloat16)
    for name in ("normir", "compile"):
        for _ in range(3):
            provs[name].fwd(x, w, bench.EPS)  # compiles, autotunes, loads
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("measure")
    for name in ("normir", "compile") * 2:
        provs[name].fwd(x, w, bench.EPS)
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
