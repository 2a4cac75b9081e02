"""normir: normalization layers as hand-written MLIR GPU kernels for gfx950 and sm_90.

The public API lives in normir.ops and is imported on first use, so that the command line and
the compiler modules load without torch, and nothing here imports the MLIR bindings.
"""

__version__ = "0.1.0"

__all__ = ["RMSNorm", "rmsnorm", "rmsnorm_bwd", "rmsnorm_fwd", "__version__"]


def __getattr__(name: str):
    if name in __all__:
        from .ops import rmsnorm as _rmsnorm

        return getattr(_rmsnorm, name)
    raise AttributeError(f"module 'normir' has no attribute {name!r}")
