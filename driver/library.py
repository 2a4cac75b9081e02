"""Build -> binary: from the caches when present, else compiled (and stored). No MLIR import
unless a compile is needed; runtime-only machines never reach the compiler."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from . import cache, compiler, env, targets
from .kernels import KERNELS
from .options import Build
from .specialize import specialize_source


class KernelNotAvailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Binary:
    build: Build
    entry: str
    fmt: str
    data: bytes
    key: str


def key_for(b: Build, fmt: str, text: str | None = None) -> str:
    text = specialize_source(b).text if text is None else text
    pipeline = compiler.pipeline_text(b.problem.target, fmt, b.layout.unroll_limit)
    return cache.cache_key(b.key_string(), pipeline, text)


def _have_compiler() -> bool:
    return compiler.toolchain_version() != "none"


def get_binary(b: Build, *, compile_missing: bool | None = None, root: Path | None = None) -> Binary:
    """The binary for a build: own toolchain's cache entry, else (no compiler here) any toolchain's,
    else a fresh compile stored in the writable cache. root: that cache folder alone, read and
    written (`normir aot`'s), in place of NORMIR_AOT_DIRS and NORMIR_CACHE_DIR."""
    tgt = targets.get(b.problem.target)
    spec = KERNELS[b.problem.kernel]
    source = specialize_source(b)
    text = source.text
    have = _have_compiler()
    toolchain = compiler.toolchain_version() if have else None
    for fmt in tgt.binary_formats:
        key = key_for(b, fmt, text)
        entry = cache.lookup(key, toolchain, roots=[root] if root is not None else None)
        if entry is not None:
            return Binary(b, spec.entry, fmt, entry.data, key)
    if compile_missing is None:
        compile_missing = env.NO_COMPILE.get() != "1"
    if not (have and compile_missing):
        why = "NORMIR_NO_COMPILE=1" if have else "the MLIR bindings are not installed (pip install flydsl==0.5.0)"
        raise KernelNotAvailable(
            f"no compiled kernel for {b.describe()} in {[str(r) for r in cache.read_roots()]} and {why}; "
            f"build it ahead with `normir aot` and point NORMIR_AOT_DIRS at the folder"
        )
    fmt = tgt.default_format()
    key = key_for(b, fmt, text)
    art = compiler.compile_text(source, b.problem.target, fmt, unroll_limit=b.layout.unroll_limit,
                                label=f"{b.problem.kernel}-{b.problem.target}-{key[:10]}", what=b.describe())
    meta = {"options": b.key_string(), "fmt": fmt, "entry": spec.entry, "target": b.problem.target}
    try:
        cache.store(key, compiler.toolchain_version(), art.data, meta, root=root)
    except OSError as e:
        _warn_unwritable(cache.write_root(), e)
    return Binary(b, spec.entry, fmt, art.data, key)


_warned: set[str] = set()


def _warn_unwritable(root, err: OSError) -> None:
    """A cache that cannot be written: the kernel is used from memory (compiled again by the next
    process), and the user is told once per folder how to fix it."""
    if str(root) in _warned:
        return
    _warned.add(str(root))
    warnings.warn(f"normir: cannot write the kernel cache at {root} ({err.strerror or err}); compiled kernels are "
                  f"kept in memory only. Set NORMIR_CACHE_DIR to a writable folder.", RuntimeWarning, stacklevel=3)
