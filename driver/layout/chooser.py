"""The chooser: the geometry's layout, then the rules and the forced knobs in their declared order
(rules.ORDER); the Layout and the names of the rules that changed it (`normir explain`)."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from .. import targets
from ..kernels import KernelSpec
from . import forced as F
from .geometry import Layout, bwd_layout, context, fwd_layout, reduce_layout
from .rules import DERIVED, ORDER, Rule

if TYPE_CHECKING:
    from ..options import Overrides, Problem

LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))


def decide(problem: Problem, overrides: Overrides, tgt: targets.Target, spec: KernelSpec, order: tuple = ORDER
           ) -> tuple[Layout, tuple[str, ...]]:
    """The layout of a kernel for a problem, the forced knobs applied and checked (an impossible one
    raises ValueError naming it and the fix), and the names of the rules that changed it, in order.
    A rule applies inside its domain (Rule.applies), where none of the knobs it keeps is forced and,
    for a shape rule, no shape rule fired before it; each Layout field has one owner, the one rule
    that changed it."""
    F.check_target(problem, overrides, tgt)
    if spec.work is None:
        F.check_fixed(problem, overrides)
        return reduce_layout(problem.n, problem.vec, tgt.warp), ()
    c = context(problem, overrides, tgt, spec)
    lay = bwd_layout(c) if c.persistent else fwd_layout(c)
    knobs = {f.name for f in fields(overrides) if getattr(overrides, f.name) is not None}
    fired, owners, shaped = [], {}, False
    for step in order:
        if not isinstance(step, Rule):
            lay = step(c, lay)
            continue
        if (step.shape and shaped) or step.keeps & knobs or not step.applies(c):
            continue
        new = step.change(c, lay)
        moved = {f for f in LAYOUT_FIELDS if getattr(new, f) != getattr(lay, f)} if new is not None else set()
        if not (moved or (step.shape and new is not None)):
            continue
        owned = moved - DERIVED if step.shape else moved
        if not owned <= step.sets or owned & owners.keys():
            raise AssertionError(f"layout policy bug: rule {step.name} changed {sorted(moved)} (it sets "
                                 f"{sorted(step.sets)}; set before: {({f: owners[f] for f in owned & owners.keys()})})")
        owners.update(dict.fromkeys(moved & step.sets, step.name))
        fired.append(step.name)
        shaped |= step.shape
        lay = new
    if lay.tpr > lay.nchunk:  # the policy's own layouts; forced ones are refused in geometry.forced_tpr
        raise AssertionError(f"layout policy bug: {problem.kernel} N={problem.n} has {lay.tpr} threads per row for "
                             f"{lay.nchunk} chunks; threads without a chunk may hang the block reduction")
    return lay, tuple(fired)
