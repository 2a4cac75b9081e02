"""Compiling specialized text: PTX/hsaco output, errors with reproduction files, the unregistered-op
check, stage dumps, the target pipelines, and the `normir compile` / `normir env` commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from normir import cli, compiler, targets, template
from normir.kernels import KERNELS
from normir.options import build
from normir.specialize import specialize, specialize_source

pytestmark = pytest.mark.cpu

MLIR_DIR = Path(__file__).resolve().parent.parent / "mlir"
_TID = "    %tid = gpu.thread_id x\n"


def _text(target: str = "sm_90", n: int = 1024, kernel: str = "rmsnorm_fwd") -> str:
    dt = "f32" if kernel == "rmsnorm_dw_reduce" else "bf16"
    return specialize(build(kernel=kernel, n=n, dtype=dt, target=target, **dict(KERNELS[kernel].requires)))


def _insert_after_tid(text: str, lines: str) -> str:
    assert text.count(_TID) >= 1
    return text.replace(_TID, _TID + lines, 1)


def _repro(err: compiler.CompileError) -> tuple[Path, str, bool]:
    """(file, pipeline, --expect-lowered) of the `normir opt` command an error prints."""
    msg = str(err)
    assert "reproduce with:" in msg
    m = re.search(r"normir opt (\S+) --pass-pipeline=(\S+|'[^']*')( --expect-lowered)?\s*$", msg)
    assert m, msg[-500:]
    return Path(m.group(1)), m.group(2).strip("'"), bool(m.group(3))


def _replay(err: compiler.CompileError, capsys) -> str:
    """Run the reproduction an error printed; return what it reported (it must fail)."""
    path, pipeline, lowered = _repro(err)
    argv = ["opt", str(path), "--pass-pipeline", pipeline] + (["--expect-lowered"] if lowered else [])
    capsys.readouterr()
    assert cli.main(argv) == 1
    return capsys.readouterr().err


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


@pytest.mark.parametrize("target", sorted(set(targets.TARGETS) - set(targets.PRIMARY)))
def test_other_targets_lower_the_prefetching_backward(target):
    """The backward asks L2 for its next row where the target has a prefetch piece; the targets
    outside CI's pair lower it too (NVPTX selects prefetch.global.L2 from sm_90 on, so sm_80 has
    no piece and refuses the knob; an abort in instruction selection would end the run)."""
    prefetch = targets.get(target).prefetch_piece is not None
    opts = build(kernel="rmsnorm_bwd", n=16384, dtype="bf16", target=target, stage=0, l2_prefetch=int(prefetch))
    assert opts.layout.l2_prefetch == prefetch
    isa = compiler.compile_text(specialize(opts), target, "isa").data.decode()
    assert KERNELS["rmsnorm_bwd"].entry in isa
    assert ("prefetch.global.L2" in isa) == prefetch
    if not prefetch:
        with pytest.raises(ValueError, match=f"l2_prefetch=1: {target} has no L2 prefetch"):
            _ = build(kernel="rmsnorm_bwd", n=16384, target=target, l2_prefetch=1).layout


def test_bad_format():
    with pytest.raises(ValueError, match="fmt='ptx'"):
        compiler.compile_text(_text(), "sm_90", "ptx")


def test_unknown_target():
    with pytest.raises(ValueError, match="target 'sm_75' is not supported"):
        compiler.compile_text(_text(), "sm_75", "isa")


# ---------------------------------------------------------------------------- errors


def test_syntax_error_has_reproduction(capsys):
    text = _text().replace("gpu.thread_id x", "gpu.thread_idd x", 1)
    with pytest.raises(compiler.CompileError) as e:
        compiler.compile_text(text, "sm_90", "isa")
    msg = str(e.value)
    assert msg.startswith("stage 'parse' failed for rmsnorm_fwd-sm_90-")
    line = text[:text.index("gpu.thread_idd")].count("\n") + 1
    assert f"error: <specialized>:{line}:12: custom op 'gpu.thread_idd' is unknown" in msg
    path, pipeline, _ = _repro(e.value)
    assert path.read_text() == text and pipeline == "builtin.module()"
    # The reproduction fails the same way, at the same line of the repro file.
    assert f"{path}:{line}:12: custom op 'gpu.thread_idd' is unknown" in _replay(e.value, capsys)


def _source(target: str = "sm_90", n: int = 1024, **kw):
    return specialize_source(build(kernel="rmsnorm_fwd", n=n, target=target, **kw))


def _line_of(path: Path, needle: str) -> int:
    return path.read_text()[:path.read_text().index(needle)].count("\n") + 1


@pytest.mark.parametrize("target", targets.PRIMARY)
def test_errors_name_the_template_line(target):
    # A typo in the kernel template is reported at the template's own line, not the spliced text's.
    src = _source(target)
    kernel = MLIR_DIR / "norm_fwd.mlir"
    bad_text = src.text.replace("gpu.thread_id x", "gpu.thread_idd x", 1)
    bad = template.Source(bad_text, src.origins)
    with pytest.raises(compiler.CompileError) as e:
        compiler.compile_text(bad, target, "isa")
    assert f"norm_fwd.mlir:{_line_of(kernel, 'gpu.thread_id x')}:12: custom op 'gpu.thread_idd'" in str(e.value)


def test_errors_name_the_piece_line():
    # A type mismatch inside a spliced piece names the piece's file and line, and the column where
    # a placeholder was filled maps back to the placeholder.
    src = _source()
    piece = MLIR_DIR / "common" / "butterfly.mlir"
    needle = "%s, %ok = gpu.shuffle xor %e, %offset, %width : f32"
    bad = template.Source(src.text.replace(needle, "%s, %ok = gpu.shuffle xor %e, %offset, %width : f16", 1),
                          src.origins)
    with pytest.raises(compiler.CompileError) as e:
        compiler.compile_text(bad, "sm_90", "isa")
    assert re.search(rf"error: \S*common/butterfly\.mlir:{_line_of(piece, needle)}:\d+: ", str(e.value)), str(e.value)
    o = src.origins[src.text[:src.text.index("%width = arith.constant 32")].count("\n")]
    assert o.file.endswith("common/butterfly.mlir")
    assert o.column(len("    %width = arith.constant 32") + 1) == len("    %width = arith.constant ${WARP}") + 1


def test_unlowered_op_is_named_at_its_line(capsys):
    # Parses and verifies, but no pass of the llvm stage lowers the tensor ops: the first op left is
    # named with its line (instead of the module being printed), and the repro fails the same way.
    bad = _insert_after_tid(_text(), (
        "    %tt = tensor.empty() : tensor<4xf32>\n"
        "    %te = tensor.extract %tt[%c0] : tensor<4xf32>\n"
        "    %r1 = memref.reinterpret_cast %rstd_arg to offset: [0], sizes: [4], strides: [1]"
        " : memref<1xf32> to memref<4xf32>\n"
        "    memref.store %te, %r1[%c0] : memref<4xf32>\n"))
    with pytest.raises(compiler.CompileError) as e:
        compiler.compile_text(bad, "sm_90", "isa")
    msg = str(e.value)
    line = bad[:bad.index("tensor.empty")].count("\n") + 1
    assert msg.startswith("stage 'llvm' failed")
    assert f"'tensor.empty' at <specialized>:{line}:11 is not lowered" in msg
    assert len(msg) < 2000  # not the module
    path, pipeline, lowered = _repro(e.value)
    assert pipeline == targets.get("sm_90").stages("isa")["llvm"] and lowered
    assert "gpu.module" in path.read_text() and path.read_text() != bad  # the llvm stage's input
    assert "'tensor.empty' at" in _replay(e.value, capsys)


def test_repro_folder_is_reused():
    text = _text().replace("gpu.thread_id x", "gpu.thread_idd x", 1)
    paths = set()
    for _ in range(2):
        with pytest.raises(compiler.CompileError) as e:
            compiler.compile_text(text, "sm_90", "isa")
        paths.add(_repro(e.value)[0])
    (path,) = paths
    assert path.parent.parent == compiler.repro_root()
    assert sorted(p.name for p in path.parent.iterdir()) == ["repro-parse.mlir", "repro-parse.sh"]


@pytest.mark.parametrize("target, dialect", [("sm_90", "nvvm"), ("gfx950", "rocdl")])
def test_unregistered_op(target, dialect):
    # nvvm/rocdl parse unknown op names in generic form; the check must catch them before lowering.
    bad = _insert_after_tid(_text(target), f'    "{dialect}.not_an_op"() : () -> ()\n')
    with pytest.raises(compiler.CompileError, match=r"unregistered operations") as e:
        compiler.compile_text(bad, target, "isa")
    line = bad[:bad.index("not_an_op")].count("\n") + 1
    assert f"{dialect}.not_an_op at <specialized>:{line}:5" in str(e.value)


def test_unknown_dialect_rejected():
    bad = _insert_after_tid(_text(), '    "nodialect.op"() : () -> ()\n')
    with pytest.raises(compiler.CompileError, match="stage 'parse' failed"):
        compiler.compile_text(bad, "sm_90", "isa")


def test_ptxas_error_names_stage_and_specialization(tmp_path, monkeypatch):
    # A ptxas that fails: the error names the stage and the specialization.
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\necho 'ptxas fatal : fake failure' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    opts = build(kernel="rmsnorm_fwd", n=1024)
    with pytest.raises(compiler.CompileError) as e:
        compiler.compile_text(specialize_source(opts), "sm_90", "bin", what=opts.describe())
    msg = str(e.value)
    assert msg.startswith("stage 'bin' failed for rmsnorm_fwd-sm_90-") and "(rmsnorm_fwd n=1024 sm_90)" in msg


# ---------------------------------------------------------------------------- dumps


def _only_dir(root: Path) -> Path:
    (d,) = list(root.iterdir())
    return d


def test_dump_dir_numbered_stages(tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    monkeypatch.setenv("NORMIR_DUMP_DIR", str(dump))
    art = compiler.compile_text(_text(), "sm_90", "isa")
    d = _only_dir(dump)
    assert d.name == compiler.default_label(_text(), "sm_90") and d.name.startswith("rmsnorm_fwd-sm_90-")
    names = sorted(p.name for p in d.iterdir())
    assert names == ["00_input.mlir", "01_unroll.mlir", "02_llvm.mlir", "03_isa.s"]
    assert (d / "00_input.mlir").read_text() == _text()
    assert "affine.for" not in (d / "01_unroll.mlir").read_text()
    assert "llvm.func" in (d / "02_llvm.mlir").read_text()
    assert (d / "03_isa.s").read_bytes() == art.data
    # Another specialization gets a folder of its own: nothing is overwritten.
    compiler.compile_text(_text(n=2048), "sm_90", "isa")
    assert len(list(dump.iterdir())) == 2


def test_dump_dir_isa_next_to_binary(tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    monkeypatch.setenv("NORMIR_DUMP_DIR", str(tmp_path / "ignored"))
    art = compiler.compile_text(_text("gfx950"), "gfx950", "bin", keep=("isa",), dump_dir=str(dump), label="k")
    assert sorted(p.name for p in (dump / "k").iterdir()) == [
        "00_input.mlir", "01_unroll.mlir", "02_llvm.mlir", "03_isa.s", "04_bin.bin"]
    assert (dump / "k" / "04_bin.bin").read_bytes() == art.data
    assert (dump / "k" / "03_isa.s").read_text() == art.stages["isa"]
    assert not (tmp_path / "ignored").exists()


def test_failing_stage_repro_next_to_the_dump(tmp_path):
    text = _text().replace("gpu.thread_id x", "gpu.thread_idd x", 1)
    with pytest.raises(compiler.CompileError) as e:
        compiler.compile_text(text, "sm_90", "isa", dump_dir=str(tmp_path), label="k")
    assert _repro(e.value)[0] == tmp_path / "k" / "repro-parse.mlir"


def test_unwritable_dump_dir_is_one_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(compiler.CompileError, match=r"cannot write the stage dump .* NORMIR_DUMP_DIR"):
        compiler.compile_text(_text(), "sm_90", "isa", dump_dir=str(blocker))


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
    assert cli.main(["compile", str(MLIR_DIR / "norm_fwd.mlir"), "--n", "2880", "--emit", "input"]) == 0
    out = capsys.readouterr().out
    assert "memref<2880xbf16>" in out
    assert "${" not in out
    assert out == specialize(build(kernel="rmsnorm_fwd", n=2880))


def test_cli_compile_set_overrides_placeholder(capsys):
    assert cli.main(["compile", "rmsnorm_fwd", "--n", "1024", "--emit", "input", "--set", "EPS=1.0e-05"]) == 0
    assert "%eps = arith.constant 1.0e-05 : f32" in capsys.readouterr().out


def test_cli_compile_gfx950_isa(capsys):
    rc = cli.main(["compile", str(MLIR_DIR / "norm_fwd.mlir"), "--target", "gfx950", "--n", "2880", "--emit", "isa"])
    assert rc == 0
    assert "global_load_dwordx4" in capsys.readouterr().out


def test_cli_compile_bin_to_file(tmp_path, capsys):
    out = tmp_path / "k.hsaco"
    assert cli.main(["compile", "rmsnorm_fwd", "--target", "gfx950", "--n", "1024", "--emit", "bin", "-o", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x7fELF"
    assert cli.main(["compile", "rmsnorm_fwd", "--target", "gfx950", "--n", "1024", "--emit", "bin"]) == 1
    assert "normir: --emit bin writes binary: give -o FILE" in capsys.readouterr().err


def _err(argv: list[str], capsys) -> str:
    """The one-line error of a failing command (no traceback)."""
    capsys.readouterr()
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("normir: ") and "Traceback" not in err, err
    return err


def test_cli_compile_errors(tmp_path, capsys):
    assert "mystery.mlir: no such file" in _err(["compile", str(tmp_path / "mystery.mlir")], capsys)
    (tmp_path / "mystery.mlir").write_text("")
    assert "cannot tell which kernel" in _err(["compile", str(tmp_path / "mystery.mlir")], capsys)
    assert "normir: n=0 is out of range" in _err(["compile", "rmsnorm_fwd", "--n", "0", "--emit", "input"], capsys)
    # A typo in a hand-edited kernel file: an unknown placeholder, at its line.
    src = tmp_path / "norm_fwd.mlir"
    src.write_text((MLIR_DIR / "norm_fwd.mlir").read_text().replace("${BLOCK}", "${BLOKC}", 1))
    line = _line_of(src, "${BLOKC}")
    assert f"norm_fwd.mlir:{line}: placeholder ${{BLOKC}} has no value" in _err(["compile", str(src), "--emit", "input"],
                                                                                   capsys)
    assert "-o /nonexistent/k.s: cannot write it" in _err(["compile", "rmsnorm_fwd", "-o", "/nonexistent/k.s"], capsys)
    assert "--include /nonexistent: no such folder" in _err(["compile", "rmsnorm_fwd", "--include", "/nonexistent"],
                                                            capsys)


def test_cli_set_is_strict(capsys):
    base = ["compile", "rmsnorm_fwd", "--n", "1024", "--emit", "input"]
    assert "--set NOPE: the text has no such placeholder; it uses " in _err(base + ["--set", "NOPE=1"], capsys)
    assert "--set EPS: give NAME=VALUE" in _err(base + ["--set", "EPS"], capsys)
    assert "is not a placeholder name" in _err(base + ["--set", "eps=1"], capsys)
    # Layout values go through the layout's checks: --set refuses them and names the knob.
    assert "${TPR} follows from the row layout" in _err(base + ["--set", "TPR=64"], capsys) and \
        "force it with --tpr" in _err(base + ["--set", "TPR=64"], capsys)
    assert "--set K:" in _err(base + ["--set", "K=4"], capsys)
    # A user-given value that the text does not use is an error naming it.
    reduce = ["compile", "rmsnorm_dw_reduce", "--n", "1024", "--dtype", "f32", "--emit", "input"]
    assert "--eps was given, but the text uses no ${EPS}" in _err(reduce + ["--eps", "1e-5"], capsys)
    assert "--store-rstd was given" in _err(reduce + ["--store-rstd"], capsys)
    assert cli.main(reduce + ["--wdtype", "f16"]) == 0  # the reduction uses the weight's type


def test_cli_unused_value_in_an_edited_file(tmp_path, capsys):
    # An edited math piece that no longer uses ${EPS}: --eps is an error, not silently ignored.
    (tmp_path / "common").mkdir()
    piece = (MLIR_DIR / "common" / "stats_rms.mlir").read_text().replace("${EPS}", "1.0e-06")
    (tmp_path / "common" / "stats_rms.mlir").write_text(piece)
    argv = ["compile", "rmsnorm_fwd", "--include", str(tmp_path), "--emit", "input"]
    assert "--eps was given, but the text uses no ${EPS}" in _err(argv + ["--eps", "1e-5"], capsys)
    assert cli.main(argv) == 0


def test_cli_include_takes_pieces_first(tmp_path, capsys):
    # A piece in an --include folder (and a copied kernel's own folder) is spliced instead of the
    # package's, and the command says which files came from outside the package.
    (tmp_path / "inc" / "common").mkdir(parents=True)
    piece = (MLIR_DIR / "common" / "rsqrt_nvvm.mlir").read_text().replace("normir common piece", "local piece")
    (tmp_path / "inc" / "common" / "rsqrt_nvvm.mlir").write_text(piece)
    assert cli.main(["compile", "rmsnorm_fwd", "--emit", "input", "--include", str(tmp_path / "inc")]) == 0
    cap = capsys.readouterr()
    assert "local piece: rsqrt" in cap.out and "from outside the installed package" in cap.err
    assert "rsqrt_nvvm.mlir" in cap.err
    (tmp_path / "copy" / "common").mkdir(parents=True)
    (tmp_path / "copy" / "common" / "rsqrt_nvvm.mlir").write_text(piece)
    (tmp_path / "copy" / "norm_fwd.mlir").write_text((MLIR_DIR / "norm_fwd.mlir").read_text())
    assert cli.main(["compile", str(tmp_path / "copy" / "norm_fwd.mlir"), "--emit", "input"]) == 0
    assert "local piece: rsqrt" in capsys.readouterr().out


def test_cli_opt_runs_a_pipeline(tmp_path, capsys):
    f = tmp_path / "m.mlir"
    f.write_text("module {\n  func.func @f() -> i32 {\n    %a = arith.constant 1 : i32\n"
                 "    %b = arith.addi %a, %a : i32\n    return %b : i32\n  }\n}\n")
    assert cli.main(["opt", str(f), "--pass-pipeline", "builtin.module(canonicalize)"]) == 0
    assert "arith.constant 2 : i32" in capsys.readouterr().out
    assert "does not parse" in _err(["opt", str(f), "--pass-pipeline", "builtin.module(nope)"], capsys)
    assert "no such file" in _err(["opt", str(tmp_path / "x.mlir"), "--pass-pipeline", "builtin.module()"], capsys)


def test_cli_aot_plan_errors(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    for content, msg in (('[{"kernel": "rmsnorm_fwd", "nn": 5}]', r"entry 0: unknown field\(s\) \['nn'\]"),
                         ('[{"kernel": "rmsnorm_fwd", "n": 0}]', "entry 0: n=0 is out of range"),
                         ('{"kernel": "rmsnorm_fwd"}', "a plan is a JSON list"),
                         ("[1]", "entry 0 is not an object"),
                         ("[", "not JSON")):
        plan.write_text(content)
        assert re.search(msg, _err(["aot", str(plan), "--out", str(tmp_path / "o")], capsys))
    assert "cannot read the plan" in _err(["aot", str(tmp_path / "none.json"), "--out", str(tmp_path / "o")], capsys)
    plan.write_text("[]")
    (tmp_path / "blocker").write_text("")
    assert "--out" in _err(["aot", str(plan), "--out", str(tmp_path / "blocker" / "o")], capsys)


def test_cli_debug_keeps_the_traceback(capsys):
    assert cli.main(["compile", "rmsnorm_fwd", "--n", "0", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_cli_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["compile", "--help"])
    out = capsys.readouterr().out
    assert "(default: 4096)" in out and "(default: sm_90)" in out


def test_cli_env(capsys, monkeypatch):
    monkeypatch.setenv("NORMIR_TPR", "rmsnorm_fwd:4096=256")
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    for name in ("NORMIR_CACHE_DIR", "NORMIR_AOT_DIRS", "NORMIR_DUMP_DIR", "NORMIR_NO_COMPILE", "NORMIR_INCLUDE"):
        assert name in out
    assert "NORMIR_TPR='rmsnorm_fwd:4096=256' (environment" in out
    assert "NORMIR_DUMP_DIR='' (default" in out
    assert "bindings: flydsl 0.5.0" in out and "ptxas:" in out and "ld.lld:" in out
    assert f"cache key toolchain part: {compiler.toolchain_version()}" in out


def test_toolchain_names_ld_lld():
    assert re.search(r"\+lld\d+\.\d+", compiler.toolchain_version()) or not targets.lld_path()


# ---------------------------------------------------------------------------- no torch, no warnings


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300)


def test_compiling_imports_no_torch():
    # The compiler loads flydsl's MLIR bindings without running flydsl's __init__ (which imports
    # torch, about 1.9 s): a compile in a fresh interpreter leaves torch unloaded, and prints nothing.
    r = _fresh("import sys\n"
               "from normir import compiler\n"
               "from normir.options import build\n"
               "from normir.specialize import specialize_source\n"
               "o = build(kernel='rmsnorm_fwd', n=1024, target='gfx950')\n"
               "compiler.compile_text(specialize_source(o), 'gfx950', 'isa')\n"
               "assert 'torch' not in sys.modules, 'torch was imported'\n"
               "assert 'numpy' not in sys.modules, 'numpy was imported'\n"
               "import flydsl\n"
               "assert flydsl.__version__ == '0.5.0'  # the rest of flydsl still loads on use\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""


def test_cli_commands_print_no_warnings(tmp_path):
    for argv in (["compile", "rmsnorm_fwd", "--target", "gfx950", "--emit", "isa", "-o", str(tmp_path / "k.s")],
                 ["env"]):
        r = subprocess.run([sys.executable, "-W", "error", "-m", "normir.cli", *argv], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0 and r.stderr == "", r.stderr
