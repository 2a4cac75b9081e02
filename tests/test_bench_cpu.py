"""The benchmark's rounds (scripts/bench.py): rotated order, medians, failures kept out; its ops,
byte accounting and the LayerNorm rows' setups (torch's on the CPU, normir's and quack's calls)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.cpu

_spec = importlib.util.spec_from_file_location("bench", Path(__file__).parent.parent / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("bench", bench)  # its dataclasses look their module up there
_spec.loader.exec_module(bench)


def test_rotation():
    assert bench.rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert bench.rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert bench.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert bench.rotated([], 2) == []


def test_rounds_rotate_the_order_and_keep_medians():
    calls, values = [], {"a": iter([1.0, 9.0, 2.0]), "b": iter([5.0, 4.0, 6.0]), "c": iter([7.0, 7.0, 8.0])}

    def time_one(name):
        calls.append(name)
        return next(values[name])

    medians, rounds, errors = bench.in_rounds(["a", "b", "c"], 3, time_one)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # each round starts one later
    assert medians == {"a": 2.0, "b": 5.0, "c": 7.0} and list(medians) == ["a", "b", "c"]
    assert rounds == {"a": [1.0, 9.0, 2.0], "b": [5.0, 4.0, 6.0], "c": [7.0, 7.0, 8.0]}
    assert errors == {}


def test_a_failing_provider_is_recorded_once_and_skipped_after():
    calls = []

    def time_one(name):
        calls.append(name)
        if name == "bad" and calls.count("bad") == 2:
            raise RuntimeError("out of memory\nmore text")
        return 1.0

    medians, rounds, errors = bench.in_rounds(["ok", "bad"], 3, time_one)
    assert calls.count("bad") == 2 and calls.count("ok") == 3
    assert medians == {"ok": 1.0, "bad": None}
    assert "bad" not in rounds and errors == {"bad": "RuntimeError: out of memory"}


def test_rounds_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--rounds", "0"])
    assert "--rounds 0" in capsys.readouterr().err
    assert bench.parse_args([]).rounds == 3


def test_ns_choose_the_shapes(capsys):
    assert bench.parse_args([]).ns == bench.FULL_NS and bench.parse_args(["--quick"]).ns == bench.QUICK_NS
    assert bench.parse_args(["--ns", "768, 1152"]).ns == (768, 1152)
    for bad, said in ((["--ns", "7x"], "whole numbers"), (["--ns", "0"], "between 1"), (["--ns", ""], "between 1"),
                      (["--ns", "768", "--quick"], "give one")):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
        assert said in capsys.readouterr().err


def test_by_round_pairs_each_round():
    row = {"ms_rounds": {"normir": [1.0, 1.0, 2.0], "quack": [1.01, 0.99, 2.1], "odd": [1.0]}}
    median, ahead, n = bench.by_round(row, "quack")
    assert (ahead, n) == (2, 3) and median == pytest.approx(1.0)  # +1%, -1%, +5%
    assert bench.by_round(row, "odd") is None and bench.by_round(row, "liger") is None
    assert bench.by_round({}, "quack") is None


def test_a_provider_offers_every_op_of_its_functions():
    p = bench.provider("peer", lambda x, w, eps: x, lambda x, r, w, eps: (x, r), lambda x, w, b, eps: x,
                       lambda x, r, w, b, eps: (x, r))
    serving = {"ip_add_fwd", *bench.QUANT_OPS}  # quant_composites' rows, a provider's by its own keywords
    assert set(p.ops) == set(bench.OPS) - serving | {"fwd_grad"} and p.is_peer
    rms = bench.provider("peer", lambda x, w, eps: x, lambda x, r, w, eps: (x, r))
    assert set(rms.ops) == {"fwd", "fwd_grad", "bwd", "fwdbwd", "add_fwd", "add_bwd"}
    assert set(bench.SMALL_OPS) - serving <= set(p.ops)
    ln = bench.provider("peer", ln=lambda x, w, b, eps: x)
    assert set(ln.ops) == {"ln_fwd", "ln_bwd"}  # no fused-add LayerNorm: those rows leave it out
    only = bench.provider("normir-x", add=lambda x, r, w, eps: (x, r), fwd=lambda t: lambda: None)
    assert set(only.ops) == {"fwd", "add_fwd", "add_bwd"} and not only.is_peer
    assert set(bench.BYTES_PER_ELEM) == set(bench.OPS)


def test_small_alone_is_an_op_choice():
    assert bench.parse_args(["--ops", "small"]).ops == ["small"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--ops", "smal"])


def test_layernorm_ops_count_their_peers_bytes():
    b = bench.BYTES_PER_ELEM
    assert (b["ln_fwd"], b["ln_bwd"]) == (b["fwd"], b["bwd"]) == (2, 3)
    assert (b["add_ln_fwd"], b["add_ln_bwd"]) == (b["add_fwd"], b["add_bwd"]) == (4, 4)
    ops = "ln_fwd,ln_bwd,add_ln_fwd,add_ln_bwd"
    assert bench.parse_args(["--ops", ops]).ops == ops.split(",")
    assert [bench.op_title(op) for op in ("bwd", "add_fwd", "ln_fwd", "add_ln_bwd")] == [
        "rmsnorm bwd", "fused add + rmsnorm fwd", "layernorm fwd", "fused add + layernorm bwd"]


def _inputs(m=4, n=64, dtype=torch.float32):
    def rows():
        return torch.randn(m, n, dtype=dtype)

    return bench.Inputs(x=rows(), residual=rows(), w=torch.randn(n, dtype=dtype), dy=rows(), dh=rows(),
                        b=torch.randn(n, dtype=dtype))


def test_torch_layernorm_setups_compute_layernorm_and_its_gradients():
    """The peers' LayerNorm setups (torch eager's, on the CPU): the forward is F.layer_norm, the
    backward autograd's (dx, dw, db), the fused add's (y, h) and (dx, dresidual, dw, db)."""
    (p,) = bench.load_torch()
    t = _inputs()
    n = t.x.shape[-1]
    ref = torch.nn.functional.layer_norm(t.x, (n,), t.w, t.b, bench.LN_EPS)
    torch.testing.assert_close(p.ops["ln_fwd"](t)(), ref)
    x, w, b = (v.clone().requires_grad_(True) for v in (t.x, t.w, t.b))
    want = torch.autograd.grad(torch.nn.functional.layer_norm(x, (n,), w, b, bench.LN_EPS), [x, w, b], t.dy)
    got = p.ops["ln_bwd"](t)
    for _ in range(2):  # the retained graph runs again
        for g, r in zip(got(), want, strict=True):
            torch.testing.assert_close(g, r)
    y, h = p.ops["add_ln_fwd"](t)()
    torch.testing.assert_close(h, t.x + t.residual)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(h, (n,), t.w, t.b, bench.LN_EPS))
    x, r, w, b = (v.clone().requires_grad_(True) for v in (t.x, t.residual, t.w, t.b))
    hh = x + r
    want = torch.autograd.grad([torch.nn.functional.layer_norm(hh, (n,), w, b, bench.LN_EPS), hh], [x, r, w, b],
                               [t.dy, t.dh])
    got = p.ops["add_ln_bwd"](t)()
    assert len(got) == 4
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r)
    torch.testing.assert_close(got[0], got[1])  # dx = dresidual


def test_quack_layernorm_takes_fp32_weights_and_its_stats_in_order():
    calls = []

    class Quack:
        @staticmethod
        def layernorm_fwd(x, weight, bias=None, eps=1e-6, return_rstd=False, return_mean=False):
            calls.append(("fwd", x, weight, bias, eps))
            out = (x,) + (("rstd",) if return_rstd else ()) + (("mean",) if return_mean else ())
            return out if len(out) > 1 else x

        @staticmethod
        def layernorm_bwd(x, weight, dout, rstd, mean, has_bias=True):
            calls.append(("bwd", x, weight, dout, rstd, mean, has_bias))

    t = _inputs(dtype=torch.bfloat16)
    ops = bench.quack_layernorm(Quack)
    assert set(ops) == {"ln_fwd", "ln_bwd"}
    ops["ln_fwd"](t)()
    (_, x, w, b, eps), = calls
    assert x is t.x and w.dtype == b.dtype == torch.float32 and eps == bench.LN_EPS
    torch.testing.assert_close(w, t.w.float())
    torch.testing.assert_close(b, t.b.float())
    calls.clear()
    timed = ops["ln_bwd"](t)
    assert [c[0] for c in calls] == ["fwd"]  # the forward runs outside the timed call
    timed()
    _, x, w, dy, rstd, mean, has_bias = calls[-1]
    assert (x, dy, rstd, mean, has_bias) == (t.x, t.dy, "rstd", "mean", True) and w.dtype == torch.float32
    assert bench.quack_layernorm(object()) == {}  # a quack without LayerNorm offers no LayerNorm rows


def test_normir_layernorm_setups_call_the_backward_directly(monkeypatch):
    """normir's LayerNorm rows: the forward without stats; the backward one layernorm_bwd /
    fused_add_layernorm_bwd call on the mean and rstd of a forward done outside."""
    calls = []

    class Normir:
        @staticmethod
        def layernorm_fwd(x, weight, bias, eps=1e-5, *, store_stats=False):
            calls.append(("layernorm_fwd", x, weight, bias, eps, store_stats))
            return "y", "mean", "rstd"

        @staticmethod
        def layernorm_bwd(x, weight, dy, mean, rstd, *, has_bias=False, atomic=False):
            calls.append(("layernorm_bwd", x, weight, dy, mean, rstd, has_bias, atomic))

        @staticmethod
        def fused_add_layernorm_fwd(x, residual, weight, bias, eps=1e-5, *, store_stats=False):
            calls.append(("fused_add_layernorm_fwd", x, residual, weight, bias, eps, store_stats))
            return "y", "h", "mean", "rstd"

        @staticmethod
        def fused_add_layernorm_bwd(dy, residual_out, weight, mean, rstd, d_residual_out=None, *, has_bias=False,
                                    atomic=False):
            calls.append(("fused_add_layernorm_bwd", dy, residual_out, weight, mean, rstd, d_residual_out, has_bias,
                          atomic))

    monkeypatch.setitem(sys.modules, "normir", Normir)
    t, eps = _inputs(), bench.LN_EPS
    bench.normir_ln_fwd(t)()
    assert calls.pop() == ("layernorm_fwd", t.x, t.w, t.b, eps, False)
    for atomic in (False, True):
        timed = bench.normir_ln_bwd(atomic)(t)
        assert calls.pop() == ("layernorm_fwd", t.x, t.w, t.b, eps, True)
        timed()
        assert calls.pop() == ("layernorm_bwd", t.x, t.w, t.dy, "mean", "rstd", True, atomic)
        timed = bench.normir_add_ln_bwd(atomic)(t)
        assert calls.pop() == ("fused_add_layernorm_fwd", t.x, t.residual, t.w, t.b, eps, True)
        timed()
        assert calls.pop() == ("fused_add_layernorm_bwd", t.dy, "h", t.w, "mean", "rstd", t.dh, True, atomic)
    bench.normir_add_ln_fwd(t)()
    assert calls.pop() == ("fused_add_layernorm_fwd", t.x, t.residual, t.w, t.b, eps, False)


def test_small_calls_table_per_op_with_normir_over_torch():
    rows = [{"op": op, "M": m, "N": 4096, "us": {"normir": 10.0 * k, "torch": 20.0, "quack": None}}
            for k, op in enumerate(("fwd", "fwd_grad"), 1) for m in (1, 16)]
    text = bench.small_table(rows)
    assert text.count("small M, fwd ") == 1 and text.count("small M, fwd_grad ") == 1
    fwd, grad = text.split("\n\n")
    assert "normir/torch" in fwd and " 0.50" in fwd and " 1.00" in grad and "n/a" in fwd  # quack failed


def test_small_calls_inside_a_cuda_graph_get_their_own_table():
    rows = [{"op": "fwd", "M": m, "N": 4096, "us": {"normir": 10.0, "torch": 20.0},
             "graph_us": {"normir": 2.5 * m, "torch": None}} for m in (1, 16)]
    rows.append({"op": "fwd_grad", "M": 1, "N": 4096, "us": {"normir": 30.0, "torch": 20.0}})
    parts = bench.small_table(rows).split("\n\n")
    assert len(parts) == 3 and "inside a CUDA graph" in parts[1] and "inside a CUDA graph" not in parts[2]
    assert " 2.50" in parts[1] and " 40.00" in parts[1] and "n/a" in parts[1]  # torch's capture failed
    assert set(bench.GRAPH_OPS) <= set(bench.SMALL_OPS)


def test_the_autograd_forward_records_a_graph():
    t = bench.Inputs(x=torch.randn(2, 8), residual=None, w=torch.randn(8), dy=None, dh=None)
    y = bench.autograd_forward(lambda x, w, eps: x * w)(t)()
    assert y.requires_grad and y.grad_fn is not None and not t.x.requires_grad  # on leaves, not the inputs


def test_inputs_hold_what_the_ops_read():
    t = bench.inputs(3, 8, torch.float32, add=False, ln=False, device="cpu")
    assert t.x.shape == t.dy.shape == (3, 8) and t.w.shape == (8,) and t.residual is t.dh is t.b is None
    t = bench.inputs(3, 8, torch.bfloat16, device="cpu")
    assert t.residual.shape == t.dh.shape == (3, 8) and t.b.dtype == torch.bfloat16


def test_serving_rows_run_for_normir_and_the_torch_peers(cpu_launches):
    # The serving rows' setups on CPU tensors (normir's launches emulated): each timed call runs,
    # and the peers' composites quantize as normir's dynamic rule does.
    t = bench.inputs(3, 256, torch.bfloat16, device="cpu")
    normir_ops = bench.normir_serving()
    torch_ops = bench.quant_composites(lambda x, w, eps: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps),
                                       bench._layer_norm)
    for op in ("ip_add_fwd", *bench.QUANT_OPS):
        assert op in bench.OPS and op in bench.BYTES_PER_ELEM and op in bench.SERVING_TITLES
        normir_ops[op](t)()
        torch_ops[op](t)()
    y = torch.randn(4, 64)
    q, s = bench.per_token_quant(y, torch.int8)
    assert q.dtype == torch.int8 and torch.allclose(s.squeeze(1), y.abs().amax(-1) / 127)
