"""normir.replace_norms: a model's norm layers swapped for normir's, in place.

Each supported layer becomes a normir module holding the same Parameter objects (an optimizer's
state stays valid) and giving the same output dtype as the layer it replaces. Before a swap the
new module runs beside the old one on a probe input (on the layer's GPU); a mismatch keeps the old
layer and says why. The rules are data (RULES): which layers they match and what they build.

    torch.nn.RMSNorm       -> normir.RMSNorm (eps None: float32's eps, as torch.rms_norm)
    torch.nn.LayerNorm     -> normir.LayerNorm (one normalized dimension)
    Hugging Face RMSNorms  -> SwappedRMSNorm: a 1-D `weight` and a float `variance_epsilon`
                              (LlamaRMSNorm, Qwen2RMSNorm, MistralRMSNorm, ...): y =
                              weight * x_hat.to(x.dtype), in weight's and x's promoted dtype;
                              Gemma's (class Gemma*RMSNorm, `eps`): y = x_hat * (1 + weight), in x's
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .layernorm import LayerNorm
from .rmsnorm import RMSNorm, rmsnorm


class SwappedRMSNorm(torch.nn.Module):
    """A Hugging Face style RMSNorm on normir's kernel: y = x_hat * (weight + weight_offset), in
    `weight.dtype` promoted with x's (promote=True, Llama's `weight * x_hat.to(input_dtype)`) or
    in x's dtype (Gemma's `.type_as(x)`). Holds the replaced layer's weight Parameter."""

    def __init__(self, weight: torch.nn.Parameter, eps: float, weight_offset: float = 0.0, promote: bool = True):
        super().__init__()
        self.weight = weight
        self.variance_epsilon = eps
        self.weight_offset = weight_offset
        self.promote = promote

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.promote_types(self.weight.dtype, x.dtype) if self.promote else x.dtype
        # None (x's dtype, the plain kernel) unless autocast is on: the layers replaced compute in
        # fp32 and cast themselves, so autocast does not change their dtype (as it does
        # normir.rmsnorm's default, following torch.rms_norm).
        explicit = out != x.dtype or torch.is_autocast_enabled()
        return rmsnorm(x, self.weight, self.variance_epsilon, out_dtype=out if explicit else None,
                       weight_offset=self.weight_offset)

    def extra_repr(self) -> str:
        return (f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, weight_offset={self.weight_offset}, "
                f"promote={self.promote}")


class Refused(ValueError):
    """A layer that a rule matched but normir cannot stand in for; the message says why."""


def _torch_rms(m: torch.nn.RMSNorm) -> torch.nn.Module:
    if len(m.normalized_shape) != 1:
        raise Refused(f"it normalizes over {len(m.normalized_shape)} dimensions; normir normalizes the last one")
    new = RMSNorm(m.normalized_shape[0], eps=m.eps, elementwise_affine=False)
    new.elementwise_affine = m.elementwise_affine
    new.weight = m.weight  # the same Parameter (or None)
    return new


def _torch_ln(m: torch.nn.LayerNorm) -> torch.nn.Module:
    if len(m.normalized_shape) != 1:
        raise Refused(f"it normalizes over {len(m.normalized_shape)} dimensions; normir normalizes the last one")
    new = LayerNorm(m.normalized_shape[0], eps=m.eps, elementwise_affine=False)
    new.elementwise_affine = m.elementwise_affine
    new.weight, new.bias = m.weight, m.bias  # the same Parameters (or None)
    return new


def _hf_eps(m: torch.nn.Module) -> float | None:
    """A Hugging Face RMSNorm's epsilon: `variance_epsilon` (Llama's and most), or `eps` on a class
    named *RMSNorm (Gemma's); None for anything else."""
    eps = getattr(m, "variance_epsilon", None)
    if eps is None and type(m).__name__.endswith("RMSNorm"):
        eps = getattr(m, "eps", None)
    return eps if isinstance(eps, float) else None


def _hf_like(m: torch.nn.Module) -> bool:
    w = getattr(m, "weight", None)
    return isinstance(w, torch.nn.Parameter) and w.dim() == 1 and _hf_eps(m) is not None \
        and not isinstance(m, (SwappedRMSNorm, RMSNorm, LayerNorm))


def _hf_rms(m: torch.nn.Module) -> torch.nn.Module:
    gemma = type(m).__name__.startswith("Gemma")
    return SwappedRMSNorm(m.weight, _hf_eps(m), weight_offset=1.0 if gemma else 0.0, promote=not gemma)


@dataclass(frozen=True)
class Rule:
    matches: Callable[[torch.nn.Module], bool]
    build: Callable[[torch.nn.Module], torch.nn.Module]  # raises Refused


RULES = (
    Rule(lambda m: type(m) is torch.nn.RMSNorm, _torch_rms),
    Rule(lambda m: type(m) is torch.nn.LayerNorm, _torch_ln),
    Rule(_hf_like, _hf_rms),
)
# Probe tolerance (relative L2 error of the new output against the old), by output dtype: the
# two differ by rounding order (normir rounds once, in fp32), not by formula.
PROBE_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def _probe(old: torch.nn.Module, new: torch.nn.Module) -> None:
    """Run both on one random input on the layer's GPU; Refused on a different dtype, shape or value."""
    param = next((p for p in old.parameters(recurse=False)), None)
    hidden = getattr(new, "normalized_shape", None) or (new.weight.shape if new.weight is not None else None)
    if param is None or not param.is_cuda or hidden is None:
        raise Refused("it has no parameter on a CUDA device to probe it on: move the model to the GPU first, "
                      "or pass probe=False to swap without checking")
    gen = torch.Generator(device=param.device).manual_seed(0)
    x = (torch.randn((2, 3, hidden[-1]), generator=gen, device=param.device) * 3 + 1).to(param.dtype)
    with torch.no_grad():
        want, got = old(x), new(x)
    if got.dtype != want.dtype or got.shape != want.shape:
        raise Refused(f"on a probe it returns {want.dtype} {tuple(want.shape)} and normir's "
                      f"{got.dtype} {tuple(got.shape)}")
    err = ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()
    if not err <= PROBE_TOL.get(want.dtype, 2e-2):
        raise Refused(f"on a probe its output differs from normir's by {err:.2g} (relative L2): another formula "
                      "(e.g. a mean subtracted)")


def replace_norms(model: torch.nn.Module, *, probe: bool = True, strict: bool = False
                  ) -> list[tuple[str, type, type]]:
    """Swap, in place, every torch.nn.RMSNorm, torch.nn.LayerNorm and Hugging Face style RMSNorm
    of `model` for a normir module holding the same Parameters; returns (qualified name, old
    class, new class) per swap. probe: check each new module against the old one on a random
    input on the layer's GPU first. A layer that cannot be swapped is kept, with a warning naming
    it and the reason (strict=True: a ValueError instead)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    swapped = []
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            rule = next((r for r in RULES if r.matches(child)), None)
            if rule is None:
                continue
            qual = f"{parent_name}.{name}" if parent_name else name
            try:
                new = rule.build(child)
                if probe:
                    _probe(child, new)
            except Refused as e:
                msg = f"normir.replace_norms kept {qual} ({type(child).__name__}): {e}"
                if strict:
                    raise ValueError(msg) from None
                warnings.warn(msg, stacklevel=2)
                continue
            new.train(child.training)
            setattr(parent, name, new)
            swapped.append((qual, type(child), type(new)))
    return swapped
