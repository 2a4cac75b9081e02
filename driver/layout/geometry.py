"""The layout's geometry: how a Layout covers a row (threads per row, chunks a thread, rows a
block, blocks a row), what a decision reads about a kernel (Features, from the catalogue), and the
inputs of a decision (Ctx: the problem, the overrides, the target and what the catalogue says of
the kernel). The measured preferences on top of it are rules (rules.py); docs/tuning.md has the
measurements behind the constants here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .. import targets
from ..kernels import KernelSpec, RowWork

if TYPE_CHECKING:
    from ..options import Overrides, Problem

DTYPES = {"bf16": 2, "f16": 2, "f32": 4}  # MLIR element type -> bytes
QDTYPES = {"f8e4m3": 1, "i8": 1}  # a quantized forward's q types (the kernel stores bytes: i8)
ELEMENT_BYTES = {**DTYPES, "i8": 1}  # every element type a kernel moves
# Bytes of a vector access at most, threads of a block at most, a block's threads where several rows share it.
MAX_VECTOR_BYTES, MAX_THREADS, ROWS_BLOCK = 16, 1024, 256
REDUCE_CT, REDUCE_RT = 8, 32  # the column sums: 8 column threads x 32 row threads
REDUCE_RT_SHORT, REDUCE_SHORT_CHUNKS = 128, 512  # 128 row threads for rows of at most 512 fp32 chunks
REDUCE_CT_LONG, REDUCE_RT_LONG, REDUCE_LONG_CHUNKS = 32, 8, 8192  # 32 x 8 from 8192 fp32 chunks
BWD_OVERHEAD_REGS = 36  # six pointers, three strides and the persistent loop's state
AMD_1024_ROW_ELEMENTS = 64  # row elements a thread of a 1024-thread AMDGPU block may hold
AMD_1024_ROW_ELEMENTS_WB = 32  # ... beside w and b read again (rules.amd_wb_reread, a quantized forward's amax)
# STAGE buffers past the first leave too little shared memory; db's slots in static shared memory
# (48 KB at most, beside the reductions'); the quarter slots (db_smem 2, 3) past that go to dynamic
# shared memory, up to two blocks' worth of a multiprocessor's 228 KB (NVIDIA; the stage piece's base).
MAX_STAGE_BYTES, MAX_DB_SMEM_BYTES, MAX_DYN_SLOT_BYTES = 200 * 1024, 40 * 1024, 112 * 1024
REG_QUADRANTS = 4  # a warp's registers come from one quadrant of the register file (4 x 16384 on sm_90)
MAX_MIN_BLOCKS = 32  # NVVM's .minnctapersm: at most the resident blocks of a multiprocessor
# The hints knob's bits (see mlir/common/hint_io_nvvm.mlir): a row's last read asks L2 to evict
# its lines first; stores do; a first read that pass 2 repeats asks L2 to keep them; loads ask L1
# to keep their lines (.L1::evict_last); a row's last reads ask L1 to evict first (.L1::evict_first).
HINT_LAST_READ, HINT_STORES, HINT_KEEP, HINT_L1_KEEP, HINT_L1_FIRST = 1, 2, 4, 16, 32
HINT_BITS = HINT_LAST_READ | HINT_STORES | HINT_KEEP | HINT_L1_KEEP | HINT_L1_FIRST
HINT_LOADS = HINT_LAST_READ | HINT_KEEP | HINT_L1_KEEP | HINT_L1_FIRST
MAX_CLUSTER = 8  # blocks of a thread-block cluster that share one row (the portable limit)
# Rows a one-pass kernel may read twice with L2 hints (rules.streamed), in chunks; streamed rows batch
# pass 2's loads up to this many threads.
FWD_STREAM_CHUNKS, FWD_BATCH_MAX_TPR = (128, 4096), 512
# Persistent kernels split rows whose column sums need more than this many registers per thread:
# with 64 (N=32768 bf16 in one 512-thread block) ptxas caps the block at 128 registers and spills.
BWD_SPLIT_DW = 32
# Persistent rows read again, sums in BWD_SPLIT_DW registers: threads a block before a cluster; rows
# with a wider row summary: warps a block before a cluster.
BWD_MAX_SUMS_THREADS, BWD_WIDE_WARPS = 512, 4


@dataclass(frozen=True)
class Layout:
    """How threads cover rows; see each kernel's header comment."""

    vec: int  # elements per vector access
    tpr: int  # threads per row
    rows: int  # rows per block
    k: int  # chunks per thread
    kfull: int  # chunks every thread has (the rest are masked)
    nchunk: int  # chunks per row
    cache_row: bool  # row kept in registers between passes
    warp: int
    prefetch_w: bool = False  # weight chunks loaded in pass 1 (registers permitting)
    batch_reload: bool = False  # row read twice: pass 2 loads all its x and w chunks, then computes
    dw_regs: bool = False  # persistent: the column sums kept in registers across the row loop
    cluster: int = 1  # blocks (one thread-block cluster) sharing each row; each takes N / cluster
    l2_prefetch: bool = False  # pass 1 also asks L2 for the block's next row (prefetch.global.L2)
    stage: bool = False  # rows staged through shared memory by asynchronous copies (cp.async)
    stage_buffers: int = 0  # STAGE buffers of K x BLOCK 16-byte chunks (2 per tensor read)
    min_blocks: int = 0  # blocks that must fit one multiprocessor (caps registers per thread); 0: no cap
    max_regs: int = 0  # registers a thread may take at most (forced, or rules.rows_cap's); 0: no cap
    hints: int = 0  # cache hints, a sum of the HINT_* bits (loads of the rows read, stores of those written)
    overlap: int = 0  # pass 2's first chunks loaded early (a backward's in the exchange, a held forward's w and b)
    db_smem: int = 0  # persistent with a bias: db's column sums in shared memory, each thread its own (the db_smem knob)
    cast_words: bool = False  # pass 2's bf16 casts by 32-bit words, the forward's x_hat * w + b one fma
    two_pass: bool = False  # LayerNorm's held rows: the variance by a second pass over the held chunks
    stage_dres: bool = False  # d_residual_out copied into shared memory in pass 1, read there in pass 2

    @property
    def slot_bytes(self) -> int:
        """Shared memory of the column sums' slots a block (db_smem): db's, and dw's too at 3."""
        return (2 if self.db_smem == 3 else 1) * self.k * self.block * self.vec * 4 if self.db_smem else 0

    @property
    def dyn_slots(self) -> bool:
        """The quarter slots (db_smem 2, 3) in dynamic shared memory: past MAX_DB_SMEM_BYTES."""
        return self.db_smem >= 2 and self.slot_bytes > MAX_DB_SMEM_BYTES

    @property
    def dres_at(self) -> int:
        """Where STAGE_DRES's chunks begin in the dynamic shared memory: past the STAGE buffers, or
        past the slots there."""
        buffers = self.stage_buffers * self.k * self.block * MAX_VECTOR_BYTES
        return buffers if self.stage else self.slot_bytes if self.dyn_slots else 0

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per block: the STAGE buffers or the slots past the static limit, then
        STAGE_DRES's chunks."""
        return self.dres_at + (self.k * self.block * MAX_VECTOR_BYTES if self.stage_dres else 0)

    @property
    def nsub(self) -> int:
        """Columns of a row that one block covers."""
        return self.nchunk * self.vec

    @property
    def block(self) -> int:
        return self.tpr * self.rows

    @property
    def wpr(self) -> int:
        return max(1, self.tpr // self.warp)

    @property
    def full(self) -> bool:
        """Every thread the same chunks: none carries a masked one."""
        return self.k == self.kfull

    @property
    def equal_counts(self) -> bool:
        """Every thread of a row has as many chunks, and the warp totals are a power of two: each
        butterfly step merges two summaries over as many elements."""
        return self.full and self.wpr & (self.wpr - 1) == 0

    @property
    def unroll_limit(self) -> int:
        """Unroll the chunk loops fully only when a private array must become registers."""
        private = self.cache_row or self.dw_regs or self.prefetch_w or self.overlap > 0 or self.batch_reload
        return targets.UNROLL_LIMIT if private else 0


# ---------------------------------------------------------------------------- what a decision reads


@dataclass(frozen=True)
class Ctx:
    """One decision's inputs: the problem, the overrides (None: the policy's), the target, the
    kernel's work, and the features the rules read about the kernel (from the catalogue,
    kernels.py, and the problem)."""

    p: Problem
    ov: Overrides
    tgt: targets.Target
    work: RowWork
    hb: int  # register bytes an element of the rows held takes (or of pass 1's loads in flight)
    grid: str  # "rows" (a block per row group: the forwards) or "persistent" (the backwards)
    kept: str  # the statistics kept (kernels.Stats.kept): "rms" or "centered"
    row_sums: int  # fp32 values a row carries through the block reduction and the cluster exchange
    after_norm: tuple  # reductions after the normalize the problem asks for (kernels.RowReduce); () none
    out_bytes: int  # bytes of the narrowest element the kernel writes (a quantized q: 1)
    reads: int  # row tensors pass 1 reads
    late_reads: int  # row tensors pass 2 alone reads (d_residual_out)
    col_sums: int  # fp32 per-column sums a persistent kernel keeps (dw, and db with a bias)
    x_bytes: int  # bytes of an element of x (the row normalized)
    weight: bool
    bias: bool
    vendor: str  # the target's: "nvidia" or "amd"

    @property
    def persistent(self) -> bool:
        return self.grid == "persistent"


def context(p: Problem, ov: Overrides, tgt: targets.Target, spec: KernelSpec) -> Ctx:
    """The register bytes an element of the rows held takes: bf16 stays packed (the late_ext piece
    keeps LLVM from holding fp32 copies), f16 and f32 are held as fp32; where pass 1 reads more rows
    than it keeps (the fused add's x and residual, summed into h), its loads in flight, which the
    compiler issues together."""
    w, t, reads = spec.work, p.types, spec.work.reads_for(p)
    held = sum(2 if t[x] == "bf16" else 4 for x in w.held_rows)
    hb = max(held, sum(DTYPES[t[x]] for x in reads)) if w.held is not None else held
    out_bytes = min(ELEMENT_BYTES[t[x]] for x in w.writes)
    return Ctx(p, ov, tgt, w, hb, spec.grid, spec.stats.kept, w.sums, w.after_for(p), out_bytes, len(reads),
               len(w.late_for(p)),
               w.col_sums + (1 if w.bias_sums and p.bdtype else 0), DTYPES[p.dtype], p.has_weight, bool(p.bdtype),
               tgt.vendor)


def sixteen(c: Ctx, lay: Layout) -> bool:
    """Every row tensor moves in 16-byte chunks."""
    return {lay.vec * ELEMENT_BYTES[t] for t in c.work.types_for(c.p)} == {MAX_VECTOR_BYTES}


def hintable(c: Ctx, lay: Layout) -> bool:
    """The target has L2 eviction hints and every row tensor moves in 16-byte chunks."""
    return bool(c.tgt.hints) and sixteen(c, lay)


def resident(tgt: targets.Target, lay: Layout, regs: int) -> int:
    """Blocks of a layout resident on one multiprocessor at `regs` registers a thread: a warp's
    registers come from one quadrant of the register file."""
    return REG_QUADRANTS * (tgt.regs_per_sm // REG_QUADRANTS // (regs * lay.warp)) // (lay.block // lay.warp)


def rows_at_once(tgt: targets.Target, lay: Layout, regs: int) -> float:
    """Rows a multiprocessor works on at once at `regs` registers a thread (resident's blocks)."""
    return resident(tgt, lay, regs) * lay.rows / lay.cluster


def slot_limit(tgt: targets.Target) -> int:
    """Bytes of the column sums' quarter slots a block may take: past static shared memory into the
    dynamic, where the target has its base (the stage piece's)."""
    return MAX_DYN_SLOT_BYTES if tgt.stage_piece else MAX_DB_SMEM_BYTES


def max_vec(n: int, elem_bytes: int) -> int:
    """The widest power-of-two vector (<= 16 bytes) that divides the row."""
    v = MAX_VECTOR_BYTES // elem_bytes
    while n % v:
        v //= 2
    return v


# ---------------------------------------------------------------------------- covering a row


def whole_warps(chunks: int, k: int, warp: int) -> int:
    """The fewest whole warps that cover `chunks` at k chunks a thread."""
    return -(-math.ceil(chunks / k) // warp) * warp


def _cover(nchunk: int, tpr: int, warp: int, shared: bool, k: int, top: int) -> tuple[int, int]:
    """(threads a row, rows a block): a forced tpr; else a power-of-two part of a warp at k chunks a
    thread for rows that share a block (ROWS_BLOCK threads), else the fewest whole warps, at most top."""
    if tpr:
        return forced_tpr(nchunk, tpr, warp)
    if shared:
        tpr = min(warp, 1 << max(0, (math.ceil(nchunk / k) - 1).bit_length()))
        return tpr, max(1, ROWS_BLOCK // tpr)
    return min(top, whole_warps(nchunk, k, warp)), 1


def forced_tpr(nchunk: int, tpr: int, warp: int) -> tuple[int, int]:
    """(tpr, rows) for a chosen threads-per-row. Every thread must own a chunk: with threads that
    own none, LLVM may duplicate the row reduction into a branch of their own, which hung the H200
    (rmsnorm_bwd, N=2880, 384 threads, staged, no weight)."""
    if tpr > nchunk:
        raise ValueError(f"tpr={tpr} leaves threads without a chunk: the row (or a cluster block's share) has "
                         f"{nchunk} chunks; choose tpr <= {nchunk}, or a narrower vector (vec) for more chunks")
    return tpr, (max(1, ROWS_BLOCK // tpr) if tpr <= warp else 1)


def split(n: int, vec: int, tgt: targets.Target, cluster: int, tpr: int, wants_split) -> int:
    """Blocks per row: the forced `cluster`, else the smallest power of two (up to MAX_CLUSTER,
    keeping whole vectors per block) for which wants_split(cluster) is false. A row shared by a
    cluster is one row per block of whole warps, so a forced tpr below the warp never splits."""
    if cluster or 0 < tpr <= tgt.warp:
        return cluster or 1
    c = 1
    while tgt.clusters and c < MAX_CLUSTER and n % (2 * c * vec) == 0 and wants_split(c):
        c *= 2
    return c


def clustered(lay: Layout, c: int) -> Layout:
    if c == 1:
        return lay
    if lay.tpr < lay.warp:
        raise ValueError(f"cluster={c} leaves each block {lay.nsub} columns, which {lay.tpr} threads "
                         f"(less than a warp of {lay.warp}) cover: use a smaller cluster or a larger tpr")
    return replace(lay, rows=1, cluster=c)  # the cluster piece exchanges one total per block


def row_layout(n: int, vec: int, held_bytes: int, tgt: targets.Target, tpr: int = 0, w_bytes: int = 2,
               cluster: int = 0) -> Layout:
    """A one-pass row: split over a thread-block cluster, where the target has clusters, until a
    block's share fits its registers (row_block)."""
    c = split(n, vec, tgt, cluster, tpr, lambda c: not row_block(n // c, vec, held_bytes, tgt, tpr, w_bytes).cache_row)
    return clustered(row_block(n // c, vec, held_bytes, tgt, tpr, w_bytes), c)


def row_block(n: int, vec: int, held_bytes: int, tgt: targets.Target, tpr: int = 0, w_bytes: int = 2) -> Layout:
    """A row (or a block's share) of n elements: rows of at most 4 chunks a lane of one warp share
    a block; longer ones get a block of up to 1024 threads of 4 (8 past 1024 chunks) chunks, and on
    NVIDIA a row of exactly 4 chunks a lane two warps of 2 (*tune-v2*, -v3, -v15). Held in
    registers where it fits the block's budget, else read again."""
    warp, nchunk = tgt.warp, n // vec
    # AMDGPU at 1024 threads with more than 4 bytes an element in flight hoists the re-read row's
    # loads into scratch (tests/test_gfx950_scratch.py): 512 threads there.
    top = MAX_THREADS // 2 if tgt.hoists_weight and held_bytes > 4 else MAX_THREADS
    shared = nchunk < warp * 4 or (nchunk == warp * 4 and not tgt.is_nvidia)
    k = 4 if shared or warp * 4 < nchunk <= 1024 else 2 if nchunk == warp * 4 else 8
    tpr, rows = _cover(nchunk, tpr, warp, shared, k, top)
    k, budget = -(-nchunk // tpr), tgt.reg_budget_bytes(tpr * rows)
    cache_row = k * vec * held_bytes <= budget
    prefetch_w = cache_row and k * vec * (held_bytes + w_bytes) <= budget
    if tgt.hoists_weight and tpr * rows >= MAX_THREADS:
        # AMDGPU at 1024 threads holds w as fp32 and bf16 rows unpacked: no w beside the row, nor
        # more than 64 elements of it (scratch at N=65536 and 131072 in bf16).
        prefetch_w, cache_row = False, cache_row and k * vec <= AMD_1024_ROW_ELEMENTS
    return Layout(vec=vec, tpr=tpr, rows=rows, k=k, kfull=nchunk // tpr, nchunk=nchunk, cache_row=cache_row, warp=warp,
                  prefetch_w=prefetch_w)


def streamed_row(lay: Layout, reads: int, sums: int) -> Layout:
    """A one-pass row read twice, pass 1 asking L2 to keep its lines and pass 2 to evict them
    (and both L1 to keep them; pass 2's last reads to evict them first past 1024 chunks): 2 chunks
    a thread up to 1024 chunks, then 4; two reads one chunk a thread up to 1024 threads, then 2,
    then 4; a wider row summary (sums > 1) at most 512 threads of one read, 4 chunks a thread where
    its chunks do not fill whole warps. Rows of 4 chunks over at most FWD_BATCH_MAX_TPR threads
    batch pass 2's loads (*tune-v36*, -v37, -v49, -v57, -v58, -v63, -v64, -v68 to -v70, -v72 to -v74)."""
    top = MAX_THREADS if sums == 1 else MAX_THREADS // 2
    ragged = sums > 1 and lay.nchunk % lay.warp != 0  # unequal counts: a reciprocal per merge step
    if reads > 1 and not ragged:
        k = 1 if lay.nchunk <= top else 2 if lay.nchunk <= 2 * top else 4
    else:
        k = 2 if lay.nchunk <= MAX_THREADS and sums == 1 else 4
    # Whole warps, each thread owning a chunk: threads rounded down where the chunks do not fill a
    # last warp (N=2880: 360), the first threads then taking a second, masked-tail chunk.
    tpr = min(whole_warps(lay.nchunk, k, lay.warp), lay.nchunk // lay.warp * lay.warp)
    hints = HINT_LAST_READ | HINT_KEEP | HINT_L1_KEEP | (HINT_L1_FIRST if lay.nchunk > MAX_THREADS else 0)
    return replace(lay, tpr=tpr, rows=1, k=-(-lay.nchunk // tpr), kfull=lay.nchunk // tpr, cache_row=False,
                   prefetch_w=False, hints=hints, batch_reload=k == 4 and tpr <= FWD_BATCH_MAX_TPR)


def fwd_layout(c: Ctx) -> Layout:
    """A one-pass kernel's (a block per row group: the forward) geometry. A reduction after the
    normalize (a quantized forward's amax) has no cluster exchange: its row stays in one block,
    and a row too long for the block's registers is read three times (pass 1, the amax's pass, the
    stores) where others split over a cluster."""
    cluster = c.ov.cluster or 0
    if c.after_norm and cluster > 1:
        raise ValueError(f"cluster={cluster}: {c.p.kernel}'s amax (qdynamic) has no cluster exchange; use None or 1")
    lay = row_layout(c.p.n, c.p.vec, c.hb, c.tgt, c.ov.tpr or 0, DTYPES[c.p.wdtype], 1 if c.after_norm else cluster)
    # AMDGPU's 1024 threads: the amax's pass reads w and b again beside the held row, which then
    # spills past AMD_1024_ROW_ELEMENTS_WB (64 bytes of scratch at N=65536 in bf16 with a bias).
    if c.after_norm and c.tgt.hoists_weight and lay.block >= MAX_THREADS and (c.weight or c.bias) and lay.cache_row \
            and lay.k * lay.vec > AMD_1024_ROW_ELEMENTS_WB:
        lay = replace(lay, cache_row=False, prefetch_w=False)
    return lay


def bwd_block(c: Ctx, n: int, vec: int, tpr: int = 0) -> Layout:
    """A persistent kernel's row (or a block's share) of n elements: short rows (<= 256 chunks) 2
    chunks a thread, held; longer ones 2 chunks a thread up to 512 chunks, then 4, read again in
    pass 2 with only the fp32 column sums in registers (more resident threads beat the saved
    re-read); past 1024 threads 512 with more chunks while the sums fit. A wider row summary read
    once more holds its rows at up to 2 chunks a thread (*tune-v73*, -v74)."""
    tgt, warp, nchunk, half = c.tgt, c.tgt.warp, n // vec, MAX_THREADS // 2
    dw_bytes = 4 * (c.col_sums + (1 if tgt.hoists_weight else 0))  # fp32 column sums (+ AMDGPU's hoisted fp32 w)
    k_target, chosen = 2 if nchunk <= 512 else 4, tpr > 0
    shared = nchunk <= warp * k_target
    # Where LLVM holds w beside the sums (AMDGPU), 1024-thread rows spill: stop at 512.
    tpr, rows = _cover(nchunk, tpr, warp, shared, k_target, half if tgt.hoists_weight else MAX_THREADS)
    fits = [-(-nchunk // t) * vec * dw_bytes <= tgt.reg_budget_bytes(t, BWD_OVERHEAD_REGS) for t in (tpr, half)]
    if not (chosen or shared) and tpr > half and fits == [False, True]:
        tpr = half  # the sums fit 512 threads of more chunks, not the 1024
    k, budget = -(-nchunk // tpr), tgt.reg_budget_bytes(tpr * rows, overhead_regs=BWD_OVERHEAD_REGS)
    hold = nchunk <= 256 or (c.row_sums > 1 and not c.late_reads and k <= 2)
    return Layout(vec=vec, tpr=tpr, rows=rows, k=k, kfull=nchunk // tpr, nchunk=nchunk, warp=warp,
                  cache_row=hold and k * vec * (4 * c.col_sums + c.hb) <= budget, dw_regs=k * vec * dw_bytes <= budget,
                  stage_buffers=2 * c.reads)


def bwd_share(c: Ctx, blocks: int) -> Layout:
    """A block's share of a persistent kernel's row split over `blocks` blocks."""
    return bwd_block(c, c.p.n // blocks, c.p.vec, c.ov.tpr or 0)


def crowded(c: Ctx, lay: Layout) -> bool:
    """Rows read again whose one column sum takes all BWD_SPLIT_DW registers a thread, in a block of
    more than BWD_MAX_SUMS_THREADS: ptxas spilled 48-296 bytes there (*tune-v105*)."""
    return not lay.cache_row and c.col_sums == 1 and lay.k * lay.vec >= BWD_SPLIT_DW \
        and lay.block > BWD_MAX_SUMS_THREADS


def bwd_layout(c: Ctx) -> Layout:
    """A persistent kernel's (the backward's) geometry: rows whose fp32 column sums do not fit one
    block's registers, need more than BWD_SPLIT_DW of them a thread or crowd the block, are split
    over a cluster until a block's share does; so is a wider row summary read once more that one
    block would take in 2 chunks a thread over more than BWD_WIDE_WARPS warps, unless the row splits
    evenly over the one block and not its halves (*tune-v73*, -v74, -v83)."""
    tpr = c.ov.tpr or 0

    def too_big(blocks: int) -> bool:
        lay = bwd_share(c, blocks)
        wide = c.row_sums > 1 and not c.late_reads and blocks == 1 and not tpr and lay.k <= 2 \
            and lay.tpr > BWD_WIDE_WARPS * c.tgt.warp and (not lay.full or bwd_share(c, 2).full)
        return not lay.dw_regs or lay.k * lay.vec * c.col_sums > BWD_SPLIT_DW or wide or crowded(c, lay)

    blocks = split(c.p.n, c.p.vec, c.tgt, c.ov.cluster or 0, tpr, too_big)
    return clustered(bwd_share(c, blocks), blocks)


def reduce_layout(n: int, vec: int, warp: int) -> Layout:
    """The column sums: 8 column threads (16-byte fp32 vectors) x 32 row threads, 128 row threads
    for short rows (at most 512 chunks), 32 x 8 for long ones (8192 chunks or more)
    (`docs/results/2026-12-03-h200.md` runs g, h, j)."""
    nchunk = n // vec
    cols, rows = (REDUCE_CT_LONG, REDUCE_RT_LONG) if nchunk >= REDUCE_LONG_CHUNKS else \
        (REDUCE_CT, REDUCE_RT_SHORT if nchunk <= REDUCE_SHORT_CHUNKS else REDUCE_RT)
    return Layout(vec=vec, tpr=cols, rows=rows, k=1, kfull=1, nchunk=nchunk, cache_row=False, warp=warp)
