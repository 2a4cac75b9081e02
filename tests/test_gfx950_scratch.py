"""Every default forward and backward layout on gfx950 compiles without scratch (private segment 0).

LLVM's AMDGPU loop unrolling decides, by body size and trip count, whether the chunk loops of a
re-read row are fully unrolled; unrolled, it hoists w out of the persistent row loop or merges
pass 2's loads into pass 1's, and the row spills. The layout policy steers clear of the ranges
where that happened (specialize.AMD_UNROLL_K, with and without a weight); a kernel change that moves
the threshold (as the backward's arithmetic change did at N=32768 and 49152) fails here, on the CPU,
before anyone runs it on an MI355X. One ISA compile per case, about 0.1 s each."""

from __future__ import annotations

import re

import pytest
from test_barriers import check_barriers, isa_of, sweep, sweep_options

pytestmark = pytest.mark.cpu


@sweep
def test_no_scratch_on_gfx950(kernel, n, dtype, has_weight):
    opts = sweep_options(kernel, n, dtype, has_weight, "gfx950")
    isa = isa_of(opts)
    check_barriers(opts, isa)  # the block reduction's barriers, once each (see test_barriers.py)
    scratch = re.search(r"\.private_segment_fixed_size:\s+(\d+)", isa)
    vgprs = re.search(r"\.vgpr_count:\s+(\d+)", isa)
    assert scratch and vgprs, "no kernel metadata in the gfx950 ISA"
    assert scratch.group(1) == "0", (f"{kernel} N={n} {dtype} {'with' if has_weight else 'without'} a weight: "
                                     f"{scratch.group(1)} bytes of scratch, {vgprs.group(1)} VGPRs "
                                     f"(layout tpr={opts.layout.tpr}, k={opts.layout.k})")
