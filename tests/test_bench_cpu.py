"""The benchmark's rounds (scripts/bench.py): rotated order, medians, failures kept out."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

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


def test_by_round_pairs_each_round():
    row = {"ms_rounds": {"normir": [1.0, 1.0, 2.0], "quack": [1.01, 0.99, 2.1], "odd": [1.0]}}
    median, ahead, n = bench.by_round(row, "quack")
    assert (ahead, n) == (2, 3) and median == pytest.approx(1.0)  # +1%, -1%, +5%
    assert bench.by_round(row, "odd") is None and bench.by_round(row, "liger") is None
    assert bench.by_round({}, "quack") is None


def test_a_provider_offers_every_op_of_its_functions():
    p = bench.provider("peer", lambda x, w, eps: x, lambda x, r, w, eps: (x, r))
    assert set(p.ops) == set(bench.OPS) and p.is_peer
    only = bench.provider("normir-x", add=lambda x, r, w, eps: (x, r), fwd=lambda t: lambda: None)
    assert set(only.ops) == {"fwd", "add_fwd", "add_bwd"} and not only.is_peer
    assert set(bench.BYTES_PER_ELEM) == set(bench.OPS)
