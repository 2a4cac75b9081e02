"""normir's ops on torch: importing any of them (or normir.ops) defines every torch.ops.normir.*
operator, whatever the order of the imports."""

import sys

from .. import _AfterTorch

# This import brings torch in itself: the hook that would define the ops after torch's import is
# not needed (and would re-enter these modules half-imported).
sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterTorch)]

from . import _fused, _rows, fused_add_rmsnorm, layernorm, rmsnorm, swap  # noqa: E402, F401
