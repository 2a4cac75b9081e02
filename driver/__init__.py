"""normir: normalization layers as hand-written MLIR GPU kernels for gfx950 and sm_90.

Importing normir needs torch but not the MLIR bindings; those are imported on the first compile.
"""

__version__ = "0.1.0"

from .ops.rmsnorm import RMSNorm, rmsnorm, rmsnorm_bwd, rmsnorm_fwd  # noqa: E402

__all__ = ["RMSNorm", "rmsnorm", "rmsnorm_bwd", "rmsnorm_fwd", "__version__"]
