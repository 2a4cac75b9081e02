"""How long the kernel author's loop takes on this machine: one `normir compile ... --emit isa` per
target (the median of a few runs of the command, process start included) and the whole lit suite.
Measures and prints; asserts nothing.

    python3 scripts/author_loop_timing.py [--runs 5] [--no-lit]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def normir_command() -> list[str]:
    """The console script next to this Python (as a user runs it), else `python -m normir.cli`."""
    script = Path(sys.executable).parent / "normir"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "normir.cli"]


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--no-lit", action="store_true")
    a = p.parse_args()
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    for target in ("sm_90", "gfx950"):
        cmd = [*normir_command(), "compile", "mlir/norm_fwd.mlir", "--target", target, "--n", "7168",
               "--dtype", "bf16", "--emit", "isa"]
        times = [timed(cmd) for _ in range(a.runs)]
        print(f"normir compile --target {target} --emit isa: median {statistics.median(times):.2f} s "
              f"(min {min(times):.2f}, max {max(times):.2f}, {a.runs} runs)")
    if not a.no_lit:
        lit = Path(sys.executable).parent / "lit"
        t = timed([str(lit) if lit.is_file() else "lit", "-s", "lit_tests"])
        print(f"lit suite: {t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
