"""Profile target for ncu: normir's op and torch.compile's side by side at the given N (bf16,
M*N = 2^27, bench.py's inputs and setups), warmed up first; the profiled calls sit inside the NVTX
range "measure".

    ncu --nvtx --nvtx-include "measure/" --clock-control none --section SpeedOfLight \
        python3 scripts/ncu_ops.py ln_fwd 32768 [N ...]
"""

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench  # noqa: E402

op, ns = sys.argv[1], [int(n) for n in sys.argv[2:]]
if op not in bench.OPS or not ns:
    sys.exit(f"usage: ncu_ops.py OP N [N ...] with OP one of {', '.join(bench.OPS)}")
provs = {p.name: p for p in bench.load_normir() + bench.load_compile()}
for n in ns:
    t = bench.inputs((1 << 27) // n, n, torch.bfloat16)
    calls = {name: provs[name].ops[op](t) for name in ("normir", "compile")}
    for call in calls.values():
        for _ in range(3):
            call()  # compiles, autotunes, loads
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("measure")
    for name in ("normir", "compile") * 2:
        calls[name]()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
