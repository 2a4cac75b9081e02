"""The layout policy: (problem, target, the kernel's RowWork) -> Layout, how threads cover rows.

Decisions come from data about the kernel (kernels.RowWork: what it reads, holds, writes and
keeps per element; its grid kind), never from its name: a kernel of a persistent grid with
per-column sums (a backward) takes bwd_layout, a kernel of a block per row group (a forward)
row_layout and, where it pays, the streamed row. The measured constants are named below; each
function's docstring says which H200 measurements set them (docs/tuning.md has the history).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from . import targets
from .kernels import KernelSpec, RowWork

if TYPE_CHECKING:
    from .options import Options, Overrides, Problem

DTYPES = {"bf16": 2, "f16": 2, "f32": 4}  # MLIR element type -> bytes
MAX_VECTOR_BYTES = 16
MAX_THREADS = 1024
REDUCE_CT, REDUCE_RT = 8, 32  # the column sums: 8 column threads x 32 row threads
REDUCE_RT_SHORT, REDUCE_SHORT_CHUNKS = 128, 512  # 128 row threads for rows of at most 512 fp32 chunks
REDUCE_CT_LONG, REDUCE_RT_LONG, REDUCE_LONG_CHUNKS = 32, 8, 8192  # 32 x 8 from 8192 fp32 chunks
BWD_OVERHEAD_REGS = 36  # six pointers, three strides and the persistent loop's state
ROWS_BLOCK = 256  # block size when several rows share a block
AMD_1024_ROW_ELEMENTS = 64  # row elements a thread of a 1024-thread AMDGPU block may hold
AMD_1024_ROW_ELEMENTS_WB = 32  # the same beside a weight and a bias (fwd_layout)
# AMDGPU persistent kernels with the column sums in memory, with and without a weight, per chunk
# width (elements): the chunks per thread [lo, hi) for which LLVM fully unrolls the chunk loops
# into a spill, and the count that keeps them rolled (see _bwd_block_layout). Found by compiling
# every N in every dtype (tests/test_gfx950_scratch.py).
AMD_UNROLL_K = {True: {4: (16, 64, 64), 8: (12, 16, 32)}, False: {4: (32, 64, 64), 8: (16, 24, 32)}}
# The same for rows whose chunks are wider than 16 bytes (a gradient or residual_out of another
# type than the row's narrowest: fp32 chunks of 8): every count of chunks under this one spilled
# somewhere (6-688 B at 512 threads, 84-3028 B at 128-448), none from it (k >= 43; the fused add's
# backward, RMSNorm's and LayerNorm's at 16384-262144, tests/test_gfx950_scratch.py).
AMD_WIDE_ROLLED_K = 48
MAX_STAGE_BYTES = 200 * 1024  # STAGE buffers past this leave too little shared memory
MAX_DB_SMEM_BYTES = 40 * 1024  # db's slots in static shared memory (48 KB at most, beside the reductions')
# The quarter slots (db_smem 2, 3) past that go to dynamic shared memory, up to two blocks' worth of
# a multiprocessor's 228 KB (NVIDIA; the stage piece's base).
MAX_DYN_SLOT_BYTES = 112 * 1024
# Registers per thread the policy caps a backward at when db's sums move to shared memory (_db_smem):
# rows held in registers (or read again with a masked chunk), rows read again; the register file's
# quadrants (a warp's registers come from one: 4 x 16384 on sm_90).
DB_SMEM_REGS_HELD, DB_SMEM_REGS_READ = 96, 80
DB_SMEM_REGS_BOTH = 80  # rows held, dw's sums in shared memory too (ptxas: 80 at 2048-32768, bf16)
# Rows of one block, 2 chunks a thread, read again, both sums in shared memory (_one_block_blocks):
# ptxas 56-64 registers uncapped, 63-72 capped for 2-6 blocks, none spilled.
DB_SMEM_REGS_ONE = 72
ONE_BLOCK_TWO_READS = 4  # the most blocks of those rows where a row is read twice (no d_residual_out)
REG_QUADRANTS = 4
BWD_SUMS_REGS = 128  # a 16-bit backward with its column sums in registers (ptxas: 111-152 at 1024-8192)
BWD_SUMS4_REGS = 200  # the same at 4 chunks a thread over a cluster, read again (ptxas: 196-217 at 65536)
# Persistent kernels stage by default only where two blocks' buffers fit a multiprocessor: at
# N=16384 (128 KB, one block) the L2 prefetch with eviction hints beat staging at 512 threads by
# 9% (*tune-v11*); rows of 2048 chunks are staged at 1024 threads instead (_staged).
STAGE_POLICY_BYTES = 100 * 1024
FWD_STREAM_CHUNKS = (128, 4096)  # rows a one-pass kernel reads twice with L2 hints (_streamed)
MAX_MIN_BLOCKS = 32  # NVVM's .minnctapersm: at most the resident blocks of a multiprocessor
# The hints knob's bits (see mlir/common/hint_io_nvvm.mlir): a row's last read asks L2 to evict
# its lines first; stores do; a first read that pass 2 repeats asks L2 to keep them; loads ask L1
# to keep their lines (.L1::evict_last); a row's last reads ask L1 to evict first (.L1::evict_first).
HINT_LAST_READ, HINT_STORES, HINT_KEEP, HINT_L1_KEEP, HINT_L1_FIRST = 1, 2, 4, 16, 32
HINT_BITS = HINT_LAST_READ | HINT_STORES | HINT_KEEP | HINT_L1_KEEP | HINT_L1_FIRST
HINT_LOADS = HINT_LAST_READ | HINT_KEEP | HINT_L1_KEEP | HINT_L1_FIRST
FWD_BATCH_MAX_TPR = 512  # streamed rows batch pass 2's loads up to this many threads
MAX_CLUSTER = 8  # blocks of a thread-block cluster that share one row (the portable limit)
FWD_WIDE_CLUSTER = 4  # one-pass rows that fill a 1024-thread block: blocks per row (see row_layout)
FWD_WIDE_SUMS_CLUSTER = 8  # the fused add's LayerNorm forward, long rows: blocks per row (_wide_sums_held)
FWD_OVERLAP, FWD_OVERLAP_MIN_K = 2, 8  # held forward rows over a cluster: w's and b's first chunks early (_overlap)
FWD_TWO_BLOCKS_THREADS = 768  # a streamed forward row of this many threads or more: capped for 2 blocks (_two_blocks)
# Persistent kernels split rows whose column sums need more than this many registers per thread:
# with 64 (N=32768 bf16 in one 512-thread block) ptxas caps the block at 128 registers and spills.
BWD_SPLIT_DW = 32
BWD_MAX_SUMS_THREADS = 512  # persistent rows read again, sums in BWD_SPLIT_DW registers: threads a block before a cluster
BWD_KEEP_THREADS = 768  # _crowded_threads: the most threads a crowded row's blocks keep (ptxas spills past it)
BWD_WIDE_WARPS = 4  # persistent rows with a wider row summary: warps per block before a cluster (bwd_layout)
# A forward's rows split evenly (_even_rows): at most this many elements a thread, at least
# FWD_EVEN_MIN_K chunks (one or two a thread lost, *tune-v83*), rows of at most FWD_EVEN_MAX_CHUNKS
# 16-byte chunks (measured up to 480).
FWD_EVEN_MAX_ELEMENTS, FWD_EVEN_MIN_K, FWD_EVEN_MAX_CHUNKS = 100, 4, 512
BWD_NARROW_MAX_FILL = 0.8  # a backward's masked rows take narrower chunks up to this share of slots filled (_even_bwd)
BWD_NARROW_K = 5  # 4-byte chunks a thread, at most, of LayerNorm's backward rows in one block (_even_halves)
BWD_NARROW_REGS = 64  # registers a thread of those rows (ptxas: 45-62, bf16, 2112-3520)
BWD_HALF_MAX_FILL = 0.875  # the fused add's masked rows take half-width chunks up to this share filled (_even_bwd)
BWD_ROWS_CAP_REGS = 136  # the fused add's LayerNorm backward in blocks of several rows: its cap (_rows_cap)
WORDS_MAX_HELD = 32  # a forward's held rows of at most this many elements a thread take the casts in words
HELD_QUAD_THREADS = 256  # LayerNorm's long bf16 backward rows held in 4 chunks a thread: threads a block (_held_quads)


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
    max_regs: int = 0  # registers a thread may take at most (forced, or _rows_cap's); 0: no cap
    hints: int = 0  # cache hints, a sum of the HINT_* bits (loads of the rows read, stores of those written)
    overlap: int = 0  # pass 2's first chunks loaded early (a backward's in the exchange, a held forward's w and b)
    db_smem: int = 0  # persistent with a bias: db's column sums in shared memory, each thread its own (the db_smem knob)
    cast_words: bool = False  # the forward's pass-2 bf16 casts by 32-bit words, x_hat * w + b one fma (_cast_words)
    two_pass: bool = False  # LayerNorm's held rows: the variance by a second pass over the held chunks (_two_pass)
    stage_dres: bool = False  # d_residual_out copied into shared memory in pass 1, read there in pass 2 (_stage_dres)

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
        if self.stage:
            return self.stage_buffers * self.k * self.block * MAX_VECTOR_BYTES
        return self.slot_bytes if self.dyn_slots else 0

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
    def equal_counts(self) -> bool:
        """Every thread of a row has as many chunks, and the warp totals are a power of two: each
        butterfly step merges two summaries over as many elements."""
        return self.k == self.kfull and self.wpr & (self.wpr - 1) == 0

    @property
    def unroll_limit(self) -> int:
        """Unroll the chunk loops fully only when a private array must become registers."""
        return targets.UNROLL_LIMIT if (self.cache_row or self.dw_regs or self.prefetch_w or self.overlap > 0
                                        or self.batch_reload) else 0


def held(dtype: str) -> int:
    """Register bytes per element of a row held across the reduction: bf16 stays packed (the
    late_ext piece keeps LLVM from holding fp32 copies), f16 and f32 are held as fp32."""
    return 2 if dtype == "bf16" else 4


def types(opts: Options) -> dict[str, str]:
    """The element type of each type placeholder (see kernels.py) for a problem."""
    return {"T": opts.dtype, "WT": opts.wdtype, "RT": opts.rdtype or opts.dtype, "HT": opts.held_dtype,
            "YT": opts.odtype or opts.dtype, "XT": opts.xdtype or opts.dtype, "BT": opts.bdtype or opts.wdtype,
            "GT": opts.gdtype or opts.dtype, "f32": "f32"}


def held_bytes(work: RowWork, opts: Options) -> int:
    """Register bytes per element to hold the rows kept between the passes, or, where pass 1
    reads more rows than it keeps (the fused add's x and residual, summed into h), its loads in
    flight: the compiler issues a thread's loads together."""
    t = types(opts)
    kept = sum(held(t[p]) for p in work.held_rows)
    return max(kept, sum(DTYPES[t[p]] for p in reads(work, opts))) if work.held is not None else kept


def reads(work: RowWork, opts: Options) -> tuple[str, ...]:
    """The row tensors pass 1 reads for a problem: work.reads, less those of an option not taken
    (the residual of a forward without one)."""
    off = {p for p, field in work.read_if if not getattr(opts, field)}
    return tuple(p for p in work.reads if p not in off)


def col_sums(work: RowWork, opts: Options) -> int:
    """fp32 per-column sums a persistent kernel keeps (dw, and db with a bias)."""
    return work.col_sums + (1 if work.bias_sums and opts.bdtype else 0)


def row_types(work: RowWork, opts: Options) -> set[str]:
    """The element types of every row tensor the kernel reads or writes (a backward's
    d_residual_out too, which its RowWork leaves to the has_dres_out rules)."""
    t = types(opts)
    return {t[p] for p in (*reads(work, opts), *work.writes, *work.held_rows, *("GT",) * opts.has_dres_out)}


# A knob the caller left to the policy, as the rules below read it: tpr, cluster, min_blocks and
# max_regs 0, the others -1.
_POLICY = {"tpr": 0, "cluster": 0, "min_blocks": 0, "max_regs": 0}


class _Asked:
    """The problem's fields and the knobs, as the rules read them (a knob not forced at its
    _POLICY value)."""

    __slots__ = ("_problem", "_overrides")

    def __init__(self, problem: Problem, overrides: Overrides):
        self._problem, self._overrides = problem, overrides

    def __getattr__(self, name: str):
        if hasattr(self._overrides, name):
            value = getattr(self._overrides, name)
            return _POLICY.get(name, -1) if value is None else value
        return getattr(self._problem, name)


def _check_overrides(opts, tgt: targets.Target) -> None:
    """The knobs forced against the target (Overrides checked their values alone)."""
    if opts.tpr and not (opts.tpr % tgt.warp == 0 or (opts.tpr < tgt.warp and opts.tpr & (opts.tpr - 1) == 0)):
        raise ValueError(f"tpr={opts.tpr} must be a power of two below the warp ({tgt.warp}) or a multiple of it, at "
                         f"most {MAX_THREADS}")
    if opts.cluster > 1 and not tgt.clusters:
        raise ValueError(f"cluster={opts.cluster}: {opts.target} has no thread-block clusters; use cluster=1")
    top = max(MAX_CLUSTER, tgt.max_cluster)
    if opts.cluster and not (opts.cluster & (opts.cluster - 1) == 0 and opts.cluster <= top):
        raise ValueError(f"cluster={opts.cluster} must be a power of two, at most {top} on {opts.target} "
                         f"({MAX_CLUSTER} portable; past it the driver is asked for a non-portable size)")
    if opts.cluster > 1 and opts.n % (opts.cluster * opts.vec):
        raise ValueError(f"cluster={opts.cluster} must split N={opts.n} into whole vectors of {opts.vec}")
    if opts.l2_prefetch == 1 and tgt.prefetch_piece is None:
        raise ValueError(f"l2_prefetch=1: {opts.target} has no L2 prefetch instruction; use None or 0")
    if opts.max_regs and opts.max_regs > tgt.max_regs:
        raise ValueError(f"max_regs={opts.max_regs}: {opts.target} has at most {tgt.max_regs} registers a thread")
    if opts.max_regs and not tgt.max_regs_attr:
        raise ValueError(f"max_regs={opts.max_regs}: {opts.target} has no register cap attribute; use None")
    if opts.min_blocks and not tgt.min_blocks_attr:
        raise ValueError(f"min_blocks={opts.min_blocks}: {opts.target} has no blocks-per-multiprocessor bound; use None")


def decide(problem: Problem, overrides: Overrides, tgt: targets.Target, spec: KernelSpec
           ) -> tuple[Layout, tuple[str, ...]]:
    """The layout of a kernel for a problem: the policy's, with the forced knobs applied and
    checked (an impossible one raises ValueError naming it and the fix), and the names of the
    policy's steps that changed it, in order."""
    opts = _Asked(problem, overrides)
    _check_overrides(opts, tgt)
    fired: list[str] = []
    lay = _decide(opts, tgt, spec, fired)
    return lay, tuple(fired)


def _step(fired: list[str], name: str, before: Layout, after: Layout) -> Layout:
    if after != before:
        fired.append(name)
    return after


def _decide(opts: Options, tgt: targets.Target, spec: KernelSpec, fired: list[str]) -> Layout:
    if spec.work is None:
        for knob, default in (("tpr", 0), ("cluster", 0), ("stage", -1), ("cache_row", -1), ("l2_prefetch", -1),
                              ("hints", -1), ("overlap", -1), ("batch_reload", -1), ("max_regs", 0)):
            value = getattr(opts, knob)
            if value != default and not (knob == "stage" and value == 0):
                raise ValueError(f"{knob}={value}: {spec.name} has a fixed layout; leave {knob} to the policy (None)")
        return reduce_layout(opts.n, opts.vec, tgt.warp)
    work = spec.work
    persistent = spec.grid == "persistent"
    lay = bwd_layout(opts, tgt, work, fired) if persistent else fwd_layout(opts, tgt, work)
    lay = _step(fired, "cache_row", lay, _cache_row(opts, lay, tgt, work, persistent))
    lay = _step(fired, "staged", lay, _staged(opts, lay, tgt, work, persistent))
    if persistent:
        # Measured on the H200 (*tune-v5*): +2-19% for the backward's one-row blocks. One-pass
        # kernels lost 3-24% with it (*tune-v9*) and have none.
        policy = lay.rows == 1 and not lay.stage and tgt.prefetch_piece is not None
        lay = replace(lay, l2_prefetch=policy if opts.l2_prefetch == -1 else bool(opts.l2_prefetch))
    elif opts.l2_prefetch == 1:
        raise ValueError(f"l2_prefetch=1: {spec.name} (a block per row group) has no L2 prefetch of a next row; "
                         "use None or 0")
    hintable = _hintable(opts, tgt, work, lay)
    if opts.hints > 0 and not hintable:
        chunk_bytes = sorted({lay.vec * DTYPES[t] for t in row_types(work, opts)})
        raise ValueError(f"hints={opts.hints}: {spec.name} on {opts.target} has no L2 eviction hints for "
                         f"{'/'.join(map(str, chunk_bytes))}-byte chunks (they need 16 and an NVVM target); "
                         "use None or 0")
    hints = _hint_policy(lay, persistent, opts.has_weight) if opts.hints == -1 and hintable else max(0, opts.hints)
    lay = replace(lay, min_blocks=opts.min_blocks or lay.min_blocks, max_regs=opts.max_regs or lay.max_regs,
                  hints=hints)
    if opts.batch_reload == 1 and (persistent or lay.cache_row):
        why = f"N={opts.n} holds them in registers (cache_row=0 reads them again)" if lay.cache_row else \
            f"{spec.name} has no such pass"
        raise ValueError(f"batch_reload=1 needs a kernel of a block per row reading its rows twice; {why}; "
                         "use None or 0")
    if opts.batch_reload != -1:
        lay = replace(lay, batch_reload=bool(opts.batch_reload))
    w_bytes = DTYPES[opts.wdtype] if opts.has_weight else 0
    if lay.prefetch_w and lay.min_blocks > 1 and lay.k * lay.vec * (held_bytes(work, opts) + w_bytes) \
            > tgt.reg_budget_bytes(lay.block * lay.min_blocks):
        lay = replace(lay, prefetch_w=False)  # the weight's registers must fit the cap too
    lay = _step(fired, "db_smem", lay, _db_smem(opts, lay, tgt, work, persistent))
    # after db_smem: both sums in shared memory free registers for it
    lay = _step(fired, "overlap", lay, _overlap(opts, lay, persistent))
    lay = _step(fired, "held_quads", lay, _held_quads(opts, tgt, work, lay, persistent))
    lay = _step(fired, "cast_words", lay, _cast_words(opts, tgt, work, lay, persistent))
    lay = _step(fired, "two_pass", lay, _two_pass(opts, tgt, work, lay, persistent))
    lay = _step(fired, "stage_dres", lay, _stage_dres(opts, tgt, lay, persistent))
    if lay.tpr > lay.nchunk:  # the policy's own layouts; forced ones are refused in _forced
        raise AssertionError(f"layout policy bug: {spec.name} N={opts.n} has {lay.tpr} threads per row for "
                             f"{lay.nchunk} chunks; threads without a chunk may hang the block reduction")
    return lay


def _held_quads(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout, persistent: bool) -> Layout:
    """Long bf16 rows of a backward held in registers, 4 chunks a thread over a cluster of a power of
    two of blocks (HELD_QUAD_THREADS threads each), where the row tensors and w are bf16 (held packed:
    16 registers a thread for x and dy):

    - LayerNorm's backwards (both column sums, moved to dynamic shared memory: db_smem 3), in
      place of rows held in 2 chunks over twice the blocks (3 a multiprocessor at 80 registers) or,
      at 65536, read again over 8 blocks. ptxas: 126-128 registers, 2 blocks, none spilled;
    - the fused add's RMSNorm backward over a cluster, dw's sums in registers, in place of its rows
      read again in blocks of 512: held with d_residual_out copied into shared memory (stage_dres),
      whose registers the held rows need (ptxas at 128 without it: 68 bytes spilled).

    On the H200 (bf16, *tune-v164*, two runs of two placements; GB/s against the policy's before):
    LayerNorm's backward 16384 as 256 x 2 blocks 3852-3879 against 3639-3658, 32768 as 256 x 4
    3749-3778 against 3423-3435, 65536 as 256 x 8 3727-3757 against 3404-3435; its fused add's
    16384 3886-3907 against 3714-3738, 32768 3685-3707 against 3652-3665, 65536 3686-3704 against
    3509-3537; RMSNorm's fused add 32768 (512 x 2) 3964-3977 against 3730-3863, 65536 (512 x 4)
    3945-3967 against 3632-3732. Fewer blocks a row wait less on the exchange's slowest block, and
    2 blocks of 4 chunks hold more of a row's bytes in flight than 3 of 2. LayerNorm's fused add
    held without the staging (128 registers, no spill) lost 3-4% at 16384 and 65536 and tied at
    32768 (*tune-v165*)."""
    # A forced knob keeps the rules' layout, and so does stage_dres=0 (the held rows of the fused adds need it).
    forced = (opts.tpr, opts.cluster, opts.cache_row, opts.db_smem, opts.overlap, opts.stage, opts.min_blocks,
              opts.max_regs) != (0, 0, -1, -1, -1, -1, 0, 0) or opts.stage_dres == 0
    if not persistent or forced or not (tgt.clusters and tgt.stage_piece and opts.has_weight) \
            or row_types(work, opts) | {opts.wdtype} != {"bf16"}:
        return lay
    quads = opts.n // (HELD_QUAD_THREADS * 4 * lay.vec)  # blocks a row at 4 chunks a thread
    if lay.vec * 2 != MAX_VECTOR_BYTES or opts.n % (HELD_QUAD_THREADS * 4 * lay.vec) or quads not in (2, 4, 8):
        return lay
    layer = work.sums > 1 and col_sums(work, opts) == 2  # LayerNorm's dw and db
    # (the fused add's atomic mode, opt-in, spilled 8 bytes so)
    fused = work.sums == 1 and opts.has_dres_out and col_sums(work, opts) == 1 and lay.cluster > 1 \
        and not lay.cache_row and lay.k == 4 and lay.kfull == 4 and not opts.atomic_dw
    if not (layer or fused):
        return lay
    if fused:  # the same threads and cluster, held
        new = replace(lay, cache_row=True, overlap=0, stage_dres=True)
    else:
        # The fused add's without the next row's L2 prefetch (*tune-v167*, -v168): 16384 3909-3922 GB/s
        # against 3852-3880, 32768 3752-3776 against 3675-3697, 65536 3738-3782 against 3612-3707.
        # LayerNorm's own lost 10-11% without it (65536 3331-3345 against 3747-3759), as did its rows
        # without w and b (-28%) and RMSNorm's fused add at 65536 (-3%; +1% at 32768).
        prefetch = lay.l2_prefetch if opts.l2_prefetch != -1 else not opts.has_dres_out
        new = replace(lay, tpr=HELD_QUAD_THREADS, rows=1, k=4, kfull=4, nchunk=HELD_QUAD_THREADS * 4, cluster=quads,
                      cache_row=True, overlap=0, db_smem=3, min_blocks=0, stage_dres=opts.has_dres_out,
                      l2_prefetch=prefetch)
    policy = opts.hints == -1 and _hintable(opts, tgt, work, new)
    return replace(new, hints=_hint_policy(new, True, opts.has_weight) if policy else lay.hints)


def _stage_dres(opts: Options, tgt: targets.Target, lay: Layout, persistent: bool) -> Layout:
    """STAGE_DRES, forced or the policy's: a backward reading d_residual_out copies each row's chunks
    of it into shared memory in pass 1 (asynchronous copies, 16 bytes a chunk, into the launch's
    dynamic shared memory past what is there), and pass 2 reads them there, instead of asking L2
    for them in pass 1 and loading them chunk by chunk in pass 2, each load's latency in turn. It
    takes no registers while in flight."""
    able = persistent and opts.has_dres_out and bool(tgt.stage_piece) and not lay.stage \
        and lay.vec * DTYPES[types(opts)["GT"]] == MAX_VECTOR_BYTES \
        and lay.dres_at + lay.k * lay.block * MAX_VECTOR_BYTES <= MAX_STAGE_BYTES
    if opts.stage_dres == 1 and not able:
        raise ValueError(f"stage_dres=1 needs a backward reading d_residual_out (has_dres_out) on a target with "
                         f"asynchronous copies ({tgt.chip}: {'yes' if tgt.stage_piece else 'no'}), 16-byte chunks "
                         f"(here {lay.vec * DTYPES[types(opts)['GT']]}), the rows not staged, and its {lay.k} x "
                         f"{lay.block} chunks within {MAX_STAGE_BYTES} bytes of shared memory; use None or 0")
    # The policy's: with _held_quads' rows. Alone it lost 2-14% (the fused adds' backwards at
    # 7168-65536 read again or held in 2 chunks; *tune-v164*), but for 2880 (+1%).
    return replace(lay, stage_dres=lay.stage_dres if opts.stage_dres == -1 else bool(opts.stage_dres))


def _cast_words(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout, persistent: bool) -> Layout:
    """CAST_WORDS, forced or the policy's: pass 2's bf16 casts by 32-bit words, one instruction an
    element (common/late_ext_bf16_words.mlir; extf's high half takes a byte permute and a shift),
    and in the forward x_hat * w + b as one fma. NVIDIA only (gfx950 keeps its text). On the H200
    (bf16, weight and bias; GB/s, former text against new):

    - LayerNorm's forwards of one read (ptxas: 10-14% fewer instructions), where a cap fixes the
      registers or the rows held have at most WORDS_MAX_HELD elements a thread (*tune-v96* to
      -v101): 2880 3728-3752 -> 3927-3945, 32768 3742-3774 -> 3949-3977, 65536 3458-3466 ->
      3537-3552, 896 +1.3%. Longer held rows took more registers (2560: 64 -> 127);
    - their rows streamed in 4 chunks a thread (batch_reload) take the words with pass 2 chunk by
      chunk where the row's warps are not a power of two (*tune-v102*): 5120 3968-3989 ->
      4092-4114, 6144 3997-4000 -> 4112-4113, 7168 3966-3984 -> 4120, 12288 3963-3988 -> 4105.
      There ptxas keeps its 40 registers; at 4096, 8192 and 16384 (shifts for the chunks'
      addresses) it takes 32, more blocks hold rows between their two reads, and the words lost
      (8192: 4055-4087 -> 3945-3948; 4096 -3%, 16384 a tie). RMSNorm's forward and the fused adds'
      (two reads) tied within 0.8% (*tune-v97*, -v101);
    - LayerNorm's backwards (*tune-v102*, -v103): +0.8-3% at 2880-65536 (65536 2854-2902 ->
      2942-2983, 32768 3216-3243 -> 3281-3303, 2880 3352-3388 -> 3403-3447), a tie at 1024-4096;
      the fused add's rows read again +2.3-3.5% (2880, 65536). Not taken: the fused add's rows
      held (capped for 6 blocks at 5632-7168 they spill 16 bytes instead of 8; 7168 -0.6%) or
      read with an fp32 weight (8-16 bytes spilled at their caps: 4096, 12320, 24640); RMSNorm's
      backwards: +1-1.4% where rows are read again (2880, 32768, 65536), a tie at 4096, but its
      held rows took 96 registers for 80 (1024-2048, 2 blocks fewer), its 4096 spilled 4 bytes
      without L2 hints, staged rows lost 2% (7168), and the fused add's tied (1600, 4096, 65536)
      with a block fewer at 8704 and 9728."""
    if opts.cast_words != -1:
        words = bool(opts.cast_words)
        if words and lay.vec % 2:
            raise ValueError(f"cast_words=1 needs chunks of whole 32-bit words (an even vec; here {lay.vec}); "
                             "use None or 0")
        return replace(lay, cast_words=words)
    if not tgt.is_nvidia or lay.vec % 2:
        return lay
    if persistent:
        bf16_rows = "bf16" in {types(opts)[t] for t in reads(work, opts)}
        rows_fit = not lay.cache_row or _wide_sums(work, opts)
        narrow_w = not opts.has_dres_out or DTYPES[opts.wdtype] <= 2
        return replace(lay, cast_words=bf16_rows and work.sums > 1 and not lay.stage and rows_fit and narrow_w)
    if not (work.sums > 1 and len(reads(work, opts)) == 1 and opts.held_dtype == "bf16"):
        return lay
    if lay.min_blocks > 0 or (lay.cache_row and lay.k * lay.vec <= WORDS_MAX_HELD):
        return replace(lay, cast_words=True)
    warps = lay.block // tgt.warp
    if lay.batch_reload and opts.batch_reload == -1 and warps & (warps - 1):
        return replace(lay, cast_words=True, batch_reload=False)
    return lay


def _two_pass(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout, persistent: bool) -> Layout:
    """TWO_PASS, forced or the policy's: LayerNorm's forward over rows held in registers, one row
    a block: pass 1 sums the row (a plain block sum), a second pass over the held chunks sums the
    squared deviations from its mean (a second plain sum): the exact two-pass variance, with no
    counts and no reciprocal in the merges. The policy takes it where threads own unequal chunk
    counts (or the warps are not a power of two), so that Chan's merges would take the general
    update, a reciprocal a butterfly step. On the H200 (bf16, weight and bias, *tune-v107*,
    -v108), GB/s against Chan's merges: 1728 as 64 x 4 3915-3929 against 3787-3809, 2880 as 96 x 4
    3978-4035 against 3907-3961, 3456 4009-4020 against 3901-3939, 4160 3911-3941 against
    3636-3671, 5184 3929-3958 against 3786-3802, 6208 3931-3956 against 3799-3825; over 24 warps
    (49152 as 768 x 8, counts equal) 3302-3307 against 3142-3169, but over 20 (40960 as 640 x 8)
    3203-3231 against 3261-3277. Where the counts are equal and the warps a power of two it tied
    (3584 as 64 x 7: 3967-3990 against 3974-4003), and Chan's merges stay."""
    fits = not persistent and work.sums > 1 and lay.cache_row and lay.cluster == 1 and lay.rows == 1
    if opts.two_pass == 1 and not fits:
        raise ValueError(f"two_pass=1 needs LayerNorm's forward with its rows held in registers, one row a "
                         f"block and no cluster (here {opts.kernel}, cache_row={lay.cache_row}, rows={lay.rows}, "
                         f"cluster={lay.cluster}); use None or 0")
    if opts.two_pass != -1:
        return replace(lay, two_pass=bool(opts.two_pass))
    return replace(lay, two_pass=fits and tgt.is_nvidia and not lay.equal_counts)


def _hintable(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout) -> bool:
    """The target has L2 eviction hints and every row tensor moves in 16-byte chunks."""
    return bool(tgt.hints) and {lay.vec * DTYPES[t] for t in row_types(work, opts)} == {MAX_VECTOR_BYTES}


def _overlap(opts: Options, lay: Layout, persistent: bool) -> Layout:
    """OVERLAP, forced or the policy's: 2 of 4 chunks in blocks of up to 512 threads. On the H200
    (*tune-v19*, *-v20*) that gained 7.4% at N=32768 and 6.7% at 65536 (bf16); 1 of 4 gained
    4.6-4.8%; 3 and 4 of 4 spilled (128 registers) and gained less or lost. 1024-thread blocks (64
    registers) spill with it (N=65536 in f32). Without a weight (no dw sums) all 4 fit: +10% at
    32768 and +21% at 65536 (*tune-v27*). With both column sums in shared memory (LayerNorm's rows
    of 4 chunks over a cluster, db_smem 3) all 4 gained 3% at 65536 (3290-3319 against 3180-3223)
    and tied at 49152 (6 warps); beside d_residual_out 3 gained 1-2% (65536, 49152; *tune-v136*),
    not taken: 3 spilled in RMSNorm's fused add with a bias.

    A forward whose rows are held over a cluster in FWD_OVERLAP_MIN_K chunks or more loads pass 2's
    first FWD_OVERLAP chunks of w and b before the row's reductions, their latency under the
    barrier and the exchange's wait (*tune-v157*, bf16, two runs of two placements): LayerNorm's
    forward at 65536 (256 x 4 blocks, 16 chunks) 3582-3603 GB/s against 3560-3576, its fused add's
    (128 x 8, 8 chunks) 3974-3988 against 3946-3964, RMSNorm's and its fused add's at 65536 a tie
    (4005-4036 against 3980-4033; 4048-4104 against 4057-4103). 1 chunk tied, 3 lost (ptxas: a
    block fewer, or the 64-register cap's schedule); the fused add's LayerNorm at 32768 (4 chunks)
    lost 1% with 1 or 2 (a block fewer), LayerNorm's held 2880 (one block) tied. 16-bit rows, w and
    b only (measured in bf16)."""
    if isinstance(opts.overlap, bool) or not isinstance(opts.overlap, int) or not -1 <= opts.overlap <= lay.k:
        raise ValueError(f"overlap={opts.overlap!r}: choose None (the policy's), 0 (none) or a chunk count up to "
                         f"K={lay.k}")
    if not persistent:  # a forward: pass 2's first chunks of w and b loaded before the reductions
        if opts.overlap > 0 and (not lay.cache_row or lay.stage):
            raise ValueError(f"overlap={opts.overlap}: a forward loads pass 2's chunks of w and b early only where "
                             f"its rows are held in registers (N={opts.n} here: "
                             f"{'staged' if lay.stage else 'read again'}); use None or 0")
        wb_types = ((opts.wdtype,) if opts.has_weight else ()) + ((opts.bdtype,) if opts.bdtype else ())
        # 16-bit rows, w and b only: fp32 ones take twice the registers early (ptxas at the 64-register
        # cap: 8 bytes spilled for f32 rows at 65536, 24 for a bf16 row's fp32 w and b).
        narrow = max(DTYPES[t] for t in (opts.dtype, *wb_types)) <= 2
        # Blocks of up to 512 threads: in larger ones (576-1024 threads, 64-96 registers) ptxas spilled
        # 4-220 bytes more with them early.
        policy = FWD_OVERLAP if lay.cache_row and not lay.stage and lay.cluster > 1 and lay.k >= FWD_OVERLAP_MIN_K \
            and narrow and lay.block <= MAX_THREADS // 2 else 0
        # Without w and b there is nothing to load early (PREFETCH_W's rule too).
        return replace(lay, overlap=(policy if opts.overlap == -1 else opts.overlap) if wb_types else 0)
    overlappable = persistent and lay.cluster > 1 and lay.dw_regs and not lay.cache_row and not lay.stage
    if opts.overlap > 0 and not overlappable:
        raise ValueError(f"overlap={opts.overlap} needs a persistent kernel (a backward) with rows split over a "
                         f"cluster (here {lay.cluster} block(s)), sums in registers, no staging; use None or 0")
    # Both column sums in shared memory (db_smem 3) leave the registers for all 4 chunks, in whole
    # powers of two of warps without d_residual_out (ptxas: 5 warps spilled 16 bytes at the cap; 3
    # chunks beside d_residual_out's early ones spilled 8-24 bytes in RMSNorm's fused add with a
    # bias). db's alone there beside d_residual_out: none (2 spilled 8 bytes at _db_smem's cap).
    if lay.db_smem == 3 and lay.wpr & (lay.wpr - 1) == 0 and not opts.has_dres_out:
        with_sums = lay.k
    elif lay.db_smem == 1 and opts.has_dres_out:
        with_sums = 0
    else:
        with_sums = 2
    policy = (with_sums if opts.has_weight else lay.k) if overlappable and lay.k == 4 and lay.block <= MAX_THREADS // 2 \
        else 0
    return replace(lay, overlap=policy if opts.overlap == -1 else opts.overlap)


def _db_smem(opts: Options, lay: Layout, tgt: targets.Target, work: RowWork, persistent: bool) -> Layout:
    """DB_SMEM, forced or the policy's: a backward with a bias keeps db's column sums in static
    shared memory, K x V fp32 slots per thread that no other thread reads (no barrier), instead
    of K x V registers. Alone that costs 1-4% (the slots' loads and stores; *tune-v75*, -v76);
    the policy takes it where the freed registers buy resident blocks: it caps the registers at
    DB_SMEM_REGS_HELD (rows held) or DB_SMEM_REGS_READ (rows read again) per thread, the level
    at which ptxas kept these kernels unspilled. On the H200 (bf16, weight and bias; GB/s
    against the policy's before):

    - rows held in registers in up to 4 warps, every thread the same chunks, no d_residual_out
      (LayerNorm's backward): 1024 as 64 x 10 blocks 3745-3766 against 3449-3460, 2048 as 128
      x 5 3768-3791 against 3427-3430, 4096 (128 x 2 blocks) 3717-3732 against 3578-3634.
      Capped without it the sums spill (1024: 2890-2900). At 2880 (a masked chunk) the cap
      spilled (56 bytes), and 256-thread rows (8192) spill at the next level (80);
    - rows read again in one block (the fused add's backward, reading d_residual_out): 2880
      as 192 threads 3475-3477 against 3073-3075 (152 -> 92 registers; a masked chunk: 80
      spilled 8 bytes, so 96), 4096 as 256 x 3 blocks 3824 against 3609-3612. Over a cluster
      (7168, 8192, 32768) it lost 3-5%, capped or not;
    - dw's sums there too (3), the slots in 16-byte quarters that no warp access finds in
      conflict, where 1 is not taken and this adds blocks (DB_SMEM_REGS_BOTH): LayerNorm's
      backward over a cluster, 3 blocks of 256 against 2: 8192 3684-3707 against 3480-3505,
      16384 3479-3487 against 3263-3272, 32768 3216 against 3172-3180 (*tune-v80*); the fused
      add's rows of up to 256 chunks, 1024 3713-3720 against 3636-3702, 2048 3843-3858 against
      3719-3721. Where 1 adds blocks, 3 tied or lost (1024: 3705-3707 against 3743-3748);
    - the fused add's rows read again over a cluster are held instead, with both sums moved, 3
      blocks of 256 against 2: 8192 3771-3791 against 3569-3596, 16384 3655 against 3388-3392
      (*tune-v80*), though ptxas spills 16 bytes at that cap (tests/test_sm90_spill.py);
    - rows over a cluster that the above leaves (a masked chunk; 3, 5, 6 or 7 warps; ptxas
      without it: 118-173 registers, 0.5-2.5 rows a multiprocessor) move both sums too, the rows
      held (LayerNorm's, capped at DB_SMEM_REGS_HELD) or read again (the fused add's: with a
      masked chunk DB_SMEM_REGS_READ, else DB_SMEM_REGS_HELD: 6 or 7 warps spilled 8 bytes at 80),
      w no wider than x; so do the fused add's masked rows of one block, where db's alone gain no
      block. On the H200 (bf16, weight and bias, *tune-v91*, -v92; GB/s against the sums in
      registers): LayerNorm's 3072 as 96 x 2, 6 blocks, 3498-3543 against 3477-3492; 3840 as
      128 x 2 3502-3527 against 3388-3413; 4608 as 160 x 2, 4 blocks, 3420-3430 against
      3200-3202; 5120 3639-3652 against 3449-3462; 5632 as 192 x 2, 3 blocks, 3242-3260 against
      2933-2954; 6144 3514-3535 against 3181-3186; 9216 as 160 x 4 3189-3200 against 3003-3016;
      11264 as 192 x 4 3007-3036 against 2748-2753; 12288 3342-3373 against 2962-2974; 2816
      (3 warps, masked) a tie. The fused add's 4352 as 160 x 2, 4 blocks, 3222-3226 against
      2354-2367; 4608 3316-3343 against 2460-2492; 4992 3401-3405 against 2559-2581; 5120
      3549-3563 against 3398-3410; 7424 as 256 x 2, 3 blocks, 3414-3417 against 2133-2135; 9216 as
      160 x 4 3158-3160 against 2918-2941; 10752 as 192 x 4 2877-2894 against 2543-2546; 12288
      3246-3256 against 2916-2927; 12800 as 224 x 4 3077-3088 against 2735-2762; 14848 as 256 x 4
      3274-3277 against 2993-3011; in one block, 3328 as 224 x 1, 3 blocks, 3615-3647 against
      3317-3341, 3840 as 256 x 1 3683-3704 against 3512-3539. ptxas: 72-96 registers, no spill.
      Held rows of 7 or 8 warps gain no block that way. With a masked chunk over 2 blocks
      (LayerNorm's 6400-7936: 157-161 registers, one block a multiprocessor) they are read
      again with both sums moved: 6656 2956-2969 against 2112-2122 (+40%), 7680 3136-3168
      against 2306-2330 (*tune-v94*). With whole warps (7168: 128 registers, 2 blocks) and over
      4 blocks (14848) that lost 4%, and they keep their layouts;
    - rows of 4 chunks a thread over a cluster, read again, 16-bit, no masked chunk (LayerNorm's
      backwards at 40960-65536): the sums in registers took 196-217 registers (BWD_SUMS4_REGS),
      one block; db's alone fit static slots (32 KB at 256 threads), capped for 2 blocks
      (BWD_SUMS_REGS; ptxas: 128, no spill). *tune-v94*, 65536: the fused add's 3156-3194 against
      2623-2637, with pass 2's chunks not loaded early (overlap 0: at 2 ptxas spilled 8 bytes,
      3069-3095); LayerNorm's 2880-2901 against 2626-2886 (a tie to +5%). Both sums' slots fit
      dynamic shared memory (64 KB), the same cap, where it leaves 2 blocks or more: 65536 +8%,
      the fused add's +2% with pass 2's chunks loaded early again (ptxas: 121-125 registers,
      *tune-v122*); 49152 a tie; one block (81920) lost 4% (*tune-v123*).

    Only where the column sums take BWD_SPLIT_DW registers a thread or more (16-bit rows): f32
    rows of 2 chunks keep 64-72 registers without it. Without a weight, 3 is 2 (db's alone in
    quarters). dw's slots at [k][tid] lost 4-12% where they added blocks (*tune-v77*)."""
    if opts.db_smem == 0 or (persistent and not opts.bdtype):  # without a bias there are no db sums to move
        return lay
    if opts.db_smem == -1 and lay.db_smem:
        return lay  # bwd_layout's rules chose it (_even_halves, _pow2_warps) with their caps
    moved = 2 if opts.db_smem == 3 and opts.has_weight else 1  # dw's sums move too at 3
    need = moved * lay.k * lay.block * lay.vec * 4
    if opts.db_smem > 0:
        # The quarter slots (2, 3) may pass static shared memory into the dynamic (the stage piece's).
        most = _slot_limit(tgt) if opts.db_smem >= 2 else MAX_DB_SMEM_BYTES
        if not (persistent and lay.dw_regs and not lay.stage) or need > most:
            raise ValueError(f"db_smem={opts.db_smem} needs a backward with its column sums in registers, not staged (the "
                             f"stage buffers take the shared memory), in at most {most} bytes of "
                             f"shared memory (here {'a backward' if persistent else 'a forward'}, sums in "
                             f"{'registers' if lay.dw_regs else 'memory'}, {'staged' if lay.stage else 'not staged'}"
                             f", {need} bytes); use None or 0, or stage=0")
        return replace(lay, db_smem=min(opts.db_smem, 1 + moved))  # 3 without a weight: 2
    full = _full(lay)
    sums_regs = lay.k * lay.vec * col_sums(work, opts)  # fp32 column sums per thread (dw's and db's)
    # Rows of 4 chunks a thread over a cluster, read again, 16-bit, every thread the same chunks
    # (LayerNorm's backwards at 65536): the sums in registers took 196-217 (ptxas), one block of
    # 256; db's alone fit static slots (with a masked chunk the cap spilled: 16416, 28704), both
    # the dynamic ones (64 KB a block; ptxas 121-125 registers at 2 blocks, none spilled):
    # 65536 3180-3223 against 2951-2961 with db's alone, the fused add's 3310-3349 against
    # 3237-3269 (*tune-v122*); 49152 a tie (3160-3196 against 3192-3214), the fused add's +1%.
    wide_k = lay.k == 4 and full and lay.cluster > 1 and not lay.cache_row and DTYPES[opts.dtype] == 2
    if not (persistent and tgt.min_blocks_attr and opts.has_weight and lay.dw_regs and not lay.stage
            and need <= MAX_DB_SMEM_BYTES and (lay.k <= 2 or wide_k) and sums_regs >= BWD_SPLIT_DW):
        return lay
    in_regs = BWD_SUMS4_REGS if wide_k else BWD_SUMS_REGS
    # Held rows over a cluster spilled at the cap in 3 warps (3072: 64 bytes) and beside an fp32
    # weight (4096: 8 bytes; tests/test_sm90_spill.py): whole powers of two, w no wider than x.
    narrow_w = DTYPES[opts.wdtype] <= DTYPES[opts.dtype]
    cluster_ok = lay.wpr & (lay.wpr - 1) == 0 and narrow_w
    both_fit = narrow_w and 2 * need <= MAX_DB_SMEM_BYTES  # both sums' slots, beside a w no wider than x
    choices = []  # (rows held, db_smem, blocks a multiprocessor), in order of preference
    at = functools.partial(_resident, tgt, lay)
    if lay.cache_row and full and not opts.has_dres_out and lay.block <= BWD_WIDE_WARPS * lay.warp \
            and (lay.cluster == 1 or cluster_ok):
        choices.append((True, 1, at(DB_SMEM_REGS_HELD)))
    elif not lay.cache_row and lay.cluster == 1:
        choices.append((False, 1, at(DB_SMEM_REGS_READ if full else DB_SMEM_REGS_HELD)))
    # Both sums at the cap spilled in blocks of several rows (256, 512) and, as above, over a
    # cluster of 3, 6 or 7 warps or beside a wider w (tests/test_sm90_spill.py).
    both = full and lay.rows == 1 and (lay.cluster == 1 or cluster_ok) and 2 * need <= MAX_DB_SMEM_BYTES
    # The fused add's rows over a cluster are read again (_wide_sums); with both sums moved they
    # are held instead. Decided here, not in bwd_layout, since it pays only with d3's cap.
    hold = lay.cluster > 1 and opts.has_dres_out and opts.cache_row == -1
    if both and (lay.cache_row or hold):
        choices.append((True, 3, at(DB_SMEM_REGS_BOTH)))
    # Rows over a cluster that this leaves (a masked chunk; 3, 5, 6 or 7 warps), and rows of one
    # block with a masked chunk read again: both sums moved, the rows held or read again as they
    # were, at the levels where ptxas keeps them unspilled (the fused add's rows read again in 6
    # or 7 whole warps spilled 8 bytes at 80).
    elif (lay.cluster > 1 or not (full or lay.cache_row)) and lay.rows == 1 and not lay.db_smem and both_fit:
        one = lay.cluster == 1 and not lay.cache_row  # rows of one block read again (_one_block_blocks)
        choices.append((lay.cache_row, 3, _one_block_blocks(opts, tgt, lay) if one
                        else at(DB_SMEM_REGS_HELD if lay.cache_row or full else DB_SMEM_REGS_READ)))
    # Rows held over 2 blocks with a masked chunk where holding them gains no block (7 or 8 warps:
    # ptxas 157-161 registers, one block, not the reckoning's 2) are read again instead.
    if lay.cache_row and not full and lay.cluster == 2 and opts.cache_row == -1 and both_fit:
        choices.append((False, 3, at(DB_SMEM_REGS_READ)))
    if wide_k:  # both sums in dynamic shared memory where their slots fit it, beside a w no wider than
        # x, at 2 blocks or more (81920, one block of 320: 2702-2706 against 2811-2830, *tune-v123*)
        both = narrow_w and 2 * need <= _slot_limit(tgt) and at(BWD_SUMS_REGS) > 1
        choices = [(False, 3 if both else 1, at(BWD_SUMS_REGS))]
    gains = [c for c in choices if c[2] > at(in_regs)]
    if not gains:
        return lay  # no block gained over the sums in registers (224 or 256 threads with a masked chunk)
    if not (full or lay.cache_row) and lay.cluster == 1:
        # Rows of one block with a masked chunk, read again: the choice of the most blocks. The
        # fused add's LayerNorm backward, both sums moved (d3, 5-6 blocks) against db's (d1, 4):
        # 2112 3607-3631 against 3505-3534, 2240 3676-3692 against 3599-3621, 2592 3477-3505
        # against 3256-3284, 2880 +3.8%, 3008 3756-3764 against 3641-3648 (*tune-v112*, -v116).
        gains.sort(key=lambda c: -c[2])
    held, db_smem, blocks = gains[0]
    if held != lay.cache_row:  # the hints of rows held or read again (_hint_policy), unless forced
        policy = opts.hints == -1 and _hintable(opts, tgt, work, lay)
        lay = replace(lay, cache_row=held, hints=_hint_policy(replace(lay, cache_row=held), True, opts.has_weight)
                      if policy else lay.hints)
    return replace(lay, db_smem=db_smem, min_blocks=lay.min_blocks or blocks)


def _one_block_blocks(opts: Options, tgt: targets.Target, lay: Layout) -> int:
    """Blocks a multiprocessor for rows of one block, 2 chunks a thread, read again, both column sums
    in shared memory (_db_smem's masked rows of one block, _one_block): as many as DB_SMEM_REGS_ONE
    allows, at most ONE_BLOCK_TWO_READS where a row is read twice. On the H200 (bf16, weight and
    bias; GB/s): LayerNorm's own backward at 4 blocks against 5 and 6 (160 x 2 at 2112: 3316-3341
    against 3267-3297 and 3262-3273; 192 x 2 at 2880: 3628-3658 against 3510-3561 and 3461-3478) and
    against 3 (224 x 2 at 3104: 3428-3499 against 3318-3341; 3520: 3673-3707 against 3575-3605); 256
    x 2 stays at 3 (4000: 3554-3597 against 3499-3541 at 4). The fused add's, reading d_residual_out
    too, gained from more blocks: 2112 at 5 and 6 3561-3622 against 3505-3534 at 4 (db's alone in
    shared memory), 3104 at 4 3575-3605 against 3407-3424 at 3; 4000 at 4 lost 1.5% (*tune-v115*,
    -v116). Uncapped (ptxas: 56-62 registers, 5-7 blocks) they lost 2-6%."""
    blocks = _resident(tgt, lay, DB_SMEM_REGS_ONE)
    return blocks if opts.has_dres_out else min(blocks, ONE_BLOCK_TWO_READS)


def _resident(tgt: targets.Target, lay: Layout, regs: int) -> int:
    """Blocks of a layout resident on one multiprocessor at `regs` registers a thread: a warp's
    registers come from one quadrant of the register file."""
    quad_warps = tgt.regs_per_sm // REG_QUADRANTS // (regs * lay.warp)
    return REG_QUADRANTS * quad_warps // (lay.block // lay.warp)


def _rows_at_once(tgt: targets.Target, lay: Layout, regs: int) -> float:
    """Rows a multiprocessor works on at once at `regs` registers a thread (_resident's blocks)."""
    return _resident(tgt, lay, regs) * lay.rows / lay.cluster


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _forced(nchunk: int, tpr: int, warp: int) -> tuple[int, int]:
    """(tpr, rows) for an explicitly chosen threads-per-row. Every thread must own a chunk: with
    threads that own none, LLVM may duplicate the row reduction (shuffles and barriers) into a
    branch of its own for them, which hung the H200 (rmsnorm_bwd, N=2880, 384 threads, staged,
    no weight). The policy's layouts never leave a thread without a chunk."""
    if tpr > nchunk:
        raise ValueError(f"tpr={tpr} leaves threads without a chunk: the row (or a cluster block's share) has "
                         f"{nchunk} chunks; choose tpr <= {nchunk}, or a narrower vector (vec) for more chunks")
    return tpr, (max(1, ROWS_BLOCK // tpr) if tpr <= warp else 1)


def _split(n: int, vec: int, tgt: targets.Target, cluster: int, tpr: int, wants_split) -> int:
    """Blocks per row: the forced `cluster`, else the smallest power of two (up to MAX_CLUSTER,
    keeping whole vectors per block) for which wants_split(cluster) is false. A row shared by a
    cluster is one row per block of whole warps, so a forced tpr below the warp never splits."""
    if cluster:
        return cluster
    c = 1
    if 0 < tpr <= tgt.warp:
        return c
    while tgt.clusters and c < MAX_CLUSTER and n % (2 * c * vec) == 0 and wants_split(c):
        c *= 2
    return c


def _clustered(lay: Layout, c: int) -> Layout:
    if c == 1:
        return lay
    if lay.tpr < lay.warp:
        raise ValueError(f"cluster={c} leaves each block {lay.nsub} columns, which {lay.tpr} threads "
                         f"(less than a warp of {lay.warp}) cover: use a smaller cluster or a larger tpr")
    return replace(lay, rows=1, cluster=c)  # the cluster piece exchanges one total per block


# ---------------------------------------------------------------------------- persistent kernels


def bwd_layout(opts: Options, tgt: targets.Target, work: RowWork, fired: list[str] | None = None) -> Layout:
    """A persistent kernel's layout (the backward): rows whose fp32 column sums do not fit one
    block's registers, or need more than BWD_SPLIT_DW of them per thread, are split over a
    thread-block cluster (where the target has clusters) until each block's share does; see
    _bwd_block_layout for a share."""
    n, vec, tpr = opts.n, opts.vec, opts.tpr

    def share(c: int) -> Layout:
        return _bwd_block_layout(n // c, vec, tgt, work, opts, tpr)

    def crowded(lay: Layout) -> bool:
        # Rows read again whose one column sum (dw's; no db's for _db_smem to move) takes all
        # BWD_SPLIT_DW registers a thread, in a block of more than BWD_MAX_SUMS_THREADS: the
        # block's share of the register file (72-96 a thread at 544-896 threads) does not hold
        # the sums and the row's chunks, and ptxas spilled 48-296 bytes (16-bit RMSNorm's
        # backward and its fused add's at 16640-30720 and 33024-61440). On the H200 (bf16,
        # *tune-v105*), RMSNorm's backward: 20480 as 320 x 2 blocks 3628-3640 GB/s against
        # 2853-2862 in one block, 24576 as 384 x 2 3636-3776 against 2152-2159, 49152 as 384 x 4
        # 3655-3698 against 2146-2167 (768 x 4 of 2 chunks a thread: 3697-3736). The fused add's
        # keep their threads (_crowded_threads).
        return not lay.cache_row and col_sums(work, opts) == 1 and lay.k * lay.vec >= BWD_SPLIT_DW \
            and lay.block > BWD_MAX_SUMS_THREADS

    def too_big(c: int) -> bool:
        lay = share(c)
        # A row summary of more than one value (LayerNorm's c1, c2): a row one block would take
        # in 2 chunks per thread over more than BWD_WIDE_WARPS warps goes to 2 blocks of half the
        # threads. On the H200 (bf16, *tune-v73*, -v74): 2880 as 96 x 2 3265-3290 GB/s against
        # 3149-3155 (192 x 1), 4096 as 128 x 2 3589-3630 against 3448-3462 (256 x 1); where the
        # sums split rows already, halving again did not gain (8192 as 128 x 4 3454-3480
        # against 3508).
        # Not where the row splits evenly over one block's threads and its halves do not (2560
        # as 160 x 2 3673-3701 against 96 x 2 blocks with a masked chunk 3082-3083, 3584 as
        # 224 x 2 3756 against 3327-3328, *tune-v83*).
        wide = _wide_sums(work, opts) and c == 1 and not tpr and lay.k <= 2 and lay.tpr > BWD_WIDE_WARPS * tgt.warp \
            and (lay.k != lay.kfull or _full(share(2)))
        return not lay.dw_regs or lay.k * lay.vec * col_sums(work, opts) > BWD_SPLIT_DW or wide or crowded(lay)

    c = _split(n, vec, tgt, opts.cluster, tpr, too_big)
    lay = _clustered(share(c), c)
    if tpr or opts.cluster:
        return lay
    unsplit = share(c // 2) if c > 1 else None
    if unsplit and crowded(unsplit):
        lay = _crowded_threads(opts, tgt, work, lay, unsplit.tpr)
    for rule in (_even_bwd, _even_halves, _pow2_warps, _rows_cap):  # each takes the layouts of its own rows
        lay = _step(fired if fired is not None else [], rule.__name__.lstrip("_"), lay, rule(opts, tgt, work, lay))
    return lay


def _crowded_threads(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout, tpr: int) -> Layout:
    """A crowded row (bwd_layout) of a kernel that reads d_residual_out in pass 2 (the fused
    add's backward), split over a cluster, keeps the threads its one block had, up to
    BWD_KEEP_THREADS, 2 chunks a thread instead of 4: at one block of each a multiprocessor
    (ptxas: 130 registers in the halved blocks, 80-91 in these) twice the warps cover pass 2's
    third read. On the H200 (bf16, *tune-v105*, -v107, -v108), GB/s against the halved blocks of
    4 chunks: 20480 as 640 x 2 3795-3800 against 3348-3369, 24576 as 768 x 2 3767-3813 against
    3479-3514 (ptxas: 4 bytes spilled), 40960 as 640 x 4 3582-3635 against 3197-3204, 49152 as
    768 x 4 3674-3682 against 3357-3366. Not RMSNorm's own backward, which lost so at 20480
    (3164-3184 against 3628-3640) and 24576 (3436-3478 against 3636-3776) and gained 1-8% at
    40960 and 49152; nor past BWD_KEEP_THREADS (896 x 2 spilled 52 bytes, 960 x 2 88)."""
    if not opts.has_dres_out or tpr > BWD_KEEP_THREADS:
        return lay
    new = _clustered(_bwd_block_layout(opts.n // lay.cluster, lay.vec, tgt, work, opts, tpr), lay.cluster)
    return new if new.dw_regs and _full(new) else lay


def _rows_cap(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout) -> Layout:
    """The fused add's LayerNorm backward (dw's and db's sums, reading d_residual_out) in blocks
    of several rows, every thread the same chunks, takes a register cap of BWD_ROWS_CAP_REGS: ptxas
    fits it in 128 registers then, 2 blocks of 256, where on its own it spills 18 bytes at 128 (at
    a cap of 128, 8). On the H200 (bf16, weight and bias; *tune-v90*, -v91): 512 as 32 x 8 rows
    3347-3370 GB/s against 3063-3077, 256 as 16 x 16 3305-3307 against 2956-2972."""
    if not (tgt.max_regs_attr and lay.rows > 1 and opts.has_dres_out and col_sums(work, opts) > 1 and _full(lay)
            and DTYPES[opts.dtype] == 2):
        return lay
    return replace(lay, max_regs=BWD_ROWS_CAP_REGS)


def _even_halves(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout) -> Layout:
    """LayerNorm's 16-bit backward (dw's and db's sums) over 2 blocks, held (its own) or read again
    (its fused add's), goes to one block where that holds more rows at once than the 2 blocks as
    _db_smem would cap them (at BWD_SUMS_REGS where it moves no sum; rows held with db's sums
    alone moved keep their blocks: 4096 in one block lost 4%, 3573-3591 against 3708-3740,
    *tune-v120*), the fused add's on a tie too, in whichever of two shapes holds the most (the
    first on a tie):

    - LayerNorm's own rows with a masked chunk: 4-byte chunks, the fewest whole warps at up to
      BWD_NARROW_K a thread, read again, the sums in registers (BWD_NARROW_REGS; ptxas 45-62, none
      spilled). On the H200 (bf16, weight and bias; *tune-v86*, -v88, -v89), GB/s against 96-160 x
      2: 2240 as 224 x 5, 4 rows a multiprocessor against 2.5, 3421-3440 against 2768-2790; 2304
      as 288 x 4, 3297-3305 against 2867-2870. Not at 2 rows against 2 (3520 as 352 x 5:
      3114-3136 against 3235-3259), nor at 3 chunks a thread (2880 as 480 x 3: 2799-2802);
    - _one_block: 16-byte chunks, 2 a thread, read again, both column sums in shared memory (in
      the dynamic past 40 KB), capped for _one_block_blocks. GB/s against the policy then: 2880
      as 192 x 2, 4 rows against 3, 3611-3667 against 3404-3448 (*tune-v111*); 3072 3665-3703
      against 3568-3588 (96 x 2 blocks, held); 4352 as 288 x 2, 3 rows against 2, 3576-3600
      against 3359-3368; 4608 3621-3646 against 3457-3477, the fused add's 3823-3837 against
      3481-3488; 5888 as 384 x 2, 2 rows against 1.5, 3496-3522 against 3393-3412, the fused
      add's 3801-3810 against 3078-3103 (4 blocks of 4 warps, _pow2_warps) (*tune-v120*); 5632
      as 352 x 2 3440-3447 against 3321-3342, the fused add's 3764-3797 against 3000-3019; 6656
      as 416 x 2 3574-3609 against 3137-3157, the fused add's 3832-3844 against 3328-3339; the
      fused add's 6144 as 384 x 2 3812-3841 against 3189-3203 (*tune-v119*); 7168 as 448 x 2
      (56 KB of slots, dynamic), 2 rows against 1, 3644-3699 against 3385-3407, the fused add's
      3819-3839 against 3439-3469 (*tune-v118*). LayerNorm's own 6144 tied (3531-3564 against
      3557-3587); where it holds no more rows it lost: 2240 (4 against 4; 3414-3438 against
      3473-3506), 3200 at 3 blocks (3 against 3), 8192 (512 x 2, 1 row against 1.5: 3475-3508
      against 3708-3772)."""
    # LayerNorm's rows held (its own) or read again (its fused add's, reading d_residual_out too)
    if not (tgt.is_nvidia and lay.cluster == 2 and work.sums > 1 and (lay.cache_row or opts.has_dres_out)
            and col_sums(work, opts) > 1 and DTYPES[opts.dtype] == 2 and lay.vec % 2 == 0):
        return lay  # (a row aligned to fewer than 4 bytes, vec 1, keeps its layout)
    if opts.db_smem != -1:
        return lay  # a forced db_smem keeps the blocks
    # Rows a multiprocessor works on at once: the 2 blocks as _db_smem caps them, else at BWD_SUMS_REGS.
    moved = _db_smem(opts, lay, tgt, work, True)
    if moved.db_smem == 1:
        return lay  # rows held with db's sums alone moved (4096: -4% in one block, *tune-v120*)
    best, most = lay, (moved.min_blocks * moved.rows / moved.cluster if moved.min_blocks
                       else _rows_at_once(tgt, lay, BWD_SUMS_REGS))
    nchunk = opts.n // 2  # 4-byte chunks of a 16-bit row
    tprs = [t for t in range(lay.warp, MAX_THREADS + 1, lay.warp) if nchunk % t == 0 and nchunk // t <= BWD_NARROW_K]
    candidates = []
    if tprs and lay.cache_row and not _full(lay):  # LayerNorm's own masked rows
        narrow = _bwd_block_layout(opts.n, 2, tgt, work, opts, tprs[0])
        candidates.append((narrow, _rows_at_once(tgt, narrow, BWD_NARROW_REGS)))
    one = _one_block(opts, tgt, work, lay)
    if one:
        candidates.append((one, one.min_blocks * one.rows))
    for new, rows in candidates:
        if rows > most or (new is one and rows == most and opts.has_dres_out):  # the fused add's: on a tie too
            best, most = new, rows
    return best


def _one_block(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout) -> Layout | None:
    """Rows over 2 blocks in one block of 2 chunks a thread (the fewest whole warps; the last chunk
    masked where the row does not fill them), read again, both column sums in shared memory (DB_SMEM
    3; past MAX_DB_SMEM_BYTES in the dynamic), capped for _one_block_blocks. None where the shape
    does not apply: another db_smem forced, no weight, a w wider than x (both sums moved beside it
    spilled, _db_smem), other than 2 chunks a thread, or slots past the limit."""
    tpr = -(-opts.n // (2 * lay.vec * lay.warp)) * lay.warp  # the fewest whole warps at 2 chunks a thread
    one = replace(_bwd_block_layout(opts.n, lay.vec, tgt, work, opts, tpr), cache_row=False, db_smem=3)
    if not (opts.db_smem in (-1, 3) and opts.has_weight and DTYPES[opts.wdtype] <= DTYPES[opts.dtype]
            and one.k == 2 and not one.stage and one.slot_bytes <= _slot_limit(tgt)):
        return None
    return replace(one, min_blocks=_one_block_blocks(opts, tgt, one))


def _slot_limit(tgt: targets.Target) -> int:
    """Bytes of the column sums' quarter slots a block may take: past static shared memory into the
    dynamic, where the target has its base (the stage piece's)."""
    return MAX_DYN_SLOT_BYTES if tgt.stage_piece else MAX_DB_SMEM_BYTES


def _pow2_warps(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout) -> Layout:
    """The fused add's LayerNorm backward (dw's and db's sums, reading d_residual_out) over 2
    blocks of 5-7 warps goes to 4 blocks of BWD_WIDE_WARPS warps instead: its rows held, both sums
    in shared memory (DB_SMEM 3, which _db_smem refuses over clusters of 3, 6 or 7 warps, where it
    spilled; w no wider than x, as there), capped for the blocks DB_SMEM_REGS_BOTH allows. Taken
    where that holds more rows at once than the sums in registers (BWD_SUMS_REGS) do: 6 and 7
    warps (2 blocks, one row a multiprocessor, against 6 blocks of 4 warps, 1.5 rows), not 5 (3
    blocks, 1.5 rows). The masked chunk this may leave costs less than the rows gain. On the H200
    (bf16, weight and bias; GB/s against 2 blocks of 5-7 warps; *tune-v81*, -v86, -v87):
    6144 as 128 x 4 3188-3216 against 3109-3141, 6656 3330-3347 against 1935-1971, 7168
    3464-3492 against 3262-3300, though ptxas spills 8 bytes at that cap
    (tests/test_sm90_spill.py). 5 warps lost (5120: 2834-2855 against 3390-3433) or, with a
    masked chunk, gained (4608: 2604-2612 against 2423-2495; not taken). LayerNorm's own backward
    lost in that shape (7168: 3202-3238 against 3325-3360). Rows with a 16-bit weight go to one
    block before this (_even_halves' _one_block: 6144 +20%, 7168 +11%); this takes the rest (no
    weight, f32 rows, RMSNorm's fused add with a bias)."""
    c = 2 * lay.cluster
    if not (tgt.min_blocks_attr and lay.cluster == 2 and opts.has_dres_out and col_sums(work, opts) > 1
            and DTYPES[opts.wdtype] <= DTYPES[opts.dtype] and lay.wpr > BWD_WIDE_WARPS and lay.wpr & (lay.wpr - 1)
            and opts.n % (c * lay.vec) == 0):
        return lay
    new = _clustered(_bwd_block_layout(opts.n // c, lay.vec, tgt, work, opts, BWD_WIDE_WARPS * lay.warp), c)
    rows = _rows_at_once(tgt, new, DB_SMEM_REGS_BOTH)
    if 2 * new.k * new.block * new.vec * 4 > MAX_DB_SMEM_BYTES or rows <= _rows_at_once(tgt, lay, BWD_SUMS_REGS):
        return lay
    return replace(new, cache_row=True, db_smem=3, min_blocks=_resident(tgt, new, DB_SMEM_REGS_BOTH))


def _full(lay: Layout) -> bool:
    """Every thread the same chunks: none carries a masked one."""
    return lay.k == lay.kfull


def _even_bwd(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout) -> Layout:
    """A backward's short row (at most 256 chunks) in one block that leaves a masked chunk is
    split evenly instead: one chunk a thread where the chunks fill whole warps; else, with two
    column sums (dw and db), narrower chunks over the same threads or up to twice as many. On the
    H200 (bf16, *tune-v82* to -v84), GB/s against the masked rows:

    - one chunk a thread: 768 as 96 x 1: RMSNorm's 3915-3919 against 3745-3749, its fused add's
      3882-3899 against 3708, LayerNorm's 3637-3646 against 3254, its fused add's 3693-3718
      against 3268-3294; 1280 as 160 x 1: 3950 against 3924-3925, 3886-3929 against 3729-3736,
      3640 against 3273-3293, 3753-3754 against 3325-3338; 1792 as 224 x 1 (*tune-v84*): 3887-3888
      against 3852-3855, 3910-3934 against 3777-3804, 3545-3547 against 3450-3455;
    - narrower chunks, two column sums, where the masked layout fills at most BWD_NARROW_MAX_FILL
      of its chunk slots: 1152 (75%) as 96 x 3 of 8 bytes, LayerNorm's 3644-3666 against
      3072-3075, its fused add's 3438-3451 against 3160-3180; 1600 (78%) as 160 x 5 of 4 bytes,
      3476-3501 against 3260-3284, 3402-3407 against 3257-3274; 576 (56%) as 96 x 3 of 4 bytes
      3093-3100 against 2626-2627. Fuller ones lost or tied: 896 (88%) as 64 x 7 of 4 bytes,
      the fused add's 3226-3248 against 3455-3467, LayerNorm's 3533-3546 against 3456-3489; 1920
      (94%) as 160 x 3 of 8 bytes 3483-3516 against 3545-3559 (*tune-v84*). With one column sum
      (RMSNorm's) they lost: 1152 as 96 x 3 3752 against 3847, 1600 as 160 x 5 of 4 bytes
      3402-3469 against 3694-3708 for the fused add.
    - chunks of half the width (8 bytes) at one a thread, where they fill whole warps and the
      masked layout fills at most BWD_HALF_MAX_FILL of its slots, for RMSNorm's fused add (one
      column sum, reading d_residual_out) in 16-bit rows (f32's not measured; *tune-v83*, -v86,
      -v87): 1152 (75%) as 288 x 1 3842-3865 against 3581-3627, 896 (88%) as 224 x 1 3864-3888
      against 3780-3818, 1664 (81%) as 416 x 1 3799-3815 against 3772-3812. Fuller ones tied or
      lost: 1408 (92%) as 352 x 1 3808-3849 against 3757-3828, 1920 (94%) as 480 x 1 3657-3683
      against 3845-3868. The same shape lost for RMSNorm's own backward (1152: 3609 against
      3847), and 4-byte chunks lost at 576 (288 x 1: 2934-2940 against 3231-3269).

    The same fused add's rows take one chunk a thread where 2 fill them, too (*tune-v138*-v140,
    two placements in v140): 1024 as 128 x 1 3922-3944 against 3882-3889, 1536 as 192 x 1
    3893-3953 against 3798-3849, 2048 as 256 x 1 3991-4008 against 3924-3970, f32 1024 as 256 x 1
    4031-4083 against 3855-3859. Not for the other backwards (v139, bf16): RMSNorm's own lost at
    2048 (3908 against 3981-3983) and 4096, LayerNorm's at 1024 and 2048 (3686-3744 against
    3748-3830), its fused add's at 2048; nor for the fused add's streamed rows (4096: 3942-3968
    against 3986-3995; 8192 as 1024 x 1 a tie)."""
    one_sum_dres = opts.has_dres_out and col_sums(work, opts) == 1
    if not (tgt.is_nvidia and lay.cluster == 1 and lay.rows == 1 and (one_sum_dres or not _full(lay))
            and lay.nchunk <= 256):
        return lay
    if lay.nchunk % lay.warp == 0:
        return _bwd_block_layout(opts.n, lay.vec, tgt, work, opts, lay.nchunk)
    half = lay.vec // 2
    if one_sum_dres and lay.nchunk <= BWD_HALF_MAX_FILL * lay.tpr * lay.k \
            and DTYPES[opts.dtype] == 2 and half and opts.n % (half * lay.warp) == 0 and opts.n // half <= MAX_THREADS:
        return _bwd_block_layout(opts.n, half, tgt, work, opts, opts.n // half)
    if col_sums(work, opts) > 1 and lay.nchunk <= BWD_NARROW_MAX_FILL * lay.tpr * lay.k:
        for vec in (lay.vec // 2, lay.vec // 4):
            for t in range(lay.tpr, 2 * lay.tpr + 1, lay.warp):
                if vec and opts.n % (vec * t) == 0:
                    return _bwd_block_layout(opts.n, vec, tgt, work, opts, t)
    return lay


def _bwd_block_layout(n: int, vec: int, tgt: targets.Target, work: RowWork, opts: Options, tpr: int = 0) -> Layout:
    """A persistent kernel's row layout, from H200 measurements (docs/results/*tune*):

    - short rows (<= 256 chunks): 2 chunks per thread, the rows read held in registers;
    - longer rows: 2 chunks per thread up to 512 chunks (N=4096 in bf16), 4 beyond, and only the
      fp32 column sums stay in registers across the persistent loop; the second pass reads the
      rows again (they are still in L1/L2). Fewer live registers buy more resident threads, which
      beat the saved re-read by 5-15%;
    - past 1024 threads the row goes to 512 threads with more chunks while the sums fit, else to
      1024 threads with the sums in memory (read-modify-write per row).
    """
    warp = tgt.warp
    weight = opts.has_weight
    forced = tpr > 0
    nchunk = n // vec
    one_held = held(opts.dtype)  # bytes per element of the normalized row held
    # fp32 column sums (+ the hoisted fp32 weight, see targets.Target.hoists_weight)
    dw_bytes = 4 * (col_sums(work, opts) + (1 if tgt.hoists_weight else 0))
    short = nchunk <= 256
    k_target = 2 if nchunk <= 512 else 4
    if tpr:
        tpr, rows = _forced(nchunk, tpr, warp)
    elif nchunk <= warp * k_target:
        tpr = min(warp, _pow2_ceil(math.ceil(nchunk / k_target)))
        rows = max(1, ROWS_BLOCK // tpr)
    else:
        # Where LLVM holds w beside the sums (AMDGPU), 1024-thread rows spill: stop at 512.
        top = MAX_THREADS // 2 if tgt.hoists_weight else MAX_THREADS
        tpr = min(top, -(-math.ceil(nchunk / k_target) // warp) * warp)
        rows = 1

        def dw_fits(t: int) -> bool:
            return -(-nchunk // t) * vec * dw_bytes <= tgt.reg_budget_bytes(t, BWD_OVERHEAD_REGS)

        half = MAX_THREADS // 2
        if not dw_fits(tpr) and tpr > half and dw_fits(half):
            tpr = half
    k = -(-nchunk // tpr)
    budget = tgt.reg_budget_bytes(tpr * rows, overhead_regs=BWD_OVERHEAD_REGS)
    dw_regs = k * vec * dw_bytes <= budget
    lo, hi, rolled_k = AMD_UNROLL_K[weight].get(vec, (0, 0, 0)) if vec == 8 or one_held == 4 else (0, 0, 0)
    if tgt.hoists_weight and not forced and not dw_regs and rows == 1 \
            and vec * max(DTYPES[t] for t in row_types(work, opts)) > MAX_VECTOR_BYTES:
        # Wider chunks: the loops stay rolled from AMD_WIDE_ROLLED_K chunks a thread (the threads
        # rounded down to whole warps, so that k does not fall back under it).
        tpr = max(warp, nchunk // AMD_WIDE_ROLLED_K // warp * warp)
        k = -(-nchunk // tpr)
    elif tgt.hoists_weight and not forced and not dw_regs and rows == 1 and lo <= k < hi:
        # LLVM (AMDGPU) fully unrolls the chunk loops of such rows, then hoists every w load out
        # of the persistent row loop and schedules pass 2's loads early (with a weight: 192-680
        # bytes of scratch, f32 at N=32768-65536, 16-bit at 49152), or, with no dw work between
        # the passes, merges pass 2's loads into pass 1's (x and dy are readonly: 68-88 bytes,
        # 16-bit at 65536). With enough chunks per thread the loops stay rolled; nothing spills.
        tpr = max(warp, -(-math.ceil(nchunk / rolled_k) // warp) * warp)
        k = -(-nchunk // tpr)
    # A row summary of more than one value (LayerNorm's c1 and c2) holds the rows read at up to 2
    # chunks per thread as well: on the H200 (bf16, *tune-v73*, -v74) against re-reading them,
    # 2880 3148-3159 GB/s against 2977-2979, 4096 3462 against 3334-3342, 8192 (over 2 blocks)
    # 3476 against 3328-3347, 7168 3331-3334 against 3116-3123, 16384 3299 against 3106-3109,
    # 32768 3198-3211 against 2890-2915. ptxas: 124 registers against 110 at 4096, no spill.
    hold = short or (_wide_sums(work, opts) and k <= 2)
    cache_row = hold and k * vec * (4 * col_sums(work, opts) + held_bytes(work, opts)) <= budget
    return Layout(vec=vec, tpr=tpr, rows=rows, k=k, kfull=nchunk // tpr, nchunk=nchunk,
                  cache_row=cache_row, warp=warp, dw_regs=dw_regs)


def _wide_sums(work: RowWork, opts: Options) -> bool:
    """A persistent kernel whose row summary has more than one value (LayerNorm's backward), the
    rules of which (held rows, 2 blocks of half the threads) the fused add's backward does not
    take: reading d_residual_out in pass 2 as well, its rows held took 164 registers at N=7168
    (2241 GB/s against 3310 re-read, *bench* 2026-12-01o, -q) and gained 0.6-2.5% elsewhere."""
    return work.sums > 1 and not opts.has_dres_out


def _cache_row(opts: Options, lay: Layout, tgt: targets.Target, work: RowWork, persistent: bool) -> Layout:
    """CACHE_ROW: forced, or the policy's. One-pass kernels: the policy is in fwd_layout; forced,
    0 reads the row again in pass 2 and 1 needs a row that fits the registers. Persistent kernels:
    without a weight there are no column sums, and the registers they would take hold the row
    instead where it fits the budget (unless a forced option needs the row read again)."""
    if not persistent:
        if opts.cache_row == 0:
            return replace(lay, cache_row=False, prefetch_w=False)
        if opts.cache_row == 1 and not lay.cache_row:
            raise ValueError(f"cache_row=1: a row of N={opts.n} ({lay.k} chunks per thread) does not fit the "
                             f"registers of {opts.target}; use None or 0")
        return lay
    if opts.cache_row != -1:
        return replace(lay, cache_row=bool(opts.cache_row))
    if opts.has_weight or opts.stage == 1 or opts.overlap > 0:  # forced staging and overlap re-read the row
        return lay
    budget = tgt.reg_budget_bytes(lay.block, overhead_regs=BWD_OVERHEAD_REGS)
    fits = lay.cluster == 1 and lay.k <= 2 and lay.k * lay.vec * held_bytes(work, opts) <= budget
    # LayerNorm's bf16 rows without w and b over a cluster (no column sums), 4 whole chunks a thread
    # in blocks of 512: held (ptxas 108 registers, no spill) instead of read again with all of pass
    # 2's chunks early. On the H200 (*tune-v166*, -v167, two placements each) 32768 4035-4063 GB/s
    # against 3404-3637, 65536 3903-3942 against 2865-3378, 131072 3844-3870 against 2724-3150.
    wide = work.sums > 1 and not opts.bdtype and not opts.has_dres_out and lay.cluster > 1 \
        and lay.block == BWD_MAX_SUMS_THREADS and lay.k == lay.kfull == 4 and held_bytes(work, opts) == 4
    return replace(lay, cache_row=lay.cache_row or fits or wide)


def _staged(opts: Options, lay: Layout, tgt: targets.Target, work: RowWork, persistent: bool) -> Layout:
    """STAGE, forced or the policy's: persistent kernels only (the rows they read go through two
    buffers each, both passes read them, while the next row's copies land). Rows re-read in
    pass 2, four or more chunks per thread, not split over a cluster. On the H200 (*tune-v6*) this
    gained 4-12% at N=7168/8192 and lost 2-6% to the L2 prefetch at 2880/4096 (2 chunks per
    thread) and 8-30% with clusters (*tune-v32*, -v40); where one block's buffers take more than
    STAGE_POLICY_BYTES, the L2 prefetch with eviction hints wins, except for rows of exactly
    2048 chunks, staged at 1024 threads (below). Needs asynchronous copies, 16-byte chunks, one
    row per block and buffers that fit. (A forward staged in a persistent grid lost 4-11% to a
    block per row, *tune-v7*, and was removed.)
    """
    _check(opts.stage, "stage", "choose 1 (on), 0 (off) or -1 (the policy's)")
    if not persistent:
        if opts.stage == 1:
            raise ValueError(f"stage=1: {opts.kernel} (a block per row group) has no staged layout; use None or 0")
        return lay
    eb = DTYPES[opts.dtype]
    buffers = 2 * len(reads(work, opts))
    sixteen = {lay.vec * DTYPES[types(opts)[t]] for t in reads(work, opts)} == {MAX_VECTOR_BYTES}
    fits = sixteen and buffers * lay.k * lay.block * MAX_VECTOR_BYTES <= MAX_STAGE_BYTES
    if opts.stage == 1 and not (tgt.stage_piece and fits and not lay.cache_row and lay.rows == 1):
        raise ValueError(f"stage=1 needs a target with asynchronous copies ({tgt.chip}: "
                         f"{'yes' if tgt.stage_piece else 'no'}), 16-byte chunks (here {lay.vec * eb}), "
                         f"buffers within {MAX_STAGE_BYTES} bytes, one row per block, and the row re-read")
    stageable = bool(tgt.stage_piece) and fits and not lay.cache_row and lay.rows == 1 and lay.cluster == 1 \
        and lay.k >= 4
    if opts.stage == -1 and stageable and lay.k == 4 and lay.block == MAX_THREADS // 2 \
            and lay.nchunk == 4 * lay.block:
        # Rows of exactly 2048 chunks (N=16384 in 16-bit types, 8192 in f32): staged as 1024
        # threads x 2 chunks (the same 128 KB of buffers, one block per multiprocessor, twice
        # the warps). On the H200 at six tensor placements each (*tune-v32*, -v33): bf16 16384
        # 3914-3947 GB/s, against 3464-3954 for 512 x 4 with the L2 prefetch (slow where L2 drops
        # the prefetched lines) and 3719-3729 for 512 x 4 staged; f32 8192 3918-4018 against
        # 3839-3895. Other widths did not gain (14336 as 896 x 2, 5120 as 320 x 2).
        return replace(lay, tpr=2 * lay.tpr, k=lay.k // 2, kfull=lay.k // 2, stage=True, stage_buffers=buffers)
    # A kernel reading d_residual_out in pass 2 (the fused add's) is not staged: the blocks that
    # staging's shared memory costs hid that read's latency (*tune-v68*, -v69: bf16 7168 3863-3869
    # GB/s with the L2 prefetch against 3753-3766 staged; 8192 3855-3874 against 3816-3911).
    policy = stageable and not opts.has_dres_out \
        and (buffers * lay.k * lay.block * MAX_VECTOR_BYTES <= STAGE_POLICY_BYTES or not opts.has_weight)
    return replace(lay, stage=policy if opts.stage == -1 else bool(opts.stage), stage_buffers=buffers)


def _hint_policy(lay: Layout, persistent: bool, has_weight: bool) -> int:
    """The cache hints a layout gets by default, from H200 measurements (*tune-v10*, -v11, -v14,
    -v16, each variant timed twice in opposite orders):

    - persistent rows that pass 2 reads again (from L2), neither staged nor split over a cluster:
      last reads and stores evict first (+3-4% at N=2880/4096, +9% at 16384); on rows held in
      registers (1024, 2048) that lost 4%, and keeping pass 1's lines (evict_last) added nothing.
      Their loads also ask L1 to keep their lines (*tune-v49*: +0.1-1.2%; without a weight +7-8%);
    - persistent rows split over a cluster (32768, 65536): stores only (+0.2-2.2%, *tune-v14*);
      the load hints lost 1-6% there;
    - without a weight, rows held in registers and neither staged nor split (N=1024-4096 in
      16-bit types): the same three hints, +6-9% over none (*tune-v66*);
    - one-pass kernels: what fwd_layout put in the layout (its streamed rows). On rows held in
      registers, load hints lost 1-9% and store hints about 1%.
    """
    if persistent:
        if lay.stage or (lay.cache_row and (has_weight or lay.cluster > 1)):
            return 0
        return HINT_STORES if lay.cluster > 1 else HINT_LAST_READ | HINT_STORES | HINT_L1_KEEP
    return lay.hints


def reduce_layout(n: int, vec: int, warp: int) -> Layout:
    """The column sums: 8 column threads (16-byte fp32 vectors) x 32 row threads, or 128 row
    threads for short rows (at most 512 chunks: N <= 2048), whose backwards leave many partial rows
    (one a resident block: 660-1584) over few column blocks (32 at 1024). On the H200 (bf16, the
    sums' kernel time, `docs/results/2026-12-03-h200.md` run h): 1024 5.2 -> 4.1 us (RMSNorm's),
    4.8 -> 3.9 (LayerNorm's dw and db), 6.5 -> 4.5 (its fused add's); 2048 a tie to -0.7 us. Past
    it the few partial rows (30-400) leave 128 row threads idle (run g: 65536 4.1 -> 13.9 us).
    Long rows (at least 8192 chunks: N >= 32768) leave the fewest partial rows (30-50) over the
    most columns: 32 column threads x 8 row threads there (run j: LayerNorm's two sums at 65536
    9.0 -> 4.0 us, 32768 5.2 -> 4.2; RMSNorm's dw at 65536 5.0 -> 2.6; lost at 8192-16384)."""
    nchunk = n // vec
    if nchunk >= REDUCE_LONG_CHUNKS:
        cols, rows = REDUCE_CT_LONG, REDUCE_RT_LONG
    else:
        cols, rows = REDUCE_CT, REDUCE_RT_SHORT if nchunk <= REDUCE_SHORT_CHUNKS else REDUCE_RT
    return Layout(vec=vec, tpr=cols, rows=rows, k=1, kfull=1, nchunk=nchunk, cache_row=False, warp=warp)


# ---------------------------------------------------------------------------- one-pass kernels


def fwd_layout(opts: Options, tgt: targets.Target, work: RowWork) -> Layout:
    """A block-per-row-group kernel's layout (the forward): row_layout's, or on targets with L2
    eviction hints the streamed row (_streamed) where nothing forced says otherwise."""
    # 8-byte chunks where the policy prefers them, unless a forced option needs 16-byte ones;
    # measured for one row read: two (the fused add's x and residual) spill under its register cap.
    narrow = opts.hints <= 0 and len(reads(work, opts)) == 1
    hb = held_bytes(work, opts)
    lay = row_layout(opts.n, opts.vec, hb, tgt, opts.tpr, DTYPES[opts.wdtype], opts.cluster, narrow=narrow)
    if tgt.hoists_weight and lay.block >= MAX_THREADS and lay.cache_row and opts.has_weight and opts.bdtype \
            and lay.k * lay.vec > AMD_1024_ROW_ELEMENTS_WB and opts.cache_row != 1:
        # AMDGPU at 1024 threads holding w and b beside the row: 12 bytes of scratch at N=65536
        # in bf16 (LayerNorm, rstd stored; tests/test_gfx950_scratch.py). The row is read again.
        lay = replace(lay, cache_row=False, prefetch_w=False)
    policy = opts.tpr == 0 and opts.cluster == 0 and opts.hints == -1 and opts.cache_row == -1
    sixteen = {lay.vec * DTYPES[t] for t in row_types(work, opts)} == {MAX_VECTOR_BYTES}
    if policy and tgt.hints and lay.cluster == 1 and sixteen \
            and FWD_STREAM_CHUNKS[0] <= lay.nchunk <= FWD_STREAM_CHUNKS[1]:
        two_reads = len(reads(work, opts)) > 1
        streamed = _streamed(lay, two_reads=two_reads, sums=work.sums)
        if work.sums > 1 and two_reads and streamed.tpr == MAX_THREADS:
            held = _wide_sums_held(opts, tgt, lay, hb)
            if held is not None:
                return held
        if work.sums > 1 and not two_reads and lay.nchunk % lay.warp:
            # One read of a wider summary whose chunks do not split over whole warps (N=2880):
            # held in registers at the streamed threads, no L2 hints. On the H200 (bf16, weight
            # and bias, *tune-v73*, -v75, -v76): 3756-3776 GB/s against 3666-3695 streamed.
            held = _row_block_layout(opts.n, lay.vec, hb, tgt, streamed.tpr, DTYPES[opts.wdtype])
            if held.cache_row:
                return _even_rows(opts, tgt, work, held, hb)
        if work.sums > 1 and two_reads and streamed.k == 1 and streamed.wpr & (streamed.wpr - 1):
            # Two reads of a wider summary at one chunk a thread over a count of warps that is
            # not a power of two: held at 2 chunks a thread where those fill whole warps, else
            # split evenly. On the H200 (bf16, weight and bias, *tune-v85*): 1536 as 96 x 2
            # 4139-4140 GB/s against 3969-3971, 2560 as 160 x 2 4147-4151 against 3819-3820, 3584
            # as 224 x 2 4121-4125 against 3779-3785, 1280 as 32 x 5 4115-4125 against 3959-3978.
            # Rows over 4, 8 or 16 warps stay streamed (1024-4096, *tune-v68*).
            tpr = lay.nchunk // 2 if lay.nchunk % (2 * lay.warp) == 0 else 0
            held = _row_block_layout(opts.n, lay.vec, hb, tgt, tpr, DTYPES[opts.wdtype]) if tpr \
                else _even_split(opts, tgt, hb)
            if held is not None and held.cache_row:
                return held
        return _two_blocks(tgt, _even_rows(opts, tgt, work, streamed, hb), two_reads, DTYPES[opts.dtype])
    if policy and work.sums > 1 and len(reads(work, opts)) > 1 and lay.cluster > 1:
        held = _wide_sums_held(opts, tgt, lay, hb)
        if held is not None:
            return held
    return _even_rows(opts, tgt, work, lay, hb) if policy else lay


def _wide_sums_held(opts: Options, tgt: targets.Target, lay: Layout, hb: int) -> Layout | None:
    """Two reads and a wider summary (the fused add's LayerNorm forward) in rows that stream in
    1024 threads or split over a cluster (N=32768, 65536 in 16-bit types): held over
    FWD_WIDE_SUMS_CLUSTER blocks of 128 threads, 4 or 8 whole 16-byte chunks a thread. On the
    H200 (bf16, weight and bias, two placements, *tune-v146*): 32768 3999-4035 GB/s against
    3954-3994 over 4 blocks of 256 (which *tune-v78* had at 3960-3974 against 3267-3270
    streamed, 3536-3545 over 2 blocks of 512, 3604-3612 of 1024); 65536 3936-3949 against
    3906-3917 over 2 blocks of 512 (4 of 256: 3936-3942; 8 of 256, 4 of 512, 2 of 1024:
    3442-3780). None where the shape does not apply. (LayerNorm's own, one read, stays streamed:
    3358-3363 against 2880-3307 over clusters, *tune-v78*.)"""
    c = FWD_WIDE_SUMS_CLUSTER
    if not tgt.clusters or c > tgt.max_cluster or DTYPES[opts.dtype] != 2:
        return None
    held = row_layout(opts.n, lay.vec, hb, tgt, MAX_THREADS // c, DTYPES[opts.wdtype], c)
    if held.cache_row and held.cluster == c and held.k == held.kfull and held.k in (4, 8) \
            and held.vec * 2 == MAX_VECTOR_BYTES:
        return held
    return None


def _two_blocks(tgt: targets.Target, lay: Layout, two_reads: bool, elem_bytes: int) -> Layout:
    """A row read once and again (streamed) in a block of FWD_TWO_BLOCKS_THREADS threads or more
    is capped for 2 blocks a multiprocessor: ptxas gives such rows 40-49 registers, one block (ncu:
    LayerNorm's at 32768, 50% occupancy against RMSNorm's 92% at 32 registers). On the H200 (bf16,
    *tune-v92*, -v93; GB/s against one block; ptxas: 32-40 registers, up to 24 bytes spilled):
    LayerNorm's (weight and bias) 24576 as 768 threads 3388-3403 against 2679-2683, 28672
    3585-3591 against 2748-2749, 32768 3747-3766 against 3330-3342; RMSNorm's 24576 4081-4100
    against 3373-3387, 32768 (32 registers either way) 4074-4100. Not two reads (the fused add's
    x and residual: 24576 3593-3602 against 4204-4205, 32768 3368-3378 against 4185-4198), nor
    512 threads (LayerNorm's 16384 capped for 4 blocks: 3799-3812 against 4062-4080), nor fp32
    rows (not measured)."""
    if tgt.min_blocks_attr and not two_reads and elem_bytes == 2 and not lay.cache_row \
            and lay.block >= FWD_TWO_BLOCKS_THREADS and not lay.min_blocks:
        return replace(lay, min_blocks=2)
    return lay


def _even_rows(opts: Options, tgt: targets.Target, work: RowWork, lay: Layout, hb: int) -> Layout:
    """A one-read forward of a wider row summary (LayerNorm's) whose layout leaves a masked chunk
    gets rows split evenly instead, held in registers: the fewest whole warps (else a sub-warp)
    in 16-byte chunks, else 8-byte ones, FWD_EVEN_MIN_K chunks a thread or more, at most
    FWD_EVEN_MAX_ELEMENTS elements. On the H200 (bf16, weight and bias, *tune-v82* to -v84), GB/s
    against the policy's masked rows: 320 as 16 x 5 of 8 bytes 3995-4000 against 3114, 576 as 16
    x 9 of 8 bytes 3960-3995 against 2930-2942, 896 as 32 x 7 of 8 bytes 3995-4014 against
    3611-3620, 1152 as 32 x 9 of 8 bytes 4004-4022 against 3103-3122, 1280 as 32 x 5 3953-3996
    against 3345, 1600 as 16 x 25 of 8 bytes 3903-3924 against 3325-3363, 2560 as 32 x 10
    3951-3971 against 3570-3577, 3584 as 64 x 7 4001-4004 against 3573-3595, 3840 as 64 x 15 of 8
    bytes 3997-4002 against 3678-3699. Fewer chunks a thread lost (2560 as 160 x 2 3249-3255, 3584 as
    224 x 2 3189-3204); RMSNorm's forward and both fused adds' kept their masked rows (within
    1%, or ahead by 1-6%). N=2880 has no such split and stays held (fwd_layout)."""
    if not (tgt.is_nvidia and work.sums > 1 and len(reads(work, opts)) == 1 and lay.cluster == 1
            and not _full(lay) and opts.n * DTYPES[opts.dtype] <= FWD_EVEN_MAX_CHUNKS * MAX_VECTOR_BYTES):
        return lay
    even = _even_split(opts, tgt, hb)
    return even if even is not None and even.cache_row else lay


def _even_split(opts: Options, tgt: targets.Target, hb: int) -> Layout | None:
    """The forward's row split evenly (see _even_rows), or None where no split qualifies."""
    warp = tgt.warp
    threads = [*range(warp, MAX_THREADS + 1, warp), *(warp >> i for i in range(1, warp.bit_length()))]
    for t in threads:
        for vec in (opts.vec, opts.vec // 2):
            if vec and opts.n % (t * vec) == 0 and FWD_EVEN_MIN_K * vec <= opts.n // t <= FWD_EVEN_MAX_ELEMENTS:
                return _row_block_layout(opts.n, vec, hb, tgt, t, DTYPES[opts.wdtype])
    return None


def _streamed(lay: Layout, two_reads: bool = False, sums: int = 1) -> Layout:
    """A row of 128-4096 16-byte chunks, read twice: pass 1 asks L2 to keep its lines
    (evict_last), pass 2 reads them again (its last use: evict_first) and writes, with 2 chunks
    per thread up to 512 threads, then 4 up to 1024. Fewer live registers and short blocks beat
    holding the row (the way Inductor's kernels read it). On the H200 (bf16, *tune-v36*, -v37),
    GB/s against the row held in registers: 1024 4121-4141 vs 4052-4092, 2880 4134-4156 vs
    4014-4043, 4096 4124-4148 vs 3962-3989, 8192 4134-4160 vs 3969-3994, 16384 4017-4037 vs
    3948-3970, 32768 4022-4044 vs 3945-3962; N=65536 lost (3346-3372 vs 3911-3942). Both passes'
    loads ask L1 to keep their lines (*tune-v49*: +0.7-1.3% at 7168-32768). Rows of 4 chunks per
    thread have pass 2's reads ask L1 to evict them first instead (HINT_L1_FIRST, *tune-v57*,
    -v58: +0.1-0.6%), and over at most FWD_BATCH_MAX_TPR threads (N=16384) load all of pass 2's
    chunks before computing (batch_reload, *tune-v63*, -v64: +1.1%; at 1024 threads -9%).

    two_reads (the fused add's x and residual, h = x + residual held as neither): one chunk per
    thread up to 1024 threads, then 2, with the L1 hints of the longer rows. On the H200 (bf16,
    *tune-v68* to -v70), GB/s against the one-read layout: N=1024 as 128 x 1 4231-4255 against
    4087-4102 (64 x 2), 2048 4220-4243 against 4102-4132, 4096 as 512 x 1 4260 against 4119,
    8192 as 1024 x 1 4247-4262 against 4146-4166; 16384 as 1024 x 2 4179-4211 against 3911-3964
    (512 x 4 batched).

    sums (fp32 values per row through the reductions; RMSNorm 1, LayerNorm's forward 3: count,
    mean, M2): a wider row summary costs more per reduction step, so rows with more than one
    take fewer threads: one-read rows 4 chunks per thread, two-read rows one chunk per thread
    up to 512 threads, then 2, then 4, and 4 where the chunks do not split evenly over whole
    warps. On the H200 (LayerNorm, bf16, weight and bias, *tune-v72* to -v74), GB/s against 2
    chunks: 1024 (one warp) 4070-4074 against 3833-3852, 2048 4042-4062 against 3791, 2880
    3653-3677 against 3059-3069, 4096 4039-4059 against 3687-3705, 7168 3970-3989 against
    3030-3040, 8192 4054-4077 against 3401-3408; 1 chunk per thread lost everywhere
    (2076-3268); at 32768, 512 x 8 lost to 1024 x 4 (3217-3228 against 3374). The fused add
    against 1024-thread blocks: 7168 as 448 x 2 4234-4245 against 3567, 8192 as 512 x 2 4220
    against 4006-4014, 16384 as 512 x 4 4151-4161 against 3903-3911 (1024 x 2); at 2048 and
    4096 one chunk per thread stays best; 32768 as 512 x 8 lost (2875-2888 against 3238-3246);
    2880 as 96 x 4 4136-4137 against 3391-3393 (352 x 1, a masked tail), 4098-4100 as 192 x 2."""
    top = MAX_THREADS if sums == 1 else MAX_THREADS // 2
    # A wider summary's general merge (unequal counts: a reciprocal per step) where the chunks do
    # not split evenly over whole warps (N=2880: 360): 4 chunks per thread, as one read.
    ragged = sums > 1 and lay.nchunk % lay.warp != 0
    if two_reads and not ragged:
        k = 1 if lay.nchunk <= top else 2 if lay.nchunk <= 2 * top else 4
    else:
        k = 2 if lay.nchunk <= MAX_THREADS and sums == 1 else 4
    # Whole warps, each thread owning a chunk (at most nchunk threads): rows of 1 chunk per thread
    # whose chunk count is not a multiple of the warp (N=2880: 360) round the threads down, and
    # the first threads take a second, masked-tail chunk (see _forced for why none may own none).
    tpr = min(-(-math.ceil(lay.nchunk / k) // lay.warp) * lay.warp, lay.nchunk // lay.warp * lay.warp)
    hints = HINT_LAST_READ | HINT_KEEP | HINT_L1_KEEP | (HINT_L1_FIRST if lay.nchunk > MAX_THREADS else 0)
    return replace(lay, tpr=tpr, rows=1, k=-(-lay.nchunk // tpr), kfull=lay.nchunk // tpr, cache_row=False,
                   prefetch_w=False, hints=hints, batch_reload=k == 4 and tpr <= FWD_BATCH_MAX_TPR)


def row_layout(n: int, vec: int, held_bytes: int, tgt: targets.Target, tpr: int = 0, w_bytes: int = 2,
               cluster: int = 0, narrow: bool = False) -> Layout:
    """Rows that do not fit one block's registers are split over a thread-block cluster where the
    target has clusters, until a block's share does. Rows that fit stay in one block, except the
    rows `narrow` below moves to a capped cluster (N=65536 in bf16 on the H200: 3931-3958 GB/s in
    one block of 1024 threads, 3654-3672 over 8 blocks, 3362-3381 over 2, *tune-v40*, -v41). See
    _row_block_layout for a block's share.

    narrow (the caller's policy may allow it): a row that fills a 1024-thread block with 8
    chunks of 16 bytes per thread on NVIDIA (N=65536 in 16-bit types) takes chunks of 8 bytes
    instead: in one block 16 per thread (+1.1-1.3%, *tune-v14*, -v15, -v16); where the target has
    clusters (and none is forced), over a cluster of FWD_WIDE_CLUSTER blocks of 256 threads, 16
    chunks each too, with the registers capped so that 4 blocks share a multiprocessor (min_blocks;
    the weight then is not held): the next rows' loads overlap a row's reduction and stores, which
    one 1024-thread block per multiprocessor cannot do (*tune-v50*: 4001-4005 GB/s against
    3931-3970 in one block)."""
    c = _split(n, vec, tgt, cluster, tpr,
               lambda c: not _row_block_layout(n // c, vec, held_bytes, tgt, tpr, w_bytes).cache_row)
    lay = _clustered(_row_block_layout(n // c, vec, held_bytes, tgt, tpr, w_bytes), c)
    # Measured for bf16 rows in 16-byte chunks only: held_bytes == 2 is one bf16 row (held packed).
    if narrow and tgt.is_nvidia and not tpr and lay.cluster == 1 and lay.block == MAX_THREADS \
            and lay.k == lay.kfull == 8 and lay.cache_row and held_bytes == 2 and vec * 2 == MAX_VECTOR_BYTES:
        if tgt.clusters and not cluster:
            c = FWD_WIDE_CLUSTER
            share = _row_block_layout(n // c, vec // 2, held_bytes, tgt, MAX_THREADS // c, w_bytes)
            return replace(_clustered(share, c), min_blocks=c)
        lay = _row_block_layout(n, vec // 2, held_bytes, tgt, MAX_THREADS, w_bytes)
    return lay


def _row_block_layout(n: int, vec: int, held_bytes: int, tgt: targets.Target, tpr: int = 0, w_bytes: int = 2) -> Layout:
    """Threads per row and chunks per thread for a row (or a block's share) of n elements.

    Rows of at most 4 chunks per lane of one warp share a block (several rows per block, no
    barrier in the reduction); longer rows get one block of up to 1024 threads with 4 (8 past
    1024 chunks) 16-byte chunks per thread: on the H200, 256 threads x 8 chunks beat 512 x 4 at
    N=16384, and 512 x 8 beat 1024 x 4 at N=32768. On NVIDIA a row of exactly 4 chunks per lane
    of a warp (N=1024 in 16-bit types) gets its own block of two warps with 2 chunks each
    (+1.5-1.9%, *tune-v2*, -v3, -v15). The row stays in registers when it fits the target's
    register budget for the block; else the second pass reads it again (mostly from L2).
    """
    warp = tgt.warp
    nchunk = n // vec
    if tpr:
        tpr, rows = _forced(nchunk, tpr, warp)
    elif nchunk < warp * 4 or (nchunk == warp * 4 and not tgt.is_nvidia):
        tpr = min(warp, _pow2_ceil(math.ceil(nchunk / 4)))
        rows = max(1, ROWS_BLOCK // tpr)
    else:
        k_target = 2 if nchunk == warp * 4 else 4 if nchunk <= 1024 else 8
        # AMDGPU at 1024 threads (128 VGPRs) with more than 4 bytes an element in flight (the
        # fused add's fp32 x and residual): LLVM hoists the re-read row's loads into 44-52 bytes
        # of scratch (f32, N=98304 and 131072); 512 threads keep none (tests/test_gfx950_scratch.py).
        top = MAX_THREADS // 2 if tgt.hoists_weight and held_bytes > 4 else MAX_THREADS
        tpr = min(top, -(-math.ceil(nchunk / k_target) // warp) * warp)
        rows = 1
    k = -(-nchunk // tpr)
    budget = tgt.reg_budget_bytes(tpr * rows)
    cache_row = k * vec * held_bytes <= budget
    prefetch_w = cache_row and k * vec * (held_bytes + w_bytes) <= budget
    if tgt.hoists_weight and tpr * rows >= MAX_THREADS:
        # AMDGPU at 1024 threads (128 VGPRs): LLVM holds w as fp32 and bf16 rows unpacked there,
        # so w does not fit beside the row, nor more than 64 elements of it (the ISA showed 36
        # and 300 bytes of scratch at N=65536 and 131072 in bf16).
        prefetch_w = False
        cache_row = cache_row and k * vec <= AMD_1024_ROW_ELEMENTS
    return Layout(vec=vec, tpr=tpr, rows=rows, k=k, kfull=nchunk // tpr, nchunk=nchunk,
                  cache_row=cache_row, warp=warp, prefetch_w=prefetch_w)


def max_vec(n: int, elem_bytes: int) -> int:
    """The widest power-of-two vector (<= 16 bytes) that divides the row."""
    v = MAX_VECTOR_BYTES // elem_bytes
    while n % v:
        v //= 2
    return v


def _check(value: object, name: str, what: str, lo: int = -1, hi: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}={value!r}: {what}")
