"""The kernel catalogue, as data: each kernel's template, its op's math (Stats: the statistics
piece, the row summaries and their merge, the accumulators, a mean), the optional features it
takes, its launch arguments by name (the one place their order is written: the template's
signature is made from it, and the launcher packs values by these names), its grid, and the
memory traffic the layout policy reads.

Adding a kernel of the family: an entry here (a template, a Stats with its math piece), and the
op that launches it in normir.ops; the layout policy needs no change.
"""

from __future__ import annotations

from dataclasses import dataclass

# Argument attributes: inputs are read-only (ld.global.nc on NVIDIA), outputs write-only.
_ATTRS = {"in": " {llvm.noalias, llvm.readonly}", "out": " {llvm.noalias, llvm.writeonly}", "inout": " {llvm.noalias}"}


@dataclass(frozen=True)
class Arg:
    """A launch argument. Tensors are bare pointers in the kernel: `row` ones typed memref<N x T>
    (a row of the tensor; the kernel views all rows through its stride), `stat` ones memref<1xf32>
    (one fp32 per row: rstd, mean). Scalars are 64-bit integers (index)."""

    name: str
    kind: str  # "in", "out", "inout" (tensors) or "index"
    type: str = ""  # a type placeholder (T, WT) or f32
    shape: str = "row"  # "row" or "stat"

    @property
    def pointer(self) -> bool:
        return self.kind != "index"

    def decl(self, n: int, types: dict[str, str], aliased: frozenset[str] = frozenset()) -> str:
        """The gpu.func argument: %<name>_arg for tensors, %<name> for scalars. types: the
        element type of each type placeholder; aliased: the tensors that may share memory with
        another argument (the in-place forms), which carry no attributes."""
        if not self.pointer:
            return f"%{self.name}: index"
        return f"%{self.name}_arg: {self.memref(n, types)}{'' if self.name in aliased else _ATTRS[self.kind]}"

    def memref(self, n: int, types: dict[str, str]) -> str:
        return "memref<1xf32>" if self.shape == "stat" else f"memref<{n}x{types.get(self.type, self.type)}>"


def index(*names: str) -> tuple[Arg, ...]:
    return tuple(Arg(n, "index") for n in names)


@dataclass(frozen=True)
class RowReduce:
    """A reduction over the normalized row after the normalize (a quantized output's amax): over
    the whole row (group 0) or over each group of `group` columns; `when` names the Problem field
    that asks for it ("" always: the dynamic scales' amax, where a static scale needs none)."""

    op: str  # "amax"
    group: int = 0
    when: str = ""


@dataclass(frozen=True)
class RowWork:
    """What a row kernel moves and keeps per element of a row: the layout policy's input.
    Tensors are named by their element-type placeholder (T: x's type; WT: the weight's)."""

    reads: tuple[str, ...]  # row tensors pass 1 reads, read again in pass 2 unless held
    writes: tuple[str, ...]  # row tensors the kernel writes
    col_sums: int = 0  # fp32 per-column sums a block keeps across the rows it takes (dw)
    bias_sums: bool = False  # and one more (db) when the op has a bias
    sums: int = 1  # fp32 sums per row through the block reduction and the cluster exchange
    held: tuple[str, ...] | None = None  # the rows held in registers between the passes (None: reads)
    # Reads that happen only with an option: (placeholder, Problem field) (the residual: rdtype).
    read_if: tuple[tuple[str, str], ...] = ()
    # Row tensors pass 2 alone reads, each with the Problem field that asks for it (d_residual_out:
    # GT, has_dres_out): read once, not held, not staged with the rows.
    late_if: tuple[tuple[str, str], ...] = ()
    # Reductions after the normalize (a quantized forward's amax of y); every layout rule of today
    # was measured without one, and a kernel with one takes none of them (the geometry's layout).
    after_norm: tuple[RowReduce, ...] = ()

    @property
    def held_rows(self) -> tuple[str, ...]:
        return self.reads if self.held is None else self.held

    def reads_for(self, problem) -> tuple[str, ...]:
        """The row tensors pass 1 reads for a problem: reads, less those of an option not taken."""
        return tuple(t for t in self.reads if all(getattr(problem, f) for x, f in self.read_if if x == t))

    def late_for(self, problem) -> tuple[str, ...]:
        """The row tensors pass 2 alone reads for a problem (d_residual_out where has_dres_out asks)."""
        return tuple(t for t, f in self.late_if if getattr(problem, f))

    def after_for(self, problem) -> tuple[RowReduce, ...]:
        """The reductions after the normalize a problem asks for."""
        return tuple(r for r in self.after_norm if not r.when or getattr(problem, r.when))

    def types_for(self, problem) -> set[str]:
        """The element types of every row tensor the kernel reads or writes for a problem."""
        t = problem.types
        return {t[x] for x in (*self.reads_for(problem), *self.writes, *self.held_rows, *self.late_for(problem))}


@dataclass(frozen=True)
class Stats:
    """An op's math: the statistics it keeps ("rms": the root mean square; "centered": the mean
    and the variance about it, which the forward stores beside rstd and the backward reads), its
    piece (statistics, normalize, gradient), the row summaries its forward and backward reduce
    (fp32 values per row, NR), the forward's merge piece (the backward's sums are added) and the
    per-thread accumulators pass 1 keeps (fp32 lanes: a count, or "V" / "2V", one or two per
    element of a chunk)."""

    kept: str
    piece: str
    fwd_sums: int
    bwd_sums: int
    fwd_combine: str
    fwd_acc: str
    bwd_acc: str

    @property
    def has_mean(self) -> bool:
        return self.kept == "centered"


COMBINE_SUM = "common/combine_sum.mlir"
RMS = Stats("rms", "common/stats_rms.mlir", 1, 1, COMBINE_SUM, "V", "V")
# LayerNorm: the forward's per-thread (mean, M2) and merged (n, mean, M2) rows by Chan's update;
# the backward's two sums added.
LAYER = Stats("centered", "common/stats_layer.mlir", 3, 2, "common/combine_chan.mlir", "2", "2V")


@dataclass(frozen=True)
class Template:
    """A kernel template and every argument its body may use; a kernel passes a subset, and the
    others are bound inside: tensors to ub.poison, scalars to 0 (only flag-guarded code, which
    folds away, uses them)."""

    path: str  # below mlir/
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class KernelSpec:
    name: str
    template: Template
    entry: str
    args: tuple[Arg, ...]  # launch order: the template's signature and the launcher's packing
    grid: str  # "rows": a block (cluster) per row group; "persistent": at most as many as run at once; "cols"
    work: RowWork | None  # None: not a row kernel (the column sums), with a fixed layout
    stats: Stats | None = None  # the op's math (row kernels)
    # The optional features the kernel takes (Problem fields that may differ from their defaults):
    # residual, store_residual, bias, weight_offset, odtype (y's / dy's own type), xdtype (dx's),
    # dres (a dresidual of its own type), dres_out (reads d_residual_out, in a type of its own: gdtype);
    # inplace (a forward whose y may be x and residual_out the residual: IN_PLACE_ALIASES); pdl (a
    # forward launched to start as the kernel ahead of it ends, waiting for it in-kernel).
    features: frozenset[str] = frozenset()
    # Fields every problem of the kernel sets, with a typical value (tools and tests build one
    # from it): a quantized forward's q type.
    requires: tuple[tuple[str, object], ...] = ()
    # Reads what the kernel ahead of it on the stream wrote, after its grid_dep wait: launched to
    # start before that kernel ends where the target has programmatic launch (the column sums; a
    # forward where its problem asks, Problem.pdl).
    programmatic: bool = False

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    def absent(self) -> tuple[Arg, ...]:
        """The template's arguments this kernel does not pass."""
        names = set(self.arg_names)
        return tuple(t for t in self.template.args if t.name not in names)


# Type placeholders: T (x: the normalized row's input), RT (the residual), ST (residual_out), HT
# (the row held and normalized: ST with a residual, f32 with sum_f32, else T), YT (y), WT (the weight), BT (the bias);
# QT a quantized forward's q, as the bytes it stores (i8: fp8 e4m3fn or int8); in the backward T is
# the normalized row's (x, or residual_out), YT dy's, XT dx's, RT dresidual's, GT d_residual_out's.
X, W, B = Arg("x", "in", "T"), Arg("w", "in", "WT"), Arg("b", "in", "BT")
RSTD_OUT, RSTD_IN = Arg("rstd", "out", "f32", "stat"), Arg("rstd", "in", "f32", "stat")
MEAN_OUT, MEAN_IN = Arg("mean", "out", "f32", "stat"), Arg("mean", "in", "f32", "stat")

NORM_FWD = Template("norm_fwd.mlir", (
    X, Arg("residual", "in", "RT"), W, B, Arg("y", "out", "YT"), Arg("residual_out", "out", "ST"), RSTD_OUT, MEAN_OUT,
    # The quantized forwards': q (QT: its bytes), the static scale or the per-row scales, the
    # amax's cap, SmoothQuant's per-column factors.
    Arg("q", "out", "QT"), Arg("scale", "in", "f32", "stat"), Arg("scales", "out", "f32", "stat"),
    Arg("scale_ub", "in", "f32", "stat"), Arg("smooth", "in", "f32"),
    *index("rows", "x_stride", "residual_stride", "y_stride", "residual_out_stride", "q_stride", "grid")))
QUANT_ARGS = ("q", "scale", "scales", "scale_ub", "smooth", "q_stride")
NORM_BWD = Template("norm_bwd.mlir", (
    X, W, Arg("dy", "in", "YT"), RSTD_IN, MEAN_IN, Arg("dres_out", "in", "GT"), Arg("dx", "out", "XT"),
    Arg("dres", "out", "RT"), Arg("dw_part", "inout", "f32"), Arg("db_part", "inout", "f32"),
    *index("rows", "x_stride", "dy_stride", "dres_out_stride", "dx_stride", "dres_stride", "grid")))
COL_SUM = Template("col_sum.mlir", (Arg("part", "in", "f32"), Arg("out", "out", "WT"), Arg("db", "out", "BT"),
                                     *index("parts")))


def args(t: Template, *names: str) -> tuple[Arg, ...]:
    """A kernel's arguments: the named ones of its template, in the template's order."""
    unknown = set(names) - {a.name for a in t.args}
    assert not unknown, unknown
    return tuple(a for a in t.args if a.name in names)


FUSED_FWD = frozenset({"residual", "store_residual", "bias", "weight_offset", "odtype", "inplace", "pdl"})
# The in-place forms' aliasing: y may be x, residual_out the residual (the forward's tensors).
IN_PLACE_ALIASES = frozenset({"x", "y", "residual", "residual_out"})
FUSED_BWD = frozenset({"bias", "weight_offset", "odtype", "xdtype", "dres", "dres_out"})
# A quantized forward's: q (fp8 or int8), dynamic per-row scales, SmoothQuant, the amax's cap, no y.
QUANT_FWD = frozenset({"quant", "qdynamic", "smooth", "scale_ub", "no_y"})
# vLLM's dynamic per-token rule (its rms_norm_dynamic_per_token_quant): the norm of the fp32 sum,
# x_hat rounded to x's type before the weight.
VLLM_DYNAMIC = frozenset({"sum_f32", "round_xhat"})


def but(t: Template, *names: str) -> tuple[Arg, ...]:
    """A kernel's arguments: its template's, less the named ones."""
    return tuple(a for a in t.args if a.name not in names)


# The forward's traffic: x, and the residual where there is one, read; y and residual_out (ST)
# written; h (HT) held between the passes.
FWD_WORK = dict(reads=("T", "RT"), held=("HT",), writes=("YT", "ST"), read_if=(("RT", "rdtype"),))
# A quantized forward's: q written too, and with dynamic scales the row's amax of y after the normalize.
QUANT_WORK = dict(FWD_WORK, writes=("QT", "YT", "ST"), after_norm=(RowReduce("amax", when="qdynamic"),))
DRES_OUT = (("GT", "has_dres_out"),)  # the fused backwards' d_residual_out, read in pass 2

KERNELS: dict[str, KernelSpec] = {
    k.name: k
    for k in (
        KernelSpec(
            name="rmsnorm_fwd", template=NORM_FWD, entry="rmsnorm_fwd",
            args=args(NORM_FWD, "x", "w", "y", "rstd", "rows", "x_stride", "y_stride", "grid"),
            grid="rows", work=RowWork(reads=("T",), writes=("T",)), stats=RMS,
            # y written over x (the serving form rms_norm(out=x, x, ...)); programmatic dependent launch
            features=frozenset({"inplace", "pdl"}),
        ),
        KernelSpec(
            # h = x + residual (fp32, rounded to residual_out's type HT), y = rmsnorm(h) * (w +
            # weight_offset) + b, residual_out = h: every feature a flag of the forward skeleton.
            name="fused_add_rmsnorm_fwd", template=NORM_FWD, entry="fused_add_rmsnorm_fwd",
            args=but(NORM_FWD, "mean", *QUANT_ARGS), grid="rows", stats=RMS, features=FUSED_FWD,
            work=RowWork(**FWD_WORK),
        ),
        KernelSpec(
            # The fused add RMSNorm's forward with y quantized (fp8 e4m3fn or int8): q = y / s with
            # a static scale or the row's s = max(amax(y) / QMAX, floor); y itself only on request.
            name="rmsnorm_quant_fwd", template=NORM_FWD, entry="rmsnorm_quant_fwd", args=but(NORM_FWD, "mean"),
            grid="rows", stats=RMS, features=FUSED_FWD | QUANT_FWD | VLLM_DYNAMIC, work=RowWork(**QUANT_WORK),
            requires=(("qdtype", "f8e4m3"),),
        ),
        KernelSpec(
            name="rmsnorm_bwd", template=NORM_BWD, entry="rmsnorm_bwd",
            args=args(NORM_BWD, "x", "w", "dy", "rstd", "dx", "dw_part", "rows", "x_stride", "dy_stride",
                      "dx_stride", "grid"),
            grid="persistent", work=RowWork(reads=("T", "YT"), writes=("XT",), col_sums=1), stats=RMS,
            features=frozenset({"odtype"}),  # dy in its own type
        ),
        KernelSpec(
            # dh = (dy * w' - h_hat * c1) * rstd (+ d_residual_out), written as dx and, in a type of
            # its own, dresidual; dw (and db) as column sums. x here is the row normalized (h).
            name="fused_add_rmsnorm_bwd", template=NORM_BWD, entry="fused_add_rmsnorm_bwd",
            args=but(NORM_BWD, "mean"), grid="persistent", stats=RMS, features=FUSED_BWD,
            work=RowWork(reads=("T", "YT"), writes=("XT", "RT"), col_sums=1, bias_sums=True, late_if=DRES_OUT),
        ),
        KernelSpec(
            # LayerNorm, with or without the residual add: y = (h - mean) * rstd * w + b, mean and
            # rstd stored (STORE_RSTD) for the backward. One kernel for both: without a residual
            # the add's flags are off and the policy sees one row read.
            name="layernorm_fwd", template=NORM_FWD, entry="layernorm_fwd", args=but(NORM_FWD, *QUANT_ARGS),
            grid="rows", stats=LAYER, features=FUSED_FWD - {"weight_offset"},
            work=RowWork(**FWD_WORK, sums=LAYER.fwd_sums),
        ),
        KernelSpec(
            # LayerNorm's forward (with or without the residual add) with y quantized, as RMSNorm's.
            name="layernorm_quant_fwd", template=NORM_FWD, entry="layernorm_quant_fwd", args=NORM_FWD.args,
            grid="rows", stats=LAYER, features=(FUSED_FWD - {"weight_offset"}) | QUANT_FWD,
            work=RowWork(**QUANT_WORK, sums=LAYER.fwd_sums), requires=(("qdtype", "f8e4m3"),),
        ),
        KernelSpec(
            # dx = (wdy - c1 - x_hat * c2) * rstd (+ d_residual_out), dw = sum dy * x_hat, db = sum dy.
            name="layernorm_bwd", template=NORM_BWD, entry="layernorm_bwd", args=NORM_BWD.args,
            grid="persistent", stats=LAYER, features=FUSED_BWD - {"weight_offset"},
            work=RowWork(reads=("T", "YT"), writes=("XT", "RT"), col_sums=1, bias_sums=True, sums=LAYER.bwd_sums,
                         late_if=DRES_OUT),
        ),
        KernelSpec(
            # Fixed-order column sums of fp32 partial rows, cast to the output's type. Its dtype is
            # the partials' (f32), wdtype the output's; with a bias (bdtype: db's type) it sums dw's
            # and db's partial rows in one launch.
            name="rmsnorm_dw_reduce", template=COL_SUM, entry="rmsnorm_dw_reduce",
            args=COL_SUM.args, grid="cols", work=None, features=frozenset({"bias"}), programmatic=True,
        ),
    )
}
