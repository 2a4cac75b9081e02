"""Shared test setup.

CPU tier (tests marked `cpu`): each test gets an empty cache folder of its own, no NORMIR_* settings
inherited from the caller's shell, and a private temporary folder (for the reproduction files that
compile errors write), so the tier never reads or writes ~/.cache/normir or leaves files in /tmp.
Fixtures: fake CUDA tensors, and normir's launches emulated on the CPU (cpu_launches).
"""

from __future__ import annotations

import tempfile

import pytest

# Settings that change what a test sees; NORMIR_PTXAS / NORMIR_ROCM_PATH (toolchain location) stay.
_CLEARED = ("NORMIR_AOT_DIRS", "NORMIR_DUMP_DIR", "NORMIR_NO_COMPILE", "NORMIR_TARGET", "NORMIR_TPR")


@pytest.fixture(autouse=True)
def _cpu_isolation(request, tmp_path_factory, monkeypatch):
    if request.node.get_closest_marker("cpu") is None:
        yield
        return
    root = tmp_path_factory.mktemp("normir-env")
    monkeypatch.setenv("NORMIR_CACHE_DIR", str(root / "cache"))
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    (root / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root / "tmp"))
    yield


@pytest.fixture
def fake():
    """Fake CUDA tensors (no GPU needed): make(shape, dtype) inside the fake mode."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = FakeTensorMode()

    def make(shape, dtype=torch.bfloat16):
        return FakeTensor(mode, torch.empty(shape, dtype=dtype, device="meta"), torch.device("cuda", 0))

    with mode:
        yield make


@pytest.fixture
def cpu_launches(monkeypatch):
    """Every launch the autograd paths make, as CPU torch math, and CPU tensors taken by the
    checks (the custom ops' fake implementations run them): cpu_emulation.py."""
    import cpu_emulation

    cpu_emulation.install(monkeypatch.setattr)
