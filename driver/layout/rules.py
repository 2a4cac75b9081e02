"""The layout policy's rules, as records. Each states the kernel features it reads and their values
(a feature left out takes the values every rule of today was measured on, MEASURED: a kernel outside
them, a forward with a reduction after the normalize or a new row sum, takes none), the Layout fields
it sets, the targets it was measured on and the runs that set it (`scripts/tune.py` runs vN,
`docs/results/*-tune-vN*`, unless named otherwise), the knobs whose forcing it leaves alone, and its
change. ORDER is the order the chooser applies them in, with the places where the forced knobs are
applied (forced.py). docs/tuning.md has each rule's measurements, under its name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from . import forced as F
from . import geometry as G
from .geometry import (
    AMD_1024_ROW_ELEMENTS_WB,
    DTYPES,
    ELEMENT_BYTES,
    MAX_THREADS,
    MAX_VECTOR_BYTES,
    Ctx,
    Layout,
    bwd_block,
    clustered,
    resident,
    row_block,
)

# AMDGPU persistent kernels with the column sums in memory, with and without a weight, per chunk
# width (elements): the chunks per thread [lo, hi) for which LLVM fully unrolls the chunk loops
# into a spill, and the count that keeps them rolled. Found by compiling every N in every dtype.
AMD_UNROLL_K = {True: {4: (16, 64, 64), 8: (12, 16, 32)}, False: {4: (32, 64, 64), 8: (16, 24, 32)}}
# The same for chunks wider than 16 bytes (every count under it spilled somewhere).
AMD_WIDE_ROLLED_K = 48
# Blocks a row: one-pass rows that fill a 1024-thread block (narrow), LayerNorm's two-read rows that
# stream in 1024 threads or split (wide_sums_held); a streamed row of FWD_TWO_BLOCKS_THREADS or more
# is capped for 2 blocks; held rows over a cluster load FWD_OVERLAP chunks of w and b early from
# FWD_OVERLAP_MIN_K chunks a thread.
FWD_WIDE_CLUSTER, FWD_WIDE_SUMS_CLUSTER, FWD_TWO_BLOCKS_THREADS, FWD_OVERLAP, FWD_OVERLAP_MIN_K = 4, 8, 768, 2, 8
# A forward's rows split evenly (even_rows): at most this many elements a thread, at least
# FWD_EVEN_MIN_K chunks, rows of at most FWD_EVEN_MAX_CHUNKS 16-byte chunks (measured up to 480);
# held rows of at most WORDS_MAX_HELD elements a thread take the casts in words.
FWD_EVEN_MAX_ELEMENTS, FWD_EVEN_MIN_K, FWD_EVEN_MAX_CHUNKS, WORDS_MAX_HELD = 100, 4, 512, 32
# Staged by default where two blocks' buffers fit a multiprocessor; the most threads a crowded row's
# blocks keep (crowded_threads: ptxas spills past it); threads a block of held_quads' rows.
STAGE_POLICY_BYTES, BWD_KEEP_THREADS, HELD_QUAD_THREADS = 100 * 1024, 768, 256
# A backward's masked rows (even_bwd) take narrower chunks up to the first share of slots filled, the
# fused add's half-width ones up to the second; even_halves' 4-byte chunks, at most BWD_NARROW_K a
# thread, at BWD_NARROW_REGS registers; rows_cap's cap.
BWD_NARROW_MAX_FILL, BWD_HALF_MAX_FILL, BWD_NARROW_K, BWD_NARROW_REGS, BWD_ROWS_CAP_REGS = 0.8, 0.875, 5, 64, 136
# Registers a thread db_smem caps a backward at (levels ptxas kept unspilled): rows held, rows read
# again, both sums moved with the rows held, rows of one block of 2 chunks read again; the most blocks
# of those one-block rows where a row is read twice.
DB_SMEM_REGS_HELD, DB_SMEM_REGS_READ, DB_SMEM_REGS_BOTH, DB_SMEM_REGS_ONE, ONE_BLOCK_TWO_READS = 96, 80, 80, 72, 4
# A 16-bit backward with its column sums in registers (ptxas: 111-152 at 1024-8192), and at 4 chunks
# a thread over a cluster, read again (ptxas: 196-217 at 65536).
BWD_SUMS_REGS, BWD_SUMS4_REGS = 128, 200

# The features every rule of today was measured on, per grid: the statistics kept, the row sums,
# the reductions after the normalize (none), the narrowest element written (2 or 4 bytes: no q).
MEASURED = {"rows": dict(kept=("rms", "centered"), row_sums=(1, 3), after_norm=((),), out_bytes=(2, 4)),
            "persistent": dict(kept=("rms", "centered"), row_sums=(1, 2), after_norm=((),), out_bytes=(2, 4))}
SHAPE = "vec tpr rows k kfull nchunk cluster"  # the fields a row's covering sets
HELD, STREAM = SHAPE + " cache_row", "tpr rows k kfull cache_row prefetch_w hints"  # a row held; the streamed reading
# What the geometry derives from a covering: a shape rule's new covering may change them, and a rule
# after it may still decide them (they are not the shape rule's unless it names them).
DERIVED = frozenset({"cache_row", "prefetch_w", "dw_regs"})
POLICY = "tpr cluster hints cache_row"  # a forward's reading forced: its shape rules stand aside


@dataclass(frozen=True)
class Rule:
    """A measured rule: `when` maps features (geometry.Ctx's; `needs`: target properties) to their
    values, one or a tuple; `change` gives the new layout, or None where the layout has not the
    shape the rule needs. A shape rule re-covers the row: the first that gives a layout takes the
    row, and the later ones stand aside."""

    name: str
    change: Callable[[Ctx, Layout], Layout | None]
    when: dict
    sets: frozenset[str]  # the Layout fields it decides
    runs: tuple[str, ...]  # the runs that set it
    on: tuple[str, ...]  # the targets it was measured on (sm_90: the H200)
    keeps: frozenset[str]  # knobs whose forcing makes it stand aside
    shape: bool

    def applies(self, c: Ctx) -> bool:
        """The kernel, problem and target lie inside the rule's domain."""
        want = {**MEASURED[self.when["grid"]], **self.when}
        return all(all(getattr(c.tgt, t) for t in v.split()) if k == "needs" else
                   getattr(c, k) in (v if isinstance(v, tuple) else (v,)) for k, v in want.items())


def rule(grid: str, sets: str, runs: str, on: str = "sm_90", keeps: str = "", shape: bool = False, **when):
    return lambda change: Rule(change.__name__, change, dict(grid=grid, **when), frozenset(sets.split()),
                               tuple(runs.split()), tuple(on.split()), frozenset(keeps.split()), shape)


# ---------------------------------------------------------------------------- the forwards


def _stream(c: Ctx, lay: Layout) -> Layout | None:
    """The streamed reading of a forward's row (geometry.streamed_row), in one block of
    FWD_STREAM_CHUNKS 16-byte chunks; else None."""
    lo, hi = G.FWD_STREAM_CHUNKS
    ok = G.hintable(c, lay) and lay.cluster == 1 and lo <= lay.nchunk <= hi
    return G.streamed_row(lay, c.reads, c.row_sums) if ok else None


def _even_split(c: Ctx) -> Layout | None:
    """A forward's row split evenly: the fewest whole warps (else a sub-warp) in 16-byte chunks, else
    8-byte ones, FWD_EVEN_MIN_K chunks a thread or more, at most FWD_EVEN_MAX_ELEMENTS elements."""
    warp, n = c.tgt.warp, c.p.n
    for t in (*range(warp, MAX_THREADS + 1, warp), *(warp >> i for i in range(1, warp.bit_length()))):
        for vec in (c.p.vec, c.p.vec // 2):
            if vec and n % (t * vec) == 0 and FWD_EVEN_MIN_K * vec <= n // t <= FWD_EVEN_MAX_ELEMENTS:
                return row_block(n, vec, c.hb, c.tgt, t, DTYPES[c.p.wdtype])


def _held(lay: Layout | None) -> Layout | None:
    return lay if lay is not None and lay.cache_row else None


@rule("rows", SHAPE + " min_blocks", "v14 v15 v16 v40 v41 v50", reads=1, vendor="nvidia", keeps="tpr", shape=True)
def narrow(c: Ctx, lay: Layout) -> Layout | None:
    """A bf16 row that fills a 1024-thread block with 8 16-byte chunks a thread (N=65536) takes
    8-byte chunks: over FWD_WIDE_CLUSTER blocks capped to share a multiprocessor where the target
    has clusters and none is forced, else 16 a thread in its block (forced hints need 16 bytes)."""
    w = FWD_WIDE_CLUSTER if c.tgt.clusters and c.ov.cluster is None else 1
    if not c.ov.hints and lay.cluster == 1 and lay.block == MAX_THREADS and lay.k == lay.kfull == 8 and lay.cache_row \
            and c.hb == 2 and lay.vec * 2 == MAX_VECTOR_BYTES:
        share = row_block(c.p.n // w, lay.vec // 2, c.hb, c.tgt, MAX_THREADS // w, DTYPES[c.p.wdtype])
        return replace(clustered(share, w), min_blocks=w) if w > 1 else share


@rule("rows", "cache_row prefetch_w", "test_gfx950_scratch", on="gfx950", vendor="amd", weight=True, bias=True,
      keeps="cache_row")
def amd_wb_reread(c: Ctx, lay: Layout) -> Layout | None:
    """AMDGPU at 1024 threads holding w and b beside more than AMD_1024_ROW_ELEMENTS_WB row elements
    a thread spills (12 bytes at N=65536 in bf16): the row is read again."""
    if lay.block >= MAX_THREADS and lay.cache_row and lay.k * lay.vec > AMD_1024_ROW_ELEMENTS_WB:
        return replace(lay, cache_row=False, prefetch_w=False)


@rule("rows", HELD, "v78 v146", kept="centered", reads=2, x_bytes=2, needs="clusters", keeps=POLICY, shape=True)
def wide_sums_held(c: Ctx, lay: Layout) -> Layout | None:
    """Two reads of LayerNorm's rows that stream in 1024 threads or split over a cluster (N=32768,
    65536): held over FWD_WIDE_SUMS_CLUSTER blocks of 128 threads, 4 or 8 whole 16-byte chunks a thread."""
    s, w = _stream(c, lay), FWD_WIDE_SUMS_CLUSTER
    if (lay.cluster > 1 or (s and s.tpr == MAX_THREADS)) and w <= c.tgt.max_cluster:
        held = G.row_layout(c.p.n, lay.vec, c.hb, c.tgt, MAX_THREADS // w, DTYPES[c.p.wdtype], w)
        if held.cache_row and held.cluster == w and held.full and held.k in (4, 8) and held.vec * 2 == MAX_VECTOR_BYTES:
            return held


@rule("rows", HELD, "v82 v83 v84", kept="centered", reads=1, vendor="nvidia", keeps=POLICY, shape=True)
def even_rows(c: Ctx, lay: Layout) -> Layout | None:
    """One read of LayerNorm's rows of at most FWD_EVEN_MAX_CHUNKS 16-byte chunks whose layout (the
    streamed one in its range, else the row's) leaves a masked chunk: split evenly, held."""
    given = _stream(c, lay) or lay
    if lay.cluster == 1 and not given.full and c.p.n * c.x_bytes <= FWD_EVEN_MAX_CHUNKS * MAX_VECTOR_BYTES:
        return _held(_even_split(c))


@rule("rows", HELD, "v73 v75 v76", kept="centered", reads=1, keeps=POLICY, shape=True)
def held_ragged(c: Ctx, lay: Layout) -> Layout | None:
    """One read of LayerNorm's rows in the streaming range whose chunks do not fill whole warps
    (N=2880): held at the streamed threads, no L2 hints (Chan's merges of unequal counts)."""
    s = _stream(c, lay)
    if s and lay.nchunk % lay.warp:
        return _held(row_block(c.p.n, lay.vec, c.hb, c.tgt, s.tpr, DTYPES[c.p.wdtype]))


@rule("rows", HELD, "v68 v85", kept="centered", reads=2, keeps=POLICY, shape=True)
def held_pairs(c: Ctx, lay: Layout) -> Layout | None:
    """Two reads of LayerNorm's rows that would stream one chunk a thread over warps not a power of
    two: held at 2 chunks a thread where those fill whole warps, else split evenly."""
    s = _stream(c, lay)
    if s and s.k == 1 and s.wpr & (s.wpr - 1):
        tpr = lay.nchunk // 2 if lay.nchunk % (2 * lay.warp) == 0 else 0
        return _held(row_block(c.p.n, lay.vec, c.hb, c.tgt, tpr, DTYPES[c.p.wdtype]) if tpr else _even_split(c))


@rule("rows", STREAM + " cast_words", "v102", kept="centered", reads=1, vendor="nvidia",
      keeps=POLICY + " cast_words batch_reload min_blocks", shape=True)
def streamed_words(c: Ctx, lay: Layout) -> Layout | None:
    """One read of LayerNorm's bf16 rows, streamed in 4 chunks a thread over warps not a power of two:
    pass 2 chunk by chunk (not batched), its casts by 32-bit words."""
    s = _stream(c, lay)
    warps = s.block // s.warp if s else 1
    if s and s.batch_reload and warps & (warps - 1) and c.p.held_dtype == "bf16" and lay.vec % 2 == 0:
        return replace(s, batch_reload=False, cast_words=True)


@rule("rows", STREAM + " batch_reload", "v36 v37 v49 v57 v58 v63 v64 v68 v69 v70 v72 v73 v74", keeps=POLICY, shape=True)
def streamed(c: Ctx, lay: Layout) -> Layout | None:
    """Rows of FWD_STREAM_CHUNKS 16-byte chunks are read twice with L2 and L1 hints
    (geometry.streamed_row): fewer live registers and short blocks beat holding the row."""
    return _stream(c, lay)


@rule("rows", "min_blocks", "v92 v93", reads=1, x_bytes=2, needs="min_blocks_attr", keeps=POLICY)
def two_blocks(c: Ctx, lay: Layout) -> Layout | None:
    """A streamed row of FWD_TWO_BLOCKS_THREADS threads or more is capped for 2 blocks a
    multiprocessor (ptxas gives it 40-49 registers: one)."""
    if _stream(c, lay) and not lay.cache_row and lay.block >= FWD_TWO_BLOCKS_THREADS:
        return replace(lay, min_blocks=2)


@rule("rows", "overlap", "v157", keeps="overlap")
def overlap_wb(c: Ctx, lay: Layout) -> Layout | None:
    """Rows held over a cluster in FWD_OVERLAP_MIN_K chunks or more, blocks of at most 512 threads,
    16-bit rows, w and b: pass 2's first FWD_OVERLAP chunks of w and b loaded before the reductions."""
    wb = ((c.p.wdtype,) if c.p.has_weight else ()) + ((c.p.bdtype,) if c.p.bdtype else ())
    if wb and lay.cache_row and not lay.stage and lay.cluster > 1 and lay.k >= FWD_OVERLAP_MIN_K \
            and max(DTYPES[t] for t in (c.p.dtype, *wb)) <= 2 and lay.block <= MAX_THREADS // 2:
        return replace(lay, overlap=FWD_OVERLAP)


@rule("rows", "cast_words", "v96 v97 v98 v99 v100 v101", kept="centered", reads=1, vendor="nvidia", keeps="cast_words")
def words_fwd(c: Ctx, lay: Layout) -> Layout | None:
    """One read of LayerNorm's bf16 rows: pass 2's casts by words and x_hat * w + b one fma, where a
    cap fixes the registers or the rows held have at most WORDS_MAX_HELD elements a thread."""
    if c.p.held_dtype == "bf16" and lay.vec % 2 == 0 \
            and (lay.min_blocks > 0 or (lay.cache_row and lay.k * lay.vec <= WORDS_MAX_HELD)):
        return replace(lay, cast_words=True)


@rule("rows", "two_pass", "v107 v108", kept="centered", vendor="nvidia", keeps="two_pass")
def two_pass(c: Ctx, lay: Layout) -> Layout | None:
    """LayerNorm's rows held, one row a block, no cluster, threads of unequal chunk counts (or warps
    not a power of two): the exact two-pass variance instead of Chan's merges with a reciprocal."""
    if lay.cache_row and lay.cluster == 1 and lay.rows == 1 and not lay.equal_counts:
        return replace(lay, two_pass=True)


# ---------------------------------------------------------------------------- the backwards


@rule("persistent", "tpr k kfull", "test_gfx950_scratch", on="gfx950", vendor="amd", keeps="tpr", shape=True)
def amd_rolled(c: Ctx, lay: Layout) -> Layout | None:
    """AMDGPU rows, column sums in memory, at a count of chunks a thread that LLVM fully unrolls into
    a spill (AMD_UNROLL_K), or in chunks wider than 16 bytes (a gradient or residual_out of a wider
    type: AMD_WIDE_ROLLED_K): enough chunks a thread that the chunk loops stay rolled."""
    lo, hi, k = AMD_UNROLL_K[c.p.has_weight].get(lay.vec, (0, 0, 0)) if lay.vec == 8 or c.p.dtype != "bf16" else (0,) * 3
    wide = lay.vec * max(ELEMENT_BYTES[t] for t in c.work.types_for(c.p)) > MAX_VECTOR_BYTES
    if lay.dw_regs or lay.rows > 1 or not (wide or lo <= lay.k < hi):
        return None
    # (wide chunks: the threads rounded down to whole warps, so that k does not fall back under AMD_WIDE_ROLLED_K)
    w = lay.warp
    tpr = max(w, lay.nchunk // AMD_WIDE_ROLLED_K // w * w if wide else G.whole_warps(lay.nchunk, k, w))
    return replace(lay, tpr=tpr, k=-(-lay.nchunk // tpr), kfull=lay.nchunk // tpr)


@rule("persistent", SHAPE, "v105 v107 v108", late_reads=1, needs="clusters", keeps="tpr cluster", shape=True)
def crowded_threads(c: Ctx, lay: Layout) -> Layout | None:
    """A crowded row (geometry.crowded) reading d_residual_out in pass 2, split over a cluster, keeps
    the threads its one block had, up to BWD_KEEP_THREADS, 2 chunks a thread instead of 4."""
    unsplit = G.bwd_share(c, lay.cluster // 2) if lay.cluster > 1 else None
    if unsplit and G.crowded(c, unsplit) and unsplit.tpr <= BWD_KEEP_THREADS:
        new = clustered(bwd_block(c, c.p.n // lay.cluster, lay.vec, unsplit.tpr), lay.cluster)
        return new if new.dw_regs and new.full else None


@rule("persistent", SHAPE, "v82 v83 v84 v86 v87 v138 v139 v140", vendor="nvidia", keeps="tpr cluster", shape=True)
def even_bwd(c: Ctx, lay: Layout) -> Layout | None:
    """A short row (at most 256 chunks) in one block that leaves a masked chunk is split evenly: one
    chunk a thread where the chunks fill whole warps; else with two column sums narrower chunks over
    as many threads or up to twice as many; one sum beside d_residual_out (RMSNorm's fused add) half-
    width chunks one a thread, and one chunk a thread where 2 fill whole warps too."""
    n, one_sum_dres = c.p.n, c.late_reads and c.col_sums == 1
    if not (lay.cluster == 1 and lay.rows == 1 and (one_sum_dres or not lay.full) and lay.nchunk <= 256):
        return None
    if lay.nchunk % lay.warp == 0:
        return bwd_block(c, n, lay.vec, lay.nchunk)
    half = lay.vec // 2
    if one_sum_dres and lay.nchunk <= BWD_HALF_MAX_FILL * lay.tpr * lay.k and c.x_bytes == 2 and half \
            and n % (half * lay.warp) == 0 and n // half <= MAX_THREADS:
        return bwd_block(c, n, half, n // half)
    if c.col_sums > 1 and lay.nchunk <= BWD_NARROW_MAX_FILL * lay.tpr * lay.k:
        tries = [(v, t) for v in (lay.vec // 2, lay.vec // 4) for t in range(lay.tpr, 2 * lay.tpr + 1, lay.warp) if v]
        return next((bwd_block(c, n, v, t) for v, t in tries if n % (v * t) == 0), None)


def _one_block_blocks(c: Ctx, lay: Layout) -> int:
    """Blocks a multiprocessor for rows of one block, 2 chunks a thread, read again, both column sums
    in shared memory: as many as DB_SMEM_REGS_ONE allows, at most ONE_BLOCK_TWO_READS where a row is
    read twice (v115, v116)."""
    blocks = resident(c.tgt, lay, DB_SMEM_REGS_ONE)
    return blocks if c.late_reads else min(blocks, ONE_BLOCK_TWO_READS)


def _db_smem_choice(c: Ctx, lay: Layout) -> tuple[bool, int, int] | None:
    """Where db's column sums (and dw's) go to shared memory: (rows held, db_smem, blocks a
    multiprocessor at the cap), where that gains blocks over the sums in registers; else None."""
    at = functools.partial(resident, c.tgt, lay)
    need = lay.k * lay.block * lay.vec * 4  # db's slots
    wide_k = lay.k == 4 and lay.full and lay.cluster > 1 and not lay.cache_row and c.x_bytes == 2
    if not (c.tgt.min_blocks_attr and c.p.has_weight and c.p.bdtype and lay.dw_regs and not lay.stage
            and need <= G.MAX_DB_SMEM_BYTES and (lay.k <= 2 or wide_k) and lay.k * lay.vec * c.col_sums >= G.BWD_SPLIT_DW):
        return None
    # Held rows over a cluster spilled at the cap in 3 warps and beside an fp32 weight
    # (tests/test_sm90_spill.py): whole powers of two, w no wider than x.
    narrow_w = DTYPES[c.p.wdtype] <= c.x_bytes
    cluster_ok = lay.cluster == 1 or (lay.wpr & (lay.wpr - 1) == 0 and narrow_w)
    both_fit = narrow_w and 2 * need <= G.MAX_DB_SMEM_BYTES
    choices = []  # (rows held, db_smem, blocks a multiprocessor), in order of preference
    if lay.cache_row and lay.full and not c.late_reads and lay.block <= G.BWD_WIDE_WARPS * lay.warp and cluster_ok:
        choices.append((True, 1, at(DB_SMEM_REGS_HELD)))
    elif not lay.cache_row and lay.cluster == 1:
        choices.append((False, 1, at(DB_SMEM_REGS_READ if lay.full else DB_SMEM_REGS_HELD)))
    # The fused add's rows over a cluster are read again; with both sums moved they are held instead.
    hold = lay.cluster > 1 and c.late_reads and c.ov.cache_row is None
    if lay.full and lay.rows == 1 and cluster_ok and 2 * need <= G.MAX_DB_SMEM_BYTES and (lay.cache_row or hold):
        choices.append((True, 3, at(DB_SMEM_REGS_BOTH)))
    elif (lay.cluster > 1 or not (lay.full or lay.cache_row)) and lay.rows == 1 and both_fit:
        regs = DB_SMEM_REGS_HELD if lay.cache_row or lay.full else DB_SMEM_REGS_READ  # (one block read again: its own)
        choices.append((lay.cache_row, 3, _one_block_blocks(c, lay) if lay.cluster == 1 and not lay.cache_row else at(regs)))
    # Rows held over 2 blocks with a masked chunk where holding them gains no block are read again.
    if lay.cache_row and not lay.full and lay.cluster == 2 and c.ov.cache_row is None and both_fit:
        choices.append((False, 3, at(DB_SMEM_REGS_READ)))
    if wide_k:  # both sums in dynamic shared memory where their slots fit it, at 2 blocks or more
        both = narrow_w and 2 * need <= G.slot_limit(c.tgt) and at(BWD_SUMS_REGS) > 1
        choices = [(False, 3 if both else 1, at(BWD_SUMS_REGS))]
    gains = [ch for ch in choices if ch[2] > at(BWD_SUMS4_REGS if wide_k else BWD_SUMS_REGS)]
    if not (lay.full or lay.cache_row) and lay.cluster == 1:
        gains.sort(key=lambda ch: -ch[2])  # rows of one block with a masked chunk: the most blocks
    return gains[0] if gains else None


@rule("persistent", HELD + " db_smem min_blocks", "v86 v88 v89 v111 v115 v116 v118 v119 v120", kept="centered", col_sums=2,
      x_bytes=2, vendor="nvidia", keeps="tpr cluster db_smem", shape=True)
def even_halves(c: Ctx, lay: Layout) -> Layout | None:
    """LayerNorm's 16-bit backward over 2 blocks, held (its own) or read again (its fused add's), goes
    to one block where that holds more rows at once than the 2 blocks as db_smem would cap them (the
    fused add's on a tie too): its own masked rows in 4-byte chunks read again, or 2 16-byte chunks a
    thread, read again, both column sums in shared memory (in the dynamic past MAX_DB_SMEM_BYTES),
    capped (the one block), whichever holds more."""
    if not (lay.cluster == 2 and (lay.cache_row or c.late_reads) and lay.vec % 2 == 0):
        return None
    choice = _db_smem_choice(c, lay)
    if choice and choice[1] == 1:
        return None  # rows held with db's sums alone moved keep their blocks
    best, most = None, choice[2] * lay.rows / lay.cluster if choice else G.rows_at_once(c.tgt, lay, BWD_SUMS_REGS)
    half = c.p.n // 2  # 4-byte chunks of a 16-bit row
    tprs = [t for t in range(lay.warp, MAX_THREADS + 1, lay.warp) if half % t == 0 and half // t <= BWD_NARROW_K]
    candidates = []
    if tprs and lay.cache_row and not lay.full:  # LayerNorm's own masked rows
        narrow4 = bwd_block(c, c.p.n, 2, tprs[0])
        candidates.append((narrow4, G.rows_at_once(c.tgt, narrow4, BWD_NARROW_REGS)))
    one = replace(bwd_block(c, c.p.n, lay.vec, -(-c.p.n // (2 * lay.vec * lay.warp)) * lay.warp), cache_row=False, db_smem=3)
    if c.p.has_weight and DTYPES[c.p.wdtype] <= c.x_bytes and one.k == 2 and one.slot_bytes <= G.slot_limit(c.tgt):
        one = replace(one, min_blocks=_one_block_blocks(c, one))
        candidates.append((one, one.min_blocks * one.rows))
    for new, rows in candidates:
        if rows > most or (new is one and rows == most and c.late_reads):
            best, most = new, rows
    return best


@rule("persistent", HELD + " db_smem min_blocks", "v81 v86 v87", late_reads=1, col_sums=2, needs="min_blocks_attr",
      keeps="tpr cluster", shape=True)
def pow2_warps(c: Ctx, lay: Layout) -> Layout | None:
    """Both column sums beside d_residual_out over 2 blocks of 5-7 warps: 4 blocks of BWD_WIDE_WARPS
    warps, held, both sums in shared memory, capped for DB_SMEM_REGS_BOTH, where that holds more rows
    at once than the sums in registers (w no wider than x)."""
    quad = 2 * lay.cluster
    if lay.cluster == 2 and DTYPES[c.p.wdtype] <= c.x_bytes and lay.wpr > G.BWD_WIDE_WARPS and lay.wpr & (lay.wpr - 1) \
            and c.p.n % (quad * lay.vec) == 0:
        new = clustered(bwd_block(c, c.p.n // quad, lay.vec, G.BWD_WIDE_WARPS * lay.warp), quad)
        if 2 * new.k * new.block * new.vec * 4 <= G.MAX_DB_SMEM_BYTES \
                and G.rows_at_once(c.tgt, new, DB_SMEM_REGS_BOTH) > G.rows_at_once(c.tgt, lay, BWD_SUMS_REGS):
            return replace(new, cache_row=True, db_smem=3, min_blocks=resident(c.tgt, new, DB_SMEM_REGS_BOTH))


@rule("persistent", "max_regs", "v90 v91", late_reads=1, col_sums=2, x_bytes=2, needs="max_regs_attr", keeps="tpr cluster")
def rows_cap(c: Ctx, lay: Layout) -> Layout | None:
    """Both column sums beside d_residual_out in blocks of several rows, every thread the same chunks:
    capped at BWD_ROWS_CAP_REGS registers (ptxas fits it in 128 then; on its own it spills at 128)."""
    return replace(lay, max_regs=BWD_ROWS_CAP_REGS) if lay.rows > 1 and lay.full else None


QUAD_KEEPS = "tpr cluster cache_row db_smem overlap stage min_blocks max_regs"  # (and stage_dres=0: _quads)


def _quads(c: Ctx, lay: Layout) -> int:
    """Blocks of HELD_QUAD_THREADS a row of bf16 tensors and w takes at 4 16-byte chunks a thread,
    where that is 2, 4 or 8; else 0 (and where stage_dres is forced off: the held rows need it)."""
    per = HELD_QUAD_THREADS * 4 * lay.vec
    quads = c.p.n // per if c.p.n % per == 0 and lay.vec * 2 == MAX_VECTOR_BYTES else 0
    bf16 = c.work.types_for(c.p) | {c.p.wdtype} == {"bf16"}
    return quads if quads in (2, 4, 8) and bf16 and c.ov.stage_dres != 0 else 0


@rule("persistent", HELD + " db_smem stage_dres", "v164 v165", kept="centered", col_sums=2, weight=True,
      needs="clusters stage_piece", keeps=QUAD_KEEPS, shape=True)
def held_quads(c: Ctx, lay: Layout) -> Layout | None:
    """LayerNorm's long bf16 backward rows held in 4 chunks a thread over 2, 4 or 8 blocks of
    HELD_QUAD_THREADS, both column sums in dynamic shared memory, and its fused add's d_residual_out
    copied into shared memory in pass 1 (stage_dres)."""
    quads = _quads(c, lay)
    return replace(lay, tpr=HELD_QUAD_THREADS, rows=1, k=4, kfull=4, nchunk=HELD_QUAD_THREADS * 4, cluster=quads,
                   cache_row=True, db_smem=3, stage_dres=bool(c.late_reads)) if quads else None


@rule("persistent", "cache_row stage_dres", "v164", kept="rms", late_reads=1, col_sums=1, weight=True,
      needs="clusters stage_piece", keeps=QUAD_KEEPS)
def held_quads_fused(c: Ctx, lay: Layout) -> Layout | None:
    """RMSNorm's fused add's long bf16 rows read again over a cluster in 4 whole chunks a thread: held,
    d_residual_out copied into shared memory in pass 1, whose registers the held rows need."""
    if _quads(c, lay) and lay.cluster > 1 and not lay.cache_row and lay.k == lay.kfull == 4 and not c.p.atomic_dw:
        return replace(lay, cache_row=True, stage_dres=True)


@rule("persistent", "cache_row", "v26 v27 v166 v167", weight=False, keeps="cache_row")
def hold_unweighted(c: Ctx, lay: Layout) -> Layout | None:
    """Without a weight there are no column sums: their registers hold the row where it fits in one
    block at up to 2 chunks a thread, and LayerNorm's bf16 rows without w and b over a cluster in 4
    whole chunks a thread in blocks of BWD_MAX_SUMS_THREADS (ptxas: 108 registers); not where forced
    staging or overlap read the row again."""
    budget = c.tgt.reg_budget_bytes(lay.block, overhead_regs=G.BWD_OVERHEAD_REGS)
    fits = lay.cluster == 1 and lay.k <= 2 and lay.k * lay.vec * c.hb <= budget
    wide = c.kept == "centered" and not (c.bias or c.late_reads) and lay.cluster > 1 \
        and lay.block == G.BWD_MAX_SUMS_THREADS and lay.k == lay.kfull == 4 and c.hb == 4
    if (fits or wide) and not (c.ov.stage == 1 or c.ov.overlap):
        return replace(lay, cache_row=True)


def _stageable(c: Ctx, lay: Layout) -> bool:
    return F.stage_fits(c, lay) and not lay.cache_row and lay.rows == 1 and lay.cluster == 1 and lay.k >= 4


@rule("persistent", "tpr k kfull stage", "v32 v33", needs="stage_piece", keeps="stage", shape=True)
def staged_pairs(c: Ctx, lay: Layout) -> Layout | None:
    """Rows of exactly 2048 chunks (N=16384 in 16-bit types, 8192 in f32) in 512 threads of 4: staged
    as 1024 threads of 2 (the same 128 KB of buffers, one block a multiprocessor, twice the warps)."""
    if _stageable(c, lay) and lay.k == 4 and lay.block == MAX_THREADS // 2 and lay.nchunk == 4 * lay.block:
        return replace(lay, tpr=2 * lay.tpr, k=lay.k // 2, kfull=lay.k // 2, stage=True)


@rule("persistent", "stage", "v6 v7 v11 v26 v27 v32 v40 v68 v69", late_reads=0, needs="stage_piece", keeps="stage")
def staged(c: Ctx, lay: Layout) -> Layout | None:
    """Rows read again, 4 or more chunks a thread, one block, no read in pass 2 alone: staged through
    shared memory where one block's buffers take at most STAGE_POLICY_BYTES, or there is no weight."""
    if _stageable(c, lay) and (lay.stage_buffers * lay.k * lay.block * MAX_VECTOR_BYTES <= STAGE_POLICY_BYTES
                               or not c.p.has_weight):
        return replace(lay, stage=True)


@rule("persistent", "l2_prefetch", "v5 v9 v167 v168", needs="prefetch_piece", keeps="l2_prefetch")
def l2_prefetch(c: Ctx, lay: Layout) -> Layout | None:
    """Pass 1 asks L2 for the block's next row where a block takes one row, not staged; not LayerNorm's
    rows held beside d_residual_out staged in shared memory (held_quads' fused add)."""
    if lay.rows == 1 and not lay.stage and not (lay.stage_dres and c.kept == "centered"):
        return replace(lay, l2_prefetch=True)


@rule("persistent", "cache_row db_smem min_blocks", "v75 v76 v77 v80 v91 v92 v94 v112 v116 v122 v123", bias=True,
      weight=True, needs="min_blocks_attr", keeps="db_smem")
def db_smem(c: Ctx, lay: Layout) -> Layout | None:
    """With a bias, db's column sums (or db's and dw's) go to shared memory where the registers that
    frees buy resident blocks, capped at a level ptxas kept them unspilled (_db_smem_choice); not
    where a rule before chose the slots."""
    choice = None if lay.db_smem else _db_smem_choice(c, lay)
    if choice:
        return replace(lay, cache_row=choice[0], db_smem=choice[1], min_blocks=lay.min_blocks or choice[2])


@rule("persistent", "overlap", "v19 v20 v27 v136", keeps="overlap")
def overlap(c: Ctx, lay: Layout) -> Layout | None:
    """Rows over a cluster read again, 4 chunks a thread in blocks of at most 512 threads: pass 2's
    first chunks loaded inside the cluster exchange, 2 beside the column sums; all 4 without a weight
    or with both sums in shared memory over whole powers of two of warps and no d_residual_out; none
    beside d_residual_out with db's sums alone there."""
    if F.overlappable(lay) and lay.k == 4 and lay.block <= MAX_THREADS // 2:
        every = not c.p.has_weight or (lay.db_smem == 3 and lay.wpr & (lay.wpr - 1) == 0 and not c.late_reads)
        return replace(lay, overlap=lay.k if every else 0 if lay.db_smem == 1 and c.late_reads else 2)


@rule("persistent", "cast_words", "v102 v103", kept="centered", vendor="nvidia", keeps="cast_words")
def words_bwd(c: Ctx, lay: Layout) -> Layout | None:
    """LayerNorm's backwards of bf16 rows: pass 2's casts by words; not staged, nor the fused add's
    rows held or read beside a wider weight (they spill at their caps)."""
    t = c.p.types
    if lay.vec % 2 == 0 and "bf16" in {t[x] for x in c.work.reads_for(c.p)} and not lay.stage \
            and not (c.late_reads and (lay.cache_row or DTYPES[c.p.wdtype] > 2)):
        return replace(lay, cast_words=True)


@rule("persistent", "hints", "v10 v11 v14 v16 v49 v66", needs="hints", keeps="hints")
def bwd_hints(c: Ctx, lay: Layout) -> Layout | None:
    """The final layout's cache hints: rows pass 2 reads again, one block, not staged (and rows held
    without a weight) have last reads and stores evict first from L2 and loads ask L1 to keep their
    lines; rows over a cluster read again, stores only."""
    if G.sixteen(c, lay) and not (lay.stage or (lay.cache_row and (c.p.has_weight or lay.cluster > 1))):
        return replace(lay, hints=G.HINT_STORES if lay.cluster > 1 else G.HINT_LAST_READ | G.HINT_STORES | G.HINT_L1_KEEP)


# The declared order: the rules, and where each forced knob is applied and checked (F.*). A forward
# takes the rules of grid "rows", a backward those of "persistent"; every field has one owner.
ORDER = (
    narrow, amd_wb_reread, wide_sums_held, even_rows, held_ragged, held_pairs, streamed_words, streamed, two_blocks,
    amd_rolled, crowded_threads, even_bwd, even_halves, pow2_warps, rows_cap, held_quads, held_quads_fused,
    hold_unweighted, F.cache_row, staged_pairs, staged, F.stage, l2_prefetch, F.l2_prefetch, F.hints, F.caps,
    F.batch_reload, db_smem, F.db_smem, overlap_wb, overlap, F.overlap, words_fwd, words_bwd, F.cast_words, two_pass,
    F.two_pass, F.stage_dres, bwd_hints,
)
RULES = tuple(r for r in ORDER if isinstance(r, Rule))
