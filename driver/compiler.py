"""Specialized text -> binary: parse, verify, reject unregistered ops, run the target's stages.

The only module that imports the MLIR bindings (lazily, on the first compile). Stages are the
ordered data in targets.Target.stages; they are joined and run here and nowhere else. With
NORMIR_DUMP_DIR set, each stage's output is written as a numbered file; when a stage fails, the
module it started from is written out together with a command that reproduces the failure.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache

from . import env, targets

STAGE_ORDER = ("input", "unroll", "llvm", "isa", "bin")


class CompileError(RuntimeError):
    pass


@dataclass(frozen=True)
class Artifact:
    fmt: str  # "isa" | "bin"
    data: bytes
    stages: dict[str, str]  # stage name -> text (only those asked for)


def _mlir():
    try:
        from flydsl._mlir import ir, passmanager
        from flydsl._mlir.dialects import gpu
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise CompileError(
            "compiling needs the MLIR Python bindings: `pip install flydsl==0.5.0` "
            "(or `pip install normir[compile]`); or bring precompiled kernels with `normir aot` "
            "and NORMIR_AOT_DIRS"
        ) from e
    return ir, passmanager, gpu


@lru_cache(maxsize=1)
def toolchain_version() -> str:
    """Names the compiler that made a binary; part of every cache key. No MLIR import."""
    try:
        fly = importlib.metadata.version("flydsl")
    except importlib.metadata.PackageNotFoundError:
        return "none"
    ptxas = targets.ptxas_path()
    ptx = "noptxas"
    if ptxas:
        try:
            out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30).stdout
            ptx = out.strip().splitlines()[-1].replace(" ", "_") if out.strip() else "ptxas"
        except (OSError, subprocess.SubprocessError):
            ptx = "ptxas?"
    return f"flydsl-{fly}+{ptx}"


def pipeline_text(target: str, fmt: str, unroll_limit: int = targets.UNROLL_LIMIT) -> str:
    """All stages of a target, joined: part of the cache key and of reproduction commands."""
    return " | ".join(targets.get(target).stages(fmt, unroll_limit, for_key=True).values())


def _dump(dump_dir: str | None, index: int, name: str, text: str | bytes) -> None:
    if not dump_dir:
        return
    os.makedirs(dump_dir, exist_ok=True)
    suffix = ".bin" if isinstance(text, bytes) else (".mlir" if name in ("input", "unroll", "llvm") else ".s")
    mode = "wb" if isinstance(text, bytes) else "w"
    with open(os.path.join(dump_dir, f"{index:02d}_{name}{suffix}"), mode) as f:
        f.write(text)


def _repro(text: str, pipeline: str, err: str, stage: str) -> CompileError:
    fd, path = tempfile.mkstemp(prefix=f"normir-{stage}-", suffix=".mlir")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return CompileError(
        f"stage {stage!r} failed:\n{err}\n"
        f"reproduce with:\n  mlir-opt --pass-pipeline='{pipeline}' {path}"
    )


def check_registered(module, ctx) -> None:
    """nvvm/rocdl accept unknown op names when parsing; a typo would fail only at serialization."""
    bad: list[str] = []

    def visit(op):
        name = op.name
        if not ctx.is_registered_operation(name):
            bad.append(f"{name} at {op.location}")
        from flydsl._mlir.ir import WalkResult

        return WalkResult.ADVANCE

    module.operation.walk(visit)
    if bad:
        raise CompileError("unregistered operations (typo in an op name?):\n  " + "\n  ".join(bad))


def compile_text(text: str, target: str, fmt: str | None = None, *, keep: tuple[str, ...] = (),
                 dump_dir: str | None = None, unroll_limit: int = targets.UNROLL_LIMIT) -> Artifact:
    """Compile specialized kernel text for a target. keep: stage names whose text to return."""
    ir, passmanager, gpu = _mlir()
    tgt = targets.get(target)
    fmt = fmt or tgt.default_format()
    if fmt not in ("isa", "bin"):
        raise ValueError(f"fmt={fmt!r}: choose 'isa' or 'bin'")
    dump_dir = dump_dir if dump_dir is not None else (env.DUMP_DIR.get() or None)
    kept: dict[str, str] = {}
    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = False
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            raise _repro(text, "builtin.module()", str(e), "parse") from None
        if not module.operation.verify():
            raise _repro(text, "builtin.module()", "verification failed", "verify")
        check_registered(module, ctx)
        _dump(dump_dir, 0, "input", text)
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
                raise _repro(before, pipeline, str(e), name) from None
            if name in ("isa", "bin"):
                blob = _binary_object(work, gpu)
                _dump(dump_dir, i, name, blob.decode(errors="replace") if name == "isa" else blob)
                if name == "isa" and "isa" in keep:
                    kept["isa"] = blob.decode(errors="replace")
                if name == fmt:
                    data = blob
            else:
                after = str(work)
                _dump(dump_dir, i, name, after)
                if name in keep:
                    kept[name] = after
    return Artifact(fmt=fmt, data=data, stages=kept)


def _binary_object(module, gpu) -> bytes:
    for op in module.body.operations:
        if op.operation.name == "gpu.binary":
            return gpu.ObjectAttr(op.attributes["objects"][0]).object
    raise CompileError("the pipeline produced no gpu.binary")
