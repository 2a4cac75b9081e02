"""Every default forward and backward layout keeps its block reduction's barriers where the
kernel text puts them: for rows of several warps one per row, plus a trailing one where the
block sums another row after it (the backward's persistent grid, a staged forward), and two more
for LayerNorm's two-pass variance (its second sum and the barrier before it); none for rows
within one warp.

A barrier LLVM duplicates into both arms of a per-thread branch is undefined behaviour: `bar.sync`
is warp-aligned on NVIDIA, and on AMD a wave whose lanes take both arms executes `s_barrier`
twice. On the H200 such a copy hung a forced layout whose spare threads owned no chunk (now
refused by layout.geometry.forced_tpr). One ISA compile per case, about 0.1 s each."""

from __future__ import annotations

import re

import pytest

from normir import compiler
from normir.kernels import KERNELS
from normir.options import Build, build
from normir.specialize import specialize

pytestmark = pytest.mark.cpu

SWEEP_N = (64, 100, 1024, 2048, 2880, 4096, 5120, 7168, 8192, 12288, 16384, 24576, 32768, 49152, 65536, 98304,
           131072, 262144, 1048576)
BARRIER = {"sm_90": re.compile(r"\b(?:bar|barrier)\.sync\b"), "gfx950": re.compile(r"\bs_barrier\b")}


def sweep(test):
    """Parametrize test(kernel, n, dtype, has_weight) over every default layout of the sweep."""
    test = pytest.mark.parametrize("has_weight", (True, False), ids=("w", "no-w"))(test)
    test = pytest.mark.parametrize("dtype", ("bf16", "f16", "f32"))(test)
    test = pytest.mark.parametrize("n", SWEEP_N)(test)
    return pytest.mark.parametrize("kernel", sorted(SWEEP_FEATURES))(test)


# Each swept kernel with its features on: the fused add with the residual in x's type (stored) and
# d_residual_out read, as autograd runs it; LayerNorm's kernels likewise, as the fused-add LayerNorm
# (the forward storing mean and rstd), and as plain LayerNorm with a bias (KERNEL+bias: in x's type
# for the forward, "T"; the backward's db sums in fp32).
SWEEP_FEATURES = {"rmsnorm_fwd": {}, "rmsnorm_bwd": {}, "fused_add_rmsnorm_bwd": {"has_dres_out": True},
                  "fused_add_rmsnorm_fwd": {"store_residual": True}, "layernorm_bwd": {"has_dres_out": True},
                  "layernorm_fwd": {"store_residual": True}, "layernorm_fwd+bias": {"bdtype": "T"},
                  "layernorm_bwd+bias": {"bdtype": "f32"},
                  # the quantized forwards with dynamic scales (the amax's reduction after the normalize)
                  "rmsnorm_quant_fwd": {"qdtype": "f8e4m3", "qdynamic": True, "store_y": False},
                  "layernorm_quant_fwd+bias": {"bdtype": "T", "qdtype": "i8", "qdynamic": True, "store_y": False}}


def sweep_options(case: str, n: int, dtype: str, has_weight: bool, target: str) -> Build:
    kernel = case.split("+")[0]
    features = dict(SWEEP_FEATURES[case])
    if features.get("store_residual"):
        features["rdtype"] = dtype
    if features.get("bdtype") == "T":
        features["bdtype"] = dtype
    return build(kernel=kernel, n=n, dtype=dtype, wdtype=dtype, target=target, has_weight=has_weight,
                   store_rstd=KERNELS[kernel].grid == "rows", **features)


def isa_of(opts: Build) -> str:
    return compiler.compile_text(specialize(opts), opts.target, "isa", unroll_limit=opts.layout.unroll_limit).data.decode()


def check_barriers(opts: Build, isa: str) -> None:
    lay = opts.layout
    reused = KERNELS[opts.kernel].grid != "rows" or lay.stage  # row_sum's %red serves a next row
    want = (2 if reused else 1) if lay.tpr > lay.warp else 0
    if lay.two_pass and lay.tpr > lay.warp:  # the variance's second sum, and the barrier before it
        want += 2
    if opts.problem.qdynamic and lay.tpr > lay.warp:  # the amax's reduction, and the barrier before it
        want += 2
    got = len(BARRIER[opts.target].findall(isa))
    assert got == want, (f"{opts.kernel} N={opts.n} {opts.dtype} {'with' if opts.has_weight else 'without'} a "
                         f"weight on {opts.target}: {got} block barriers, expected {want} (tpr={lay.tpr}, k={lay.k}, "
                         f"kfull={lay.kfull}); LLVM duplicated the reduction into a branch")


@sweep
def test_reduction_barriers_sm90(kernel, n, dtype, has_weight):
    opts = sweep_options(kernel, n, dtype, has_weight, "sm_90")
    check_barriers(opts, isa_of(opts))
