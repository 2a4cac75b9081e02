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
from test_barriers import SWEEP_N, check_barriers, isa_of, sweep, sweep_options

from normir.options import build

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


# The backwards' dtype rule: an incoming gradient in another type than the row (mixed precision:
# fp32 gradients of bf16 activations, bf16 ones of an fp32 residual stream, dy of a bf16 y beside
# an fp32 residual_out), each layout the policy gives it (layout.AMD_WIDE_ROLLED_K). (kernel, the
# row's type, the gradient's, the Options field it is.)
GRAD_CASES = (("rmsnorm_bwd", "bf16", "f32", "odtype"), ("rmsnorm_bwd", "f32", "bf16", "odtype"),
              ("fused_add_rmsnorm_bwd", "f32", "bf16", "gdtype"), ("fused_add_rmsnorm_bwd", "bf16", "f32", "gdtype"),
              ("layernorm_bwd", "f32", "bf16", "gdtype"), ("layernorm_bwd", "bf16", "f32", "gdtype"),
              ("fused_add_rmsnorm_bwd", "f32", "bf16", "odtype"), ("layernorm_bwd", "f32", "bf16", "odtype"))


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}-{c[2]}")
@pytest.mark.parametrize("n", SWEEP_N)
def test_no_scratch_with_gradients_in_their_own_dtype(case, n):
    kernel, dtype, gdt, field = case
    extra = {"has_dres_out": True} if field == "gdtype" else {}
    opts = build(kernel=kernel, n=n, dtype=dtype, wdtype=dtype, target="gfx950", **extra, **{field: gdt})
    isa = isa_of(opts)
    scratch = re.search(r"\.private_segment_fixed_size:\s+(\d+)", isa)
    assert scratch and scratch.group(1) == "0", f"{opts.describe()}: {scratch and scratch.group(1)} bytes of scratch"
