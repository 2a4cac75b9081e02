"""normir's ops on torch: importing any of them (or normir.ops) defines every torch.ops.normir.*
operator, whatever the order of the imports. Their DTensor sharding rules (distributed.py) are
registered once torch.distributed.tensor is imported: no DTensor exists before, and importing it
here would add half a second to `import normir`."""

import importlib
import sys

from .. import _AfterImport, after_import

# This import brings torch in itself: the hook that would define the ops after torch's import is
# not needed (and would re-enter these modules half-imported).
sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _AfterImport) and f.name == "torch")]

import torch.distributed  # noqa: E402  (a part of torch's own import: it costs nothing)

from . import _fused, _rows, fused_add_rmsnorm, layernorm, rmsnorm, swap  # noqa: E402, F401

if torch.distributed.is_available():
    after_import("torch.distributed.tensor", lambda: importlib.import_module(f"{__name__}.distributed"),
                 "register the sharding rules of its operators for DTensor")
