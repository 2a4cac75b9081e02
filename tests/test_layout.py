"""Options validation, cache-key text, the layout policy, and the placeholder values it leads to (no MLIR)."""

from __future__ import annotations

import dataclasses
import hashlib
import math

import pytest

from normir import options as O
from normir import specialize as SP
from normir import targets
from normir.kernels import KERNELS
from normir.layout import geometry as S
from normir.layout import rules as R
from normir.layout.geometry import HINT_KEEP, HINT_L1_FIRST, HINT_L1_KEEP, HINT_LAST_READ, HINT_STORES
from normir.options import MAX_N, PROBLEM_FIELDS, Build, build
from normir.specialize import specialize

pytestmark = pytest.mark.cpu


# ---------------------------------------------------------------------------- Options validation


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kernel="rmsnorm_fw"), r"kernel 'rmsnorm_fw' is unknown"),
        (dict(target="sm_91"), r"target 'sm_91' is not supported"),
        (dict(n=0), r"^n=0 is out of range"),
        (dict(n=-8), r"^n=-8 is out of range"),
        (dict(n=MAX_N + 1), rf"^n={MAX_N + 1} is out of range"),
        (dict(n=1024.0), r"^n=1024.0 is out of range"),
        (dict(n="1024"), r"^n='1024' is out of range"),
        (dict(dtype="fp16"), r"^dtype='fp16': choose one of"),
        (dict(dtype="f64"), r"^dtype='f64'"),
        (dict(wdtype="bfloat16"), r"^wdtype='bfloat16': choose one of"),
        (dict(eps=math.nan), r"^eps=nan must be a finite float32"),
        (dict(eps=math.inf), r"^eps=inf must be"),
        (dict(eps=-math.inf), r"^eps=-inf must be"),
        (dict(eps=0.0), r"^eps=0.0 must be"),
        (dict(eps=0), r"^eps=0 must be"),
        (dict(eps=-1e-6), r"^eps=-1e-06 must be"),
        (dict(eps=1e-40), r"^eps=1e-40 must be"),  # a float32 subnormal
        (dict(eps=1e39), r"^eps=1e\+39 must be"),  # overflows float32
        (dict(vec=3), r"^vec=3 must be a power of two"),
        (dict(vec=6), r"^vec=6 must be a power of two"),
        (dict(vec=-4), r"^vec=-4 must be"),
        (dict(vec=16), r"^vec=16 must be .* at most 8"),  # 32 bytes of bf16: wider than 16
        (dict(n=1028, vec=8), r"^vec=8 must be .* at most 4"),  # 8 does not divide 1028
        (dict(n=1001, dtype="f32", vec=2), r"^vec=2 .* at most 1"),  # odd N
        (dict(tpr=48), r"^tpr=48 must be a power of two below the warp \(32\) or a multiple of it"),
        (dict(tpr=3), r"^tpr=3 must be"),
        (dict(tpr=96, target="gfx950"), r"^tpr=96 must be .* warp \(64\)"),
        (dict(tpr=2048), r"^tpr=2048: choose an int from 1 to 1024 \(threads per row\), or None"),
    ],
)
def test_options_rejects(kwargs, match):
    args = dict(kernel="rmsnorm_fwd", n=1024)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        build(**args)


def test_options_rejects_negative_tpr():
    with pytest.raises(ValueError, match=r"^tpr=-32"):
        build(kernel="rmsnorm_fwd", n=1024, tpr=-32)


def test_options_rejects_bool_n():
    with pytest.raises(ValueError, match=r"^n=True"):
        build(kernel="rmsnorm_fwd", n=True)


def test_options_accepts_eps_bounds():
    assert build(kernel="rmsnorm_fwd", n=8, eps=O.FLT_MIN).eps == O.FLT_MIN
    assert build(kernel="rmsnorm_fwd", n=8, eps=1).eps == 1.0
    assert build(kernel="rmsnorm_fwd", n=1).n == 1
    assert build(kernel="rmsnorm_fwd", n=MAX_N, dtype="f32").n == MAX_N


def test_eps_rounded_to_float32():
    o = build(kernel="rmsnorm_fwd", n=1024, eps=1e-6)
    assert o.eps != 1e-6
    assert o.eps == O.f32(1e-6) == 9.999999974752427e-07
    assert O.f32(o.eps) == o.eps
    # The same float32 from another double: the same binary.
    assert build(kernel="rmsnorm_fwd", n=1024, eps=1e-6 + 1e-20).digest() == o.digest()
    assert SP.mlir_f32(o.eps) == "9.999999975e-07"


def test_vec_defaults_to_widest_and_normalizes_key():
    widest = build(kernel="rmsnorm_fwd", n=1024)
    assert widest.vec == 8
    assert build(kernel="rmsnorm_fwd", n=1024, vec=8).digest() == widest.digest()
    assert build(kernel="rmsnorm_fwd", n=1024, vec=4).layout.vec == 4
    assert build(kernel="rmsnorm_fwd", n=1024, dtype="f32").vec == 4
    assert build(kernel="rmsnorm_fwd", n=100).vec == 4
    assert build(kernel="rmsnorm_fwd", n=2880, dtype="f16", vec=1).layout.nchunk == 2880


def test_options_frozen():
    o = build(kernel="rmsnorm_fwd", n=1024)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.n = 2048  # type: ignore[misc]


# ---------------------------------------------------------------------------- key_string / digest


def test_key_string_is_stable_text():
    # Part of every cache key: a change here invalidates every AOT folder, so make it on purpose.
    # The problem's fields, then every field of the layout decided (not the knobs forced).
    o = build(kernel="rmsnorm_fwd", n=4096)
    # The problem's fields that differ from their defaults (a new field leaves every key of the kernels
    # that do not use it as it was).
    assert o.key_string() == (
        "kernel='rmsnorm_fwd';n=4096;eps=9.999999974752427e-07;vec=8|vec=8;tpr=256;rows=1;k=2;kfull=2;"
        "nchunk=512;cache_row=False;warp=32;prefetch_w=False;batch_reload=False;dw_regs=False;cluster=1;"
        "l2_prefetch=False;stage=False;stage_buffers=0;min_blocks=0;max_regs=0;hints=21;overlap=0;db_smem=0;"
        "cast_words=False;two_pass=False;stage_dres=False"
    )
    assert o.digest() == hashlib.sha256(o.key_string().encode()).hexdigest()
    assert o.digest() == "ca07ff8c51d5d9c3a9f9cb3340570eff5b1112019685faf39e342804701195f7"


_ALTERNATIVES = dict(kernel="rmsnorm_bwd", n=2048, dtype="f16", wdtype="f32", eps=1e-5, target="gfx950",
                     has_weight=False, store_rstd=True, vec=4, atomic_dw=True,
                     rdtype="f32", sdtype="f32", odtype="f32", xdtype="f32", bdtype="f32", store_residual=True,
                     has_dres_out=True, weight_offset=1.0, gdtype="f32", qdtype="i8", qdynamic=True, has_smooth=True,
                     has_scale_ub=True, store_y=False, inplace=True, sum_f32=True, round_xhat=True, pdl=True)
# The kernel each field is tried on (one that takes it), and the fields it needs set beside it.
_BASES = {"xdtype": dict(kernel="fused_add_rmsnorm_bwd"),
          "has_dres_out": dict(kernel="fused_add_rmsnorm_bwd"),
          "gdtype": dict(kernel="fused_add_rmsnorm_bwd", has_dres_out=True),
          **{f: dict(kernel="fused_add_rmsnorm_fwd", rdtype="bf16") for f in ("sdtype", "store_residual")},
          **{f: dict(kernel="fused_add_rmsnorm_fwd") for f in ("rdtype", "odtype", "bdtype", "weight_offset")},
          # the quantized forward's (with its q type: fp8, dynamic, a residual where sum_f32 needs it)
          **{f: dict(kernel="rmsnorm_quant_fwd", qdtype="f8e4m3", qdynamic=f == "has_scale_ub")
             for f in ("qdtype", "qdynamic", "has_smooth", "has_scale_ub", "store_y", "round_xhat")},
          "sum_f32": dict(kernel="rmsnorm_quant_fwd", qdtype="f8e4m3", rdtype="bf16")}


def test_alternatives_cover_every_problem_field():
    assert set(_ALTERNATIVES) == set(PROBLEM_FIELDS)


@pytest.mark.parametrize("name", sorted(_ALTERNATIVES))
def test_digest_differs_per_problem_field(name):
    base = build(**{"kernel": "rmsnorm_fwd", **_BASES.get(name, {})}, n=4096)
    other = build(**{**{f: getattr(base.problem, f) for f in PROBLEM_FIELDS}, name: _ALTERNATIVES[name]})
    assert other.key_string() != base.key_string()
    assert other.digest() != base.digest()
    assert other != base


@pytest.mark.parametrize("knob, value", [("tpr", 128), ("tpr", 256), ("cache_row", 0), ("cache_row", 1),
                                         ("hints", 0), ("hints", 21), ("stage", 1), ("l2_prefetch", 0)])
def test_a_knob_moves_the_key_where_it_moves_the_layout(knob, value):
    # The key holds the layout decided, not the knobs: a knob forced to the policy's own choice
    # makes the same binary; one that changes the layout, another.
    base = build(kernel="rmsnorm_bwd", n=4096)
    other = build(kernel="rmsnorm_bwd", n=4096, **{knob: value})
    assert (other.key_string() == base.key_string()) == (other.layout == base.layout)


# ---------------------------------------------------------------------------- layouts

# (target, N, dtype, expected vec, the path the row is there for). The policy is tuned on hardware
# and moves rows between paths; each row asserts its vec and the layout invariants, and the table as
# a whole must keep reaching every path (test_*_table_covers_every_path). Path names:
#   rows: several rows per block   warps: a row spans several warps   tail: the last chunk round is masked
#   stream: the row does not fit the register budget (second pass re-reads x)
#   dwmem (backward only): the dw sums do not fit registers either and accumulate in memory
#   cluster: the row is split over the blocks of a thread-block cluster (sm_90+)
FWD_CASES = [
    ("sm_90", 1, "bf16", 1, {"rows"}),  # N=1: one lane per row, many rows per block
    ("sm_90", 7, "bf16", 1, {"rows", "tail"}),  # odd N -> vec 1
    ("sm_90", 64, "bf16", 8, {"rows"}),  # tiny rows: a few lanes per row
    ("sm_90", 100, "bf16", 4, {"rows", "tail"}),  # 8 does not divide 100 -> vec 4; 25 chunks
    ("sm_90", 1024, "bf16", 8, {"rows"}),  # one warp per row, several rows per block
    ("sm_90", 2048, "bf16", 8, {"rows"}),  # several rows per block (N <= 2048) or 2 warps
    ("gfx950", 2048, "bf16", 8, {"rows"}),  # wave64: one warp per row
    ("gfx950", 2880, "bf16", 8, {"tail"}),  # gpt-oss hidden size: 360 chunks, a masked last round
    ("sm_90", 2880, "bf16", 8, {"warps", "tail"}),  # multi-warp row with a tail chunk
    ("sm_90", 4096, "bf16", 8, {"warps"}),  # multi-warp, exact
    ("gfx950", 5120, "bf16", 8, {"warps", "tail"}),  # tail chunk
    ("gfx950", 7168, "bf16", 8, {"warps", "tail"}),  # tail chunk (DeepSeek hidden size)
    ("sm_90", 7168, "bf16", 8, {"warps"}),  # 896 chunks
    ("sm_90", 4097, "f32", 1, {"warps", "tail"}),  # odd N, multi-warp, vec 1
    ("sm_90", 8192, "f32", 4, {"warps"}),  # f32: 4 elements per 16 bytes
    ("sm_90", 65536, "bf16", 4, {"warps"}),  # 64 bf16 elements per thread, held packed; 8-byte chunks
    ("sm_90", 65536, "f32", 4, {"warps", "cluster"}),  # as fp32 they do not fit: two blocks share a row
    ("sm_80", 65536, "bf16", 4, {"warps", "stream"}),  # no clusters: 64 elements per thread, 8-byte chunks
    ("gfx950", 65536, "bf16", 8, {"warps"}),  # gfx950's larger register file
    ("sm_90", MAX_N, "f32", 4, {"warps", "stream", "cluster"}),  # the longest row: over 8 blocks, still streamed
]

BWD_CASES = [
    ("sm_90", 7, "bf16", 1, {"rows"}),  # odd N -> vec 1, a few lanes per row
    ("sm_90", 64, "bf16", 8, {"rows"}),  # several rows per block
    ("sm_90", 100, "bf16", 4, {"rows", "tail"}),  # vec 4 with a masked last round
    ("gfx950", 1024, "bf16", 8, {"rows"}),  # wave64
    ("sm_90", 1024, "bf16", 8, {"warps"}),
    ("sm_90", 2880, "bf16", 8, {"warps", "tail"}),  # tail chunk
    ("sm_90", 8192, "f32", 4, {"warps"}),  # f32
    ("sm_90", 16384, "bf16", 8, {"warps", "stream"}),  # x and dy staged, dw sums in registers
    ("sm_90", 14336, "bf16", 8, {"warps", "stream"}),  # x and dy re-read (L2 prefetch)
    ("gfx950", 16384, "bf16", 8, {"warps"}),
    ("sm_90", 32768, "bf16", 8, {"warps", "stream", "cluster"}),  # two blocks share a row's dw sums
    ("sm_80", 65536, "bf16", 8, {"warps", "stream", "dwmem"}),  # no clusters: dw sums in memory too
    ("gfx950", 65536, "bf16", 8, {"warps", "stream"}),  # gfx950 still holds the dw sums
    ("sm_90", MAX_N, "f32", 4, {"warps", "stream", "dwmem", "cluster"}),  # the longest row
]


def _features(lay: S.Layout, backward: bool = False) -> set[str]:
    f = set()
    if backward and not lay.dw_regs:
        f.add("dwmem")
    if lay.rows > 1:
        f.add("rows")
    if lay.tpr > lay.warp:
        f.add("warps")
    if lay.kfull < lay.k:
        f.add("tail")
    if not lay.cache_row:
        f.add("stream")
    if lay.cluster > 1:
        f.add("cluster")
    return f


def _check_invariants(o: Build) -> None:
    lay, n, eb = o.layout, o.n, S.DTYPES[o.dtype]
    tgt = targets.get(o.target)
    assert lay.warp == tgt.warp
    assert lay.vec & (lay.vec - 1) == 0 and lay.vec * eb <= S.MAX_VECTOR_BYTES
    assert n % lay.vec == 0 and lay.nsub * lay.cluster == n and lay.nchunk * lay.vec == lay.nsub
    assert lay.tpr * lay.k * lay.vec >= lay.nsub, "the chunk rounds do not cover the block's share"
    assert lay.kfull * lay.tpr * lay.vec <= lay.nsub, "an unmasked chunk falls past the share's end"
    assert lay.cluster & (lay.cluster - 1) == 0 and lay.cluster <= max(S.MAX_CLUSTER, tgt.max_cluster)
    assert o.cluster or lay.cluster <= S.MAX_CLUSTER, "the policy's clusters stay portable"
    if lay.cluster > 1:  # the cluster piece exchanges one total per block: one row, whole warps
        assert tgt.clusters and lay.rows == 1 and lay.tpr % lay.warp == 0
    assert (lay.k - 1) * lay.tpr < lay.nchunk, "a chunk round is entirely masked"
    assert lay.kfull == lay.nchunk // lay.tpr and lay.k == -(-lay.nchunk // lay.tpr)
    assert 1 <= lay.block <= S.MAX_THREADS
    assert lay.block % lay.warp == 0, "a block must be whole warps"
    if lay.rows > 1:  # no barrier in the reduction: a row must live inside one warp
        assert lay.tpr <= lay.warp and lay.warp % lay.tpr == 0
    if lay.tpr > lay.warp:  # warp totals meet in shared memory: whole warps per row
        assert lay.rows == 1 and lay.tpr % lay.warp == 0 and lay.wpr == lay.tpr // lay.warp
    if lay.prefetch_w:
        assert lay.cache_row
    if lay.batch_reload:  # pass 2's loads batched: the forward's streamed rows of 4 chunks
        assert o.kernel == "rmsnorm_fwd" and not lay.cache_row and lay.k == 4
    if o.kernel == "rmsnorm_bwd" and lay.cache_row:
        assert lay.dw_regs, "x and dy in registers but not the (smaller) dw sums"
    # A private array (row cache, dw sums, weight) becomes registers only when its loops unroll.
    private = lay.cache_row or lay.prefetch_w or lay.batch_reload or (o.kernel == "rmsnorm_bwd" and lay.dw_regs)
    assert lay.unroll_limit == (targets.UNROLL_LIMIT if private else 0)


def _layout(kernel: str, target: str, n: int, dtype: str) -> S.Layout:
    o = build(kernel=kernel, n=n, dtype=dtype, wdtype=dtype, target=target)
    _check_invariants(o)
    return o.layout


@pytest.mark.parametrize("target, n, dtype, vec, path", FWD_CASES)
def test_row_layout(target, n, dtype, vec, path):
    assert _layout("rmsnorm_fwd", target, n, dtype).vec == vec


@pytest.mark.parametrize("target, n, dtype, vec, path", BWD_CASES)
def test_bwd_layout(target, n, dtype, vec, path):
    assert _layout("rmsnorm_bwd", target, n, dtype).vec == vec


@pytest.mark.parametrize("kernel, cases, paths", [
    ("rmsnorm_fwd", FWD_CASES, {"rows", "warps", "tail", "stream", "cluster"}),
    ("rmsnorm_bwd", BWD_CASES, {"rows", "warps", "tail", "stream", "dwmem", "cluster"}),
])
def test_table_covers_every_path(kernel, cases, paths):
    reached = set()
    for target, n, dtype, _, _ in cases:
        reached |= _features(_layout(kernel, target, n, dtype), backward=kernel == "rmsnorm_bwd")
    assert reached == paths, f"no table row takes the {sorted(paths - reached)} path any more: add one"
    # ... and register mode too, with and without a row tail.
    modes = {(_layout(kernel, t, n, d).cache_row, _features(_layout(kernel, t, n, d)) >= {"tail"})
             for t, n, d, _, _ in cases}
    assert (True, True) in modes and (True, False) in modes


@pytest.mark.parametrize("kernel", ["rmsnorm_fwd", "rmsnorm_bwd"])
def test_layout_paths_that_follow_from_the_hardware(kernel):
    # Tiny rows share a block; 64 bf16 elements per thread stay in registers at 1024 threads
    # (held packed), 64 fp32 ones do not: sm_90 splits such a row over a cluster of two blocks,
    # sm_80 re-reads it; the longest rows stream in every dtype, and the backward's dw sums of
    # the longest row do not fit either.
    for n in (1, 7, 64):
        assert _layout(kernel, "sm_90", n, "bf16").rows > 1
    if kernel == "rmsnorm_fwd":
        assert _layout(kernel, "sm_90", 65536, "bf16").cache_row
        assert _layout(kernel, "sm_90", 65536, "bf16").cluster == 4  # the narrow rule (row_layout)
        assert _layout(kernel, "sm_80", 65536, "bf16").cluster == 1
        assert not _layout(kernel, "sm_80", 65536, "f32").cache_row
        assert _layout(kernel, "sm_90", 65536, "f32").cluster == 2
    for n in (1024, 16384):
        assert _layout(kernel, "sm_90", n, "bf16").cluster == 1
    for target in targets.PRIMARY:
        lay = _layout(kernel, target, MAX_N, "f32")
        assert not lay.cache_row and lay.tpr > lay.warp
        if kernel == "rmsnorm_bwd":
            assert not lay.dw_regs


@pytest.mark.parametrize("kernel", ["rmsnorm_fwd", "rmsnorm_bwd"])
@pytest.mark.parametrize("target", targets.PRIMARY)
def test_forced_tpr(kernel, target):
    warp = targets.get(target).warp
    for n in (1, 100, 2880, 4096, 65536):
        for tpr in (1, 8, warp // 2, warp, 3 * warp, 1024):
            nchunk = n // S.max_vec(n, 2)
            if tpr > nchunk:  # threads without a chunk: refused (see layout.geometry.forced_tpr)
                with pytest.raises(ValueError, match=rf"^tpr={tpr} leaves threads without a chunk: .* {nchunk} chunks"):
                    build(kernel=kernel, n=n, target=target, tpr=tpr)
                continue
            o = build(kernel=kernel, n=n, target=target, tpr=tpr)
            assert o.layout.tpr == tpr
            assert (o.layout.rows > 1) == (tpr <= warp)
            assert o.layout.cluster == 1 or tpr > warp
            _check_invariants(o)
    # The default and an explicit tpr are different binaries.
    assert build(kernel=kernel, n=4096, tpr=128).digest() != build(kernel=kernel, n=4096).digest()


@pytest.mark.parametrize("kernel", ["rmsnorm_fwd", "rmsnorm_bwd"])
@pytest.mark.parametrize("target", targets.PRIMARY)
def test_layout_invariants_sweep(kernel, target):
    # Every N in a spread of sizes (odd, prime, powers of two and their neighbours), every dtype.
    ns = sorted({1, 2, 3, 5, 8, 31, 33, 127, 255, 256, 257, 1000, 1023, 1025, 2047, 2049, 3000, 4095, 4104,
                 8191, 12288, 32767, 32768, 100000, 131072, 262143, MAX_N})
    for dt in S.DTYPES:
        for n in ns:
            _check_invariants(build(kernel=kernel, n=n, dtype=dt, wdtype=dt, target=target))


@pytest.mark.parametrize("kernel", ["rmsnorm_fwd", "rmsnorm_bwd"])
def test_forced_cluster(kernel):
    for n, dt in ((5760, "bf16"), (5120, "f32"), (65536, "bf16"), (MAX_N, "f16")):
        for c in (1, 2, 4, 8):
            o = build(kernel=kernel, n=n, dtype=dt, wdtype=dt, cluster=c)
            assert o.layout.cluster == c and o.layout.nsub == n // c
            _check_invariants(o)
    assert build(kernel=kernel, n=4096, cluster=2).digest() != build(kernel=kernel, n=4096).digest()
    # Past the portable 8 blocks: 16 where the target allows a non-portable size (sm_90), forced only.
    o = build(kernel=kernel, n=65536, cluster=16)
    assert o.layout.cluster == 16 and o.layout.nsub == 4096
    _check_invariants(o)
    for bad, msg in ((dict(cluster=3), r"^cluster=3: choose one of 1, 2, 4, 8, 16"),
                     (dict(cluster=32, n=65536), r"^cluster=32: choose one of 1, 2, 4, 8, 16"),
                     (dict(cluster=16, target="sm_80"), r"^cluster=16: sm_80 has no thread-block clusters"),
                     (dict(cluster=2, target="gfx950"), r"^cluster=2: gfx950 has no thread-block clusters"),
                     (dict(cluster=2, target="sm_80"), r"^cluster=2: sm_80 has no"),
                     (dict(n=4104, cluster=2), r"^cluster=2 must split N=4104 into whole vectors of 8"),
                     (dict(n=1024, cluster=8), r"^cluster=8 leaves each block 128 columns"),
                     (dict(n=4096, cluster=2, tpr=16), r"^cluster=2 leaves each block 2048 columns")):
        with pytest.raises(ValueError, match=msg):
            build(kernel=kernel, **{"n": 4096, **bad})


def test_l2_prefetch_policy():
    # On for the backward's one-row blocks that are not staged (NVIDIA), off for the forward;
    # the flag can be forced either way where the target has the instruction.
    assert build(kernel="rmsnorm_bwd", n=32768).layout.l2_prefetch
    assert build(kernel="rmsnorm_bwd", n=8192, stage=0).layout.l2_prefetch
    assert not build(kernel="rmsnorm_bwd", n=8192).layout.l2_prefetch  # staged instead
    assert not build(kernel="rmsnorm_fwd", n=8192).layout.l2_prefetch
    assert not build(kernel="rmsnorm_bwd", n=64).layout.l2_prefetch  # several rows per block
    assert not build(kernel="rmsnorm_fwd", n=8192, l2_prefetch=0).layout.l2_prefetch
    assert build(kernel="rmsnorm_bwd", n=64, l2_prefetch=1).layout.l2_prefetch
    assert not build(kernel="rmsnorm_bwd", n=8192, target="gfx950").layout.l2_prefetch
    assert not build(kernel="rmsnorm_dw_reduce", n=8192, dtype="f32").layout.l2_prefetch
    with pytest.raises(ValueError, match=r"^l2_prefetch=1: gfx950 has no L2 prefetch instruction"):
        build(kernel="rmsnorm_bwd", n=8192, target="gfx950", l2_prefetch=1)
    with pytest.raises(ValueError, match=r"^l2_prefetch=1: rmsnorm_fwd \(a block per row group\) has no L2 prefetch"):
        build(kernel="rmsnorm_fwd", n=8192, l2_prefetch=1)
    with pytest.raises(ValueError, match=r"^l2_prefetch=2: choose one of 0, 1 "):
        build(kernel="rmsnorm_fwd", n=8192, l2_prefetch=2)


def test_hint_policy():
    # The backward's rows that pass 2 reads again (not staged) get last-read and store hints and
    # ask L1 to keep what they load, or with a cluster store hints; the forward's streamed rows
    # their L2 and L1 load hints; nothing else.
    def hints(kernel="rmsnorm_bwd", **kw):
        return build(kernel=kernel, **{"n": 4096, **kw}).layout.hints

    assert hints() == hints(n=2880) == hints(n=14336) == hints(n=16384, stage=0) == \
        HINT_LAST_READ | HINT_STORES | HINT_L1_KEEP == 19
    assert hints(n=16384) == 0  # staged
    assert hints(n=8192) == 0  # staged
    assert hints(n=32768) == hints(n=65536) == HINT_STORES  # a cluster: stores only
    assert hints(n=2048) == 0  # held in registers
    assert hints(n=16384, stage=1) == 0
    # Without a weight, rows held in registers get them too, unless staged or split over a cluster.
    assert hints(has_weight=False) == hints(n=1024, has_weight=False) == hints(n=2880, has_weight=False) == 19
    assert build(kernel="rmsnorm_bwd", n=2880, has_weight=False).layout.cache_row
    assert hints(n=8192, has_weight=False) == 0 and hints(n=32768, has_weight=False) == HINT_STORES
    # The forward: rows of 128-4096 chunks are streamed, pass 1 keeping its lines and pass 2's
    # reads evicting them first from L2, both keeping them in L1, except that rows of 4 chunks per
    # thread (16384, 32768) have pass 2 ask L1 to evict them first; rows held in registers get none.
    assert hints("rmsnorm_fwd") == hints("rmsnorm_fwd", n=1024) == hints("rmsnorm_fwd", n=8192) == \
        HINT_LAST_READ | HINT_KEEP | HINT_L1_KEEP == 21
    assert hints("rmsnorm_fwd", n=16384) == hints("rmsnorm_fwd", n=32768) == 21 | HINT_L1_FIRST == 53
    assert hints("rmsnorm_fwd", n=65536) == hints("rmsnorm_fwd", n=512) == hints("rmsnorm_fwd", cache_row=1) == 0
    assert hints("rmsnorm_fwd", tpr=256) == hints("rmsnorm_fwd", hints=0) == 0  # forced: no streaming
    assert hints("rmsnorm_fwd", n=32768, hints=2) == 2
    assert hints(target="gfx950") == hints(vec=4) == hints(n=4095) == 0  # no hints there
    assert hints(hints=0) == 0 and hints(n=8192, hints=7) == 7 and hints(n=8192, hints=55) == 55
    with pytest.raises(ValueError, match=r"^hints=3: rmsnorm_bwd on gfx950 has no L2 eviction hints for 16-byte"):
        build(kernel="rmsnorm_bwd", n=4096, target="gfx950", hints=3)
    with pytest.raises(ValueError, match=r"^hints=1: rmsnorm_fwd on sm_90 has no L2 eviction hints for 8-byte"):
        build(kernel="rmsnorm_fwd", n=4096, vec=4, hints=1)
    for bad in (56, 128, -2, True, 1.0):
        with pytest.raises(ValueError, match=r"^hints=.*: choose an int from 0 to 55 \(cache hints, a sum of"):
            build(kernel="rmsnorm_fwd", n=4096, hints=bad)
    for bad in (8, 15, 40):  # the pruned bits 8 (coherent loads) and 64 (.L2::256B) are not hints
        with pytest.raises(ValueError, match=rf"^hints={bad}: bits 8 are not hints"):
            build(kernel="rmsnorm_fwd", n=4096, hints=bad)
    with pytest.raises(ValueError, match=r"^hints=1: rmsnorm_dw_reduce has a fixed layout"):
        build(kernel="rmsnorm_dw_reduce", n=4096, dtype="f32", hints=1)


def test_l1_qualifier_of_last_reads():
    # Bit 32 gives the forward's last reads .L1::evict_first; without it they take the other
    # loads' qualifier (.L1::evict_last with bit 16, none without); the backward never uses it.
    def loads(kernel="rmsnorm_fwd", tensor="x", **kw):  # x's hinted load function in the text
        text = specialize(build(kernel=kernel, **{"n": 4096, "tpr": 256, "cache_row": 0, **kw}))
        return text[text.index(f"@normir_ld_hint_{tensor}("):text.index(f"@normir_st_hint_{tensor}(")]

    assert loads(hints=53).count("ld.global.nc.L1::evict_first.L2") == 1
    assert loads(hints=53).count("ld.global.nc.L1::evict_last.L2") == 1
    assert loads(hints=21).count("ld.global.nc.L1::evict_last.L2") == 2 and "evict_first.L2" not in loads(hints=21)
    assert loads(hints=5).count("ld.global.nc.L2::cache_hint") == 2
    bwd = specialize(build(kernel="rmsnorm_bwd", n=2880, has_weight=False, hints=19))
    for t in ("x", "dy"):
        assert loads("rmsnorm_bwd", t, n=2880, tpr=None, cache_row=None, has_weight=False, hints=19).count(
            "ld.global.nc.L1::evict_last.L2::cache_hint.v4") == 2
    assert "st.global.L2::cache_hint.v4" in bwd


def test_forward_batch_reload():
    # The forward's streamed rows of 4 chunks per thread over at most 512 threads (16384 in 16-bit
    # types) batch pass 2's loads; 2-chunk rows (8192), 1024 threads (32768) and held rows do not.
    # Its blocks sum one row each: row_sum's trailing barrier is left out (kept in persistent grids).
    def lay(**kw):
        return build(kernel="rmsnorm_fwd", **kw).layout

    assert lay(n=16384).batch_reload and lay(n=12288).batch_reload and lay(n=8192, dtype="f32", wdtype="f32").batch_reload
    assert not (lay(n=8192).batch_reload or lay(n=32768).batch_reload or lay(n=65536).batch_reload)
    assert not lay(n=16384, tpr=512, cache_row=0, hints=53).batch_reload  # forced layouts: not the policy's
    values = SP.common_values(build(kernel="rmsnorm_fwd", n=16384))
    assert values["BATCH_RELOAD"] == "true" and values["RED_REUSED"] == "false"
    assert SP.common_values(build(kernel="rmsnorm_fwd", n=8192))["BATCH_RELOAD"] == "false"
    assert SP.common_values(build(kernel="rmsnorm_bwd", n=8192))["RED_REUSED"] == "true"
    # The knob: forced on a streamed forward row, off on the policy's, refused where rows are held.
    assert lay(n=8192, tpr=256, cache_row=0, hints=53, batch_reload=1).batch_reload
    assert not lay(n=16384, batch_reload=0).batch_reload
    for bad, why in ((dict(n=65536), "holds them in registers"), (dict(n=4096, cache_row=1), "holds them"),
                     (dict(kernel="rmsnorm_bwd", n=4096), "rmsnorm_bwd has no such pass")):
        with pytest.raises(ValueError, match=f"^batch_reload=1 .*{why}"):
            build(**{"kernel": "rmsnorm_fwd", **bad, "batch_reload": 1})
    with pytest.raises(ValueError, match=r"^batch_reload=2: choose one of 0, 1 "):
        build(kernel="rmsnorm_fwd", n=4096, batch_reload=2)


def test_nvidia_forward_row_shapes():
    # N=65536 in bf16 fills a 1024-thread block: 8-byte chunks rather than 16-byte ones, over a
    # cluster of 4 blocks of 256 threads capped at 64 registers (4 blocks to a multiprocessor,
    # the weight not held) where the target has clusters, else 16 per thread in one block, unless
    # an option that needs 16-byte chunks (staging, hints) or a layout is forced.
    lay = build(kernel="rmsnorm_fwd", n=65536).layout
    assert (lay.tpr, lay.cluster, lay.vec, lay.k, lay.kfull, lay.min_blocks) == (256, 4, 4, 16, 16, 4)
    assert lay.cache_row and not lay.prefetch_w
    assert "minctasm = 4" in SP.common_values(build(kernel="rmsnorm_fwd", n=65536))["KERNEL_ATTRS"]
    assert build(kernel="rmsnorm_fwd", n=65536, min_blocks=2).layout.min_blocks == 2  # forced
    for one_block in (build(kernel="rmsnorm_fwd", n=65536, cluster=1).layout,
                      build(kernel="rmsnorm_fwd", n=65536, target="sm_80").layout):
        assert (one_block.tpr, one_block.cluster, one_block.vec, one_block.k, one_block.min_blocks) == (1024, 1, 4, 16, 0)
    for forced in (dict(hints=2), dict(tpr=1024)):
        assert build(kernel="rmsnorm_fwd", n=65536, **forced).layout.vec == 8
    assert build(kernel="rmsnorm_fwd", n=65536, target="gfx950").layout.vec == 8
    # Only bf16 rows in 16-byte chunks narrow (as measured): not f16 or f32 rows of the same shape,
    # nor a bf16 row whose pointers already allow only 8 bytes.
    assert build(kernel="rmsnorm_fwd", n=32768, dtype="f16", wdtype="f16", vec=4).layout.vec == 4
    assert build(kernel="rmsnorm_fwd", n=32768, dtype="f32", wdtype="f32").layout.vec == 4
    assert build(kernel="rmsnorm_fwd", n=65536, vec=4).layout.vec == 4
    assert build(kernel="rmsnorm_fwd", n=32768).layout.vec == 8
    assert build(kernel="rmsnorm_bwd", n=65536).layout.vec == 8
    # N=1024 in 16-bit types (exactly 4 chunks per lane of a warp): a block of 2 warps, 2 chunks
    # each, one row per block; AMDGPU keeps several rows per block there.
    lay = build(kernel="rmsnorm_fwd", n=1024).layout
    assert (lay.tpr, lay.rows, lay.k) == (64, 1, 2)
    assert build(kernel="rmsnorm_fwd", n=512).layout.rows == 16
    amd = build(kernel="rmsnorm_fwd", n=2048, target="gfx950").layout
    assert (amd.tpr, amd.rows, amd.k) == (64, 4, 4)


def test_cluster_exchange_by_pushes():
    # Rows split over a cluster exchange their totals by pushes (st.async + mbarriers); rows in one
    # block have no exchange at all, and no cluster barrier is left in any kernel.
    def spliced(**kw):  # (pushes, the cluster barrier's arrive) in the kernel text
        text = SP.specialize(build(kernel="rmsnorm_bwd", **{"n": 32768, **kw}))
        return "st.async" in text, "nvvm.cluster.arrive\n" in text

    assert spliced() == (True, False)
    assert spliced(n=4096) == (False, False)
    assert spliced(target="gfx950") == (False, False)
    text = SP.specialize(build(kernel="rmsnorm_fwd", n=65536))
    assert "st.async" in text and "nvvm.cluster.arrive\n" not in text


def test_overlap_policy():
    # Rows over a cluster of 512-thread blocks with 4 chunks per thread load pass 2's first 2
    # chunks between posting the block's total and waiting for the peers'; nothing else does by
    # default.
    def overlap(**kw):
        return build(kernel="rmsnorm_bwd", **{"n": 32768, **kw}).layout.overlap

    assert overlap() == overlap(n=65536) == overlap(dtype="f16", wdtype="f16") == 2
    assert overlap(n=16384) == overlap(n=4096) == 0  # one block per row
    assert overlap(n=65536, dtype="f32", wdtype="f32") == 0  # 1024-thread blocks
    assert overlap(target="gfx950") == 0
    assert overlap(overlap=0) == 0 and overlap(overlap=4) == 4
    with pytest.raises(ValueError, match=r"^overlap=2 needs a persistent kernel \(a backward\) with rows split over"):
        build(kernel="rmsnorm_bwd", n=16384, overlap=2)
    with pytest.raises(ValueError, match=r"^overlap=5: choose None \(the policy's\), 0 \(none\) or a chunk count up to K=4"):
        build(kernel="rmsnorm_bwd", n=32768, overlap=5)
    # A forward with its rows held: pass 2's first chunks of w and b loaded before the reductions.
    fwd = build(kernel="rmsnorm_fwd", n=65536, dtype="f32", wdtype="f32", overlap=1).layout
    assert fwd.cache_row and fwd.overlap == 1
    assert build(kernel="rmsnorm_fwd", n=65536, has_weight=False, overlap=1).layout.overlap == 0  # nothing to load
    with pytest.raises(ValueError, match=r"^overlap=1: a forward loads pass 2's chunks of w and b early only where "
                                         r"its rows are held in registers \(N=4096 here: read again\)"):
        build(kernel="rmsnorm_fwd", n=4096, overlap=1)
    # The forwards' policy: 2 where rows are held over a cluster in 8+ chunks, blocks of <= 512
    # threads, 16-bit x, w and b (LayerNorm's 65536: 256 x 4 of 16 chunks; its fused add's: 128 x 8 of 8).
    def fwd_overlap(**kw):
        return build(**{"kernel": "layernorm_fwd", "n": 65536, "bdtype": "bf16", **kw}).layout.overlap

    assert fwd_overlap() == fwd_overlap(rdtype="bf16", store_residual=True) == fwd_overlap(bdtype="") == 2
    assert build(kernel="rmsnorm_fwd", n=65536).layout.overlap == 2
    assert fwd_overlap(dtype="f32", wdtype="f32", bdtype="f32") == 0  # fp32 rows spilled with it
    assert fwd_overlap(wdtype="f32", bdtype="f32") == 0  # fp32 w and b spilled with it
    assert fwd_overlap(n=131072) == 0  # 1024-thread blocks spilled with it
    assert fwd_overlap(n=32768, rdtype="bf16", store_residual=True) == 0  # 4 chunks: a block fewer
    assert fwd_overlap(n=2880) == fwd_overlap(target="gfx950") == 0  # one block; no clusters


def test_no_weight_policy():
    # Without a weight (no dw sums): 2-chunk rows held in registers, 4-chunk rows of one block
    # staged whatever their size, rows over a cluster with all of pass 2 inside the barrier.
    def lay(n, **kw):
        return build(kernel="rmsnorm_bwd", n=n, has_weight=False, **kw).layout

    assert lay(2880).cache_row and lay(4096).cache_row and not build(kernel="rmsnorm_bwd", n=4096).layout.cache_row
    assert lay(8192).stage and lay(14336).stage and not build(kernel="rmsnorm_bwd", n=14336).layout.stage
    assert lay(32768).overlap == lay(65536).overlap == 4 and not lay(32768).cache_row
    assert not lay(16384, target="gfx950").stage  # no asynchronous copies there
    # gfx950, 16-bit N=65536: 32 chunks per thread, where LLVM keeps the loops rolled (no scratch).
    assert lay(65536, target="gfx950").k == 32 and build(kernel="rmsnorm_bwd", n=65536, target="gfx950").layout.k == 16
    # Forced choices win, and a forced stage or overlap keeps the row re-read.
    assert not lay(4096, cache_row=0).cache_row and lay(16384, cache_row=1).cache_row
    assert lay(4096, stage=1).stage and not lay(4096, stage=1).cache_row
    assert build(kernel="rmsnorm_bwd", n=4096, cache_row=1).layout.cache_row
    with pytest.raises(ValueError, match=r"^cache_row=2: choose one of 0, 1 "):
        build(kernel="rmsnorm_bwd", n=4096, cache_row=2)
    # The forward takes it too: 0 streams any row, 1 needs a row that fits the registers.
    assert build(kernel="rmsnorm_fwd", n=4096, cache_row=1).layout.cache_row
    assert not build(kernel="rmsnorm_fwd", n=65536, cache_row=0).layout.cache_row
    with pytest.raises(ValueError, match=r"^cache_row=1: a row of N=1048576 .* does not fit the registers of sm_90"):
        build(kernel="rmsnorm_fwd", n=MAX_N, dtype="f32", wdtype="f32", cache_row=1)
    with pytest.raises(ValueError, match=r"^cache_row=1: rmsnorm_dw_reduce has a fixed layout"):
        build(kernel="rmsnorm_dw_reduce", n=4096, dtype="f32", cache_row=1)


@pytest.mark.parametrize("name", ("l2_prefetch", "stage", "min_blocks", "max_regs", "hints", "overlap", "cache_row"))
def test_knobs_reject_bools_and_floats(name):
    # True would pass for 1 and 1.0 compare equal to 1: both are refused, naming the knob.
    for bad in (True, 1.0, "1"):
        with pytest.raises(ValueError, match=rf"^{name}={bad!r}: "):
            build(kernel="rmsnorm_bwd", n=32768, **{name: bad})


def test_max_regs():
    # A forced cap on a thread's registers (NVVM maxnreg): in the layout and the kernel's
    # attributes beside a cap of blocks; refused past the target's registers, below 16, on a
    # target without the attribute, and on a kernel of a fixed layout.
    lay = build(kernel="layernorm_fwd", n=4608, bdtype="bf16", max_regs=64).layout
    assert (lay.max_regs, build(kernel="layernorm_fwd", n=4608, bdtype="bf16").layout.max_regs) == (64, 0)
    attrs = SP.common_values(build(kernel="rmsnorm_bwd", n=4096, min_blocks=2, max_regs=96))["KERNEL_ATTRS"]
    assert attrs == ", nvvm.minctasm = 2 : i32, nvvm.maxnreg = 96 : i32"
    for bad, why in ((256, "choose an int from 16 to 255"), (8, "choose an int from 16"), (-1, "choose an int")):
        with pytest.raises(ValueError, match=rf"^max_regs={bad}: {why}"):
            build(kernel="rmsnorm_bwd", n=4096, max_regs=bad)
    with pytest.raises(ValueError, match=r"^max_regs=64: gfx950 has no register cap attribute; use None"):
        build(kernel="rmsnorm_bwd", n=4096, target="gfx950", max_regs=64)
    with pytest.raises(ValueError, match=r"^max_regs=64: rmsnorm_dw_reduce has a fixed layout; leave max_regs"):
        build(kernel="rmsnorm_dw_reduce", n=4096, dtype="f32", max_regs=64)


def test_rows_cap_policy():
    # The fused add's LayerNorm backward in blocks of several rows, every thread the same chunks,
    # 16-bit rows: capped at BWD_ROWS_CAP_REGS (ptxas spilled at its own 128). Not with a masked
    # chunk (384), one row a block (1024), without d_residual_out, in fp32 rows, on gfx950, nor
    # where a layout is forced; a forced cap wins.
    def cap(n, **kw):
        return build(kernel="layernorm_bwd", n=n, **{"bdtype": "f32", "has_dres_out": True, **kw}).layout.max_regs

    assert cap(512) == cap(256) == cap(64) == R.BWD_ROWS_CAP_REGS
    assert build(kernel="layernorm_bwd", n=512, bdtype="f32", has_dres_out=True).layout.rows > 1
    for n, kw in ((384, {}), (1024, {}), (512, dict(has_dres_out=False)), (512, dict(dtype="f32", wdtype="f32")),
                  (512, dict(target="gfx950")), (512, dict(tpr=32))):
        assert cap(n, **kw) == 0, (n, kw)
    assert cap(512, max_regs=160) == 160
    attrs = SP.common_values(build(kernel="layernorm_bwd", n=512, bdtype="f32", has_dres_out=True))["KERNEL_ATTRS"]
    assert f"nvvm.maxnreg = {R.BWD_ROWS_CAP_REGS} : i32" in attrs


def test_two_blocks_policy():
    # A streamed forward row of one read in FWD_TWO_BLOCKS_THREADS threads or more is capped for 2
    # blocks (one fit at ptxas's own registers); not two reads (the fused add's), not at 512
    # threads, not held rows, not fp32 rows (not measured), not on gfx950, not where the layout or
    # the cap is forced.
    def lay(n, **kw):
        return build(kernel="layernorm_fwd", n=n, **{"bdtype": "bf16", **kw}).layout

    for n in (24576, 32768):
        assert (lay(n).block, lay(n).cache_row, lay(n).min_blocks) == (n // 32, False, 2), n
    assert build(kernel="rmsnorm_fwd", n=24576).layout.min_blocks == 2
    fused = build(kernel="fused_add_rmsnorm_fwd", n=32768, rdtype="bf16", store_residual=True).layout
    assert (fused.block, fused.cache_row, fused.min_blocks) == (1024, False, 0)
    for n, kw in ((16384, {}), (2880, {}), (32768, dict(target="gfx950")), (32768, dict(tpr=1024)),
                  (32768, dict(dtype="f32", wdtype="f32", bdtype="f32"))):
        assert not lay(n, **kw).min_blocks, (n, kw)
    assert lay(32768, min_blocks=1).min_blocks == 1
    assert R.FWD_TWO_BLOCKS_THREADS == 768


def test_min_blocks():
    assert build(kernel="rmsnorm_bwd", n=4096, min_blocks=2).layout.min_blocks == 2
    assert build(kernel="rmsnorm_bwd", n=4096).layout.min_blocks == 0
    with pytest.raises(ValueError, match=r"^min_blocks=2: gfx950 has no blocks-per-multiprocessor bound"):
        build(kernel="rmsnorm_bwd", n=4096, target="gfx950", min_blocks=2)
    for bad in (-1, 33, True):
        with pytest.raises(ValueError, match=r"^min_blocks=.*: choose an int from 1 to 32"):
            build(kernel="rmsnorm_bwd", n=4096, min_blocks=bad)


def test_stage_policy():
    # Backward rows re-read in pass 2 are staged through shared memory on NVIDIA targets when
    # the chunks are 16 bytes; the buffers' size is the launch's dynamic shared memory.
    lay = build(kernel="rmsnorm_bwd", n=8192).layout
    assert lay.stage and not lay.l2_prefetch and lay.smem_bytes == 4 * lay.k * lay.block * 16 == 65536
    # One block's buffers past STAGE_POLICY_BYTES (N=14336: 112 KB): prefetch and hints instead,
    # unless forced.
    assert not build(kernel="rmsnorm_bwd", n=14336).layout.stage
    assert build(kernel="rmsnorm_bwd", n=14336, stage=1).layout.smem_bytes == 4 * 4 * 448 * 16
    # Rows of exactly 2048 chunks: the same 128 KB of buffers, at 1024 threads x 2 chunks.
    for kw in (dict(n=16384), dict(n=16384, has_weight=False), dict(n=16384, dtype="f16", wdtype="f32"),
               dict(n=8192, dtype="f32", wdtype="f32")):
        wide = build(kernel="rmsnorm_bwd", **kw).layout
        assert (wide.stage, wide.block, wide.k, wide.kfull, wide.smem_bytes, wide.l2_prefetch) == \
            (True, 1024, 2, 2, 131072, False)
    forced = build(kernel="rmsnorm_bwd", n=16384, stage=1).layout  # forced: the layout stays
    assert (forced.block, forced.k, forced.smem_bytes) == (512, 4, 131072)
    assert build(kernel="rmsnorm_bwd", n=16384, tpr=512, stage=0).layout.block == 512
    assert not build(kernel="rmsnorm_bwd", n=16384, target="gfx950").layout.stage
    assert not build(kernel="rmsnorm_bwd", n=2880).layout.stage  # two chunks per thread
    assert not build(kernel="rmsnorm_bwd", n=32768).layout.stage  # split over a cluster
    assert build(kernel="rmsnorm_bwd", n=32768, stage=1).layout.stage
    assert build(kernel="rmsnorm_bwd", n=14336, stage=0).layout.l2_prefetch  # the fallback prefetches
    assert build(kernel="rmsnorm_bwd", n=16384, stage=0).layout.l2_prefetch
    assert not build(kernel="rmsnorm_bwd", n=1024).layout.stage  # held in registers
    assert not build(kernel="rmsnorm_bwd", n=8192, vec=4).layout.stage  # 8-byte chunks
    assert not build(kernel="rmsnorm_bwd", n=8192, target="gfx950").layout.stage
    # Kernels of a block per row group (the forward) have no staging (it lost 4-11%: removed).
    assert not build(kernel="rmsnorm_fwd", n=16384).layout.stage
    assert not build(kernel="rmsnorm_fwd", n=1024, stage=0).layout.stage and \
        build(kernel="rmsnorm_fwd", n=1024).layout.smem_bytes == 0
    with pytest.raises(ValueError, match=r"^stage=1: rmsnorm_fwd \(a block per row group\) has no staged layout"):
        build(kernel="rmsnorm_fwd", n=16384, stage=1)
    with pytest.raises(ValueError, match=r"^stage=1: rmsnorm_dw_reduce has a fixed layout"):
        build(kernel="rmsnorm_dw_reduce", n=4096, dtype="f32", stage=1)
    for bad in (dict(target="gfx950"), dict(vec=4), dict(n=1024)):
        with pytest.raises(ValueError, match=r"^stage=1 needs a target with asynchronous copies"):
            build(kernel="rmsnorm_bwd", **{"n": 16384, "stage": 1, **bad})
    with pytest.raises(ValueError, match=r"^stage=5: choose one of 0, 1 "):
        build(kernel="rmsnorm_bwd", n=16384, stage=5)


def test_amd_layouts_that_spilled():
    # gfx950 rows whose ISA showed scratch: the forward's 1024-thread rows hold no w and at most 64
    # elements; the backward's rows with dw in memory where LLVM unrolled into a spill get enough
    # chunks per thread that the loops stay rolled (f32: 64, 16-bit: 32).
    fwd = build(kernel="rmsnorm_fwd", n=65536, target="gfx950").layout
    assert fwd.block == 1024 and fwd.cache_row and not fwd.prefetch_w
    assert not build(kernel="rmsnorm_fwd", n=131072, target="gfx950").layout.cache_row
    for n, dt, k, tpr in ((65536, "f32", 64, 256), (32768, "f32", 64, 128), (49152, "bf16", 32, 192)):
        bwd = build(kernel="rmsnorm_bwd", n=n, dtype=dt, wdtype=dt, target="gfx950").layout
        assert not bwd.dw_regs and (bwd.k, bwd.tpr) == (k, tpr)
    # Rows outside those ranges, and sm_90, keep their layouts.
    assert build(kernel="rmsnorm_bwd", n=65536, target="gfx950").layout.k == 16
    assert build(kernel="rmsnorm_bwd", n=98304, target="gfx950").layout.k == 24
    sm90 = build(kernel="rmsnorm_fwd", n=65536).layout
    assert (sm90.block, sm90.cluster, sm90.k, sm90.vec, sm90.cache_row) == (256, 4, 16, 4, True)
    assert build(kernel="rmsnorm_bwd", n=65536, dtype="f32", wdtype="f32").layout.k < R.AMD_UNROLL_K[True][4][0]


def test_reduce_layout():
    o = build(kernel="rmsnorm_dw_reduce", n=4096, dtype="f32", target="gfx950")
    lay = o.layout
    assert (lay.vec, lay.tpr, lay.rows, lay.block) == (4, S.REDUCE_CT, S.REDUCE_RT, S.REDUCE_CT * S.REDUCE_RT)
    assert lay.nchunk * lay.vec == 4096
    # Short rows (at most 512 fp32 chunks) leave many partial rows over few column blocks: 128 row
    # threads there.
    short = build(kernel="rmsnorm_dw_reduce", n=2048, dtype="f32").layout
    assert (short.tpr, short.rows) == (S.REDUCE_CT, S.REDUCE_RT_SHORT)
    assert build(kernel="rmsnorm_dw_reduce", n=2052, dtype="f32").layout.rows == S.REDUCE_RT
    # Long rows (at least 8192 chunks) leave few partial rows over many columns: 32 x 8.
    long = build(kernel="rmsnorm_dw_reduce", n=32768, dtype="f32").layout
    assert (long.tpr, long.rows, long.block) == (S.REDUCE_CT_LONG, S.REDUCE_RT_LONG, S.REDUCE_CT * S.REDUCE_RT)
    below = build(kernel="rmsnorm_dw_reduce", n=32764, dtype="f32").layout
    assert (below.tpr, below.rows) == (S.REDUCE_CT, S.REDUCE_RT)


def test_reduce_sums_dw_and_db_in_one_kernel():
    # With a bias type (db's), the column sums take both outputs: db keeps its own type (the
    # backward's bdtype is f32, its partial sums'; the reduction's is db's output type).
    both = build(kernel="rmsnorm_dw_reduce", n=1024, dtype="f32", wdtype="bf16", bdtype="f16")
    assert both.bdtype == "f16"
    text = SP.specialize(both)
    assert "%has_bias = arith.constant true" in text and "vector<4xf16>" in text and "vector<4xbf16>" in text
    one = SP.specialize(build(kernel="rmsnorm_dw_reduce", n=1024, dtype="f32", wdtype="bf16"))
    assert "%has_bias = arith.constant false" in one
    assert build(kernel="layernorm_bwd", n=1024, bdtype="bf16").bdtype == "f32"


# ---------------------------------------------------------------------------- specialize


def _kernel_options(kernel: str, target: str, n: int = 2880) -> Build:
    dt = "f32" if kernel == "rmsnorm_dw_reduce" else "bf16"  # the reduction reads fp32 partials
    return build(kernel=kernel, n=n, dtype=dt, wdtype="bf16", target=target, **dict(KERNELS[kernel].requires))


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("target", targets.PRIMARY)
def test_specialize_every_kernel(kernel, target):
    o = _kernel_options(kernel, target)
    text = SP.specialize(o)
    assert "${" not in text
    assert "normir:splice" not in text
    assert "memref<2880x" in text
    assert targets.get(target).target_attr in text
    assert f"gpu.func @{KERNELS[kernel].entry}(" in text
    assert f"known_block_size = array<i32: {o.layout.block}, 1, 1>" in text


def test_specialize_values_follow_options():
    a = SP.specialize(build(kernel="rmsnorm_fwd", n=4096, eps=1e-5))
    b = SP.specialize(build(kernel="rmsnorm_fwd", n=4096, eps=1e-6, has_weight=False, dtype="f16", wdtype="f32"))
    assert f"arith.constant {SP.mlir_f32(1e-5)} : f32" in a
    assert f"arith.constant {SP.mlir_f32(1e-6)} : f32" in b
    assert "%has_weight = arith.constant true" in a and "%has_weight = arith.constant false" in b
    assert "memref<4096xf16>" in b and "memref<4096xf32>" in b and "arith.extf" in b
    assert "vector<8xbf16>" in a and "arith.extf" in a


def test_fwd_streamed_policy():
    # On targets with L2 hints, forward rows of 128-4096 16-byte chunks are read twice (2 chunks
    # per thread up to 512 threads, then 4); shorter and longer rows, narrower vectors, gfx950 and
    # anything forced keep the row in registers.
    def lay(n, **kw):
        return build(kernel="rmsnorm_fwd", n=n, **kw).layout

    streamed = {1024: (64, 2), 2880: (192, 2), 8192: (512, 2), 12288: (384, 4), 32768: (1024, 4)}
    for n, (tpr, k) in streamed.items():
        got = lay(n)
        hints = 21 if k == 2 else 53  # 4-chunk rows: pass 2's reads ask L1 to evict first
        assert (got.tpr, got.k, got.rows, got.cache_row, got.prefetch_w, got.hints) == (tpr, k, 1, False, False, hints)
    assert lay(16384, dtype="f32", wdtype="f32").tpr == 1024 and not lay(16384, dtype="f32", wdtype="f32").cache_row
    assert not lay(4096, target="sm_80").cache_row  # every NVVM target with the hint piece
    for held_row in (lay(1016), lay(32776), lay(16392, dtype="f32", wdtype="f32"), lay(4096, vec=4),
                     lay(4096, target="gfx950"), lay(4096, tpr=256), lay(4096, hints=0), lay(4096, cache_row=1)):
        assert held_row.cache_row and held_row.hints == 0
    assert lay(65536).cache_row and lay(65536).vec == 4  # 8-byte chunks, held


@pytest.mark.parametrize("target", ("sm_90", "gfx950"))
def test_every_policy_thread_owns_a_chunk(target):
    # Threads without a chunk let LLVM duplicate the block reduction into a branch of their own
    # (two barriers; the H200 hung). layout.decide refuses such a policy layout; this sweeps it
    # over row lengths of every residue (N = 2880: 360 chunks, not a multiple of the warp).
    ns = sorted({*range(1, 300), *range(300, 20000, 37), 2880, 5120, 7168, 14336, 24576, 49152, 98304, 1048576})
    features = {"rmsnorm_fwd": [{}], "rmsnorm_bwd": [{}],
                "fused_add_rmsnorm_fwd": [{}, {"rdtype": "bf16", "store_residual": True}],
                "fused_add_rmsnorm_bwd": [{"has_dres_out": True}],
                "layernorm_fwd": [{}, {"rdtype": "f32", "store_residual": True}],
                "layernorm_bwd": [{"bdtype": "f32"}]}
    for kernel, cases in features.items():
        for extra in cases:
            for dt in ("bf16", "f32"):
                for n in ns:
                    for has_weight in (True, False):
                        lay = build(kernel=kernel, n=n, dtype=dt, wdtype=dt, target=target, has_weight=has_weight,
                                      **extra).layout
                        assert lay.tpr <= lay.nchunk, (kernel, n, dt, extra, lay)


def test_backward_rows_crowding_one_block_split_over_a_cluster():
    # Rows read again whose dw sums fill BWD_SPLIT_DW registers a thread leave blocks of more than
    # 512 threads (ptxas spilled 48-296 bytes at their 72-96 registers) for a cluster.
    for kernel, extra in (("rmsnorm_bwd", {}), ("fused_add_rmsnorm_bwd", {})):
        for n in (17408, 20480, 24576, 36864, 49152, 57344):
            lay = build(kernel=kernel, n=n, **extra).layout
            assert lay.cluster > 1 and lay.block <= 512 and not lay.cache_row, (kernel, n, lay)
    # Reading d_residual_out in pass 2, the split rows keep the threads of their one block (up to
    # 768), 2 chunks a thread (rule crowded_threads); past 768 they are halved as above.
    for n, tpr, cluster in ((17408, 544, 2), (24576, 768, 2), (40960, 640, 4), (49152, 768, 4)):
        lay = build(kernel="fused_add_rmsnorm_bwd", n=n, has_dres_out=True).layout
        assert (lay.tpr, lay.cluster, lay.k, lay.kfull) == (tpr, cluster, 2, 2), (n, lay)
    for n in (28672, 57344):  # 896 threads in one block
        lay = build(kernel="fused_add_rmsnorm_bwd", n=n, has_dres_out=True).layout
        assert lay.cluster > 1 and lay.block <= 512 and lay.k == 4, (n, lay)
    assert build(kernel="rmsnorm_bwd", n=16384).layout.cluster == 1  # 512 threads: staged as 1024 x 2
    assert build(kernel="rmsnorm_bwd", n=12288, dtype="f32", wdtype="f32").layout.block == 768  # 16 sums a thread
    assert build(kernel="rmsnorm_bwd", n=24576, target="gfx950").layout.cluster == 1  # no clusters there
