"""normir: normalization layers as hand-written MLIR GPU kernels for gfx950 and sm_90.

The public API lives in normir.ops. `import normir` defines every torch.ops.normir.* operator as
soon as torch is imported: at once where torch is already loaded, else right after the program
imports it (a graph saved with normir's ops, loaded in a new process, finds them after `import
normir`). The command line and the compiler modules never import torch themselves, so they load
without it (and without its start-up time), and nothing here imports the MLIR bindings.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

__all__ = ["FusedAddLayerNorm", "FusedAddRMSNorm", "LayerNorm", "RMSNorm", "fused_add_layernorm",
           "fused_add_layernorm_bwd", "fused_add_layernorm_fwd", "fused_add_rmsnorm", "fused_add_rmsnorm_bwd",
           "fused_add_rmsnorm_fwd", "layernorm", "layernorm_bwd", "layernorm_fwd", "layernorm_quant", "replace_norms",
           "rmsnorm", "rmsnorm_bwd", "rmsnorm_fwd", "rmsnorm_quant", "__version__"]


def _bind() -> None:
    """Import the op modules (which define the custom ops) and bind the public names here: later
    `normir.rmsnorm_fwd` lookups are plain module attributes (a module __getattr__ costs about
    1 us a call, a small call's whole budget)."""
    from .ops import fused_add_rmsnorm, layernorm, quant, rmsnorm, swap

    for public in __all__:
        if public != "__version__":
            home = next(m for m in (rmsnorm, fused_add_rmsnorm, layernorm, quant, swap) if hasattr(m, public))
            globals()[public] = getattr(home, public)


def __getattr__(name: str):
    if name in __all__:  # torch not imported yet: the API's first use imports it
        _bind()
        return globals()[name]
    if name == "serving":  # the serving forms' module (normir.serving), imported on first use
        return importlib.import_module(f"{__name__}.serving")
    raise AttributeError(f"module 'normir' has no attribute {name!r}")


_pending = False  # torch was imported by a normir module mid-import: that module binds at its end


def _importing_normir() -> bool:
    """A module of normir's is being imported (its import brought torch in)."""
    return any(getattr(getattr(m, "__spec__", None), "_initializing", False)
               for name, m in list(sys.modules.items()) if name.startswith("normir.") and m is not None)


def _bind_pending() -> None:
    """Bind now if torch came in while a normir module was being imported (normir.launch's last line)."""
    global _pending
    if _pending:
        _pending = False
        _bind()


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the import of torch, it hands back torch's own spec with the
    loader's exec_module wrapped to bind normir (defining its ops) once torch's module has run,
    or, where a normir module's own import brought torch in, once that module is done. It removes
    itself first, so it acts once."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            global _pending
            run(module)
            if _importing_normir():
                _pending = True
                return
            try:
                _bind()
            except Exception as e:  # never break the program's import of torch; the API's first use raises
                warnings.warn(f"normir could not define its torch.ops.normir operators: {e}", stacklevel=2)

        spec.loader.exec_module = exec_module
        return spec


if "torch" in sys.modules:
    _bind()
elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterTorch())
