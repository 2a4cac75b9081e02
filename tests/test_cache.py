"""The on-disk cache (atomic entries, corruption = miss, toolchain keys, AOT roots), library.get_binary's
cache -> compile path, `normir aot`, and the runtime path's independence from the MLIR bindings."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from normir import cache, compiler, library
from normir.options import build

pytestmark = pytest.mark.cpu

KEY = hashlib.sha256(b"some kernel").hexdigest()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _flip_byte(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------- cache entries


def test_cache_key_parts():
    k = cache.cache_key("opts", "pipe", "text")
    assert len(k) == 64
    assert k == cache.cache_key("opts", "pipe", "text")
    assert k != cache.cache_key("opts", "pipe", "text2")
    assert k != cache.cache_key("opts", "pipe2", "text")
    assert k != cache.cache_key("opts2", "pipe", "text")
    assert cache.cache_key("ab", "c", "") != cache.cache_key("a", "bc", "")  # parts are delimited


def test_roots_follow_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMIR_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("NORMIR_AOT_DIRS", os.pathsep.join([str(tmp_path / "a1"), "", str(tmp_path / "a2")]))
    assert cache.write_root() == tmp_path / "c"
    assert cache.read_roots() == [tmp_path / "a1", tmp_path / "a2", tmp_path / "c"]
    monkeypatch.delenv("NORMIR_AOT_DIRS")
    assert cache.read_roots() == [tmp_path / "c"]


def test_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMIR_CACHE_DIR", str(tmp_path))
    assert cache.lookup(KEY, "tc-1") is None
    path = cache.store(KEY, "tc-1", b"\x7fELF binary", {"fmt": "bin"})
    assert path == tmp_path / KEY[:2] / KEY / "tc-1.bin"
    # Nothing but the entry's two files: the temporary files were renamed into place.
    assert _files(tmp_path) == [f"{KEY[:2]}/{KEY}/tc-1.bin", f"{KEY[:2]}/{KEY}/tc-1.json"]
    entry = cache.lookup(KEY, "tc-1")
    assert entry is not None and entry.data == b"\x7fELF binary"
    assert entry.meta["fmt"] == "bin" and entry.meta["toolchain"] == "tc-1" and entry.meta["key"] == KEY
    assert entry.meta["sha256"] == hashlib.sha256(b"\x7fELF binary").hexdigest()
    # Storing again replaces the entry.
    cache.store(KEY, "tc-1", b"new", {})
    assert cache.lookup(KEY, "tc-1").data == b"new"
    assert len(_files(tmp_path)) == 2


def test_toolchain_names_are_slugged(tmp_path):
    cache.store(KEY, "tool chain/1", b"x", {}, root=tmp_path)
    assert cache.lookup(KEY, "tool chain/1", roots=[tmp_path]).data == b"x"
    assert all("/" not in Path(f).name and " " not in f for f in _files(tmp_path))


@pytest.mark.parametrize("toolchain", ["flydsl-0.5.0+noptxas", "real"])
def test_round_trip_dotted_toolchain(tmp_path, toolchain):
    toolchain = compiler.toolchain_version() if toolchain == "real" else toolchain
    cache.store(KEY, toolchain, b"bits", {}, root=tmp_path)
    entry = cache.lookup(KEY, toolchain, roots=[tmp_path])
    assert entry is not None and entry.data == b"bits"


def test_toolchains_do_not_share_files(tmp_path):
    cache.store(KEY, "flydsl-0.5.0+noptxas", b"old", {}, root=tmp_path)
    cache.store(KEY, "flydsl-0.5.1+noptxas", b"new", {}, root=tmp_path)
    assert len(_files(tmp_path)) == 4


def test_corrupt_binary_is_a_miss(tmp_path):
    path = cache.store(KEY, "tc", bytes(range(256)), {}, root=tmp_path)
    _flip_byte(path)
    assert cache.lookup(KEY, "tc", roots=[tmp_path]) is None
    assert cache.lookup(KEY, None, roots=[tmp_path]) is None


def test_truncated_binary_is_a_miss(tmp_path):
    path = cache.store(KEY, "tc", bytes(range(256)), {}, root=tmp_path)
    path.write_bytes(path.read_bytes()[:100])
    assert cache.lookup(KEY, "tc", roots=[tmp_path]) is None


def test_missing_binary_is_a_miss(tmp_path):
    cache.store(KEY, "tc", b"data", {}, root=tmp_path).unlink()
    assert cache.lookup(KEY, "tc", roots=[tmp_path]) is None


@pytest.mark.parametrize("bad_json", ["", "{", '{"sha256": ', "[1, 2]", '"text"', "\x00\x01"])
def test_invalid_json_is_a_miss(tmp_path, bad_json):
    path = cache.store(KEY, "tc", b"data", {}, root=tmp_path)
    path.with_suffix(".json").write_text(bad_json)
    assert cache.lookup(KEY, "tc", roots=[tmp_path]) is None
    assert cache.lookup(KEY, None, roots=[tmp_path]) is None


def test_json_without_hash_is_a_miss(tmp_path):
    path = cache.store(KEY, "tc", b"data", {}, root=tmp_path)
    path.with_suffix(".json").write_text(json.dumps({"key": KEY}))
    assert cache.lookup(KEY, "tc", roots=[tmp_path]) is None


def test_any_toolchain_lookup(tmp_path):
    cache.store(KEY, "other-compiler", b"theirs", {}, root=tmp_path)
    assert cache.lookup(KEY, "my-compiler", roots=[tmp_path]) is None  # a compiler machine builds its own
    entry = cache.lookup(KEY, None, roots=[tmp_path])  # a runtime-only machine takes any
    assert entry is not None and entry.data == b"theirs"
    # A corrupt entry of one toolchain does not hide a good one of another.
    cache.store(KEY, "third-compiler", b"third", {}, root=tmp_path)
    _flip_byte(tmp_path / KEY[:2] / KEY / "third-compiler.bin", 0)
    assert cache.lookup(KEY, None, roots=[tmp_path]).data == b"theirs"


def test_aot_roots_first(tmp_path, monkeypatch):
    aot1, aot2, own = tmp_path / "aot1", tmp_path / "aot2", tmp_path / "own"
    monkeypatch.setenv("NORMIR_CACHE_DIR", str(own))
    monkeypatch.setenv("NORMIR_AOT_DIRS", os.pathsep.join([str(aot1), str(aot2)]))
    cache.store(KEY, "tc", b"own", {})
    assert _files(own) and not aot1.exists()  # stores go to the writable cache only
    assert cache.lookup(KEY, "tc").data == b"own"
    cache.store(KEY, "tc", b"aot2", {}, root=aot2)
    assert cache.lookup(KEY, "tc").data == b"aot2"
    cache.store(KEY, "tc", b"aot1", {}, root=aot1)
    assert cache.lookup(KEY, "tc").data == b"aot1"
    _flip_byte(aot1 / KEY[:2] / KEY / "tc.bin", 0)  # a corrupt AOT entry falls through to the next root
    assert cache.lookup(KEY, "tc").data == b"aot2"


def test_unreadable_root_is_skipped(tmp_path):
    missing = tmp_path / "does-not-exist"
    cache.store(KEY, "tc", b"x", {}, root=tmp_path / "real")
    assert cache.lookup(KEY, None, roots=[missing, tmp_path / "real"]).data == b"x"


# ---------------------------------------------------------------------------- get_binary


@pytest.fixture
def count_compiles(monkeypatch):
    calls = []
    real = compiler.compile_text

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "compile_text", counting)
    return calls


def _entry_files(root: Path, key: str) -> list[Path]:
    return sorted((root / key[:2] / key).glob("*.bin"))


def test_get_binary_compiles_then_recovers_from_corruption(tmp_path, monkeypatch, count_compiles):
    monkeypatch.setenv("NORMIR_CACHE_DIR", str(tmp_path))
    opts = build(kernel="rmsnorm_fwd", n=1024, target="gfx950")
    b = library.get_binary(opts)
    assert count_compiles == ["gfx950"]
    assert (b.entry, b.fmt, b.build) == ("rmsnorm_fwd", "bin", opts)
    assert b.data[:4] == b"\x7fELF"
    assert b.key == library.key_for(opts, "bin")
    [path] = _entry_files(tmp_path, b.key)
    assert cache.lookup(b.key, None).data == b.data
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["target"] == "gfx950" and meta["entry"] == "rmsnorm_fwd" and meta["options"] == opts.key_string()

    _flip_byte(path)
    assert cache.lookup(b.key, None) is None
    b2 = library.get_binary(opts)
    assert len(count_compiles) == 2  # rebuilt, not served corrupt
    assert b2.data == b.data
    entry = cache.lookup(b.key, None)
    assert entry is not None and entry.data == b.data


def test_unwritable_cache_warns_once_and_still_compiles(tmp_path, monkeypatch, count_compiles):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("NORMIR_CACHE_DIR", str(blocker / "cache"))  # below a file: cannot be made
    monkeypatch.setattr(library, "_warned", set())
    with pytest.warns(RuntimeWarning, match=r"cannot write the kernel cache at .*file/cache .* NORMIR_CACHE_DIR"):
        b = library.get_binary(build(kernel="rmsnorm_fwd", n=1024, target="sm_90"))
    assert b.data and len(count_compiles) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        library.get_binary(build(kernel="rmsnorm_fwd", n=2048, target="sm_90"))  # no second warning


def test_get_binary_second_call_is_a_cache_hit(tmp_path, monkeypatch, count_compiles):
    monkeypatch.setenv("NORMIR_CACHE_DIR", str(tmp_path))
    opts = build(kernel="rmsnorm_fwd", n=1024, target="sm_90")
    first = library.get_binary(opts)
    second = library.get_binary(opts)
    assert second.data == first.data
    assert len(count_compiles) == 1


def test_key_for_depends_on_text_and_unroll():
    opts = build(kernel="rmsnorm_fwd", n=1024, target="sm_90")
    assert library.key_for(opts, "isa") == library.key_for(opts, "isa")
    assert library.key_for(opts, "isa") != library.key_for(opts, "bin")
    assert library.key_for(opts, "isa") != library.key_for(opts, "isa", text="// other text")
    assert library.key_for(opts, "isa") != library.key_for(build(kernel="rmsnorm_fwd", n=1024, target="sm_80"), "isa")


def test_not_available_without_compiler(tmp_path, monkeypatch, count_compiles):
    monkeypatch.setenv("NORMIR_AOT_DIRS", str(tmp_path / "aot"))
    monkeypatch.setattr(library, "_have_compiler", lambda: False)
    with pytest.raises(library.KernelNotAvailable) as e:
        library.get_binary(build(kernel="rmsnorm_fwd", n=1024, target="sm_90"))
    msg = str(e.value)
    assert "normir aot" in msg and "NORMIR_AOT_DIRS" in msg and "pip install flydsl" in msg
    assert str(tmp_path / "aot") in msg
    assert count_compiles == []


def test_not_available_with_no_compile(monkeypatch, count_compiles):
    monkeypatch.setenv("NORMIR_NO_COMPILE", "1")
    with pytest.raises(library.KernelNotAvailable, match="NORMIR_NO_COMPILE=1") as e:
        library.get_binary(build(kernel="rmsnorm_fwd", n=1024, target="sm_90"))
    assert "normir aot" in str(e.value)
    with pytest.raises(library.KernelNotAvailable):
        library.get_binary(build(kernel="rmsnorm_fwd", n=1024, target="sm_90"), compile_missing=False)
    assert count_compiles == []


# ---------------------------------------------------------------------------- normir aot

PLAN = [
    {"kernel": "rmsnorm_fwd", "n": 1024, "dtype": "bf16", "wdtype": "bf16", "target": "sm_90"},
    {"kernel": "rmsnorm_fwd", "n": 1024, "dtype": "bf16", "wdtype": "bf16", "target": "gfx950"},
]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NORMIR_") or k in ("NORMIR_PTXAS", "NORMIR_ROCM_PATH")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def aot_dir(tmp_path_factory):
    """An AOT folder made by `normir aot` with the 2-entry plan. Run in a subprocess: the command
    sets NORMIR_CACHE_DIR in its own process and forks a worker pool."""
    root = tmp_path_factory.mktemp("aot")
    plan = root / "plan.json"
    plan.write_text(json.dumps(PLAN))
    out = root / "out"
    code = "import sys; from normir.cli import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "aot", str(plan), "--out", str(out), "--jobs", "1", "-v"],
                       capture_output=True, text=True, timeout=300,
                       env=_clean_env(NORMIR_CACHE_DIR=str(root / "unused-cache")))
    assert r.returncode == 0, r.stderr
    assert "aot: 2 specializations" in r.stdout
    assert r.stdout.count("rmsnorm_fwd n=1024") == 2
    assert not (root / "unused-cache").exists() or not any((root / "unused-cache").rglob("*.json"))
    return out


def test_aot_folder_holds_the_plan(aot_dir):
    metas = [json.loads(p.read_text()) for p in aot_dir.rglob("*.json")]
    assert sorted(m["target"] for m in metas) == ["gfx950", "sm_90"]
    for m in metas:
        assert m["toolchain"] == compiler.toolchain_version()


def _runtime_only(monkeypatch, aot_dir: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("NORMIR_AOT_DIRS", str(aot_dir))
    monkeypatch.setenv("NORMIR_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(library, "_have_compiler", lambda: False)


def test_aot_lookup_without_compiler(aot_dir, tmp_path, monkeypatch, count_compiles):
    _runtime_only(monkeypatch, aot_dir, tmp_path)
    b = library.get_binary(build(**PLAN[0]))
    assert b.entry == "rmsnorm_fwd" and len(b.data) > 0
    assert b.fmt in ("bin", "isa")
    assert count_compiles == []
    # Not in the plan: not available, and the message says how to fix that.
    with pytest.raises(library.KernelNotAvailable, match="normir aot"):
        library.get_binary(build(**{**PLAN[0], "n": 2048}))


def test_aot_lookup_without_compiler_gfx950(aot_dir, tmp_path, monkeypatch, count_compiles):
    _runtime_only(monkeypatch, aot_dir, tmp_path)
    b = library.get_binary(build(**PLAN[1]))
    assert b.data[:4] == b"\x7fELF"
    assert count_compiles == []


def test_aot_lookup_with_compiler_and_no_compile(aot_dir, tmp_path, monkeypatch, count_compiles):
    monkeypatch.setenv("NORMIR_AOT_DIRS", str(aot_dir))
    monkeypatch.setenv("NORMIR_NO_COMPILE", "1")
    b = library.get_binary(build(**PLAN[0]))
    assert len(b.data) > 0 and count_compiles == []


# ---------------------------------------------------------------------------- no MLIR on the runtime path


def _run_python(code: str, **env: str) -> None:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                       env=_clean_env(**env))
    assert r.returncode == 0, r.stdout + r.stderr


def test_runtime_imports_no_mlir(tmp_path):
    _run_python("""
        import sys
        import normir, normir.library, normir.cache, normir.runtime, normir.launch
        loaded = sorted(m for m in sys.modules if m == "flydsl" or m.startswith("flydsl."))
        assert not loaded, loaded
    """, NORMIR_CACHE_DIR=str(tmp_path))


def test_aot_lookup_imports_no_mlir(aot_dir, tmp_path):
    _run_python(f"""
        import sys
        from normir import library
        from normir.options import build
        library._have_compiler = lambda: False
        b = library.get_binary(build(**{PLAN[0]!r}))
        assert b.data
        loaded = sorted(m for m in sys.modules if m == "flydsl" or m.startswith("flydsl."))
        assert not loaded, loaded
    """, NORMIR_CACHE_DIR=str(tmp_path / "empty"), NORMIR_AOT_DIRS=str(aot_dir))
