"""Torch-facing launch plumbing: device -> target, the kernel handle cache, streams, vector width.

The hot path (a dict hit, a few int operations and one ctypes call) never imports MLIR, hashes
kernel text or builds Options; those happen once per (kernel, shape, dtype, device) on a miss.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from functools import cache

import torch

from . import env, library, runtime, targets
from .kernels import KERNELS
from .layout import MAX_VECTOR_BYTES, Layout
from .options import Options

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


_TPR_ITEM = re.compile(r"(\w+):(\d+)=(\d+)(?:x(\d+))?(?:p([01]))?(?:s([01]))?(?:m(\d+))?(?:h(\d+))?(?:v(\d+))?"
                       r"(?:o(\d+))?(?:r([01]))?(?:b([01]))?(?:d([0-3]))?(?:n(\d+))?(?:w([01]))?(?:t([01]))?(?:g([01]))?")


def tpr_overrides() -> dict[tuple[str, int], dict[str, int]]:
    """NORMIR_TPR parsed: {(kernel, n): Options fields}: tpr (threads per row), cluster (blocks
    per row), l2_prefetch, stage, min_blocks, hints, vec (elements per vector access, at most
    what the tensors' alignment allows), overlap, cache_row, batch_reload (b), db_smem (d) and
    max_regs (n), cast_words (w), two_pass (t) and stage_dres (g); the policy's values (0, 0, -1, -1, 0,
    -1, 0, -1, -1, -1, -1, 0, -1, -1, -1) where omitted."""
    out = {}
    for item in filter(None, (p.strip() for p in env.TPR.get().split(","))):
        m = _TPR_ITEM.fullmatch(item)
        if m is None:
            raise ValueError(f"NORMIR_TPR item {item!r} is not KERNEL:N=TPR[xCLUSTER][p0|p1][s0|s1][mBLOCKS]"
                             "[hHINTS][vVEC][oCHUNKS][r0|r1][b0|b1][d0-d3][nREGS][w0|w1][t0|t1][g0|g1] "
                             "(e.g. rmsnorm_bwd:65536=512x2p0s1m2h1)")
        out[(m[1], int(m[2]))] = dict(tpr=int(m[3]), cluster=int(m[4] or 0), l2_prefetch=int(m[5]) if m[5] else -1,
                                      stage=int(m[6]) if m[6] else -1, min_blocks=int(m[7] or 0),
                                      hints=int(m[8]) if m[8] else -1, vec=int(m[9] or 0),
                                      overlap=int(m[10]) if m[10] else -1, cache_row=int(m[11]) if m[11] else -1,
                                      batch_reload=int(m[12]) if m[12] else -1,
                                      db_smem=int(m[13]) if m[13] else -1, max_regs=int(m[14] or 0),
                                      cast_words=int(m[15]) if m[15] else -1,
                                      two_pass=int(m[16]) if m[16] else -1,
                                      stage_dres=int(m[17]) if m[17] else -1)
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


def handle(kernel: str, device: int, n: int, dtype: str, wdtype: str, eps: float, has_weight: bool,
           store_rstd: bool, vec: int, atomic_dw: bool = False, extra: tuple[tuple[str, object], ...] = ()
           ) -> tuple[runtime.LaunchHandle, Layout]:
    """The loaded kernel and its layout for a problem; extra: more Options fields as (name, value)
    pairs (the fused ops' dtypes and flags)."""
    key = (kernel, device, n, dtype, wdtype, eps, has_weight, store_rstd, vec, atomic_dw, extra)
    hit = _handles.get(key)
    if hit is not None:
        return hit
    with _lock:
        hit = _handles.get(key)
        if hit is None:
            over = dict(tpr_overrides().get((kernel, n), {}))
            vec = min(vec, over.pop("vec", 0) or vec)  # a narrower vector than the pointers allow
            opts = Options(kernel=kernel, n=n, dtype=dtype, wdtype=wdtype, eps=eps,
                           target=device_target(device), has_weight=has_weight,
                           store_rstd=store_rstd, vec=vec, atomic_dw=atomic_dw, **dict(extra), **over)
            binary = library.get_binary(opts)
            drv = runtime.driver(vendor())
            with _loading(drv):
                fn = drv.function(device, binary.key, binary.data, binary.entry)
                spec = KERNELS[kernel]
                programmatic = spec.programmatic and targets.get(opts.target).grid_dep_piece is not None
                h = runtime.LaunchHandle(drv, fn, binary.entry, opts.layout.block, spec.arg_names,
                                         tuple("p" if a.pointer else "q" for a in spec.args), opts.layout.cluster,
                                         opts.layout.smem_bytes, device, programmatic)
            hit = _handles[key] = (h, opts.layout)
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
