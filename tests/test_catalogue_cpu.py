"""A new op's touch-list (docs/design.md, "Adding an op") checked from the catalogue: every kernel of
kernels.KERNELS is launched by an op of the op table (normir.ops.OPS) or shared by all, and reached
by the golden snapshot, the GPU tier's AOT plan, `normir report` and a lit test; every op's custom
ops exist, with a fake implementation and a vmap rule (the forwards an autograd formula and a
torch.func Function; the serving forms, which write their arguments, no vmap); its launches take the
kernel's arguments by name from the catalogue. A new catalogue entry without its entries elsewhere
fails here, naming what is missing."""

from __future__ import annotations

from pathlib import Path

import golden
import pytest
import torch
from gpu_cases import specializations

from normir import cli
from normir.kernels import KERNELS
from normir.ops import OPS, SHARED_KERNELS, _rows

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parent.parent


def test_every_kernel_has_one_op():
    launched = [k for _, kernels, _ in OPS.values() for k in kernels] + list(SHARED_KERNELS)
    assert sorted(launched) == sorted(set(launched)), "a kernel listed by two ops"
    assert set(launched) == set(KERNELS), (f"kernels no op launches: {sorted(set(KERNELS) - set(launched))}; "
                                           f"op kernels not in the catalogue: {sorted(set(launched) - set(KERNELS))}")


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_every_kernel_is_reached_by_the_tests(kernel):
    assert kernel in golden.VARIANTS or kernel in SHARED_KERNELS, f"{kernel}: no feature sets in tests/golden.py"
    assert any(p["kernel"] == kernel for p in specializations()), f"{kernel}: not in tests/gpu_cases.py's AOT plan"
    assert kernel in cli.REPORT_SHAPES, f"{kernel}: no shapes in normir report (cli.REPORT_SHAPES)"
    assert any(kernel in t.read_text() for t in (ROOT / "lit_tests").glob("*.test")), f"{kernel}: no lit test"


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_defines_its_custom_ops(op):
    module, kernels, custom = OPS[op]
    for name in custom:
        overload = getattr(torch.ops.normir, name).default
        # the impl, the fake, vmap (but for the serving forms' mutating operators, which write their arguments)
        mutating = overload._schema.is_mutable
        for key in ("CompositeExplicitAutograd", "Meta", *(() if mutating else ("FuncTorchBatched",))):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), key), (name, key)
        assert mutating == (op == "serving"), f"{name}: only the serving forms write their arguments"
        if name.endswith("_fwd"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), "Autograd"), name
            assert any(getattr(v, "qualname", None) == f"normir::{name}" and v.func is not None
                       for v in vars(module).values() if isinstance(v, _rows.Op)), f"{name}: no torch.func Function"


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_launches_pack_the_catalogue_order(kernel):
    # The launch takes the template's arguments by name and passes the kernel's own, in its order.
    values = {a.name: i for i, a in enumerate(KERNELS[kernel].template.args)}
    want = tuple(values[a.name] for a in KERNELS[kernel].args if a.name != "grid")
    assert _rows.picker(kernel)(values) == want
