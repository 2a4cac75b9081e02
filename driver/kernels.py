"""The kernel catalogue, as data: each kernel's template, its op flags, its launch arguments by
name (the one place their order is written: the template's signature is made from it, and the
launcher packs values by these names), its grid, and the memory traffic the layout policy reads.

Adding a kernel of the family: an entry here (a template with its flags and a math piece), and
the op that launches it in normir.ops; the layout policy needs no change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

    def decl(self, n: int, types: dict[str, str]) -> str:
        """The gpu.func argument: %<name>_arg for tensors, %<name> for scalars. types: the
        element type of each type placeholder."""
        if not self.pointer:
            return f"%{self.name}: index"
        return f"%{self.name}_arg: {self.memref(n, types)}{_ATTRS[self.kind]}"

    def memref(self, n: int, types: dict[str, str]) -> str:
        return "memref<1xf32>" if self.shape == "stat" else f"memref<{n}x{types.get(self.type, self.type)}>"


def index(*names: str) -> tuple[Arg, ...]:
    return tuple(Arg(n, "index") for n in names)


@dataclass(frozen=True)
class RowWork:
    """What a row kernel moves and keeps per element of a row: the layout policy's input.
    Tensors are named by their element-type placeholder (T: x's type; WT: the weight's)."""

    reads: tuple[str, ...]  # row tensors pass 1 reads, held between the passes or read again in pass 2
    writes: tuple[str, ...]  # row tensors pass 2 writes
    weights: tuple[str, ...]  # per-column tensors pass 2 reads (the weight), when the op has them
    col_sums: int = 0  # fp32 per-column sums a block keeps across the rows it takes (dw: 1), with a weight
    sums: int = 1  # fp32 sums per row through the block reduction and the cluster exchange


@dataclass(frozen=True)
class Template:
    """A kernel template and every tensor its body may use; a kernel passes a subset, and the
    others are bound to ub.poison inside (only flag-guarded code, which folds away, uses them)."""

    path: str  # below mlir/
    tensors: tuple[Arg, ...]


@dataclass(frozen=True)
class KernelSpec:
    name: str
    template: Template
    entry: str
    args: tuple[Arg, ...]  # launch order: the template's signature and the launcher's packing
    grid: str  # "rows": a block (cluster) per row group; "persistent": at most as many as run at once; "cols"
    work: RowWork | None  # None: not a row kernel (the column sums), with a fixed layout
    flags: dict[str, str] = field(default_factory=dict)  # placeholder values fixed by the op

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    def absent(self) -> tuple[Arg, ...]:
        """The template's tensors this kernel does not pass."""
        names = set(self.arg_names)
        return tuple(t for t in self.template.tensors if t.name not in names)


X, W, DY = Arg("x", "in", "T"), Arg("w", "in", "WT"), Arg("dy", "in", "T")

NORM_FWD = Template("norm_fwd.mlir", (X, W, Arg("y", "out", "T"), Arg("rstd", "out", "f32", "stat")))
NORM_BWD = Template("norm_bwd.mlir", (X, W, DY, Arg("rstd", "in", "f32", "stat"), Arg("dx", "out", "T"),
                                      Arg("dw_part", "inout", "f32")))
COL_SUM = Template("col_sum.mlir", (Arg("part", "in", "f32"), Arg("out", "out", "WT")))

RMS = {"STATS_PIECE": "common/stats_rms.mlir"}

KERNELS: dict[str, KernelSpec] = {
    k.name: k
    for k in (
        KernelSpec(
            name="rmsnorm_fwd", template=NORM_FWD, entry="rmsnorm_fwd",
            args=NORM_FWD.tensors + index("rows", "x_stride", "y_stride", "grid"),
            grid="rows", work=RowWork(reads=("T",), writes=("T",), weights=("WT",)), flags=RMS,
        ),
        KernelSpec(
            name="rmsnorm_bwd", template=NORM_BWD, entry="rmsnorm_bwd",
            args=NORM_BWD.tensors + index("rows", "x_stride", "dy_stride", "dx_stride", "grid"),
            grid="persistent", work=RowWork(reads=("T", "T"), writes=("T",), weights=("WT",), col_sums=1),
            flags=RMS,
        ),
        KernelSpec(
            # Fixed-order column sums of fp32 partial rows (dw), cast to the weight's type. Its
            # dtype is the partials' (f32), wdtype the weight's.
            name="rmsnorm_dw_reduce", template=COL_SUM, entry="rmsnorm_dw_reduce",
            args=COL_SUM.tensors + index("parts"), grid="cols", work=None,
        ),
    )
}
