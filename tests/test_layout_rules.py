"""The layout policy's rules as records and its one chooser (driver/layout/): what each record
states, the declared order they fire in, the knobs they leave alone, the one owner of each Layout
field, `normir explain`'s list, and the measured domain: a kernel with a feature no rule was
measured on (a forward with a reduction after the normalize, a new row sum) takes none of them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from normir import targets
from normir.kernels import KERNELS, RowReduce
from normir.layout import chooser, forced, geometry, rules
from normir.options import KNOB, build, split

pytestmark = pytest.mark.cpu

LAYOUT_FIELDS = {f.name for f in dataclasses.fields(geometry.Layout)}
CTX_FIELDS = {f.name for f in dataclasses.fields(geometry.Ctx)}
# A spread of problems every family of rules fires on: (kernel, fields), N over powers of two and
# the masked or uneven sizes the rules are about.
NS = (64, 768, 1024, 1152, 2048, 2880, 3584, 4096, 5120, 6144, 7168, 8192, 16384, 24576, 32768, 65536)
CASES = [("rmsnorm_fwd", {}), ("rmsnorm_bwd", {}), ("rmsnorm_bwd", dict(has_weight=False)),
         ("fused_add_rmsnorm_fwd", dict(rdtype="bf16", store_residual=True)),
         ("fused_add_rmsnorm_bwd", dict(has_dres_out=True)), ("layernorm_fwd", dict(bdtype="bf16")),
         ("layernorm_fwd", dict(rdtype="bf16", store_residual=True, bdtype="bf16")),
         ("layernorm_bwd", dict(bdtype="f32")), ("layernorm_bwd", dict(bdtype="f32", has_dres_out=True))]


def _problems(targets_=("sm_90", "gfx950")):
    for target in targets_:
        for kernel, extra in CASES:
            for n in NS:
                yield dict(kernel=kernel, n=n, target=target, **extra)


def test_each_record_states_its_domain_fields_targets_runs_and_knobs():
    names = [r.name for r in rules.RULES]
    assert len(names) == len(set(names)) and all(names)
    for r in rules.RULES:
        assert r.when["grid"] in rules.MEASURED, r.name
        assert set(r.when) <= CTX_FIELDS | {"needs"}, (r.name, set(r.when) - CTX_FIELDS)
        assert all(hasattr(targets.get("sm_90"), t) for t in r.when.get("needs", "").split()), r.name
        assert r.sets and r.sets <= LAYOUT_FIELDS, (r.name, r.sets - LAYOUT_FIELDS)
        assert r.keeps <= set(KNOB), (r.name, r.keeps - set(KNOB))
        assert r.runs and r.on and set(r.on) <= set(targets.TARGETS), r.name
        assert r.change.__doc__, r.name  # one line of reason (the measurements: docs/tuning.md, under its name)
    # The rules measured by compiling for gfx950 keep to AMD targets; the others were timed on the H200.
    assert {r.name for r in rules.RULES if r.on == ("gfx950",)} == {r.name for r in rules.RULES
                                                                    if r.when.get("vendor") == "amd"}
    # ORDER is the rules and the places of the forced knobs, each once.
    steps = [s for s in rules.ORDER if not isinstance(s, rules.Rule)]
    assert all(getattr(forced, s.__name__) is s for s in steps) and len(steps) == len(set(steps))


def test_docs_name_every_rule():
    text = (Path(__file__).resolve().parent.parent / "docs" / "tuning.md").read_text()
    headings = {w.strip(",") for line in text.splitlines() if line.startswith("### ") for w in line[4:].split()}
    assert {r.name for r in rules.RULES} <= headings


def test_rules_fire_in_the_declared_order_inside_their_grid():
    order = [r.name for r in rules.RULES]
    fired_anywhere = set()
    for fields in _problems():
        b = build(**fields)
        at = [order.index(name) for name in b.rules]
        assert at == sorted(at), (fields, b.rules)
        grid = KERNELS[fields["kernel"]].grid
        assert all(rules.RULES[i].when["grid"] == grid for i in at), (fields, b.rules)
        fired_anywhere |= set(b.rules)
    # The spread reaches most of the policy (so that the order above is checked on it).
    assert len(fired_anywhere) >= 20, sorted(set(order) - fired_anywhere)


def test_explain_prints_the_rules_that_fired():
    def explain(*args):
        out = subprocess.run([sys.executable, "-m", "normir.cli", "explain", *args], capture_output=True, text=True,
                             check=True).stdout
        return next(line for line in out.splitlines() if line.startswith("rules that fired: "))

    assert explain("rmsnorm_fwd", "--n", "65536") == "rules that fired: narrow, overlap_wb"
    assert explain("rmsnorm_fwd", "--n", "65536", "--tpr", "1024") == "rules that fired: none (the geometry's layout)"
    assert explain("layernorm_bwd", "--n", "65536", "--bdtype", "f32", "--has-dres-out") == \
        "rules that fired: held_quads"


@pytest.mark.parametrize("fields, rule, knob", [
    (dict(kernel="rmsnorm_fwd", n=65536), "narrow", dict(tpr=1024)),
    (dict(kernel="rmsnorm_fwd", n=4096), "streamed", dict(cache_row=0)),
    (dict(kernel="rmsnorm_fwd", n=4096), "streamed", dict(hints=21)),
    (dict(kernel="rmsnorm_bwd", n=16384), "staged_pairs", dict(stage=0)),
    (dict(kernel="rmsnorm_bwd", n=32768), "overlap", dict(overlap=1)),
    (dict(kernel="layernorm_bwd", n=65536, bdtype="f32"), "held_quads", dict(max_regs=128)),
])
def test_a_rule_stands_aside_where_a_knob_it_keeps_is_forced(fields, rule, knob):
    assert rule in build(**fields).rules
    assert rule not in build(**fields, **knob).rules


def _decide(fields, spec=None, order=rules.ORDER):
    problem, overrides = split(fields)
    return chooser.decide(problem, overrides, targets.get(problem.target), spec or KERNELS[problem.kernel], order)


GEOMETRY = tuple(s for s in rules.ORDER if not isinstance(s, rules.Rule))  # the forced knobs' places alone


def test_a_forward_with_a_reduction_after_the_normalize_takes_none_of_todays_rules():
    # A quantized RMSNorm forward (its catalogue entry as a later issue would add it: RMSNorm's
    # forward with an amax of y over the row, or over groups of 32 columns) gets the geometry's
    # layout, no rule fired; so does a forward with a new row sum. RMSNorm's own forward takes
    # rules at those sizes, and its decisions are the golden snapshot's (tests/test_golden_cpu.py).
    plain = KERNELS["rmsnorm_fwd"]
    quantized = [replace(plain, work=replace(plain.work, after_norm=(RowReduce("amax", group),))) for group in (0, 32)]
    new_sums = replace(plain, work=replace(plain.work, sums=2))
    fired = set()
    for n, target in ((n, t) for n in NS + (131072,) for t in ("sm_90", "gfx950")):
        for extra in ({}, dict(has_weight=False), dict(dtype="f32", wdtype="f32")):
            fields = dict(kernel="rmsnorm_fwd", n=n, target=target, **extra)
            lay, names = _decide(fields)
            assert (lay, names) == (build(**fields).layout, build(**fields).rules)
            fired |= set(names)
            for spec in (*quantized, new_sums):
                # the geometry's own layout (a reduction after the normalize keeps its row in one
                # block: no cluster exchange for it), no rule fired
                got = _decide(fields, spec)
                assert got == _decide(fields, spec, GEOMETRY) and got[1] == (), (spec.work, fields)
    assert fired, "RMSNorm's forward takes no rule at these sizes: the test above checks nothing"


def test_a_backward_with_a_new_row_sum_takes_none_of_todays_rules():
    plain = KERNELS["layernorm_bwd"]
    wider = replace(plain, work=replace(plain.work, sums=3))
    for n in NS:
        fields = dict(kernel="layernorm_bwd", n=n, bdtype="f32")
        assert _decide(fields, wider) == _decide(fields, plain, GEOMETRY)
    assert any(_decide(dict(kernel="layernorm_bwd", n=n, bdtype="f32"))[1] for n in NS)


def _rule(name, sets, change, shape=False, **when):
    return replace(rules.rule("rows", sets, "v0", shape=shape, **when)(change), name=name)


def test_each_field_has_one_owner():
    fields = dict(kernel="rmsnorm_fwd", n=4096)
    one = _rule("one", "overlap", lambda c, lay: replace(lay, overlap=1))
    two = _rule("two", "overlap", lambda c, lay: replace(lay, overlap=2))
    assert _decide(fields, order=(one,))[1] == ("one",)
    with pytest.raises(AssertionError, match=r"rule two changed \['overlap'\] .* set before: \{'overlap': 'one'\}"):
        _decide(fields, order=(one, two))
    stray = _rule("stray", "overlap", lambda c, lay: replace(lay, two_pass=True))
    with pytest.raises(AssertionError, match=r"rule stray changed \['two_pass'\] \(it sets \['overlap'\]"):
        _decide(fields, order=(stray,))


def test_the_first_shape_rule_takes_the_row():
    fields = dict(kernel="rmsnorm_fwd", n=4096)
    keep = _rule("keep", "tpr", lambda c, lay: lay, shape=True)  # takes the row as the geometry had it
    other = _rule("other", "tpr", lambda c, lay: replace(lay, tpr=lay.tpr // 2), shape=True)
    assert _decide(fields, order=(keep, other))[1] == ("keep",)
    assert _decide(fields, order=(other,))[1] == ("other",)
    # A rule outside its domain stands aside (here: the statistics kept).
    assert _decide(fields, order=(_rule("ln", "tpr", other.change, kept="centered"),))[1] == ()
