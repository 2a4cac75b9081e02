"""normir.replace_norms and the modules' construction without a GPU: which layers are swapped,
that the new modules hold the same Parameter objects and keep the layers' settings, what is kept
and why, and construction on the meta device (where Hugging Face builds models first). The probe
(on the GPU) is in test_gpu_swap.py."""

from __future__ import annotations

import pytest
import torch

import normir
from normir.ops.swap import SwappedRMSNorm

pytestmark = pytest.mark.cpu


class LlamaRMSNorm(torch.nn.Module):  # Hugging Face's, as transformers writes it
    def __init__(self, hidden_size, eps=1e-6, device=None, dtype=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(torch.nn.Module):  # Gemma's: `eps`, (1 + weight), the result in x's dtype
    def __init__(self, dim, eps=1e-6, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))

    def forward(self, x):
        xf = x.float()
        output = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (output * (1.0 + self.weight.float())).type_as(x)


class Block(torch.nn.Module):
    def __init__(self, n, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.input_layernorm = LlamaRMSNorm(n, **kw)
        self.proj = torch.nn.Linear(n, n, **kw)
        self.post = torch.nn.RMSNorm(n, **kw)
        self.ln = torch.nn.LayerNorm(n, **kw)
        self.ln2d = torch.nn.LayerNorm((2, n // 2), **kw)
        self.gemma = GemmaRMSNorm(n, **kw)


def test_swaps_keep_parameters_and_settings():
    model = torch.nn.Sequential(Block(16), Block(16))
    params = {name: p for name, p in model.named_parameters()}
    with pytest.warns(UserWarning, match=r"kept 0\.ln2d \(LayerNorm\): it normalizes over 2 dimensions"):
        swapped = normir.replace_norms(model, probe=False)
    names = [s[0] for s in swapped]
    assert names == ["0.input_layernorm", "0.post", "0.ln", "0.gemma", "1.input_layernorm", "1.post", "1.ln",
                     "1.gemma"]
    assert [s[1] for s in swapped[:4]] == [LlamaRMSNorm, torch.nn.RMSNorm, torch.nn.LayerNorm, GemmaRMSNorm]
    assert [s[2] for s in swapped[:4]] == [SwappedRMSNorm, normir.RMSNorm, normir.LayerNorm, SwappedRMSNorm]
    # The same Parameter objects, under the same names: an optimizer's state stays valid.
    assert {name: p for name, p in model.named_parameters()} == params
    assert all(a is b for a, b in zip(dict(model.named_parameters()).values(), params.values()))
    blk = model[0]
    assert isinstance(blk.ln2d, torch.nn.LayerNorm) and isinstance(blk.proj, torch.nn.Linear)
    assert blk.post.eps is None and blk.ln.eps == 1e-5 and blk.input_layernorm.variance_epsilon == 1e-6
    assert (blk.gemma.weight_offset, blk.gemma.promote) == (1.0, False)
    assert (blk.input_layernorm.weight_offset, blk.input_layernorm.promote) == (0.0, True)
    with pytest.warns(UserWarning, match=r"kept 1\.ln2d"):
        assert normir.replace_norms(model, probe=False) == []  # normir's own modules are not swapped again


def test_strict_and_probe_need_a_gpu():
    model = Block(16)
    with pytest.raises(ValueError, match=r"kept input_layernorm \(LlamaRMSNorm\): it has no parameter on a CUDA "
                                         r"device to probe it on"):
        normir.replace_norms(model, strict=True)
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module, got int"):
        normir.replace_norms(3)


def test_meta_device_and_eps_none():
    # Hugging Face builds models on the meta device first: normir's modules construct there, and a
    # model built there swaps without a probe.
    for mod in (normir.RMSNorm(8, device="meta"), normir.LayerNorm(8, device="meta"),
                normir.FusedAddRMSNorm(8, device="meta"), normir.FusedAddLayerNorm(8, device="meta")):
        assert all(p.is_meta for p in mod.parameters())
    model = Block(16, device="meta", dtype=torch.bfloat16)
    with pytest.warns(UserWarning):
        assert len(normir.replace_norms(model, probe=False)) == 4
    assert model.post.weight.is_meta
    m = normir.RMSNorm(8, eps=None)
    assert m.eps is None and m.normalized_shape == (8,)
    assert list(m.state_dict()) == list(torch.nn.RMSNorm(8).state_dict())
    with pytest.raises(ValueError, match=r"hidden_size=\(2, 4\): normir normalizes the last dimension only"):
        normir.RMSNorm((2, 4))


def test_eps_none_is_torch_rms_norms_fp32_eps(monkeypatch, fake):
    # torch.rms_norm with eps=None adds float32's epsilon for 16-bit inputs too (its fp32 math's),
    # not the input dtype's (checked on an H200, torch 2.11: rows of 0.01 in bf16 give 1.0).
    seen = []
    import normir.ops.rmsnorm as rms

    def spy(x, weight=None, eps=1e-6, **kw):
        seen.append(eps)
        return x

    monkeypatch.setattr(rms, "rmsnorm", spy)
    normir.RMSNorm(8, eps=None, device="cuda", dtype=torch.bfloat16)(fake((2, 8)))
    normir.RMSNorm(8, eps=None, device="cuda")(fake((2, 8), torch.float32))
    assert seen == [torch.finfo(torch.float32).eps] * 2


def test_torch_rms_norm_eps_none_is_fp32_eps():
    # The rule above is torch's own (here on the CPU): a bf16 row of 0.01 normalizes to 1.
    x = torch.full((2, 8), 0.01, dtype=torch.bfloat16)
    assert torch.equal(torch.rms_norm(x, (8,), None, None), torch.rms_norm(x, (8,), None, torch.finfo(torch.float32).eps))


def test_a_hugging_face_llama():
    # transformers' own LlamaForCausalLM (built from a small config, random weights): every
    # LlamaRMSNorm swapped, the same Parameters; run where transformers is installed.
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg)
    params = list(model.parameters())
    swapped = normir.replace_norms(model, probe=False)
    assert sorted(s[0] for s in swapped) == ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
                                             "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm",
                                             "model.norm"]
    assert all(s[1].__name__ == "LlamaRMSNorm" and s[2] is SwappedRMSNorm for s in swapped)
    assert all(a is b for a, b in zip(model.parameters(), params))
    assert model.model.norm.variance_epsilon == cfg.rms_norm_eps
