"""The one registry of environment variables normir reads. Nothing else calls os.environ."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str

    def get(self) -> str:
        return os.environ.get(self.name, self.default)

    def source(self) -> str:
        """Where the value in effect comes from."""
        return "environment" if self.name in os.environ else "default"


CACHE_DIR = EnvVar(
    "NORMIR_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "normir"),
    "on-disk cache of compiled kernels (read and written)",
)
AOT_DIRS = EnvVar(
    "NORMIR_AOT_DIRS", "",
    "extra read-only cache folders made by `normir aot`, separated by os.pathsep; searched first",
)
DUMP_DIR = EnvVar(
    "NORMIR_DUMP_DIR", "",
    "when set, every compile writes its numbered stage files (00_input.mlir, ...) below this folder",
)
ROCM_PATH = EnvVar(
    "NORMIR_ROCM_PATH", "",
    "toolkit folder for gfx hsaco linking (needs llvm/bin/ld.lld); else ROCM_PATH, /opt/rocm, "
    "or the Debian lld-22 that scripts/setup.sh installs",
)
PTXAS = EnvVar("NORMIR_PTXAS", "", "ptxas to make cubins; else the one on PATH; without one, PTX")
NO_COMPILE = EnvVar(
    "NORMIR_NO_COMPILE", "0",
    "1: never compile at run time; a kernel missing from the caches is an error (AOT deployments)",
)
TPR = EnvVar(
    "NORMIR_TPR", "",
    "tuning: threads per row, optionally blocks per row (a cluster, up to 8; 16 on sm_90, a "
    "non-portable size) after an x, the L2 prefetch "
    "(p1 on, p0 off), shared-memory staging (s1, s0), blocks per multiprocessor the registers must "
    "allow (m2), cache hints (h0-h55, see Options.hints), a narrower vector (v4: elements), the "
    "backward's chunks loaded inside the cluster exchange or a held forward's w and b before its "
    "reductions (o2), the row held in registers (r1) "
    "or re-read (r0), the forward's pass 2 loading all its chunks first (b1) or not (b0), and "
    "the backward's db sums in shared memory (d1; d2 in conflict-free quarters; d3 dw's too) or "
    "registers (d0), a cap on a thread's registers (n64: NVVM maxnreg), and pass 2's bf16 casts by "
    "32-bit words (w1) or element by element (w0), LayerNorm's held forward's variance by a "
    "second pass (t1) or Chan's merges (t0), a backward's d_residual_out copied into shared memory "
    "in pass 1 (g1) or loaded in pass 2 (g0), for given kernels and N, e.g. "
    "'rmsnorm_fwd:65536=512x2p0,rmsnorm_bwd:16384=512s1h3' (0 keeps the policy's)",
)
TARGET = EnvVar("NORMIR_TARGET", "", "override the target chip picked from the torch device (e.g. sm_90)")
INCLUDE = EnvVar(
    "NORMIR_INCLUDE", "",
    "folders searched before the package for kernel templates and spliced pieces (paths relative to "
    "mlir/, e.g. common/row_sum.mlir), separated by os.pathsep; `normir compile --include` adds more",
)

ALL = (CACHE_DIR, AOT_DIRS, DUMP_DIR, INCLUDE, ROCM_PATH, PTXAS, NO_COMPILE, TPR, TARGET)


def describe() -> str:
    """Each variable: the value in effect, where it came from, the default and what it does."""
    return "\n".join(f"{v.name}={v.get()!r} ({v.source()}; default {v.default!r})\n    {v.help}" for v in ALL)
