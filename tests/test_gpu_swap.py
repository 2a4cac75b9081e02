"""GPU tier: normir.replace_norms on the H200. The probe accepts torch's norms and Hugging Face
style RMSNorms (Llama's, Gemma's) and keeps a layer of another formula (Cohere's LayerNorm, which
subtracts the mean) with a warning; the swapped model's outputs and gradients match the original's
within bf16 tolerance, and its gradients land in the same Parameters."""

from __future__ import annotations

import pytest
import torch
from gpu_cases import SWAP_N
from gpu_helpers import TOL, rel_err
from test_swap_cpu import GemmaRMSNorm, LlamaRMSNorm

import normir

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


class CohereLayerNorm(torch.nn.Module):  # a weight and variance_epsilon, but the mean is subtracted
    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        mean = hidden_states.mean(-1, keepdim=True)
        variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
        hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight.to(torch.float32) * hidden_states).to(input_dtype)


class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.norms = torch.nn.ModuleList([LlamaRMSNorm(n), torch.nn.RMSNorm(n), torch.nn.LayerNorm(n),
                                          GemmaRMSNorm(n), CohereLayerNorm(n)])
        self.lins = torch.nn.ModuleList(torch.nn.Linear(n, n) for _ in self.norms)

    def forward(self, x):
        for norm, lin in zip(self.norms, self.lins):
            x = torch.nn.functional.gelu(lin(norm(x))) + x
        return x


def test_probe_swaps_the_same_formulas_and_keeps_others():
    torch.manual_seed(0)
    model = Model(SWAP_N).cuda().bfloat16()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ref = Model(SWAP_N).cuda().bfloat16()
    ref.load_state_dict(model.state_dict())
    params = list(model.parameters())
    with pytest.warns(UserWarning, match=r"kept norms\.4 \(CohereLayerNorm\): on a probe its output differs"):
        swapped = normir.replace_norms(model)
    assert [s[0] for s in swapped] == ["norms.0", "norms.1", "norms.2", "norms.3"]
    assert all(a is b for a, b in zip(model.parameters(), params))
    x = torch.randn((4, 16, SWAP_N), device="cuda", dtype=torch.bfloat16)
    y, y_ref = model(x), ref(x)
    assert y.dtype == y_ref.dtype and rel_err(y, y_ref) <= TOL[torch.bfloat16]
    y.float().square().mean().backward()
    y_ref.float().square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.grad is not None and rel_err(p.grad, q.grad) <= 3 * TOL[torch.bfloat16], name


def test_rmsnorm_eps_none_matches_torch_on_small_rows():
    # torch.nn.RMSNorm(eps=None) adds float32's epsilon for bf16 input too: on rows of mean square
    # 1e-4, bf16's epsilon (0.0078) would give 0.11 instead of 1.
    x = torch.full((3, SWAP_N), 0.01, device="cuda", dtype=torch.bfloat16)
    x = x + 1e-3 * torch.randn_like(x)
    ours = normir.RMSNorm(SWAP_N, eps=None, device="cuda", dtype=torch.bfloat16)
    theirs = torch.nn.RMSNorm(SWAP_N, eps=None, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        assert rel_err(ours(x), theirs(x)) <= TOL[torch.bfloat16]
