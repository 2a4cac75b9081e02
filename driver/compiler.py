"""Specialized text -> binary: parse, verify, reject unregistered ops, run the target's stages.

The only module that imports the MLIR bindings (lazily, on the first compile), and it imports them
without torch (see bindings()). Stages are the ordered data in targets.Target.stages; they are
joined and run here and nowhere else. Diagnostics name the file and line the text came from
(template.Source's line map). With NORMIR_DUMP_DIR set, each stage's output is written below
DUMP_DIR/<kernel>-<target>-<short key>/; when a stage fails, the module it started from is written
to that folder (or to one reused temporary folder per specialization) with a `normir opt` command
that replays the failure.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import env, targets
from .template import Source

STAGE_ORDER = ("input", "unroll", "llvm", "isa", "bin")
# Dialects the llvm stage may leave: what the binary serializer translates.
LOWERED_DIALECTS = ("builtin", "gpu", "llvm", "nvvm", "rocdl")


class CompileError(RuntimeError):
    pass


@dataclass(frozen=True)
class Artifact:
    fmt: str  # "isa" | "bin"
    data: bytes
    stages: dict[str, str]  # stage name -> text (only those asked for)


def bindings():
    """(ir, passmanager, gpu) of flydsl's MLIR bindings, imported without running flydsl's package
    __init__: it imports flydsl.autotune and with it torch (about 1.9 s, most of a compile). The
    package module is created from its spec, unexecuted, so that `flydsl._mlir` (which needs no
    more of it) imports on its own; the real __init__ runs the first time anything else of the
    package is asked for (flydsl.__version__, flydsl.autotune, ...), so nothing changes for other
    users of flydsl in the same process."""
    if "flydsl" not in sys.modules:
        spec = importlib.util.find_spec("flydsl")
        if spec is None or spec.loader is None:
            raise CompileError(
                "compiling needs the MLIR Python bindings: `pip install flydsl==0.5.0` "
                "(or `pip install normir[compile]`); or bring precompiled kernels with `normir aot` "
                "and NORMIR_AOT_DIRS")
        pkg = importlib.util.module_from_spec(spec)

        def run_init(name: str):
            del pkg.__dict__["__getattr__"]
            spec.loader.exec_module(pkg)
            return getattr(pkg, name)

        pkg.__getattr__ = run_init
        sys.modules["flydsl"] = pkg
    if "flydsl._mlir.ir" not in sys.modules and "numpy" not in sys.modules:
        # ir.py registers a few attribute builders with numpy when it can import it (about 60 ms);
        # compiling text needs none of them, so a process without numpy yet stays without it.
        sys.modules["numpy"] = None  # type: ignore[assignment]
        try:
            from flydsl._mlir import ir
        finally:
            del sys.modules["numpy"]
    from flydsl._mlir import ir, passmanager
    from flydsl._mlir.dialects import gpu

    return ir, passmanager, gpu


def _tool_version(path: str | None, line: int) -> str:
    """A line of `path --version` (ptxas names its version last, ld.lld first)."""
    if not path:
        return "none"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[line] if lines else "unknown"


@lru_cache(maxsize=1)
def tools() -> dict[str, dict[str, str]]:
    """The toolchain found here: the bindings, ptxas, ld.lld; path and version of each."""
    import importlib.metadata

    try:
        fly = importlib.metadata.version("flydsl")
        spec = importlib.util.find_spec("flydsl")
        fly_path = str(Path(spec.origin).parent) if spec and spec.origin else "?"
    except importlib.metadata.PackageNotFoundError:
        fly, fly_path = "none", ""
    ptxas = targets.ptxas_path()
    lld = targets.lld_path()
    return {
        "bindings": {"version": f"flydsl {fly}" if fly != "none" else "none", "path": fly_path},
        "ptxas": {"version": _tool_version(ptxas, -1), "path": ptxas or ""},
        "ld.lld": {"version": _tool_version(lld, 0), "path": lld or ""},
    }


@lru_cache(maxsize=1)
def toolchain_version() -> str:
    """Names the compiler that made a binary (bindings, ptxas, ld.lld); part of every cache key.
    No MLIR import."""
    t = tools()
    if t["bindings"]["version"] == "none":
        return "none"
    fly = t["bindings"]["version"].split()[-1]
    ptx = t["ptxas"]["version"].replace(" ", "_") if t["ptxas"]["path"] else "noptxas"
    m = re.search(r"\d+(\.\d+)+", t["ld.lld"]["version"])
    lld = f"lld{m.group(0)}" if m else "nolld"
    return f"flydsl-{fly}+{ptx}+{lld}"


def pipeline_text(target: str, fmt: str, unroll_limit: int = targets.UNROLL_LIMIT) -> str:
    """All stages of a target, joined: part of the cache key and of reproduction commands."""
    return " | ".join(targets.get(target).stages(fmt, unroll_limit, for_key=True).values())


def default_label(text: str, target: str) -> str:
    """<kernel>-<target>-<short key>: the folder of one specialization's dumps and repro files."""
    m = re.search(r"gpu\.func @(\w+)", text)
    return f"{m.group(1) if m else 'module'}-{target}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def repro_root() -> Path:
    return Path(tempfile.gettempdir()) / "normir-repro"


class _Run:
    """One compile: its source map, label, and where dumps and repro files go."""

    def __init__(self, source: Source, target: str, label: str | None, dump_dir: str | None, what: str | None):
        self.source = source
        self.target = target
        self.label = label or default_label(source.text, target)
        self.dump = Path(dump_dir) / self.label if dump_dir else None
        self.what = what

    def dump_stage(self, index: int, name: str, data: str | bytes) -> None:
        if self.dump is None:
            return
        suffix = ".bin" if isinstance(data, bytes) else (".mlir" if name in ("input", "unroll", "llvm") else ".s")
        path = self.dump / f"{index:02d}_{name}{suffix}"
        try:
            self.dump.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
        except OSError as e:
            raise CompileError(f"cannot write the stage dump {path}: {e.strerror or e}; "
                               f"unset NORMIR_DUMP_DIR or point it at a writable folder") from None

    def fail(self, stage: str, module_text: str, pipeline: str, message: str, extra: str = "") -> CompileError:
        """A CompileError naming the stage, the specialization and the source lines, with a
        reproduction: the stage's input module and a `normir opt` command that replays it."""
        folder = self.dump if self.dump is not None else repro_root() / self.label
        path = folder / f"repro-{stage}.mlir"
        cmd = f"normir opt {shlex.quote(str(path))} --pass-pipeline={shlex.quote(pipeline)}{extra}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(module_text)
            (folder / f"repro-{stage}.sh").write_text(f"#!/bin/sh\n# {self.label}: stage {stage!r}\nexec {cmd}\n")
            how = f"reproduce with:\n  {cmd}"
        except OSError as e:
            how = f"(no reproduction written: {path}: {e.strerror or e})"
        what = f" ({self.what})" if self.what else ""
        return CompileError(f"stage {stage!r} failed for {self.label}{what}:\n"
                            f"{self.source.translate(message).strip()}\n{how}")


def check_registered(module, ctx, source: Source | None = None) -> None:
    """nvvm/rocdl accept unknown op names when parsing; a typo would fail only at serialization."""
    bad: list[str] = []
    ir = bindings()[0]

    def visit(op):
        if not ctx.is_registered_operation(op.name):
            bad.append(f"{op.name} at {_where(op, source)}")
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if bad:
        raise CompileError("unregistered operations (typo in an op name?):\n  " + "\n  ".join(bad))


def _where(op, source: Source | None) -> str:
    loc = str(op.location)
    loc = source.translate(loc) if source is not None else loc
    m = re.fullmatch(r"loc\((.*)\)", loc)
    return m.group(1) if m else loc


def unlowered_op(module, source: Source | None = None) -> str | None:
    """The first op outside the dialects the serializer translates, with its source location."""
    ir = bindings()[0]
    found: list[str] = []

    def visit(op):
        if op.name.split(".", 1)[0] not in LOWERED_DIALECTS:
            found.append(f"'{op.name}' at {_where(op, source)}")
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found[0] if found else None


def _as_source(text: str | Source, name: str = "<specialized>") -> Source:
    """text as a Source whose lines are its own (for text with no template behind it)."""
    if isinstance(text, Source):
        return text
    from .template import Origin

    return Source(text, tuple(Origin(name, i) for i in range(1, text.count("\n") + 2)))


def compile_text(text: str | Source, target: str, fmt: str | None = None, *, keep: tuple[str, ...] = (),
                 dump_dir: str | None = None, unroll_limit: int = targets.UNROLL_LIMIT,
                 label: str | None = None, what: str | None = None) -> Artifact:
    """Compile specialized kernel text (or a template.Source, whose line map then names the
    source lines in errors) for a target. keep: stage names whose text to return. label: the
    dump/repro folder's name (default <kernel>-<target>-<short key>); what: the specialization,
    named in errors."""
    tgt = targets.get(target)
    fmt = fmt or tgt.default_format()
    if fmt not in ("isa", "bin"):
        raise ValueError(f"fmt={fmt!r}: choose 'isa' or 'bin'")
    ir, passmanager, gpu = bindings()
    source = _as_source(text)
    text = source.text
    run = _Run(source, target, label, dump_dir if dump_dir is not None else (env.DUMP_DIR.get() or None), what)
    kept: dict[str, str] = {}
    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = False
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            raise run.fail("parse", text, "builtin.module()", str(e)) from None
        if not module.operation.verify():
            raise run.fail("verify", text, "builtin.module()", "verification failed")
        check_registered(module, ctx, source)
        run.dump_stage(0, "input", text)
        if "input" in keep:
            kept["input"] = text
        stages = tgt.stages(fmt, unroll_limit)
        if "isa" in keep and fmt != "isa":
            # ISA next to a binary: a side branch off the llvm module, run before the binary.
            stages = {**{k: v for k, v in stages.items() if k != fmt}, "isa": tgt.stages("isa")["isa"],
                      fmt: stages[fmt]}
        data = b""
        for i, (name, pipeline) in enumerate(stages.items(), start=1):
            before = str(module)
            work = ir.Module.parse(before) if name == "isa" and fmt != "isa" else module
            try:
                passmanager.PassManager.parse(pipeline).run(work.operation)
            except ir.MLIRError as e:
                raise run.fail(name, before, pipeline, str(e)) from None
            if name == "llvm":
                left = unlowered_op(work, source)
                if left is not None:
                    raise run.fail(name, before, pipeline, f"{left} is not lowered to llvm/nvvm/rocdl by this "
                                   f"stage: no pass converts it for {target}; rewrite it in ops that lower",
                                   extra=" --expect-lowered")
            if name in ("isa", "bin"):
                blob = _binary_object(work, gpu)
                run.dump_stage(i, name, blob.decode(errors="replace") if name == "isa" else blob)
                if name == "isa" and "isa" in keep:
                    kept["isa"] = blob.decode(errors="replace")
                if name == fmt:
                    data = blob
            else:
                after = str(work)
                run.dump_stage(i, name, after)
                if name in keep:
                    kept[name] = after
    return Artifact(fmt=fmt, data=data, stages=kept)


def run_pipeline(text: str, pipeline: str, *, expect_lowered: bool = False, name: str = "<text>") -> str:
    """`normir opt`: parse text, run one pipeline, return the module's text (CompileError on failure).
    name: the file the text is from, for locations."""
    ir, passmanager, gpu = bindings()
    source = _as_source(text, name)
    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = False
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            raise CompileError(source.translate(str(e))) from None
        check_registered(module, ctx, source)
        try:
            pm = passmanager.PassManager.parse(pipeline)
        except (ir.MLIRError, ValueError) as e:
            raise CompileError(f"--pass-pipeline does not parse: {e}") from None
        try:
            pm.run(module.operation)
        except ir.MLIRError as e:
            raise CompileError(source.translate(str(e))) from None
        if expect_lowered:
            left = unlowered_op(module, source)
            if left is not None:
                raise CompileError(f"{left} is not lowered to llvm/nvvm/rocdl")
        return str(module)


def _binary_object(module, gpu) -> bytes:
    for op in module.body.operations:
        if op.operation.name == "gpu.binary":
            return gpu.ObjectAttr(op.attributes["objects"][0]).object
    raise CompileError("the pipeline produced no gpu.binary")
