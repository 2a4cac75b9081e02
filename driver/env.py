"""The one registry of environment variables normir reads. Nothing else calls os.environ."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str | Callable[[], str]  # a callable where the text is made from another table

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
SYSTEM_ROCM_PATH = EnvVar("ROCM_PATH", "", "ROCm's own install folder, the hsaco linker's toolkit after NORMIR_ROCM_PATH")
def _tpr_help() -> str:
    """NORMIR_TPR's help, from the knobs' table (options.KNOBS; imported on use: env loads first)."""
    from .options import KNOBS

    letters = ", ".join(f"{k.tpr} {k.name} ({k.help})" for k in KNOBS[1:])
    return ("tuning: layouts forced per kernel and N, comma-separated KERNEL:N=TPR items (threads per row, 0: the "
            "policy's) followed by knobs, each a letter and a value in this order: " + letters
            + "; and v, a narrower vector (elements), after h. E.g. 'rmsnorm_fwd:65536=512x2p0,rmsnorm_bwd:16384=512s1h3'")


TPR = EnvVar("NORMIR_TPR", "", _tpr_help)
TARGET = EnvVar("NORMIR_TARGET", "", "override the target chip picked from the torch device (e.g. sm_90)")
INCLUDE = EnvVar(
    "NORMIR_INCLUDE", "",
    "folders searched before the package for kernel templates and spliced pieces (paths relative to "
    "mlir/, e.g. common/row_sum.mlir), separated by os.pathsep; `normir compile --include` adds more",
)

PDL = EnvVar(
    "NORMIR_PDL", "1",
    "1: the serving forms and quantized forwards (normir.serving, rmsnorm_quant, layernorm_quant) launch with "
    "programmatic dependent launch where the GPU has it (sm_90+), unless a call passes enable_pdl=False; 0: plain "
    "launches. Results are bitwise equal either way",
)

ALL = (CACHE_DIR, AOT_DIRS, DUMP_DIR, INCLUDE, ROCM_PATH, SYSTEM_ROCM_PATH, PTXAS, NO_COMPILE, TPR, TARGET, PDL)


def describe() -> str:
    """Each variable: the value in effect, where it came from, the default and what it does."""
    return "\n".join(f"{v.name}={v.get()!r} ({v.source()}; default {v.default!r})\n    "
                     + (v.help() if callable(v.help) else v.help) for v in ALL)
