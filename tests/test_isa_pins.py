"""RMSNorm's compiled code, pinned: the sha256 of the sm_90 PTX and the gfx950 ISA of the
specializations below, with the kernel's entry name normalized. These kernels were measured on
the H200 (forward at the copy ceiling, backward at 89-96% of it); a change that moves any of these
hashes changes the code the benchmark measured. Such a change needs the benchmark run beside the
peers (scripts/bench.py on the H200, committed under docs/results/); then write the new hashes
with `python3 scripts/pin_isa.py --write` and say in the commit which run backs them.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from normir import compiler, targets
from normir.kernels import KERNELS
from normir.options import build
from normir.specialize import specialize_source

pytestmark = pytest.mark.cpu

PINS = Path(__file__).resolve().parent / "isa_pins.json"

# (name, Options fields): each a layout path of the policy (see specialize's layout functions).
SPECS = {
    "fwd-1024": dict(kernel="rmsnorm_fwd", n=1024),  # streamed, 2 warps x 2 chunks
    "fwd-2880-rstd": dict(kernel="rmsnorm_fwd", n=2880, store_rstd=True),  # streamed, tail, rstd stored
    "fwd-4096-nw": dict(kernel="rmsnorm_fwd", n=4096, has_weight=False),  # no weight
    "fwd-7168": dict(kernel="rmsnorm_fwd", n=7168),
    "fwd-16384": dict(kernel="rmsnorm_fwd", n=16384),  # 4 chunks, batched pass 2
    "fwd-32768": dict(kernel="rmsnorm_fwd", n=32768),  # 1024 threads x 4
    "fwd-65536": dict(kernel="rmsnorm_fwd", n=65536),  # 4-block cluster, pushes, 8-byte chunks
    "fwd-131072": dict(kernel="rmsnorm_fwd", n=131072),  # re-read over a cluster
    "fwd-100-f16": dict(kernel="rmsnorm_fwd", n=100, dtype="f16", wdtype="f16"),  # rows per block, vec 4
    "fwd-8192-f32w": dict(kernel="rmsnorm_fwd", n=8192, dtype="f16", wdtype="f32"),  # f32 weight
    "fwd-512": dict(kernel="rmsnorm_fwd", n=512),  # held in registers, several rows per block
    "bwd-1024": dict(kernel="rmsnorm_bwd", n=1024),  # held in registers
    "bwd-2880": dict(kernel="rmsnorm_bwd", n=2880),  # re-read with hints and the L2 prefetch
    "bwd-4096-nw": dict(kernel="rmsnorm_bwd", n=4096, has_weight=False),  # no weight: held, hinted
    "bwd-7168": dict(kernel="rmsnorm_bwd", n=7168),  # staged
    "bwd-16384": dict(kernel="rmsnorm_bwd", n=16384),  # staged, widened to 1024 x 2
    "bwd-14336": dict(kernel="rmsnorm_bwd", n=14336),  # re-read, L2 prefetch
    "bwd-32768": dict(kernel="rmsnorm_bwd", n=32768),  # 2-block cluster, pushes, overlap
    "bwd-65536-nw": dict(kernel="rmsnorm_bwd", n=65536, has_weight=False),  # cluster without a weight
    "bwd-4096-f32-atomic": dict(kernel="rmsnorm_bwd", n=4096, dtype="f32", wdtype="f32", atomic_dw=True),
    "bwd-100-f16": dict(kernel="rmsnorm_bwd", n=100, dtype="f16", wdtype="f16"),
    "reduce-4096": dict(kernel="rmsnorm_dw_reduce", n=4096, dtype="f32", wdtype="bf16"),
}


def isa_hash(fields: dict, target: str) -> str:
    opts = build(**fields, target=target)
    art = compiler.compile_text(specialize_source(opts), target, "isa", unroll_limit=opts.layout.unroll_limit)
    text = re.sub(rf"\b{KERNELS[opts.kernel].entry}\b", "ENTRY", art.data.decode())
    return hashlib.sha256(text.encode()).hexdigest()


def current() -> dict[str, str]:
    return {f"{name}@{t}": isa_hash(fields, t) for name, fields in SPECS.items() for t in targets.PRIMARY}


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("target", targets.PRIMARY)
def test_pinned(name, target):
    pins = json.loads(PINS.read_text())
    assert isa_hash(SPECS[name], target) == pins[f"{name}@{target}"], (
        f"{name} on {target} compiles to other code than the benchmarked kernels; see this file's docstring")


def test_pins_cover_the_specs():
    assert sorted(json.loads(PINS.read_text())) == sorted(f"{n}@{t}" for n in SPECS for t in targets.PRIMARY)
