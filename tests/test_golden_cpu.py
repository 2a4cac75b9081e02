"""The layout policy's decisions equal the committed golden snapshot (tests/golden.py): every Layout
field and every placeholder value of every kernel over the snapshot's grid, on every target. A
failure lists the first problems whose decisions moved; an intended change rewrites the snapshot in a
commit of its own that says why (`python3 tests/golden.py --write`)."""

from __future__ import annotations

import golden
import pytest

pytestmark = pytest.mark.cpu


def test_decisions_match_the_golden_snapshot():
    want = golden.SNAPSHOT.read_text().splitlines()
    assert want[0] == golden.HEADER, "the Layout's fields changed: rewrite the snapshot (python3 tests/golden.py --write)"
    got = golden.snapshot()
    moved = [f"- {w}\n+ {g}" for w, g in zip(want[1:], got) if w != g]
    assert len(got) == len(want) - 1 and not moved, \
        f"{len(moved)} of {len(got)} decisions moved (grid {len(want) - 1} -> {len(got)}); first:\n" + "\n".join(moved[:5])
