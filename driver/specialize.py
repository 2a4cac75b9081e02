"""Kernel text -> specialized text: the options dataclass, the row layout policy, placeholder
substitution and splicing of the shared pieces in mlir/common. Pure Python: no MLIR import."""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field, fields, replace

from . import targets
from .kernels import KERNELS
from .template import Resolver, Source, SpecializationError, mlir_root, render_file, substitute  # noqa: F401

DTYPES = {"bf16": 2, "f16": 2, "f32": 4}  # MLIR element type -> bytes
MAX_N = 1 << 20
MAX_VECTOR_BYTES = 16
FLT_MIN = 1.1754943508222875e-38
MAX_THREADS = 1024
REDUCE_CT, REDUCE_RT = 8, 32
BWD_OVERHEAD_REGS = 36  # six pointers, three strides and the persistent loop's state
ROWS_BLOCK = 256  # block size when several rows share a block
AMD_1024_ROW_ELEMENTS = 64  # row elements a thread of a 1024-thread AMDGPU block may hold
# AMDGPU backward with the dw sums in memory, with and without a weight, per chunk width
# (elements): the chunks per thread [lo, hi) for which LLVM fully unrolls the chunk loops into a
# spill, and the count that keeps them rolled (see _bwd_block_layout). Found by compiling every N
# in every dtype (tests/test_gfx950_scratch.py).
AMD_UNROLL_K = {True: {4: (16, 64, 64), 8: (12, 16, 32)}, False: {4: (32, 64, 64), 8: (16, 24, 32)}}
HINTING = ("rmsnorm_fwd", "rmsnorm_bwd")  # kernels with L2 eviction hints
PREFETCHING = ("rmsnorm_bwd",)  # kernels with the L2 prefetch of the next row
MAX_STAGE_BYTES = 200 * 1024  # STAGE buffers past this leave too little shared memory
# The backward stages by default only where two blocks' buffers fit a multiprocessor: at N=16384
# (128 KB, one block) the L2 prefetch with eviction hints beat staging at 512 threads by 9%
# (docs/results/*tune-v11*); rows of 2048 chunks are staged at 1024 threads instead (_staged).
STAGE_POLICY_BYTES = 100 * 1024
FWD_STREAM_CHUNKS = (128, 4096)  # rows the forward reads twice with L2 hints (see _fwd_streamed)
STAGING = {"rmsnorm_fwd": 1, "rmsnorm_bwd": 4}  # kernels with a STAGE layout: their buffer count
MAX_MIN_BLOCKS = 32  # NVVM's .minnctapersm: at most the resident blocks of a multiprocessor
# Options.hints bits (see mlir/common/cache_hint_nvvm.mlir): a row's last read asks L2 to evict
# its lines first; stores do; a first read that pass 2 repeats asks L2 to keep them; loads skip
# the non-coherent (.nc) path; loads ask L1 to keep their lines (.L1::evict_last); a row's last
# reads ask L1 to evict first (.L1::evict_first); loads ask L2 to fetch 256-byte blocks (.L2::256B).
HINT_LAST_READ, HINT_STORES, HINT_KEEP, HINT_COHERENT, HINT_L1_KEEP, HINT_L1_FIRST = 1, 2, 4, 8, 16, 32
HINT_L2_256B = 64
HINT_LOADS = HINT_LAST_READ | HINT_KEEP | HINT_COHERENT | HINT_L1_KEEP | HINT_L1_FIRST | HINT_L2_256B
MAX_HINTS = 127
FWD_BATCH_MAX_TPR = 512  # the forward's streamed rows batch pass 2's loads up to this many threads
MAX_CLUSTER = 8  # blocks of a thread-block cluster that share one row (the portable limit)
FWD_WIDE_CLUSTER = 4  # the forward's rows that fill a 1024-thread block: blocks per row (see row_layout)
# The backward splits rows whose dw sums need more than this many registers per thread: with
# 64 (N=32768 bf16 in one 512-thread block) ptxas caps the block at 128 registers and spills.
BWD_SPLIT_DW = 32



def f32(x: float) -> float:
    """x rounded to float32, as the kernel will see it."""
    return struct.unpack("f", struct.pack("f", x))[0]


def mlir_f32(x: float) -> str:
    return f"{f32(x):.9e}"


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
    prefetch_w: bool = False  # weight chunks loaded before the reduction (registers permitting)
    batch_reload: bool = False  # forward read twice: pass 2 loads all its x and w chunks, then computes
    dw_regs: bool = False  # backward: dw sums kept in registers across the persistent loop
    cluster: int = 1  # blocks (one thread-block cluster) sharing each row; each takes N / cluster
    l2_prefetch: bool = False  # pass 1 also asks L2 for the block's next row (prefetch.global.L2)
    stage: bool = False  # rows staged through shared memory by asynchronous copies (cp.async)
    stage_buffers: int = 0  # STAGE buffers of K x BLOCK 16-byte chunks: 4 backward (2 x x, dy), 1 forward
    min_blocks: int = 0  # blocks that must fit one multiprocessor (caps registers per thread); 0: no cap
    hints: int = 0  # cache hints, a sum of the HINT_* bits (loads of x and dy, stores of y and dx)
    overlap: int = 0  # backward over a cluster: pass 2's first chunks loaded between posting the total and the wait
    push: bool = False  # over a cluster: totals pushed with st.async and mbarriers, no cluster barrier per row

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per block: the STAGE buffers."""
        return self.stage_buffers * self.k * self.block * MAX_VECTOR_BYTES if self.stage else 0

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
    def unroll_limit(self) -> int:
        """Unroll the chunk loops fully only when a private array must become registers."""
        return targets.UNROLL_LIMIT if (self.cache_row or self.dw_regs or self.prefetch_w or self.overlap > 0
                                        or self.batch_reload) else 0


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


def bwd_layout(n: int, vec: int, held_bytes: int, tgt: targets.Target, tpr: int = 0, cluster: int = 0,
               weight: bool = True) -> Layout:
    """The backward's layout: rows whose fp32 dw sums do not fit one block's registers, or need
    more than BWD_SPLIT_DW of them per thread, are split over a thread-block cluster (where the
    target has clusters) until each block's share does; see _bwd_block_layout for a share."""
    def too_big(c: int) -> bool:
        lay = _bwd_block_layout(n // c, vec, held_bytes, tgt, tpr, weight)
        return not lay.dw_regs or lay.k * lay.vec > BWD_SPLIT_DW

    c = _split(n, vec, tgt, cluster, tpr, too_big)
    return _clustered(_bwd_block_layout(n // c, vec, held_bytes, tgt, tpr, weight), c)


def _bwd_block_layout(n: int, vec: int, held_bytes: int, tgt: targets.Target, tpr: int = 0,
                      weight: bool = True) -> Layout:
    """The backward's row layout, from H200 measurements (docs/results/*tune*):

    - short rows (<= 256 chunks): 2 chunks per thread, x and dy kept in registers;
    - longer rows: 2 chunks per thread up to 512 chunks (N=4096 in bf16), 4 beyond, and only the
      fp32 dw sums stay in registers across the persistent loop; the second pass reads x and dy
      again (they are still in L1/L2). Fewer live registers buy more resident threads, which
      beat the saved re-read by 5-15%;
    - past 1024 threads the row goes to 512 threads with more chunks while the dw sums fit,
      else to 1024 threads with the sums in memory (read-modify-write per row).
    """
    warp = tgt.warp
    forced = tpr > 0
    nchunk = n // vec
    dw_bytes = 8 if tgt.hoists_weight else 4  # fp32 dw sums (+ the hoisted fp32 w, see targets)
    short = nchunk <= 256
    k_target = 2 if nchunk <= 512 else 4
    if tpr:
        tpr, rows = _forced(nchunk, tpr, warp)
    elif nchunk <= warp * k_target:
        tpr = min(warp, _pow2_ceil(math.ceil(nchunk / k_target)))
        rows = max(1, ROWS_BLOCK // tpr)
    else:
        # Where LLVM holds w beside the dw sums (AMDGPU), 1024-thread rows spill: stop at 512.
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
    lo, hi, rolled_k = AMD_UNROLL_K[weight].get(vec, (0, 0, 0)) if vec == 8 or held_bytes == 4 else (0, 0, 0)
    if tgt.hoists_weight and not forced and not dw_regs and rows == 1 and lo <= k < hi:
        # LLVM (AMDGPU) fully unrolls the chunk loops of such rows, then hoists every w load out
        # of the persistent row loop and schedules pass 2's loads early (with a weight: 192-680
        # bytes of scratch, f32 at N=32768-65536, 16-bit at 49152), or, with no dw work between
        # the passes, merges pass 2's loads into pass 1's (x and dy are readonly: 68-88 bytes,
        # 16-bit at 65536). With enough chunks per thread the loops stay rolled; nothing spills.
        tpr = max(warp, -(-math.ceil(nchunk / rolled_k) // warp) * warp)
        k = -(-nchunk // tpr)
    cache_row = short and k * vec * (4 + 2 * held_bytes) <= budget
    return Layout(vec=vec, tpr=tpr, rows=rows, k=k, kfull=nchunk // tpr, nchunk=nchunk,
                  cache_row=cache_row, warp=warp, prefetch_w=False, dw_regs=dw_regs)


def _cache_row(opts: Options, lay: Layout, tgt: targets.Target) -> Layout:
    """CACHE_ROW: forced, or the policy's. The forward's policy is in fwd_layout; forced, 0 reads
    the row again in pass 2 and 1 needs a row that fits the registers. The backward: without a
    weight there are no dw sums, and the registers they would take hold the row instead where
    it fits the budget (unless a forced option needs the row read again)."""
    if opts.kernel == "rmsnorm_fwd":
        if opts.cache_row == 0:
            return replace(lay, cache_row=False, prefetch_w=False)
        if opts.cache_row == 1 and not lay.cache_row:
            raise ValueError(f"cache_row=1: a row of N={opts.n} ({lay.k} chunks per thread) does not fit the "
                             f"registers of {opts.target}; use -1 or 0")
        return lay
    if opts.kernel != "rmsnorm_bwd":
        if opts.cache_row != -1:
            raise ValueError(f"cache_row={opts.cache_row}: only the forward and the backward take it "
                             f"({opts.kernel} does not); use -1")
        return lay
    if opts.cache_row != -1:
        return replace(lay, cache_row=bool(opts.cache_row))
    if opts.has_weight or opts.stage == 1 or opts.overlap > 0:  # forced staging and overlap re-read the row
        return lay
    budget = tgt.reg_budget_bytes(lay.block, overhead_regs=BWD_OVERHEAD_REGS)
    fits = lay.cluster == 1 and lay.k <= 2 and lay.k * lay.vec * 2 * held(opts.dtype) <= budget
    return replace(lay, cache_row=lay.cache_row or fits)


def _staged(kernel: str, lay: Layout, stage: int, tgt: targets.Target, eb: int, weight: bool = True) -> Layout:
    """The STAGE choice: forced, or the policy's.

    Backward (x, dy through two buffers, both passes read them): rows re-read in pass 2, four or
    more chunks per thread, not split over a cluster. On the H200 (docs/results/*tune-v6*) this
    gained 4-12% at N=7168/8192 and lost 2-6% to the L2 prefetch at 2880/4096 (2 chunks per
    thread) and 25-30% with clusters (32768/65536; 19-22% in *tune-v32* with the next row's
    copies issued after the cluster barrier's arrive; 8-14% with the exchange by pushes, *tune-v40*:
    65536 3135-3344 vs 3615-3804); where one block's buffers take more than
    STAGE_POLICY_BYTES, the L2 prefetch with eviction hints wins, except for rows of exactly
    2048 chunks, staged at 1024 threads (see below).
    Forward (persistent grid; the next row lands in one buffer while the current one, held in
    registers, is written): never by default. It lost 4-11% at N=8192-65536 in bf16 and 11%
    at 65536 in f32 to one block per row (docs/results/*tune-v7*); it stays a forced option.
    Both need asynchronous copies, 16-byte chunks, one row per block and buffers that fit.
    """
    buffers = STAGING[kernel]
    backward = kernel == "rmsnorm_bwd"
    held = lay.cache_row != backward  # the backward streams the row; the forward holds it
    fits = lay.vec * eb == MAX_VECTOR_BYTES and buffers * lay.k * lay.block * MAX_VECTOR_BYTES <= MAX_STAGE_BYTES
    if stage == 1 and not (tgt.stage_piece and fits and held and lay.rows == 1):
        raise ValueError(f"stage=1 needs a target with asynchronous copies ({tgt.chip}: "
                         f"{'yes' if tgt.stage_piece else 'no'}), 16-byte chunks (here {lay.vec * eb}), "
                         f"buffers within {MAX_STAGE_BYTES} bytes, one row per block, and the row "
                         f"{'re-read' if backward else 'held in registers'}")
    stageable = backward and bool(tgt.stage_piece) and fits and held and lay.rows == 1 and lay.cluster == 1 \
        and lay.k >= 4
    if stage == -1 and stageable and lay.k == 4 and lay.block == MAX_THREADS // 2 and lay.nchunk == 4 * lay.block:
        # Rows of exactly 2048 chunks (N=16384 in 16-bit types, 8192 in f32): staged as 1024
        # threads x 2 chunks (the same 128 KB of buffers, one block per multiprocessor, twice
        # the warps). On the H200 at six tensor placements each (docs/results/*tune-v32*, -v33):
        # bf16 16384 3914-3947 GB/s, against 3464-3954 for 512 x 4 with the L2 prefetch (slow
        # where L2 drops the prefetched lines) and 3719-3729 for 512 x 4 staged; f32 8192
        # 3918-4018 against 3839-3895. Other widths did not gain: 896 x 2 at 14336 ran 3477-3493
        # against the prefetch's 3932-3969, 320 x 2 at 5120 3326-3347 against 160 x 4's 3888-3903.
        return _widened(lay, buffers)
    policy = stageable and lay.k >= 4 and (buffers * lay.k * lay.block * MAX_VECTOR_BYTES <= STAGE_POLICY_BYTES
                                           or not weight)
    return replace(lay, stage=policy if stage == -1 else bool(stage), stage_buffers=buffers)


def _widened(lay: Layout, buffers: int) -> Layout:
    """A staged one-row block of twice lay's threads, each with half its chunks (none masked)."""
    tpr = 2 * lay.tpr
    return replace(lay, tpr=tpr, k=lay.k // 2, kfull=lay.k // 2, stage=True, stage_buffers=buffers)


def _hint_policy(kernel: str, lay: Layout, has_weight: bool) -> int:
    """The cache hints a layout gets by default, from H200 measurements (docs/results/*tune-v10*,
    -v11, -v14 and -v16, each variant timed twice in opposite orders):

    - backward rows that pass 2 reads again (from L2), neither staged nor split over a cluster:
      last reads and dx stores evict first (+3-4% at N=2880/4096, +9% at 16384); on rows held in
      registers (1024, 2048) that lost 4%, and keeping pass 1's lines (evict_last) added nothing.
      Their loads also ask L1 to keep their lines (*tune-v49*: 2880 +1.2%, 4096 +1.2%, 14336
      +0.1%; without a weight +7-8% at 2880 and 4096);
    - backward rows split over a cluster (32768, 65536): dx stores only (+1.3/+2.2% and +0.2/
      +0.3% in two runs, docs/results/*tune-v14*); the load hints lost 1-6% there;
    - the backward without a weight, rows held in registers and neither staged nor split over a
      cluster (N=1024-4096 in 16-bit types): the same three hints, *tune-v66*: 1024 3922-3935 vs
      3588-3615 without hints (v62, v65), 2048 3933-3953 vs 3592-3654, 2880 3906-3928 vs
      3635-3685, 4096 3870-3909 vs 3563-3650. Last reads and stores alone (3) tie; loads that also
      ask L2 for 256-byte blocks (.L2::256B, hint bit 64) measured 3-4% below (3766-3823, v60-v62,
      v66) and lost 5-8% with a weight, and on staged rows (7168, 8192) 0.5-1%: a knob only;
    - the forward: what fwd_layout put in the layout (its streamed rows: pass 1 keeps, pass 2's
      reads evict first). On rows held in registers, load hints lost 1-9% and store hints about
      1% (0.3-1.5% gained at N=65536 in bf16, where 8-byte chunks gained more).
    """
    if kernel == "rmsnorm_bwd":
        if lay.stage or (lay.cache_row and (has_weight or lay.cluster > 1)):
            return 0
        return HINT_STORES if lay.cluster > 1 else HINT_LAST_READ | HINT_STORES | HINT_L1_KEEP
    return lay.hints


def reduce_layout(n: int, vec: int, warp: int) -> Layout:
    """dw reduction: 8 column threads (16-byte fp32 vectors) x 32 row threads."""
    return Layout(vec=vec, tpr=REDUCE_CT, rows=REDUCE_RT, k=1, kfull=1, nchunk=n // vec,
                  cache_row=False, warp=warp)


def held(dtype: str) -> int:
    """Register bytes per element of a row held across the reduction: bf16 stays packed (the
    late_ext piece keeps LLVM from holding fp32 copies), f16 and f32 are held as fp32."""
    return 2 if dtype == "bf16" else 4


def fwd_layout(opts: Options, tgt: targets.Target) -> Layout:
    """The forward's layout: row_layout's, or on targets with L2 eviction hints the streamed row
    (_fwd_streamed) where nothing forced says otherwise."""
    # 8-byte chunks where the policy prefers them, unless a forced option needs 16-byte ones.
    narrow = opts.stage != 1 and opts.hints <= 0
    lay = row_layout(opts.n, opts.vec, held(opts.dtype), tgt, opts.tpr, DTYPES[opts.wdtype], opts.cluster,
                     narrow=narrow)
    policy = opts.tpr == 0 and opts.cluster == 0 and opts.stage != 1 and opts.hints == -1 and opts.cache_row == -1
    if policy and tgt.hint_piece is not None and lay.cluster == 1 and lay.vec * DTYPES[opts.dtype] == MAX_VECTOR_BYTES \
            and FWD_STREAM_CHUNKS[0] <= lay.nchunk <= FWD_STREAM_CHUNKS[1]:
        return _fwd_streamed(lay)
    return lay


def _fwd_streamed(lay: Layout) -> Layout:
    """A row of 128-4096 16-byte chunks, read twice: pass 1 asks L2 to keep its lines
    (evict_last), pass 2 reads them again (its last use: evict_first) and writes y, with 2
    chunks per thread up to 512 threads, then 4 up to 1024. Fewer live registers and short
    blocks beat holding the row (the way Inductor's kernels read it). On the H200 (bf16,
    docs/results/*tune-v36*, -v37*, two placements x two rounds), GB/s against the row held in
    registers: 1024 4121-4141 vs 4052-4092, 2048 4120-4148 vs 4068-4094, 2880 4134-4156 vs
    4014-4043, 4096 4124-4148 vs 3962-3989, 7168 4079-4102 vs 4022-4045, 8192 4134-4160 vs
    3969-3994, 16384 4017-4037 vs 3948-3970, 32768 4022-4044 vs 3945-3962. Not kept: the same
    without hints (8192: 3950-3962), 4 chunks at 256 threads for 8192 (3868-3905), 2 at 1024
    threads for 16384 (3782-3797), one chunk per thread (4096: 3429-3456), N=65536 (8192 chunks:
    3346-3372 vs 3911-3942 held in 8-byte chunks). Both passes' loads also ask L1 to keep their
    lines (.L1::evict_last, as Triton spells eviction_policy='evict_last'), *tune-v49*: 7168
    4128-4156 vs 4081-4083, 16384 4044-4069 vs 4015-4037, 32768 4053-4079 vs 4018-4050; 1024-8192
    within 0.3% either way. Rows of 4 chunks per thread (N=16384, 32768) have pass 2's reads ask
    L1 to evict them first instead (.L1::evict_first, as Inductor's last reads do; HINT_L1_FIRST),
    *tune-v57*, -v58 (two runs, three placements x two rounds): 32768 4071-4097 vs 4054-4082 and
    4083-4109 vs 4073-4096, 16384 4057-4078 vs 4056-4063 and 4072-4099 vs 4077-4079; on 2-chunk
    rows (1024-8192) within 0.3% either way, so those keep evict_last. Rows of 4 chunks per thread
    over at most FWD_BATCH_MAX_TPR threads (N=16384) load all of pass 2's chunks of x and w before
    computing (batch_reload), as Triton's one-trip loop does: *tune-v63*, -v64, 4111-4138 and
    4111-4143 vs 4063-4086 and 4070-4094 (3 blocks per multiprocessor instead of 4); at 1024
    threads (32768) it leaves one block per multiprocessor, 3705-3728 vs 4078-4104; on 2-chunk
    rows within noise (7168 and 8192, with and without row_sum's trailing barrier)."""
    k = 2 if lay.nchunk <= 2 * (MAX_THREADS // 2) else 4
    tpr = -(-math.ceil(lay.nchunk / k) // lay.warp) * lay.warp
    hints = HINT_LAST_READ | HINT_KEEP | HINT_L1_KEEP | (HINT_L1_FIRST if k == 4 else 0)
    return replace(lay, tpr=tpr, rows=1, k=-(-lay.nchunk // tpr), kfull=lay.nchunk // tpr, cache_row=False,
                   prefetch_w=False, hints=hints, batch_reload=k == 4 and tpr <= FWD_BATCH_MAX_TPR)


def row_layout(n: int, vec: int, held_bytes: int, tgt: targets.Target, tpr: int = 0, w_bytes: int = 2,
               cluster: int = 0, narrow: bool = False) -> Layout:
    """The forward's layout: rows that do not fit one block's registers are split over a
    thread-block cluster where the target has clusters, until a block's share does. Rows that
    fit stay in one block, except the rows `narrow` below moves to a capped cluster: on the
    H200, N=65536 in bf16 ran at 3931-3958 GB/s in one block of 1024 threads, 3908-3947 over 4
    blocks with the exchange by pushes but no register cap (3516-3549 with the cluster barrier),
    3654-3672 over 8 and 3362-3381 over 2 (docs/results/*tune-v40*, -v41); at 32768, 3973-3985
    over 2 blocks against the one-block streamed row's 4037-4051. See _row_block_layout for a
    block's share.

    narrow (the caller's policy may allow it): a row that fills a 1024-thread block with 8
    chunks of 16 bytes per thread on NVIDIA (N=65536 in 16-bit types) takes chunks of 8 bytes
    instead: in one block 16 per thread, +1.1%, +1.2% and +1.3% in three H200 runs
    (docs/results/*tune-v14*, -v15, -v16); where the target has clusters (and none is forced),
    over a cluster of FWD_WIDE_CLUSTER blocks of 256 threads, 16 chunks each too, with the
    registers capped so that 4 blocks share a multiprocessor (min_blocks; the weight then is not
    held): the next rows' loads overlap a row's reduction and stores, which one 1024-thread block
    per multiprocessor cannot do. bf16 N=65536 on the H200 (*tune-v50*): 4001-4005 GB/s against
    3931-3970 in one block; 16-byte chunks 3989-3994, 2 blocks of 512 3962-3988."""
    c = _split(n, vec, tgt, cluster, tpr,
               lambda c: not _row_block_layout(n // c, vec, held_bytes, tgt, tpr, w_bytes).cache_row)
    lay = _clustered(_row_block_layout(n // c, vec, held_bytes, tgt, tpr, w_bytes), c)
    # Measured for bf16 rows in 16-byte chunks only: held_bytes == 2 is bf16 (held packed).
    if narrow and tgt.is_nvidia and not tpr and lay.cluster == 1 and lay.block == MAX_THREADS \
            and lay.k == lay.kfull == 8 and lay.cache_row and held_bytes == 2 and vec * 2 == MAX_VECTOR_BYTES:
        if tgt.clusters and not cluster:
            c = FWD_WIDE_CLUSTER
            share = _row_block_layout(n // c, vec // 2, held_bytes, tgt, MAX_THREADS // c, w_bytes)
            return replace(_clustered(share, c), min_blocks=c)
        lay = _row_block_layout(n, vec // 2, held_bytes, tgt, MAX_THREADS, w_bytes)
    return lay


def _row_block_layout(n: int, vec: int, held_bytes: int, tgt: targets.Target, tpr: int = 0, w_bytes: int = 2) -> Layout:
    """Pick threads per row and chunks per thread for a row (or a block's share) of n elements.

    Rows of at most 4 chunks per lane of one warp share a block (several rows per block, no
    barrier in the reduction); longer rows get one block of up to 1024 threads with 4 (8 past
    1024 chunks) 16-byte chunks per thread: on the H200, 256 threads x 8 chunks beat 512 x 4 at
    N=16384, and 512 x 8 beat 1024 x 4 at N=32768 (docs/results/*tune*). On NVIDIA a row of
    exactly 4 chunks per lane of a warp (N=1024 in 16-bit types) gets its own block of two warps
    with 2 chunks each: +1.5-1.9% over 8 rows per block in three H200 runs (*tune-v2*, *-v3*, *-v15*).
    The row stays in registers (as fp32, as the compiler keeps it) when it fits the target's
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
        tpr = min(MAX_THREADS, -(-math.ceil(nchunk / k_target) // warp) * warp)
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


@dataclass(frozen=True)
class Options:
    """Everything fixed at compile time for one kernel binary. Validates itself."""

    kernel: str
    n: int
    dtype: str = "bf16"
    wdtype: str = "bf16"
    eps: float = 1e-6
    target: str = "sm_90"
    has_weight: bool = True
    store_rstd: bool = False
    vec: int = 0  # 0: the widest the row allows
    atomic_dw: bool = False
    tpr: int = 0  # threads per row; 0: the kernel's layout policy decides (tuning knob)
    cluster: int = 0  # blocks per row (a thread-block cluster); 0: the layout policy decides
    l2_prefetch: int = -1  # 1/0: prefetch the next row into L2 or not; -1: the layout policy decides
    stage: int = -1  # backward, 1/0: stage x and dy through shared memory or not; -1: the policy's
    min_blocks: int = 0  # NVVM: blocks per multiprocessor the registers must allow; 0: the policy's (row_layout)
    hints: int = -1  # cache hints, a sum of the HINT_* bits (0: none); -1: the policy's
    overlap: int = -1  # backward over a cluster: pass 2's chunks loaded inside the exchange (0: none); -1: the policy's
    cache_row: int = -1  # 1/0: the row (x, and dy) held in registers between the passes, or read again; -1: policy
    push: int = -1  # over a cluster, 1/0: totals exchanged by pushes (st.async, mbarriers) or cluster barrier; -1: policy
    batch_reload: int = -1  # forward read twice, 1/0: pass 2 loads all its chunks before computing or not; -1: policy
    layout: Layout = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel {self.kernel!r} is unknown; choose one of {sorted(KERNELS)}")
        tgt = targets.get(self.target)
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n={self.n!r} is out of range: normir supports 1 <= N <= {MAX_N}")
        for name in ("dtype", "wdtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r}: choose one of {sorted(DTYPES)}")
        eps = float(self.eps)
        if not (math.isfinite(eps) and eps >= FLT_MIN and math.isfinite(f32(eps))):
            raise ValueError(f"eps={self.eps!r} must be a finite float32 >= {FLT_MIN:g} (e.g. 1e-6)")
        object.__setattr__(self, "eps", f32(eps))
        widest = max_vec(self.n, DTYPES[self.dtype])
        vec = self.vec or widest
        if vec & (vec - 1) or vec > widest:
            raise ValueError(f"vec={self.vec} must be a power of two dividing N, at most {widest}")
        object.__setattr__(self, "vec", vec)
        if self.tpr and not (0 < self.tpr <= MAX_THREADS and (self.tpr % tgt.warp == 0 or (
                self.tpr < tgt.warp and self.tpr & (self.tpr - 1) == 0))):
            raise ValueError(f"tpr={self.tpr} must be a power of two below the warp ({tgt.warp}) or a "
                             f"multiple of it, at most {MAX_THREADS}")
        if self.cluster and not (self.cluster & (self.cluster - 1) == 0 and self.cluster <= MAX_CLUSTER):
            raise ValueError(f"cluster={self.cluster} must be a power of two, at most {MAX_CLUSTER}")
        if self.cluster > 1 and not tgt.clusters:
            raise ValueError(f"cluster={self.cluster}: {self.target} has no thread-block clusters; use cluster=1")
        if self.cluster > 1 and self.n % (self.cluster * vec):
            raise ValueError(f"cluster={self.cluster} must split N={self.n} into whole vectors of {vec}")
        _check_int("l2_prefetch", self.l2_prefetch, -1, 1, "choose 1 (on), 0 (off) or -1 (the policy's)")
        if self.l2_prefetch == 1 and (tgt.prefetch_piece is None or self.kernel not in PREFETCHING):
            raise ValueError(f"l2_prefetch=1: {self.kernel} on {self.target} has no L2 prefetch of the next row; "
                             "use -1 or 0")
        _check_int("stage", self.stage, -1, 1, "choose 1 (on), 0 (off) or -1 (the policy's)")
        _check_int("min_blocks", self.min_blocks, 0, MAX_MIN_BLOCKS,
                   f"must be an int from 0 (the policy's) to {MAX_MIN_BLOCKS}")
        _check_int("hints", self.hints, -1, MAX_HINTS,
                   f"choose -1 (the policy's), 0 (none), or a sum of {HINT_LAST_READ} (last reads evict first), "
                   f"{HINT_STORES} (stores evict first), {HINT_KEEP} (reads repeated later evict last), "
                   f"{HINT_COHERENT} (no .nc loads), {HINT_L1_KEEP} (loads ask L1 to keep their lines), "
                   f"{HINT_L1_FIRST} (the forward's last reads ask L1 to evict them first) and "
                   f"{HINT_L2_256B} (loads fetch 256-byte blocks into L2)")
        _check_int("cache_row", self.cache_row, -1, 1,
                   "choose 1 (the row held in registers), 0 (read again) or -1 (the policy's)")
        _check_int("push", self.push, -1, 1,
                   "choose 1 (pushes and mbarriers), 0 (the cluster barrier) or -1 (the policy's)")
        _check_int("batch_reload", self.batch_reload, -1, 1,
                   "choose 1 (pass 2 loads every chunk first), 0 (chunk by chunk) or -1 (the policy's)")
        if self.min_blocks and not tgt.min_blocks_attr:
            raise ValueError(f"min_blocks={self.min_blocks}: {self.target} has no blocks-per-multiprocessor bound; use 0")
        spec = KERNELS[self.kernel]
        lay = _cache_row(self, spec.layout(self, tgt), tgt)
        if self.kernel in STAGING:
            lay = _staged(self.kernel, lay, self.stage, tgt, DTYPES[self.dtype], self.has_weight)
        elif self.stage == 1:
            raise ValueError(f"stage=1: {self.kernel} has no staged layout; use -1 or 0")
        if self.kernel in PREFETCHING:
            # Measured on the H200 (docs/results/*tune-v5*): +2-19% for the backward's one-row
            # blocks. The forward, which lost 3-24% with it in a block-per-row grid and 4-16% in a
            # persistent grid (docs/results/*tune-v9*), has none.
            policy = lay.rows == 1 and not lay.stage and tgt.prefetch_piece is not None
            lay = replace(lay, l2_prefetch=policy if self.l2_prefetch == -1 else bool(self.l2_prefetch))
        hintable = tgt.hint_piece is not None and lay.vec * DTYPES[self.dtype] == MAX_VECTOR_BYTES \
            and self.kernel in HINTING
        if self.hints > 0 and not hintable:
            raise ValueError(f"hints={self.hints}: {self.kernel} on {self.target} has no L2 eviction hints for "
                             f"{lay.vec * DTYPES[self.dtype]}-byte chunks (they need 16 and an NVVM target); use -1 or 0")
        hints = _hint_policy(self.kernel, lay, self.has_weight) if self.hints == -1 and hintable else max(0, self.hints)
        lay = replace(lay, min_blocks=self.min_blocks or lay.min_blocks, hints=hints)
        if self.batch_reload == 1 and (self.kernel != "rmsnorm_fwd" or lay.cache_row):
            why = f"N={self.n} holds them in registers (cache_row=0 reads them again)" if lay.cache_row else \
                f"{self.kernel} has no such pass"
            raise ValueError(f"batch_reload=1 needs the forward (rmsnorm_fwd) reading its rows twice; {why}; "
                             "use -1 or 0")
        if self.batch_reload != -1:
            lay = replace(lay, batch_reload=bool(self.batch_reload))
        if lay.prefetch_w and lay.min_blocks > 1 and lay.k * lay.vec * (held(self.dtype) + DTYPES[self.wdtype]) \
                > tgt.reg_budget_bytes(lay.block * lay.min_blocks):
            lay = replace(lay, prefetch_w=False)  # the weight's registers must fit the cap too
        _check_int("overlap", self.overlap, -1, lay.k,
                   f"choose -1 (the policy's), 0 (none) or a chunk count up to K={lay.k}")
        overlappable = self.kernel == "rmsnorm_bwd" and lay.cluster > 1 and lay.dw_regs \
            and not lay.cache_row and not lay.stage
        if self.overlap > 0 and not overlappable:
            raise ValueError(f"overlap={self.overlap} needs the backward ({self.kernel}) with rows split over a "
                             f"cluster (here {lay.cluster} block(s)), dw sums in registers, no staging; use -1 or 0")
        # The policy: 2 of 4 chunks in blocks of up to 512 threads. On the H200 (docs/results/
        # *tune-v19*, *-v20*) that gained 7.4% at N=32768 and 6.7% at 65536 (bf16); 1 of 4 gained
        # 4.6-4.8%; 3 and 4 of 4 spilled (128 registers) and gained less or lost. 1024-thread
        # blocks (64 registers) spill with it (N=65536 in f32).
        # Without a weight (no dw sums) all 4 fit: +10% at 32768 and +21% at 65536 (*tune-v27*).
        policy = (2 if self.has_weight else lay.k) if overlappable and lay.k == 4 and lay.block <= MAX_THREADS // 2 else 0
        lay = replace(lay, overlap=policy if self.overlap == -1 else self.overlap)
        if self.push == 1 and not (lay.cluster > 1 and tgt.cluster_push_piece):
            raise ValueError(f"push=1 needs rows split over a cluster (here {lay.cluster} block(s)) on a target "
                             f"with st.async ({self.target}: {'yes' if tgt.cluster_push_piece else 'no'}); use -1 or 0")
        # The policy: push wherever a row is split over a cluster. On the H200 (docs/results/
        # *tune-v40*, -v41, bf16, two placements x two rounds), against the cluster barrier: backward
        # 65536 3615-3804 vs 3459-3465 GB/s (no weight 3562-3751 vs 3178-3276), 32768 3765-3956 vs
        # 3646-3658; forward split over 4 blocks at 65536 3908-3947 vs 3516-3549 (the basis of
        # row_layout's capped 4-block rows, *tune-v50*). Likely why: barrier.cluster.arrive releases (it waits
        # for the thread's earlier stores and copies) and every block waits for the slowest
        # thread of every peer; a push orders nothing else and one thread per block signals.
        lay = replace(lay, push=lay.cluster > 1 and self.push != 0 and tgt.cluster_push_piece is not None)
        object.__setattr__(self, "layout", lay)

    def key_string(self) -> str:
        """Stable text of the fields (Python's hash() is salted per process)."""
        return ";".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.compare)

    def describe(self) -> str:
        """The kernel, N, target and every field that differs from its default: for messages."""
        defaults = {f.name: f.default for f in fields(self) if f.init}
        parts = [f"{self.kernel} n={self.n} {self.target}"]
        parts += [f"{name}={getattr(self, name)!r}" for name, d in defaults.items()
                  if name not in ("kernel", "n", "target", "vec", "eps") and getattr(self, name) != d]
        return " ".join(parts)

    def digest(self) -> str:
        return hashlib.sha256(self.key_string().encode()).hexdigest()


def _check_int(name: str, value: object, lo: int, hi: int, what: str) -> None:
    """A knob that must be an int (not a bool) in [lo, hi]; else an error naming it and the choices."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}={value!r}: {what}")


def _cast(src: str, dst: str) -> str:
    if src == dst:
        return "arith.bitcast"
    return "arith.extf" if DTYPES[dst] > DTYPES[src] else "arith.truncf"


def common_values(opts: Options) -> dict[str, str]:
    """Placeholders every kernel shares: types, constants, layout, target spellings."""
    tgt = targets.get(opts.target)
    lay = opts.layout
    eb, wb = DTYPES[opts.dtype], DTYPES[opts.wdtype]
    return {
        "TARGET": tgt.target_attr,
        "RSQRT_PIECE": tgt.rsqrt_piece,
        # The cross-block piece only where rows are split: a no-op sum otherwise.
        "CLUSTER_PIECE": (tgt.cluster_push_piece if lay.push else tgt.cluster_piece) if lay.cluster > 1
        else "common/cluster_sum_none.mlir",
        "CLUSTER": str(lay.cluster),
        "PREFETCH_PIECE": tgt.prefetch_piece if lay.l2_prefetch else "common/prefetch_none.mlir",
        "L2_PREFETCH": _bool(lay.l2_prefetch),
        "STAGE": _bool(lay.stage),
        "STAGE_PIECE": tgt.stage_piece if lay.stage else "common/stage_none.mlir",
        "STAGE_BLOCK_BYTES": str(lay.block * MAX_VECTOR_BYTES),
        "HINT_PIECE": tgt.hint_piece if lay.hints else "common/cache_hint_none.mlir",
        "HINT_LD": _bool(bool(lay.hints & HINT_LOADS)),
        "HINT_ST": _bool(bool(lay.hints & HINT_STORES)),
        "POLICY_LAST_READ": "evict_first" if lay.hints & HINT_LAST_READ else "evict_normal",
        "POLICY_KEEP": "evict_last" if lay.hints & HINT_KEEP else "evict_normal",
        "LD_NC": "" if lay.hints & HINT_COHERENT else ".nc",
        "LD_L1": ".L1::evict_last" if lay.hints & HINT_L1_KEEP else "",
        "LD_L1_LAST": ".L1::evict_first" if lay.hints & HINT_L1_FIRST else
        ".L1::evict_last" if lay.hints & HINT_L1_KEEP else "",
        "LD_PF": ".L2::256B" if lay.hints & HINT_L2_256B else "",
        "BATCH_RELOAD": _bool(lay.batch_reload),  # Options refuses it on held rows
        "KERNEL_ATTRS": tgt.min_blocks_attr.format(lay.min_blocks) if lay.min_blocks else "",
        "EB": str(eb),
        "NSUB": str(lay.nsub),
        "ATOMIC_PIECE": tgt.atomic_piece,
        "LATE_EXT_PIECE": "common/late_ext_bf16.mlir" if opts.dtype == "bf16" else "common/late_ext_generic.mlir",
        "WARP": str(tgt.warp),
        "N": str(opts.n),
        "T": opts.dtype,
        "WT": opts.wdtype,
        "EPS": mlir_f32(opts.eps),
        "INV_N": mlir_f32(1.0 / opts.n),
        "V": str(lay.vec),
        "ALIGN": str(lay.vec * eb),
        "W_ALIGN": str(min(MAX_VECTOR_BYTES, lay.vec * wb)),
        "PART_ALIGN": str(min(MAX_VECTOR_BYTES, lay.vec * 4)),
        "DW_REGS": _bool(lay.dw_regs),
        "OVERLAP": _bool(lay.overlap > 0),
        "OVERLAP_K": str(lay.overlap),
        "BLOCK": str(lay.block),
        "ROWS": str(lay.rows),
        "TPR": str(lay.tpr),
        "WPR": str(lay.wpr),
        "MULTI_WARP": _bool(lay.tpr > lay.warp),
        # row_sum's trailing barrier guards %red for the block's next row: a grid of one row group
        # per block (KernelSpec.grid "rows", not staged) has none (*tune-v64*: +1% at 7168,
        # +0.2-0.6% at 2048-8192 for the forward).
        "RED_REUSED": _bool(KERNELS[opts.kernel].grid != "rows" or lay.stage),
        "SHUFFLE_STEPS": str(int(math.log2(min(lay.tpr, lay.warp)))),
        "WARP_STEPS": str(int(math.log2(lay.warp))),
        "K": str(lay.k),
        "KFULL": str(lay.kfull),
        "NCHUNK": str(lay.nchunk),
        "CACHE_ROW": _bool(lay.cache_row),
        "PREFETCH_W": _bool(lay.prefetch_w and opts.has_weight),
        "HAS_WEIGHT": _bool(opts.has_weight),
        "STORE_RSTD": _bool(opts.store_rstd),
        "ATOMIC_DW": _bool(opts.atomic_dw),
        "EXT_T": _cast(opts.dtype, "f32"),
        "EXT_WT": _cast(opts.wdtype, "f32"),
        "TRUNC_T": _cast("f32", opts.dtype),
        "TRUNC_WT": _cast("f32", opts.wdtype),
    }


# Placeholders that follow from the row layout: `normir compile --set` refuses them, since a layout
# is checked as a whole (a forced tpr leaving threads without a chunk hung the H200); the value is
# the flag that forces it through that check ("" where only the layout as a whole moves it).
LAYOUT_VALUES = {
    "TPR": "--tpr", "CLUSTER": "--cluster", "CLUSTER_PIECE": "--cluster", "V": "--vec", "ALIGN": "--vec",
    "W_ALIGN": "--vec", "PART_ALIGN": "--vec", "STAGE": "--stage", "STAGE_PIECE": "--stage",
    "STAGE_BLOCK_BYTES": "--stage", "L2_PREFETCH": "--l2-prefetch", "PREFETCH_PIECE": "--l2-prefetch",
    "CACHE_ROW": "--cache-row", "OVERLAP": "--overlap", "OVERLAP_K": "--overlap", "BATCH_RELOAD": "--batch-reload",
    "KERNEL_ATTRS": "--min-blocks", "ROWS": "", "BLOCK": "", "K": "", "KFULL": "", "NCHUNK": "", "NSUB": "",
    "WPR": "", "MULTI_WARP": "", "SHUFFLE_STEPS": "", "WARP_STEPS": "", "DW_REGS": "", "PREFETCH_W": "",
    "RED_REUSED": "", "CT": "", "RT": "",
}
# The placeholders each user-given option of `normir compile` fills: an option the text does not use
# (--eps on a text without ${EPS}) is an error rather than silently ignored.
USER_VALUES = {"eps": ("EPS",), "wdtype": ("WT",), "store_rstd": ("STORE_RSTD",),
               "atomic_dw": ("ATOMIC_DW",), "no_weight": ("HAS_WEIGHT",)}


def _bool(b: bool) -> str:
    return "true" if b else "false"


def values_for(opts: Options) -> dict[str, str]:
    """Every placeholder value the driver computes for a kernel's options."""
    return {**common_values(opts), **KERNELS[opts.kernel].extra_values(opts)}


def specialize_source(opts: Options, resolver: Resolver | None = None) -> Source:
    """The kernel text with every placeholder filled and every common piece spliced, with its
    line map (template.Source)."""
    return render_file(KERNELS[opts.kernel].template, values_for(opts), resolver=resolver)


def specialize(opts: Options) -> str:
    """The kernel text with every placeholder filled and every common piece spliced."""
    return specialize_source(opts).text
