"""The knobs a caller forced (options.Overrides: None is the policy's), checked against the target
and the kernel and applied: each at its place in the chooser's order (rules.ORDER), where the
field it sets is decided. A forced knob wins over every rule; an impossible one raises ValueError
naming it and the fix.
"""

from __future__ import annotations

from dataclasses import replace

from .. import targets
from . import geometry as G
from .geometry import DTYPES, ELEMENT_BYTES, MAX_STAGE_BYTES, MAX_VECTOR_BYTES, Ctx, Layout

# The knobs a kernel of a fixed layout (the column sums) refuses when forced (stage=0 aside).
FIXED = ("tpr", "cluster", "stage", "cache_row", "l2_prefetch", "hints", "overlap", "batch_reload", "max_regs")


def check_target(p, ov, tgt: targets.Target) -> None:
    """The knobs forced against the target (Overrides checked their values alone)."""
    tpr, cluster, top = ov.tpr, ov.cluster or 0, max(G.MAX_CLUSTER, tgt.max_cluster)
    if tpr and not (tpr % tgt.warp == 0 or (tpr < tgt.warp and tpr & (tpr - 1) == 0)):
        raise ValueError(f"tpr={tpr} must be a power of two below the warp ({tgt.warp}) or a multiple of it, at "
                         f"most {G.MAX_THREADS}")
    if cluster > 1 and not tgt.clusters:
        raise ValueError(f"cluster={cluster}: {p.target} has no thread-block clusters; use cluster=1")
    if cluster and not (cluster & (cluster - 1) == 0 and cluster <= top):
        raise ValueError(f"cluster={cluster} must be a power of two, at most {top} on {p.target} "
                         f"({G.MAX_CLUSTER} portable; past it the driver is asked for a non-portable size)")
    if cluster > 1 and p.n % (cluster * p.vec):
        raise ValueError(f"cluster={cluster} must split N={p.n} into whole vectors of {p.vec}")
    if ov.l2_prefetch == 1 and tgt.prefetch_piece is None:
        raise ValueError(f"l2_prefetch=1: {p.target} has no L2 prefetch instruction; use None or 0")
    if ov.max_regs and ov.max_regs > tgt.max_regs:
        raise ValueError(f"max_regs={ov.max_regs}: {p.target} has at most {tgt.max_regs} registers a thread")
    if ov.max_regs and not tgt.max_regs_attr:
        raise ValueError(f"max_regs={ov.max_regs}: {p.target} has no register cap attribute; use None")
    if ov.min_blocks and not tgt.min_blocks_attr:
        raise ValueError(f"min_blocks={ov.min_blocks}: {p.target} has no blocks-per-multiprocessor bound; use None")


def check_fixed(p, ov) -> None:
    """A kernel of a fixed layout (the column sums) takes no layout knob."""
    for knob in FIXED:
        value = getattr(ov, knob)
        if value is not None and not (knob == "stage" and value == 0):
            raise ValueError(f"{knob}={value}: {p.kernel} has a fixed layout; leave {knob} to the policy (None)")


def stage_fits(c: Ctx, lay: Layout) -> bool:
    """The rows pass 1 reads move in 16-byte chunks and their STAGE buffers fit shared memory."""
    sixteen = {lay.vec * DTYPES[c.p.types[t]] for t in c.work.reads_for(c.p)} == {MAX_VECTOR_BYTES}
    return sixteen and lay.stage_buffers * lay.k * lay.block * MAX_VECTOR_BYTES <= MAX_STAGE_BYTES


def overlappable(lay: Layout) -> bool:
    """A backward's rows split over a cluster, read again, sums in registers, not staged: pass 2's
    first chunks may load inside the cluster exchange."""
    return lay.cluster > 1 and lay.dw_regs and not lay.cache_row and not lay.stage


def cache_row(c: Ctx, lay: Layout) -> Layout:
    if c.ov.cache_row == 1 and not (c.persistent or lay.cache_row):
        raise ValueError(f"cache_row=1: a row of N={c.p.n} ({lay.k} chunks per thread) does not fit the "
                         f"registers of {c.p.target}; use None or 0")
    if c.ov.cache_row is None or (c.ov.cache_row and not c.persistent):
        return lay
    return replace(lay, cache_row=bool(c.ov.cache_row)) if c.persistent else replace(lay, cache_row=False, prefetch_w=False)


def stage(c: Ctx, lay: Layout) -> Layout:
    if c.ov.stage == 1 and not c.persistent:
        raise ValueError(f"stage=1: {c.p.kernel} (a block per row group) has no staged layout; use None or 0")
    if c.ov.stage == 1 and not (c.tgt.stage_piece and stage_fits(c, lay) and not lay.cache_row and lay.rows == 1):
        raise ValueError(f"stage=1 needs a target with asynchronous copies ({c.tgt.chip}: "
                         f"{'yes' if c.tgt.stage_piece else 'no'}), 16-byte chunks (here {lay.vec * c.x_bytes}), "
                         f"buffers within {MAX_STAGE_BYTES} bytes, one row per block, and the row re-read")
    return replace(lay, stage=bool(c.ov.stage)) if c.ov.stage is not None and c.persistent else lay


def l2_prefetch(c: Ctx, lay: Layout) -> Layout:
    if c.ov.l2_prefetch == 1 and not c.persistent:
        raise ValueError(f"l2_prefetch=1: {c.p.kernel} (a block per row group) has no L2 prefetch of a next row; "
                         "use None or 0")
    return replace(lay, l2_prefetch=bool(c.ov.l2_prefetch)) if c.ov.l2_prefetch is not None and c.persistent else lay


def hints(c: Ctx, lay: Layout) -> Layout:
    if c.ov.hints and not G.hintable(c, lay):
        chunk_bytes = "/".join(map(str, sorted({lay.vec * ELEMENT_BYTES[t] for t in c.work.types_for(c.p)})))
        raise ValueError(f"hints={c.ov.hints}: {c.p.kernel} on {c.p.target} has no L2 eviction hints for "
                         f"{chunk_bytes}-byte chunks (they need 16 and an NVVM target); use None or 0")
    return lay if c.ov.hints is None else replace(lay, hints=c.ov.hints)


def caps(c: Ctx, lay: Layout) -> Layout:
    """The register caps forced (min_blocks, max_regs); the weight's registers must fit a cap too."""
    lay = replace(lay, min_blocks=c.ov.min_blocks or lay.min_blocks, max_regs=c.ov.max_regs or lay.max_regs)
    need = lay.k * lay.vec * (c.hb + (DTYPES[c.p.wdtype] if c.p.has_weight else 0))
    if lay.prefetch_w and lay.min_blocks > 1 and need > c.tgt.reg_budget_bytes(lay.block * lay.min_blocks):
        return replace(lay, prefetch_w=False)
    return lay


def batch_reload(c: Ctx, lay: Layout) -> Layout:
    if c.ov.batch_reload == 1 and (c.persistent or lay.cache_row):
        why = f"{c.p.kernel} has no such pass" if c.persistent else \
            f"N={c.p.n} holds them in registers (cache_row=0 reads them again)"
        raise ValueError(f"batch_reload=1 needs a kernel of a block per row reading its rows twice; {why}; "
                         "use None or 0")
    return lay if c.ov.batch_reload is None else replace(lay, batch_reload=bool(c.ov.batch_reload))


def db_smem(c: Ctx, lay: Layout) -> Layout:
    v = c.ov.db_smem
    if not v or (c.persistent and not c.p.bdtype):  # without a bias there are no db sums to move
        return lay
    moved = 2 if v == 3 and c.p.has_weight else 1  # dw's sums move too at 3
    need = moved * lay.k * lay.block * lay.vec * 4
    # The quarter slots (2, 3) may pass static shared memory into the dynamic (the stage piece's).
    most = G.slot_limit(c.tgt) if v >= 2 else G.MAX_DB_SMEM_BYTES
    if not (c.persistent and lay.dw_regs and not lay.stage) or need > most:
        raise ValueError(f"db_smem={v} needs a backward with its column sums in registers, not staged (the "
                         f"stage buffers take the shared memory), in at most {most} bytes of "
                         f"shared memory (here {'a backward' if c.persistent else 'a forward'}, sums in "
                         f"{'registers' if lay.dw_regs else 'memory'}, {'staged' if lay.stage else 'not staged'}"
                         f", {need} bytes); use None or 0, or stage=0")
    return replace(lay, db_smem=min(v, 1 + moved))  # 3 without a weight: 2


def overlap(c: Ctx, lay: Layout) -> Layout:
    v = c.ov.overlap
    if v is not None and v > lay.k:
        raise ValueError(f"overlap={v!r}: choose None (the policy's), 0 (none) or a chunk count up to K={lay.k}")
    if v and not c.persistent and (not lay.cache_row or lay.stage):  # a forward's w and b early need held rows
        raise ValueError(f"overlap={v}: a forward loads pass 2's chunks of w and b early only where "
                         f"its rows are held in registers (N={c.p.n} here: "
                         f"{'staged' if lay.stage else 'read again'}); use None or 0")
    if v and c.persistent and not overlappable(lay):
        raise ValueError(f"overlap={v} needs a persistent kernel (a backward) with rows split over a "
                         f"cluster (here {lay.cluster} block(s)), sums in registers, no staging; use None or 0")
    # A forward without w and b has nothing to load early.
    return lay if v is None or not (c.persistent or c.p.has_weight or c.p.bdtype) else replace(lay, overlap=v)


def cast_words(c: Ctx, lay: Layout) -> Layout:
    if c.ov.cast_words and lay.vec % 2:
        raise ValueError(f"cast_words=1 needs chunks of whole 32-bit words (an even vec; here {lay.vec}); "
                         "use None or 0")
    return lay if c.ov.cast_words is None else replace(lay, cast_words=bool(c.ov.cast_words))


def two_pass(c: Ctx, lay: Layout) -> Layout:
    if c.ov.two_pass == 1 and (c.persistent or c.kept != "centered" or not lay.cache_row or lay.cluster > 1
                               or lay.rows > 1):
        raise ValueError(f"two_pass=1 needs LayerNorm's forward with its rows held in registers, one row a "
                         f"block and no cluster (here {c.p.kernel}, cache_row={lay.cache_row}, rows={lay.rows}, "
                         f"cluster={lay.cluster}); use None or 0")
    return lay if c.ov.two_pass is None else replace(lay, two_pass=bool(c.ov.two_pass))


def stage_dres(c: Ctx, lay: Layout) -> Layout:
    gt = lay.vec * DTYPES[c.p.types["GT"]]
    able = c.persistent and c.late_reads and c.tgt.stage_piece and not lay.stage and gt == MAX_VECTOR_BYTES \
        and lay.dres_at + lay.k * lay.block * MAX_VECTOR_BYTES <= MAX_STAGE_BYTES
    if c.ov.stage_dres == 1 and not able:
        raise ValueError(f"stage_dres=1 needs a backward reading d_residual_out (has_dres_out) on a target with "
                         f"asynchronous copies ({c.tgt.chip}: {'yes' if c.tgt.stage_piece else 'no'}), 16-byte chunks "
                         f"(here {gt}), the rows not staged, and its {lay.k} x {lay.block} chunks within "
                         f"{MAX_STAGE_BYTES} bytes of shared memory; use None or 0")
    return lay if c.ov.stage_dres is None else replace(lay, stage_dres=bool(c.ov.stage_dres))
