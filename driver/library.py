"""Options -> binary: from the caches when present, else compiled (and stored). No MLIR import
unless a compile is needed; runtime-only machines never reach the compiler."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from . import cache, compiler, env, targets
from .kernels import KERNELS
from .options import Options
from .specialize import specialize_source


class KernelNotAvailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Binary:
    options: Options
    entry: str
    fmt: str
    data: bytes
    key: str


def key_for(opts: Options, fmt: str, text: str | None = None) -> str:
    text = specialize_source(opts).text if text is None else text
    pipeline = compiler.pipeline_text(opts.target, fmt, opts.layout.unroll_limit)
    return cache.cache_key(opts.key_string(), pipeline, text)


def _have_compiler() -> bool:
    return compiler.toolchain_version() != "none"


def get_binary(opts: Options, *, compile_missing: bool | None = None) -> Binary:
    """The binary for opts: own toolchain's cache entry, else (no compiler here) any toolchain's,
    else a fresh compile stored in the writable cache."""
    tgt = targets.get(opts.target)
    spec = KERNELS[opts.kernel]
    source = specialize_source(opts)
    text = source.text
    have = _have_compiler()
    toolchain = compiler.toolchain_version() if have else None
    for fmt in tgt.binary_formats:
        key = key_for(opts, fmt, text)
        entry = cache.lookup(key, toolchain)
        if entry is not None:
            return Binary(opts, spec.entry, fmt, entry.data, key)
    if compile_missing is None:
        compile_missing = env.NO_COMPILE.get() != "1"
    if not (have and compile_missing):
        why = "NORMIR_NO_COMPILE=1" if have else "the MLIR bindings are not installed (pip install flydsl==0.5.0)"
        raise KernelNotAvailable(
            f"no compiled kernel for {opts} in {[str(r) for r in cache.read_roots()]} and {why}; "
            f"build it ahead with `normir aot` and point NORMIR_AOT_DIRS at the folder"
        )
    fmt = tgt.default_format()
    key = key_for(opts, fmt, text)
    art = compiler.compile_text(source, opts.target, fmt, unroll_limit=opts.layout.unroll_limit,
                                label=f"{opts.kernel}-{opts.target}-{key[:10]}", what=opts.describe())
    meta = {"options": opts.key_string(), "fmt": fmt, "entry": spec.entry, "target": opts.target}
    try:
        cache.store(key, compiler.toolchain_version(), art.data, meta)
    except OSError as e:
        _warn_unwritable(cache.write_root(), e)
    return Binary(opts, spec.entry, fmt, art.data, key)


_warned: set[str] = set()


def _warn_unwritable(root, err: OSError) -> None:
    """A cache that cannot be written: the kernel is used from memory (compiled again by the next
    process), and the user is told once per folder how to fix it."""
    if str(root) in _warned:
        return
    _warned.add(str(root))
    warnings.warn(f"normir: cannot write the kernel cache at {root} ({err.strerror or err}); compiled kernels are "
                  f"kept in memory only. Set NORMIR_CACHE_DIR to a writable folder.", RuntimeWarning, stacklevel=3)
