"""The golden snapshot of the layout policy's decisions: for every kernel over a grid of problems
on every target, every field of the Layout and a digest of every placeholder value the driver
computes (specialize.values_for), one line a problem. A refactor of the policy leaves it
identical (tests/test_golden_cpu.py); an intended change of a decision is a commit of its own
that rewrites it (`python3 tests/golden.py --write`) and says why.

The grid: the GPU tier's, the benchmark's and the tuning script's specializations (the AOT plan),
and for every kernel N = 1..1048576 at powers of two and models' hidden sizes, in the dtype mixes
the GPU tier runs, with each kernel's feature sets, on every target. A problem the driver refuses
is a decision too: its line holds the error's first words.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from normir import targets
from normir.layout import Layout
from normir.options import build
from normir.specialize import values_for

SNAPSHOT = Path(__file__).with_name("golden_decisions.txt")
ROOT = Path(__file__).resolve().parent.parent

NS = tuple(1 << i for i in range(21)) + (768, 896, 1152, 1280, 1536, 1600, 2560, 2880, 3072, 3584, 5120, 6144, 7168,
                                        12288, 14336)
MIXES = (("bf16", "bf16"), ("f16", "f16"), ("f32", "f32"), ("bf16", "f32"))  # (x, weight)


def _other(dt: str) -> str:
    """A gradient's type other than the row's (the backwards' dtype rule)."""
    return "bf16" if dt == "f32" else "f32"


# Each kernel's feature sets over a mix (x, w): Options fields beside kernel, n, dtype, wdtype, target.
VARIANTS = {
    "rmsnorm_fwd": lambda x, w: [dict(store_rstd=True), dict(store_rstd=True, has_weight=False), dict(),
                                 dict(inplace=True)],
    "rmsnorm_bwd": lambda x, w: [dict(), dict(has_weight=False), dict(odtype=_other(x))],
    "fused_add_rmsnorm_fwd": lambda x, w: [
        dict(rdtype=x, store_residual=True, store_rstd=True), dict(rdtype="f32", store_residual=True, bdtype=x),
        dict(rdtype=x, store_residual=True, weight_offset=1.0, store_rstd=True), dict(bdtype=x, odtype="f32"),
        dict(rdtype=x, store_residual=True, inplace=True)],
    "fused_add_rmsnorm_bwd": lambda x, w: [
        dict(has_dres_out=True), dict(has_dres_out=True, bdtype="f32"), dict(),
        dict(has_dres_out=True, rdtype=_other(x), gdtype=_other(x))],
    "layernorm_fwd": lambda x, w: [dict(bdtype=w, store_rstd=True), dict(has_weight=False),
                                   dict(rdtype=x, store_residual=True, bdtype=w, store_rstd=True),
                                   dict(rdtype=x, store_residual=True, bdtype=w, inplace=True)],
    "layernorm_bwd": lambda x, w: [dict(bdtype="f32"), dict(has_weight=False),
                                   dict(has_dres_out=True, bdtype="f32"), dict(has_dres_out=True, odtype=_other(x))],
    "rmsnorm_quant_fwd": lambda x, w: [
        dict(qdtype="f8e4m3", qdynamic=True, store_y=False), dict(qdtype="i8", qdynamic=True, store_y=False,
                                                                   has_smooth=True),
        dict(qdtype="f8e4m3", store_y=False),
        dict(qdtype="f8e4m3", qdynamic=True, has_scale_ub=True, rdtype=x, store_residual=True),
        # the serving forms: the residual in place, vLLM's dynamic rule
        dict(qdtype="f8e4m3", qdynamic=True, rdtype=x, store_residual=True, inplace=True, store_y=False, sum_f32=True,
             round_xhat=True),
        dict(qdtype="i8", qdynamic=True, store_y=False, round_xhat=True)],
    "layernorm_quant_fwd": lambda x, w: [dict(qdtype="i8", qdynamic=True, bdtype=w, store_y=False),
                                         dict(qdtype="f8e4m3", rdtype=x, store_residual=True, bdtype=w, store_y=False)],
}


def grid() -> list[dict]:
    """Every problem of the snapshot, as Options fields (the AOT plan's first, then the sweep)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from gpu_cases import specializations

    plan = json.loads(subprocess.run([sys.executable, str(ROOT / "scripts" / "tune.py"), "plan"], capture_output=True,
                                     text=True, check=True).stdout)
    problems = [*specializations(), *plan]
    for target in sorted(targets.TARGETS):
        for kernel, variants in VARIANTS.items():
            for x, w in MIXES:
                for extra in variants(x, w):
                    problems += [dict(kernel=kernel, n=n, dtype=x, wdtype=w, target=target, **extra) for n in NS]
        for w in ("bf16", "f32"):
            for extra in (dict(), dict(bdtype=w)):
                problems += [dict(kernel="rmsnorm_dw_reduce", n=n, dtype="f32", wdtype=w, target=target, **extra)
                             for n in NS]
    seen, out = set(), []
    for p in problems:
        key = _key(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


# A knob at the value that once meant the policy's choice (0 or -1) is left out of a problem's key.
_POLICY = {"tpr": 0, "cluster": 0, "min_blocks": 0, "max_regs": 0, **{k: -1 for k in (
    "l2_prefetch", "stage", "hints", "overlap", "cache_row", "batch_reload", "db_smem", "two_pass", "cast_words",
    "stage_dres")}}


def _key(problem: dict) -> str:
    return " ".join(f"{k}={problem[k]}" for k in sorted(problem) if _POLICY.get(k, object()) != problem[k])


LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))


def decide(problem: dict) -> str:
    """One problem's decisions: every Layout field in LAYOUT_FIELDS' order and a digest of every
    placeholder value, or the refusal's message."""
    try:
        opts = build(**problem)
    except ValueError as e:
        return "refused: " + " ".join(str(e).split())[:80]
    lay = opts.layout
    values = values_for(opts)
    digest = hashlib.sha1("\n".join(f"{k}={values[k]}" for k in sorted(values)).encode()).hexdigest()[:12]
    return ",".join(str(int(v) if isinstance(v, bool) else v) for v in (getattr(lay, f) for f in LAYOUT_FIELDS)) \
        + " " + digest


def snapshot() -> list[str]:
    return [f"{_key(p)} | {decide(p)}" for p in grid()]


HEADER = "# layout fields: " + ",".join(LAYOUT_FIELDS) + " | digest of every placeholder value"

if __name__ == "__main__":
    lines = snapshot()
    if sys.argv[1:] == ["--write"]:
        SNAPSHOT.write_text("\n".join([HEADER, *lines]) + "\n")
        print(f"{len(lines)} decisions -> {SNAPSHOT}")
    else:
        print("\n".join(lines))
