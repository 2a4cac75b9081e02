"""Torch-facing launch plumbing: device -> target, the kernel handle cache, streams, vector width.

The hot path (a dict hit, a few int operations and one ctypes call) never imports MLIR, hashes
kernel text or decides a layout; those happen once per (kernel, shape, dtype, device) on a miss.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from functools import cache

import torch

from . import _bind_pending, env, library, runtime, targets
from .kernels import KERNELS
from .layout import MAX_VECTOR_BYTES, Layout
from .options import KNOBS, Overrides, Problem, build

TORCH_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}

_handles: dict[tuple, tuple[runtime.LaunchHandle, Layout]] = {}
_lock = threading.Lock()


def vendor() -> str:
    return "hip" if torch.version.hip else "cuda"


@cache
def device_target(index: int) -> str:
    forced = env.TARGET.get()
    if forced:
        return targets.get(forced).chip
    if torch.version.hip:
        chip = torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
    else:
        major, minor = torch.cuda.get_device_capability(index)
        chip = f"sm_{major}{minor}"
    if chip not in targets.TARGETS:
        raise RuntimeError(f"GPU {index} is {chip}, which normir has no target for; supported: "
                           f"{sorted(targets.TARGETS)} (NORMIR_TARGET overrides the detection)")
    return chip


# NORMIR_TPR's item: KERNEL:N=TPR, then each knob's letter and value in options.KNOBS' order (v, a
# narrower vector than the tensors allow, after h). 0 for TPR (and x0, m0, n0, v0) is the policy's.
_TPR_LETTERS = [k.tpr for k in KNOBS[1:]]
_TPR_LETTERS.insert(_TPR_LETTERS.index("h") + 1, "v")
_TPR_ITEM = re.compile(r"(\w+):(\d+)=(\d+)" + "".join(f"(?:{c}(\\d+))?" for c in _TPR_LETTERS))
_TPR_NAMES = ["tpr"] + [k.name for k in KNOBS[1:]]
_TPR_NAMES.insert(_TPR_NAMES.index("hints") + 1, "vec")
TPR_FORM = "KERNEL:N=TPR" + "".join(f"[{c}N]" for c in _TPR_LETTERS)


def tpr_overrides() -> dict[tuple[str, int], dict[str, int]]:
    """NORMIR_TPR parsed: {(kernel, n): the knobs it forces (options.KNOBS), and vec (a narrower
    vector access)}. A knob's 0 where 0 is no value of it (tpr, cluster, min_blocks, max_regs,
    vec) is the policy's, as in the variant strings of docs/results/."""
    out = {}
    for item in filter(None, (p.strip() for p in env.TPR.get().split(","))):
        m = _TPR_ITEM.fullmatch(item)
        if m is None:
            raise ValueError(f"NORMIR_TPR item {item!r} is not {TPR_FORM} (e.g. rmsnorm_bwd:65536=512x2p0s1m2h1)")
        given = {name: int(v) for name, v in zip(_TPR_NAMES, m.groups()[2:]) if v is not None}
        knobs = {name: v for name, v in given.items()
                 if not (v == 0 and name in ("tpr", "cluster", "min_blocks", "max_regs", "vec"))}
        try:
            Overrides(**{k: v for k, v in knobs.items() if k != "vec"})
        except ValueError as e:
            raise ValueError(f"NORMIR_TPR item {item!r} is not {TPR_FORM}: {e}") from None
        out[(m[1], int(m[2]))] = knobs
    return out


_derived: list[dict] = []  # the ops' fast-path tables, which hold handles too


def derived_cache(table: dict) -> dict:
    """Register an op's table of handles so that clear_handles() empties it as well."""
    _derived.append(table)
    return table


def clear_handles() -> None:
    """Forget loaded kernels' handles (after changing NORMIR_TPR, say); modules stay loaded."""
    _handles.clear()
    for table in _derived:
        table.clear()


def handle(problem: Problem, device: int) -> tuple[runtime.LaunchHandle, Layout]:
    """The loaded kernel and its layout for a problem on a device (its target is the device's;
    NORMIR_TPR's knobs for its kernel and N, if any, forced)."""
    key = (problem, device)
    hit = _handles.get(key)
    if hit is not None:
        return hit
    with _lock:
        hit = _handles.get(key)
        if hit is None:
            over = dict(tpr_overrides().get((problem.kernel, problem.n), {}))
            vec = min(problem.vec, over.pop("vec", problem.vec))  # a narrower vector than the pointers allow
            b = build(replace(problem, target=device_target(device), vec=vec), Overrides(**over))
            binary = library.get_binary(b)
            drv = runtime.driver(vendor())
            with _loading(drv):
                fn = drv.function(device, binary.key, binary.data, binary.entry)
                spec = KERNELS[problem.kernel]
                programmatic = ((spec.programmatic or b.problem.pdl)
                                and targets.get(b.problem.target).grid_dep_piece is not None)
                h = runtime.LaunchHandle(drv, fn, binary.entry, b.layout.block, spec.arg_names,
                                         tuple("p" if a.pointer else "q" for a in spec.args), b.layout.cluster,
                                         b.layout.smem_bytes, device, programmatic)
            hit = _handles[key] = (h, b.layout)
    return hit


@contextlib.contextmanager
def _loading(drv: runtime.Driver) -> Iterator[None]:
    """Where a kernel is first used inside a CUDA graph capture (torch.cuda.graph around a first
    call, a graphed callable captured without a warm-up of this shape), its module is loaded and
    its function queried (attributes, occupancy) with this thread's capture mode relaxed: the
    capture's default mode refuses a module load, and the refused call would also invalidate the
    user's capture. Nothing of it is enqueued on the capturing stream; the launch that follows is
    captured as any other. Should the driver still refuse, the error says to warm up first.
    Outside a capture nothing changes (the check costs one call, on a handle's first use only)."""
    if not (torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()):
        yield
        return
    try:
        with drv.relaxed_capture():
            yield
    except runtime.DriverError as e:
        if runtime.CAPTURE_HINT in str(e):
            raise
        raise runtime.DriverError(f"{e}{runtime.CAPTURE_HINT}") from e


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream(device: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


def vector_width(n: int, elem_bytes: int, pointers_and_bytes: tuple[tuple[int, int], ...],
                 strides: tuple[int, ...]) -> int:
    """The widest vector (elements) that N, every row stride and every pointer's alignment allow.

    pointers_and_bytes: (data_ptr, element bytes) of each tensor the kernel touches with vectors;
    a tensor's alignment must cover vec * its element size (capped at 16 bytes).
    """
    vec = MAX_VECTOR_BYTES // elem_bytes
    if n % vec == 0 and all(s % vec == 0 for s in strides) and all(p % MAX_VECTOR_BYTES == 0 for p, _ in pointers_and_bytes):
        return vec  # the common case: everything 16-byte aligned
    while vec > 1:
        if n % vec == 0 and all(s % vec == 0 for s in strides) and all(
            p % min(MAX_VECTOR_BYTES, vec * b) == 0 for p, b in pointers_and_bytes
        ):
            break
        vec //= 2
    return vec


def dtype_name(t: torch.dtype, what: str) -> str:
    try:
        return TORCH_DTYPES[t]
    except KeyError:
        raise TypeError(f"{what} has dtype {t}; normir supports torch.bfloat16, torch.float16 and "
                        f"torch.float32") from None


# Importing this module first (before normir.ops) brings torch in: the ops are defined now that
# everything above is (normir/__init__.py).
_bind_pending()
