"""The layout policy's register caps on sm_90 leave nothing spilled (ptxas, on the CPU).

A cap (min_blocks, NVVM's .minctasm) that the kernel's live values do not fit makes ptxas spill
them to local memory, which cost 20-50% on the H200 (*tune-v74*). The policy caps LayerNorm's
backward where db's column sums move to shared memory (the db_smem rule); each distinct layout
it caps that way is compiled here (bf16 with the weight in bf16 and in fp32, f16), and ptxas must
report no spill, but for one measured exception (HELD_OVER_CLUSTER_SPILL) and another dtype's
uncapped layout at the same N (ptxas's own choice, UNCAPPED_SPILL). Skipped where ptxas is absent."""

from __future__ import annotations

import re
import subprocess

import pytest

from normir import compiler, specialize, targets
from normir.options import build

pytestmark = pytest.mark.cpu

PTXAS = targets.ptxas_path()
# The fused add's rows held over a cluster with both column sums in shared memory, 3 blocks of 256:
# ptxas spills 16 bytes at that cap, and still +5.5-7.8% over 2 blocks unspilled (*tune-v80*).
HELD_OVER_CLUSTER_SPILL = 16
# Another dtype's layout at a capped N may be uncapped: its registers are ptxas's own choice, which
# trades a few bytes of spill for a resident block where the kernel states its block size
# (docs/tuning.md; bf16 rows with an fp32 weight and d_residual_out at 8224-24640: 8 bytes).
UNCAPPED_SPILL = 8


def _capped_layouts() -> list[tuple[int, bool]]:
    """(N, d_residual_out) of one N per distinct capped layout, 16-bit rows up to 32768."""
    seen, out = set(), []
    for dres in (False, True):
        for n in range(256, 32769, 32):
            lay = build(kernel="layernorm_bwd", n=n, bdtype="f32", has_dres_out=dres).layout
            shape = (dres, lay.tpr, lay.cluster, lay.k, lay.kfull, lay.cache_row, lay.db_smem, lay.min_blocks)
            if lay.db_smem and lay.min_blocks and shape not in seen:
                seen.add(shape)
                out.append((n, dres))
    return out


CASES = _capped_layouts()


def test_the_policy_caps_some_layouts():
    assert any(not d for _, d in CASES) and any(d for _, d in CASES), CASES


@pytest.mark.skipif(PTXAS is None, reason="ptxas not found")
@pytest.mark.parametrize(("dtype", "wdtype"), [("bf16", "bf16"), ("bf16", "f32"), ("f16", "f16")])
@pytest.mark.parametrize(("n", "dres"), CASES)
def test_capped_layouts_do_not_spill(n, dres, dtype, wdtype, tmp_path):
    opts = build(kernel="layernorm_bwd", n=n, dtype=dtype, wdtype=wdtype, bdtype="f32", has_dres_out=dres)
    ptx = compiler.compile_text(specialize.specialize(opts), "sm_90", "isa").data
    path = tmp_path / "k.ptx"
    path.write_bytes(ptx)
    run = subprocess.run([PTXAS, "-v", "-arch=sm_90", str(path), "-o", str(tmp_path / "k.cubin")],
                         capture_output=True, text=True, check=True)
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill (?:stores|loads)", run.stderr)]
    regs = re.search(r"Used (\d+) registers", run.stderr)
    lay = opts.layout
    allowed = (HELD_OVER_CLUSTER_SPILL if dres and lay.cache_row and lay.cluster > 1
               else 0 if lay.min_blocks else UNCAPPED_SPILL)
    assert regs and spills and max(spills) <= allowed, (
        f"layernorm_bwd N={n} {dtype} w {wdtype}{' d_residual_out' if dres else ''}: {run.stderr.strip()} "
        f"(layout {lay.tpr} x {lay.cluster}, k={lay.k}, min_blocks={lay.min_blocks})")
