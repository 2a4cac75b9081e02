"""normir for serving stacks: the norms writing into the caller's tensors (in place where the
names say so) and vLLM's fused quantized RMSNorms, with vLLM's argument order. Each is also a
mutating operator, torch.ops.normir.<name>, with vLLM's schema. normir.ops.serving has the math,
the aliasing rules and the launches."""

from .ops.serving import (
    fused_add_layer_norm,
    fused_add_rms_norm,
    fused_add_rms_norm_static_fp8_quant,
    layer_norm,
    rms_norm,
    rms_norm_dynamic_per_token_quant,
    rms_norm_static_fp8_quant,
)

__all__ = ["fused_add_layer_norm", "fused_add_rms_norm", "fused_add_rms_norm_static_fp8_quant", "layer_norm",
           "rms_norm", "rms_norm_dynamic_per_token_quant", "rms_norm_static_fp8_quant"]
