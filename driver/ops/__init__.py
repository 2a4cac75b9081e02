"""normir's ops on torch: importing any of them (or normir.ops) defines every torch.ops.normir.*
operator, whatever the order of the imports.

OPS is the op table: each op module, the catalogue's kernels it launches (kernels.KERNELS) and
its custom ops. A kernel of the catalogue that no op launches, or an op's kernel or custom op that
does not exist, fails tests/test_catalogue_cpu.py (docs/design.md lists the rest of a new op's
touch-list, which that test checks too)."""

import sys

from .. import _AfterTorch

# This import brings torch in itself: the hook that would define the ops after torch's import is
# not needed (and would re-enter these modules half-imported).
sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterTorch)]

from . import _fused, _rows, fused_add_rmsnorm, layernorm, rmsnorm, swap  # noqa: E402, F401

# op: (its module, the kernels it launches, its custom ops); the column sums' kernel (dw, db) is
# every backward's, launched by _rows.column_sums.
OPS = {
    "rmsnorm": (rmsnorm, ("rmsnorm_fwd", "rmsnorm_bwd"), ("rmsnorm_fwd", "rmsnorm_bwd")),
    "fused_add_rmsnorm": (fused_add_rmsnorm, ("fused_add_rmsnorm_fwd", "fused_add_rmsnorm_bwd"),
                          ("fused_add_rmsnorm_fwd", "fused_add_rmsnorm_bwd")),
    "layernorm": (layernorm, ("layernorm_fwd", "layernorm_bwd"), ("layernorm_fwd", "layernorm_bwd")),
}
SHARED_KERNELS = ("rmsnorm_dw_reduce",)
