"""On-disk cache of compiled kernels, and the AOT folders made from it. No MLIR import.

Layout: <root>/<key[:2]>/<key>/<toolchain>.bin + <toolchain>.json, where key hashes the options,
the full pipeline text and the specialized kernel text, and <toolchain> names the compiler that
made the binary. A machine with the compiler looks up its own toolchain's entry; a machine
without one (runtime only, e.g. a GPU node fed by `normir aot`) takes any toolchain's entry.
Writes go to a temporary file and os.replace (atomic); the JSON holds the binary's sha256, so a
torn or corrupt entry is detected and treated as a miss (then rebuilt).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import env


@dataclass(frozen=True)
class Entry:
    data: bytes
    meta: dict


def cache_key(options_key: str, pipeline: str, text: str) -> str:
    h = hashlib.sha256()
    for part in (options_key, pipeline, text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _slug(toolchain: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", toolchain)


def read_roots() -> list[Path]:
    """AOT folders first (read-only), then the writable cache."""
    aot = [Path(p) for p in env.AOT_DIRS.get().split(os.pathsep) if p]
    return [*aot, write_root()]


def write_root() -> Path:
    return Path(env.CACHE_DIR.get())


def _entry_dir(root: Path, key: str) -> Path:
    return root / key[:2] / key


def _read(json_path: Path) -> Entry | None:
    try:
        meta = json.loads(json_path.read_text())
        data = json_path.with_name(json_path.name[: -len(".json")] + ".bin").read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        return None  # torn or corrupt: a miss
    return Entry(data, meta)


def lookup(key: str, toolchain: str | None, roots: list[Path] | None = None) -> Entry | None:
    """The entry for key; made by `toolchain`, or by any toolchain when it is None."""
    for root in roots if roots is not None else read_roots():
        d = _entry_dir(root, key)
        if toolchain is not None:
            candidates = [d / f"{_slug(toolchain)}.json"]
        else:
            try:
                candidates = sorted(d.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
            except OSError:
                continue
        for c in candidates:
            entry = _read(c)
            if entry is not None:
                return entry
    return None


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def store(key: str, toolchain: str, data: bytes, meta: dict, root: Path | None = None) -> Path:
    """Write the binary, then its JSON (the JSON's presence marks the entry complete)."""
    d = _entry_dir(root or write_root(), key)
    slug = _slug(toolchain)  # may contain dots: build the names, never with_suffix()
    meta = {**meta, "toolchain": toolchain, "sha256": hashlib.sha256(data).hexdigest(), "key": key}
    _atomic_write(d / f"{slug}.bin", data)
    _atomic_write(d / f"{slug}.json", json.dumps(meta, indent=1, sort_keys=True).encode())
    return d / f"{slug}.bin"
