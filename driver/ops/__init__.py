"""normir's ops on torch: importing any of them (or normir.ops) defines every torch.ops.normir.*
operator, whatever the order of the imports. Their DTensor sharding rules (distributed.py) are
registered once torch.distributed.tensor is imported: no DTensor exists before, and importing it
here would add half a second to `import normir`.

OPS is the op table: each op module, the catalogue's kernels it launches (kernels.KERNELS) and
its custom ops. A kernel of the catalogue that no op launches, or an op's kernel or custom op that
does not exist, fails tests/test_catalogue_cpu.py (docs/design.md lists the rest of a new op's
touch-list, which that test checks too)."""

import importlib.abc
import importlib.util
import sys
import warnings

from .. import _AfterTorch

# This import brings torch in itself: the hook that would define the ops after torch's import is
# not needed (and would re-enter these modules half-imported).
sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterTorch)]

import torch.distributed  # noqa: E402  (a part of torch's own import: it costs nothing)

from . import _fused, _rows, fused_add_rmsnorm, layernorm, quant, rmsnorm, serving, swap  # noqa: E402, F401

# op: (its module, the kernels it launches, its custom ops); the column sums' kernel (dw, db) is
# every backward's, launched by _rows.column_sums.
OPS = {
    "rmsnorm": (rmsnorm, ("rmsnorm_fwd", "rmsnorm_bwd"), ("rmsnorm_fwd", "rmsnorm_bwd")),
    "fused_add_rmsnorm": (fused_add_rmsnorm, ("fused_add_rmsnorm_fwd", "fused_add_rmsnorm_bwd"),
                          ("fused_add_rmsnorm_fwd", "fused_add_rmsnorm_bwd")),
    "layernorm": (layernorm, ("layernorm_fwd", "layernorm_bwd"), ("layernorm_fwd", "layernorm_bwd")),
    "quant": (quant, ("rmsnorm_quant_fwd", "layernorm_quant_fwd"), ("rmsnorm_quant_fwd", "layernorm_quant_fwd")),
    # the in-place and vLLM-schema forms: mutating operators over the kernels above
    "serving": (serving, (), tuple(serving.SERVING)),
}
SHARED_KERNELS = ("rmsnorm_dw_reduce",)

DTENSOR = "torch.distributed.tensor"


class _AfterDTensor(importlib.abc.MetaPathFinder):
    """As normir's _AfterTorch, for torch.distributed.tensor: finds nothing itself, hands back its
    own spec with the loader's exec_module wrapped to register the sharding rules once the module
    has run, and removes itself first, so it acts once."""

    def find_spec(self, name, path=None, target=None):
        if name != DTENSOR:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                importlib.import_module(f"{__name__}.distributed")
            except Exception as e:  # never break the program's import; DTensor calls then say what is missing
                warnings.warn(f"normir could not register its operators' sharding rules for DTensor: {e}", stacklevel=2)

        spec.loader.exec_module = exec_module
        return spec


if torch.distributed.is_available():
    if DTENSOR in sys.modules:
        from . import distributed  # noqa: F401
    elif not any(isinstance(f, _AfterDTensor) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDTensor())
