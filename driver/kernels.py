"""The kernel registry: one entry per kernel. Adding a kernel = a .mlir file + one entry here.

An entry names the template, the entry point, the launch argument order (pointers first, then
64-bit integers, as the bare-pointer calling convention lays them out), how rows map to blocks,
and the kernel's own placeholders beyond the common ones (specialize.common_values).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .specialize import Layout, Options
    from .targets import Target


@dataclass(frozen=True)
class KernelSpec:
    name: str
    template: str  # path below mlir/
    entry: str
    args: tuple[str, ...]  # "p" pointer, "q" int64, in launch order
    grid: str  # "rows": ceil(M / rows) blocks; "persistent": at most a few blocks per SM; "cols"
    layout: Callable[[Options, Target], Layout]
    extra_values: Callable[[Options], dict[str, str]] = lambda opts: {}


def _fwd_layout(opts: Options, tgt: Target) -> Layout:
    from .specialize import fwd_layout

    return fwd_layout(opts, tgt)


def _bwd_layout(opts: Options, tgt: Target) -> Layout:
    from .specialize import bwd_layout, held

    return bwd_layout(opts.n, opts.vec, held(opts.dtype), tgt, opts.tpr, opts.cluster, opts.has_weight)


def _reduce_layout(opts: Options, tgt: Target) -> Layout:
    from .specialize import reduce_layout

    return reduce_layout(opts.n, opts.vec, tgt.warp)


def _reduce_values(opts: Options) -> dict[str, str]:
    return {"CT": str(opts.layout.tpr), "RT": str(opts.layout.rows)}


KERNELS: dict[str, KernelSpec] = {
    k.name: k
    for k in (
        KernelSpec(
            name="rmsnorm_fwd", template="rmsnorm_fwd.mlir", entry="rmsnorm_fwd",
            # x, w, y, rstd, rows, x_stride, y_stride, grid (blocks)
            args=("p", "p", "p", "p", "q", "q", "q", "q"),
            grid="rows", layout=_fwd_layout,
        ),
        KernelSpec(
            name="rmsnorm_bwd", template="rmsnorm_bwd.mlir", entry="rmsnorm_bwd",
            # x, w, dy, rstd, dx, dw_part, rows, x_stride, dy_stride, dx_stride, grid
            args=("p", "p", "p", "p", "p", "p", "q", "q", "q", "q", "q"),
            grid="persistent", layout=_bwd_layout,
        ),
        KernelSpec(
            # dtype is the partials' (f32); wdtype the weight's, which dw is returned in.
            name="rmsnorm_dw_reduce", template="rmsnorm_dw_reduce.mlir", entry="rmsnorm_dw_reduce",
            args=("p", "p", "q"),  # dw_part, dw, number of partial rows
            grid="cols", layout=_reduce_layout, extra_values=_reduce_values,
        ),
    )
}
