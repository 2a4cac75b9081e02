"""Options -> kernel text: the placeholder values the driver computes for a kernel (types,
constants, the layout, the target's spellings, the kernel's signature and op flags), and the
template rendered with them (template.render_file: substitution, splicing, line map)."""

from __future__ import annotations

import math

from . import targets
from .kernels import COMBINE_SUM, IN_PLACE_ALIASES, KERNELS
from .layout.geometry import (
    DTYPES,
    HINT_KEEP,
    HINT_L1_FIRST,
    HINT_L1_KEEP,
    HINT_LAST_READ,
    HINT_LOADS,
    HINT_STORES,
    MAX_CLUSTER,
    MAX_VECTOR_BYTES,
    Layout,
)
from .options import KNOBS, Build, f32
from .template import Resolver, Source, render_file


def mlir_f32(x: float) -> str:
    return f"{f32(x):.9e}"


def _bool(b: bool) -> str:
    return "true" if b else "false"


def _cast(src: str, dst: str) -> str:
    if src == dst:
        return "arith.bitcast"
    return "arith.extf" if DTYPES[dst] > DTYPES[src] else "arith.truncf"


def signature_values(b: Build) -> dict[str, str]:
    """ARGS: the kernel's arguments in launch order (kernels.KernelSpec.args); ABSENT: the
    template's tensors this kernel does not pass, bound to ub.poison (flag-guarded code alone uses
    them, and it folds away)."""
    spec = KERNELS[b.problem.kernel]
    tys = b.problem.types
    sep = ",\n" + " " * 6
    aliased = IN_PLACE_ALIASES if b.problem.inplace else frozenset()
    absent = "".join(f"    %{a.name}_arg = ub.poison : {a.memref(b.problem.n, tys)}\n" if a.pointer else
                     f"    %{a.name} = arith.constant 0 : index\n" for a in spec.absent())
    return {"ENTRY": spec.entry, "ARGS": sep.join(a.decl(b.problem.n, tys, aliased) for a in spec.args),
            "ABSENT": absent.rstrip("\n")}


def _late_ext(t: str, placeholder: str, forward: bool, words: bool) -> str:
    """The late cast piece of the tensor of type placeholder (its type t): bf16 by 32-bit words
    where the layout says so (the words_fwd and words_bwd rules); else a backward's or a forward's held row
    element by element (in words RMSNorm's backward at 4096 spilled 4 bytes at its 64 registers),
    and a forward's w and b by the cast itself; f16 and f32 by the cast itself."""
    if t != "bf16" or (forward and not words and placeholder in ("WT", "BT")):
        return "common/late_ext_generic.mlir"
    return "common/late_ext_bf16_words.mlir" if words else "common/late_ext_bf16.mlir"


def type_values(b: Build) -> dict[str, str]:
    """Each type placeholder's element type (kernels.py names them), and for each the casts to
    and from f32, the late cast piece, and the chunk's alignment and element bytes."""
    tys = b.problem.types
    lay = b.layout
    out: dict[str, str] = {}
    forward = KERNELS[b.problem.kernel].grid == "rows"
    for p in ("T", "RT", "HT", "ST", "YT", "XT", "WT", "BT", "GT"):
        t = tys[p]
        out[p] = t
        out[f"EXT_{p}"] = _cast(t, "f32")
        out[f"TRUNC_{p}"] = _cast("f32", t)
        out[f"ALIGN_{p}"] = str(min(MAX_VECTOR_BYTES, lay.vec * DTYPES[t]))
        out[f"EB_{p}"] = str(DTYPES[t])
        out[f"LATE_EXT_{p}_PIECE"] = _late_ext(t, p, forward, lay.cast_words)
    # TWO_PASS's second pass casts the held row too: in the other bf16 spelling than pass 2's, so that
    # LLVM does not share them (shared, LayerNorm's forward at 2880 took 64 registers for 54).
    out["LATE_EXT_DEV_PIECE"] = _late_ext(tys["HT"], "HT", forward, not lay.cast_words and lay.vec % 2 == 0)
    out["X_TO_H"] = _cast(tys["T"], tys["HT"])
    out["H_TO_S"] = _cast(tys["HT"], tys["ST"])  # the held row as residual_out stores it
    out["WB_CONTRACT"] = "fastmath<contract>" if lay.cast_words else ""  # x_hat * w + b as one fma
    out["HALF_V"] = str(max(1, lay.vec // 2))  # late_ext_bf16_words: a chunk's 32-bit words
    return out


# A quantized forward's largest magnitude of q and its scale's floor: fp8 e4m3fn's 448 and
# 1 / (448 * 512) (a zero row's scale), int8's 127 and float32's epsilon.
QUANT_LIMITS = {"f8e4m3": (448.0, 1.0 / (448.0 * 512.0)), "i8": (127.0, 2.0 ** -23)}


def quant_values(b: Build) -> dict[str, str]:
    """A quantized forward's flags, limits, conversion piece and chunk shapes (QUANT false: none)."""
    p, v = b.problem, b.layout.vec
    qmax, floor = QUANT_LIMITS.get(p.qdtype, (1.0, 1.0))
    pairs = -(-v // 2)
    tgt = targets.get(p.target)
    return {
        "QUANT": _bool(bool(p.qdtype)), "QDYNAMIC": _bool(p.qdynamic), "QINT": _bool(p.qdtype == "i8"),
        # dynamic fp8 divides by the row's scale; the static forms and int8 multiply by its inverse
        "QDIV": _bool(p.qdynamic and p.qdtype == "f8e4m3"),
        "HAS_SMOOTH": _bool(p.has_smooth), "HAS_SCALE_UB": _bool(p.has_scale_ub), "STORE_Y": _bool(p.store_y),
        "QMAX": mlir_f32(qmax), "QFLOOR": mlir_f32(floor),
        "QUANT_PIECE": (tgt.quant_piece if p.qdtype else None) or "common/quant_none.mlir",
        "ALIGN_QT": str(v), "ALIGN_SMOOTH": str(min(MAX_VECTOR_BYTES, 4 * v)),
        # fp8 converts pairs: a chunk of one element beside a zero (shuffle lane V is the pad's first)
        "QPAIRS": str(pairs), "QP2": str(2 * pairs), "QPAD": ", ".join(map(str, range(2 * pairs))),
        "QLANES": ", ".join(map(str, range(v))),
    }


def flag_values(b: Build) -> dict[str, str]:
    """The fused ops' flags (each an i1 constant in the skeletons) and the weight offset."""
    return {
        "HAS_RESIDUAL": _bool(bool(b.problem.rdtype) and KERNELS[b.problem.kernel].grid == "rows"),
        "STORE_RESIDUAL": _bool(b.problem.store_residual),
        "IN_PLACE": _bool(b.problem.inplace),
        "ROUND_XHAT": _bool(b.problem.round_xhat),
        "PDL": _bool(b.problem.pdl),
        # loads through the non-coherent path, but where the kernel writes what it reads
        "LD_NC": "" if b.problem.inplace else ".nc",
        "HAS_BIAS": _bool(bool(b.problem.bdtype)),
        "HAS_OFFSET": _bool(b.problem.weight_offset != 0.0),
        "WEIGHT_OFFSET": mlir_f32(b.problem.weight_offset),
        "HAS_DRES_OUT": _bool(b.problem.has_dres_out),
        "STORE_DRES": _bool(bool(b.problem.rdtype) and KERNELS[b.problem.kernel].grid != "rows"),
    }


def stats_values(b: Build) -> dict[str, str]:
    """The op's math (kernels.Stats): its piece, each direction's merge and accumulator, its mean."""
    stats = KERNELS[b.problem.kernel].stats
    if stats is None:
        return {}
    v = b.layout.vec

    def lanes(acc: str) -> int:
        return int(acc[:-1] or 1) * v if acc.endswith("V") else int(acc)

    lay = b.layout
    # The backward adds its sums; so does a forward's two-pass variance (the two_pass rule).
    combine = stats.fwd_combine if KERNELS[b.problem.kernel].grid == "rows" and not lay.two_pass else COMBINE_SUM
    return {"STATS_PIECE": stats.piece, "HAS_MEAN": _bool(stats.has_mean), "COMBINE_PIECE": combine,
            # The butterfly's first shuffled value: Chan's merge of equal counts reads no partner count.
            # A two-pass variance's sums sit in the last value alone (stats_layer.mlir).
            "PAIR_FIRST": "2" if lay.two_pass else "1" if combine != COMBINE_SUM and lay.equal_counts else "0",
            "FWD_ACC": f"vector<{lanes(stats.fwd_acc)}xf32>", "BWD_ACC": f"vector<{lanes(stats.bwd_acc)}xf32>",
            # vector.shuffle lane lists: a 2V accumulator's halves, and the two joined.
            "LANES_LO": ", ".join(map(str, range(v))), "LANES_HI": ", ".join(map(str, range(v, 2 * v))),
            "LANES_2V": ", ".join(map(str, range(2 * v)))}


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def common_values(b: Build) -> dict[str, str]:
    """Placeholders every kernel may use: types, constants, layout, target spellings."""
    tgt = targets.get(b.problem.target)
    lay = b.layout
    eb, wb = DTYPES[b.problem.dtype], DTYPES[b.problem.wdtype]
    work = KERNELS[b.problem.kernel].work
    nr = work.sums if work is not None else 1
    return {
        "NR": str(nr),  # fp32 sums per row through the reductions and the cluster exchange
        # The exchange's slots: 2 buffers x blocks x sums, for the portable cluster or a forced larger one.
        "XCH_SLOTS": str(2 * max(MAX_CLUSTER, lay.cluster) * nr),
        "TARGET": tgt.target_attr,
        "RSQRT_PIECE": tgt.rsqrt_piece,
        # The cross-block piece only where rows are split: a no-op sum otherwise.
        "CLUSTER_PIECE": tgt.cluster_piece if lay.cluster > 1 else "common/cluster_sum_none.mlir",
        "CLUSTER": str(lay.cluster),
        # The prefetch: of the next row (L2_PREFETCH), and of d_residual_out ahead of pass 2.
        "PREFETCH_PIECE": (tgt.prefetch_piece if lay.l2_prefetch or b.problem.has_dres_out else None)
        or "common/prefetch_none.mlir",
        "L2_PREFETCH": _bool(lay.l2_prefetch),
        "STAGE": _bool(lay.stage),
        # The launch's dynamic shared memory: the STAGE buffers, or the column sums' slots past static;
        # then STAGE_DRES's chunks of d_residual_out (from byte DRES_AT), copied by the same piece.
        "STAGE_PIECE": tgt.stage_piece if lay.stage or lay.dyn_slots or lay.stage_dres else "common/stage_none.mlir",
        "STAGE_DRES": _bool(lay.stage_dres),
        "DRES_AT": str(lay.dres_at),
        "STAGE_BLOCK_BYTES": str(lay.block * MAX_VECTOR_BYTES),
        "POLICY_PIECE": tgt.policy_piece if lay.hints else "common/cache_policy_none.mlir",
        "GRID_DEP_PIECE": tgt.grid_dep_piece or "common/grid_dep_none.mlir",
        "HINT_IO_PIECE": tgt.hint_io_piece if lay.hints else "common/hint_io_none.mlir",
        "HINT_LD": _bool(bool(lay.hints & HINT_LOADS)),
        "HINT_ST": _bool(bool(lay.hints & HINT_STORES)),
        "POLICY_LAST_READ": "evict_first" if lay.hints & HINT_LAST_READ else "evict_normal",
        "POLICY_KEEP": "evict_last" if lay.hints & HINT_KEEP else "evict_normal",
        "LD_L1": ".L1::evict_last" if lay.hints & HINT_L1_KEEP else "",
        "LD_L1_LAST": ".L1::evict_first" if lay.hints & HINT_L1_FIRST else
        ".L1::evict_last" if lay.hints & HINT_L1_KEEP else "",
        "BATCH_RELOAD": _bool(lay.batch_reload),
        "TWO_PASS": _bool(lay.two_pass),
        "KERNEL_ATTRS": (tgt.min_blocks_attr.format(lay.min_blocks) if lay.min_blocks else "")
        + (tgt.max_regs_attr.format(lay.max_regs) if lay.max_regs else ""),
        "EB": str(eb),
        "NSUB": str(lay.nsub),
        "ATOMIC_SCOPE": tgt.atomic_scope,
        "ATOMIC_ATTRS": tgt.atomic_attrs,
        "WARP": str(tgt.warp),
        "N": str(b.problem.n),
        "T": b.problem.dtype,
        "WT": b.problem.wdtype,
        "EPS": mlir_f32(b.problem.eps),
        "INV_N": mlir_f32(1.0 / b.problem.n),
        "INV_V": mlir_f32(1.0 / lay.vec),
        "V": str(lay.vec),
        "ALIGN": str(lay.vec * eb),
        "W_ALIGN": str(min(MAX_VECTOR_BYTES, lay.vec * wb)),
        "PART_ALIGN": str(min(MAX_VECTOR_BYTES, lay.vec * 4)),
        "DW_REGS": _bool(lay.dw_regs),
        **_slot_values(lay),  # the column sums' slots: registers or shared memory (_slot_values)
        "OVERLAP": _bool(lay.overlap > 0),
        "OVERLAP_K": str(lay.overlap),
        # d_residual_out's OVERLAP chunks loaded with them, before the exchange's wait, where the column
        # sums sit in shared memory (registers free for them): the fused add's LayerNorm backward at
        # 40960-65536 +2.7-3.4%; RMSNorm's, its sums in registers at 128 a thread, lost 1-2% (*tune-v131*).
        "OVERLAP_DRES": _bool(lay.overlap > 0 and lay.db_smem > 0 and b.problem.has_dres_out and not lay.stage_dres),
        "BLOCK": str(lay.block),
        "ROWS": str(lay.rows),
        "TPR": str(lay.tpr),
        "WPR": str(lay.wpr),
        "MULTI_WARP": _bool(lay.tpr > lay.warp),
        # row_sum's trailing barrier guards %red for the block's next row: a grid of one row group
        # per block has none (*tune-v64*: +1% at 7168, +0.2-0.6% at 2048-8192 for the forward).
        "RED_REUSED": _bool(KERNELS[b.problem.kernel].grid != "rows"),
        "SHUFFLE_STEPS": str(int(math.log2(min(lay.tpr, lay.warp)))),
        # The warp totals' butterfly: log2 of the power of two covering them (1 warp: no step).
        "WPR_P2": str(_pow2_at_least(lay.wpr)),
        "WARP_STEPS": str(int(math.log2(_pow2_at_least(lay.wpr)))),
        # LayerNorm's butterfly merge needs no division where counts are equal.
        "EQUAL_COUNTS": _bool(lay.equal_counts),
        "PAIR_FIRST": "0",  # every value shuffled (stats_values: LayerNorm's forward may skip its count)
        "K": str(lay.k),
        "KFULL": str(lay.kfull),
        "NCHUNK": str(lay.nchunk),
        "CACHE_ROW": _bool(lay.cache_row),
        "PREFETCH_W": _bool(lay.prefetch_w and b.problem.has_weight),
        "HAS_WEIGHT": _bool(b.problem.has_weight),
        "STORE_RSTD": _bool(b.problem.store_rstd),
        "ATOMIC_DW": _bool(b.problem.atomic_dw),
        **type_values(b),
        "COL_THREADS": str(lay.tpr),  # the column sums' layout: column threads, row threads
        "ROW_THREADS": str(lay.rows),
    }


# Placeholders that follow from the row layout: `normir compile --set` refuses them, since a layout
# is checked as a whole (a forced tpr leaving threads without a chunk hung the H200); the value is
# the flag that forces it through that check ("" where only the layout as a whole moves it).
LAYOUT_VALUES = {
    **{"V": "--vec", "ALIGN": "--vec", "W_ALIGN": "--vec", "PART_ALIGN": "--vec"},
    **{name: "" for name in ("ROWS", "BLOCK", "K", "KFULL", "NCHUNK", "NSUB", "WPR", "MULTI_WARP", "SHUFFLE_STEPS",
                             "WARP_STEPS", "WPR_P2", "EQUAL_COUNTS", "PAIR_FIRST", "DW_REGS", "PREFETCH_W",
                             "RED_REUSED", "COL_THREADS", "ROW_THREADS", "ARGS", "ABSENT")},
    # each knob's (options.KNOBS): the first knob to name a placeholder forces it
    **{name: f"--{knob.name.replace('_', '-')}" for knob in reversed(KNOBS) for name in knob.placeholders},
}
# The placeholders each user-given option of `normir compile` fills: an option the text does not use
# (--eps on a text without ${EPS}) is an error rather than silently ignored.
USER_VALUES = {"eps": ("EPS",), "wdtype": ("WT",), "store_rstd": ("STORE_RSTD",),
               "atomic_dw": ("ATOMIC_DW",), "no_weight": ("HAS_WEIGHT",)}


def _slot_values(lay: Layout) -> dict[str, str]:
    """The column sums' slots, db's (DB_*) and dw's (DW_*), per the layout's db_smem: K x V fp32
    registers a thread (0), K x V shared-memory slots a thread at [k][tid] (db's at 1), or in
    16-byte quarters at [k][quarter][tid] (db's at 2, dw's too at 3; common/slots_split.mlir)."""
    q = min(lay.vec, MAX_VECTOR_BYTES // 4)  # fp32 a quarter
    quarters = f"memref<{lay.k}x{lay.vec // q}x{lay.block}x{q}xf32, #gpu.address_space<workgroup>>"
    quarter = f"vector<{q}xf32>"
    dyn = lay.dyn_slots  # the quarters at a byte address in dynamic shared memory (common/slots_dyn.mlir)
    out = {"SLOT_Q": str(q), "SLOT_H": str(lay.vec // q), "SLOT_BUF": "index" if dyn else quarters,
           "SLOT_LOAD": f"func.call @normir_slot_load(%buf, %k, %h, %tid) : (index, index, index, index) -> {quarter}"
           if dyn else f"vector.load %buf[%k, %h, %tid, %c0] : {quarters}, {quarter}",
           "SLOT_STORE": f"func.call @normir_slot_store(%q, %buf, %k, %h, %tid) : ({quarter}, index, index, index, "
           "index) -> ()" if dyn else f"vector.store %q, %buf[%k, %h, %tid, %c0] : {quarters}, {quarter}",
           "SLOTS_DYN_PIECE": "common/slots_dyn.mlir" if dyn else "common/slots_none.mlir",
           # dw's slots from the base, db's after them (db's alone at 2)
           "SLOT_BASES": "" if not dyn else "\n    ".join(
               ["%dwbuf = arith.addi %stage_base, %c0 : index"] * (lay.db_smem == 3)
               + [f"%db_slots_at = arith.constant {lay.slot_bytes // 2 if lay.db_smem == 3 else 0} : index",
                  "%dbbuf = arith.addi %stage_base, %db_slots_at : index"])}
    vec = f"vector<{lay.vec}xf32>"
    for tag, kind in (("DB", lay.db_smem), ("DW", 2 if lay.db_smem == 3 else 0)):
        buf = f"%{tag.lower()}buf"
        shape = {0: f"{lay.k}x{lay.vec}", 1: f"{lay.k}x{lay.block}x{lay.vec}"}.get(
            kind, f"{lay.k}x{lay.vec // q}x{lay.block}x{q}")
        memref = "index" if kind >= 2 and dyn else \
            f"memref<{shape}xf32, #gpu.address_space<{'workgroup' if kind else 'private'}>>"
        if kind < 2:
            at = "%k, %tid, %c0" if kind else "%k, %c0"
            access = {"GET": f"vector.load {buf}[{at}] : {memref}, {vec}", "PUT": "vector.store",
                      "PUT_TO": f"{buf}[{at}] : {memref}, {vec}"}
        else:
            fn = f"@normir_{tag.lower()}"
            access = {"GET": f"func.call {fn}_get({buf}, %k, %tid) : ({memref}, index, index) -> {vec}",
                      "PUT": f"func.call {fn}_put(", "PUT_TO": f"{buf}, %k, %tid) : ({vec}, {memref}, index, index) -> ()"}
        # 16-byte accesses: the workgroup buffer's alignment must say so (its element's is 4).
        decl = f",\n              {buf}: {memref}" + (" {llvm.align = 16 : i64}" if kind else "")
        out |= {f"{tag}_{k}": v for k, v in access.items()}
        out[f"{tag}_SLOTS_PIECE"] = "common/slots_split.mlir" if kind >= 2 else "common/slots_none.mlir"
        out |= {f"{tag}_IN_WORKGROUP": decl if kind and not dyn else "", f"{tag}_IN_PRIVATE": "" if kind else decl}
    return out


def values_for(b: Build) -> dict[str, str]:
    """Every placeholder value the driver computes for a kernel's options."""
    return {**common_values(b), **flag_values(b), **quant_values(b), **signature_values(b), **stats_values(b)}


def specialize_source(b: Build, resolver: Resolver | None = None) -> Source:
    """The kernel text with every placeholder filled and every common piece spliced, with its
    line map (template.Source)."""
    return render_file(KERNELS[b.problem.kernel].template.path, values_for(b), resolver=resolver)


def specialize(b: Build) -> str:
    """The kernel text with every placeholder filled and every common piece spliced."""
    return specialize_source(b).text
