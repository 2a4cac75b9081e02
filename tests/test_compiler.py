"""Compiling specialized text: PTX/hsaco output, errors with reproduction files, the unregistered-op
check, stage dumps, the target pipelines, and the `normir compile` / `normir env` commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from normir import cli, compiler, targets
from normir.kernels import KERNELS
from normir.specialize import Options, specialize

pytestmark = pytest.mark.cpu

MLIR_DIR = Path(__file__).resolve().parent.parent / "mlir"
_TID = "    %tid = gpu.thread_id x\n"


def _text(target: str = "sm_90", n: int = 1024, kernel: str = "rmsnorm_fwd") -> str:
    dt = "f32" if kernel == "rmsnorm_dw_reduce" else "bf16"
    return specialize(Options(kernel=kernel, n=n, dtype=dt, target=target))


def _insert_after_tid(text: str, lines: str) -> str:
    assert text.count(_TID) >= 1
    return text.replace(_TID, _TID + lines, 1)


def _repro_path(err: compiler.CompileError) -> Path:
    msg = str(err)
    assert "reproduce with:" in msg
    m = re.search(r"mlir-opt --pass-pipeline='([^']*)' (\S+)\s*$", msg)
    assert m, msg[-500:]
    return Path(m.group(2))


# ---------------------------------------------------------------------------- outputs


def test_sm90_ptx():
    art = compiler.compile_text(_text("sm_90"), "sm_90", "isa")
    assert art.fmt == "isa"
    ptx = art.data.decode()
    assert ".target sm_90" in ptx
    assert ".entry rmsnorm_fwd(" in ptx
    assert re.search(r"ld\.global(\.nc)?\.v4", ptx), "16-byte loads expected for N=1024 bf16"
    assert "llvm" not in art.stages and "input" not in art.stages  # only the stages asked for


def test_gfx950_hsaco():
    art = compiler.compile_text(_text("gfx950"), "gfx950", "bin", keep=("input", "llvm", "isa"))
    assert art.fmt == "bin"
    assert art.data[:4] == b"\x7fELF"
    assert b"rmsnorm_fwd" in art.data
    assert set(art.stages) == {"input", "llvm", "isa"}
    assert art.stages["input"] == _text("gfx950")
    assert "llvm.func @rmsnorm_fwd" in art.stages["llvm"]
    assert "global_load_dwordx4" in art.stages["isa"] and ".amdgcn_target" in art.stages["isa"]


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("target", targets.PRIMARY)
def test_every_kernel_compiles(kernel, target):
    art = compiler.compile_text(_text(target, 2880, kernel), target, "isa")
    isa = art.data.decode()
    entry = KERNELS[kernel].entry
    if targets.get(target).is_nvidia:
        assert f".entry {entry}(" in isa
        assert ".local" not in isa, "the kernel spills or keeps a private array in local memory"
    else:
        assert f"{entry}:" in isa
        assert re.search(r"\.private_segment_fixed_size:\s+0\b", isa), "scratch use on gfx950"


def test_bad_format():
    with pytest.raises(ValueError, match="fmt='ptx'"):
        compiler.compile_text(_text(), "sm_90", "ptx")


def test_unknown_target():
    with pytest.raises(ValueError, match="target 'sm_75' is not supported"):
        compiler.compile_text(_text(), "sm_75", "isa")


# ---------------------------------------------------------------------------- errors


def test_syntax_error_has_reproduction():
    text = _text().replace("gpu.thread_id x", "gpu.thread_idd x", 1)
    with pytest.raises(compiler.CompileError) as e:
        compiler.compile_text(text, "sm_90", "isa")
    msg = str(e.value)
    assert msg.startswith("stage 'parse' failed")
    assert "gpu.thread_idd" in msg
    path = _repro_path(e.value)
    assert path.is_file()
    assert path.read_text() == text


def test_stage_failure_reproduction_holds_the_stage_input():
    # Parses and verifies, but an index cast from the tensor op survives lowering: LLVM translation fails.
    bad = _insert_after_tid(_text(), (
        "    %tt = tensor.empty() : tensor<4xf32>\n"
        "    %te = tensor.extract %tt[%c0] : tensor<4xf32>\n"
        "    %r1 = memref.reinterpret_cast %rstd_arg to offset: [0], sizes: [4], strides: [1]"
        " : memref<1xf32> to memref<4xf32>\n"
        "    memref.store %te, %r1[%c0] : memref<4xf32>\n"))
    with pytest.raises(compiler.CompileError) as e:
        compiler.compile_text(bad, "sm_90", "isa")
    msg = str(e.value)
    m = re.match(r"stage '(\w+)' failed", msg)
    assert m and m.group(1) not in ("parse", "verify"), msg[:200]
    stage = m.group(1)
    assert f"--pass-pipeline='{targets.get('sm_90').stages('isa')[stage]}'" in msg
    path = _repro_path(e.value)
    assert path.is_file() and "gpu.module" in path.read_text()
    assert path.read_text() != bad  # the module as the failing stage received it


@pytest.mark.parametrize("target, dialect", [("sm_90", "nvvm"), ("gfx950", "rocdl")])
def test_unregistered_op(target, dialect):
    # nvvm/rocdl parse unknown op names in generic form; the check must catch them before lowering.
    bad = _insert_after_tid(_text(target), f'    "{dialect}.not_an_op"() : () -> ()\n')
    with pytest.raises(compiler.CompileError, match=r"unregistered operations") as e:
        compiler.compile_text(bad, target, "isa")
    assert f"{dialect}.not_an_op" in str(e.value)
    assert f"{dialect}.not_an_op at loc(" in str(e.value)


def test_unknown_dialect_rejected():
    bad = _insert_after_tid(_text(), '    "nodialect.op"() : () -> ()\n')
    with pytest.raises(compiler.CompileError, match="stage 'parse' failed"):
        compiler.compile_text(bad, "sm_90", "isa")


# ---------------------------------------------------------------------------- dumps


def test_dump_dir_numbered_stages(tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    monkeypatch.setenv("NORMIR_DUMP_DIR", str(dump))
    art = compiler.compile_text(_text(), "sm_90", "isa")
    names = sorted(p.name for p in dump.iterdir())
    assert names == ["00_input.mlir", "01_unroll.mlir", "02_llvm.mlir", "03_isa.s"]
    assert (dump / "00_input.mlir").read_text() == _text()
    assert "affine.for" not in (dump / "01_unroll.mlir").read_text()
    assert "llvm.func" in (dump / "02_llvm.mlir").read_text()
    assert (dump / "03_isa.s").read_bytes() == art.data


def test_dump_dir_isa_next_to_binary(tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    monkeypatch.setenv("NORMIR_DUMP_DIR", str(tmp_path / "ignored"))
    art = compiler.compile_text(_text("gfx950"), "gfx950", "bin", keep=("isa",), dump_dir=str(dump))
    assert sorted(p.name for p in dump.iterdir()) == [
        "00_input.mlir", "01_unroll.mlir", "02_llvm.mlir", "03_isa.s", "04_bin.bin"]
    assert (dump / "04_bin.bin").read_bytes() == art.data
    assert (dump / "03_isa.s").read_text() == art.stages["isa"]
    assert not (tmp_path / "ignored").exists()


def test_no_dump_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    compiler.compile_text(_text(), "sm_90", "isa")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- pipelines


@pytest.mark.parametrize("chip", sorted(targets.TARGETS))
def test_stage_pipelines_parse(chip):
    from flydsl._mlir import ir, passmanager

    tgt = targets.get(chip)
    for fmt in ("isa", "bin"):
        for limit in (targets.UNROLL_LIMIT, 0):
            stages = tgt.stages(fmt, limit)
            assert list(stages) == ["unroll", "llvm", fmt]
            assert list(stages) == [s for s in compiler.STAGE_ORDER if s in stages]
            with ir.Context():
                for pipeline in stages.values():
                    passmanager.PassManager.parse(pipeline)
            key_text = compiler.pipeline_text(chip, fmt, limit)  # part of the cache key
            assert stages["unroll"] in key_text and stages["llvm"] in key_text and f"format={fmt}" in key_text
    assert "unroll-full-threshold=0" in tgt.stages("isa", 0)["unroll"]


def test_toolchain_version_names_the_compiler():
    tc = compiler.toolchain_version()
    assert tc.startswith("flydsl-0.5.0+")


# ---------------------------------------------------------------------------- cli


def test_cli_compile_emit_input(capsys):
    assert cli.main(["compile", str(MLIR_DIR / "rmsnorm_fwd.mlir"), "--n", "2880", "--emit", "input"]) == 0
    out = capsys.readouterr().out
    assert "memref<2880xbf16>" in out
    assert "${" not in out
    assert out == specialize(Options(kernel="rmsnorm_fwd", n=2880))


def test_cli_compile_set_overrides_placeholder(capsys):
    assert cli.main(["compile", "rmsnorm_fwd", "--n", "1024", "--emit", "input", "--set", "EPS=1.0e-05"]) == 0
    assert "%eps = arith.constant 1.0e-05 : f32" in capsys.readouterr().out


def test_cli_compile_gfx950_isa(capsys):
    rc = cli.main(["compile", str(MLIR_DIR / "rmsnorm_fwd.mlir"), "--target", "gfx950", "--n", "2880", "--emit", "isa"])
    assert rc == 0
    assert "global_load_dwordx4" in capsys.readouterr().out


def test_cli_compile_bin_to_file(tmp_path, capsys):
    out = tmp_path / "k.hsaco"
    assert cli.main(["compile", "rmsnorm_fwd", "--target", "gfx950", "--n", "1024", "--emit", "bin", "-o", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x7fELF"
    with pytest.raises(SystemExit, match="give -o FILE"):
        cli.main(["compile", "rmsnorm_fwd", "--target", "gfx950", "--n", "1024", "--emit", "bin"])


def test_cli_compile_errors(tmp_path, capsys):
    with pytest.raises(SystemExit, match="cannot tell which kernel"):
        cli.main(["compile", str(tmp_path / "mystery.mlir"), "--emit", "input"])
    # Invalid options are reported, not raised.
    assert cli.main(["compile", "rmsnorm_fwd", "--n", "0", "--emit", "input"]) == 1
    assert "normir: n=0 is out of range" in capsys.readouterr().err
    # A typo in a hand-edited kernel file: an unknown placeholder.
    src = tmp_path / "rmsnorm_fwd.mlir"
    src.write_text((MLIR_DIR / "rmsnorm_fwd.mlir").read_text().replace("${BLOCK}", "${BLOKC}", 1))
    assert cli.main(["compile", str(src), "--emit", "input"]) == 1
    assert "placeholder ${BLOKC} has no value" in capsys.readouterr().err


def test_cli_env(capsys):
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    for name in ("NORMIR_CACHE_DIR", "NORMIR_AOT_DIRS", "NORMIR_DUMP_DIR", "NORMIR_NO_COMPILE"):
        assert name in out
