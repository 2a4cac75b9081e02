"""normir's command line, for compiler engineers and deployments.

  normir compile FILE.mlir|KERNEL --target sm_90 --n 4096 [--dtype bf16 ...] [--set NAME=VALUE]
                 [--include DIR] [layout knobs: --tpr --cluster ...] [--emit input|unroll|llvm|isa|bin] [-o OUT]
  normir opt FILE.mlir --pass-pipeline=PIPELINE [--expect-lowered]   replay one stage (repro files)
  normir explain KERNEL --n N [--dtype ...] [knobs]   the layout policy's rules that fired, and the layout
  normir aot --out DIR PLAN.json       compile a list of specializations into a cache folder
  normir report [--target ...]         compile every kernel at representative shapes; print sizes,
                                       registers (or VGPRs and scratch) and vector widths
  normir env                           the settings in effect, where each came from, and the toolchain

Errors are one line (`--debug` shows the traceback). MLIR diagnostics name the file and line of
the template or spliced piece they come from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from . import compiler, env, library, targets, template
from .kernels import KERNELS
from .layout import Layout
from .options import KNOBS, Build, build, forced
from .specialize import LAYOUT_VALUES, USER_VALUES, specialize_source, values_for


class UsageError(ValueError):
    """A command-line mistake: reported in one line."""


# The fused ops' features (kernels.KernelSpec.features) set by flags of their names (- for _).
_FEATURE_FLAGS = ("rdtype", "sdtype", "odtype", "xdtype", "gdtype", "bdtype", "store_residual", "has_dres_out",
                  "weight_offset", "qdtype", "qdynamic", "has_smooth", "has_scale_ub", "inplace", "sum_f32",
                  "round_xhat", "pdl")


def _build_from_args(a: argparse.Namespace, kernel: str) -> Build:
    return build(kernel=kernel, n=a.n, dtype=a.dtype, wdtype=a.wdtype or a.dtype, eps=a.eps, target=a.target,
                 has_weight=not a.no_weight, store_rstd=a.store_rstd, vec=a.vec, atomic_dw=a.atomic_dw,
                 store_y=not a.no_y,
                 **{f: getattr(a, f) for f in _FEATURE_FLAGS}, **{k.name: getattr(a, k.name) for k in KNOBS})


def find_checkout(start: Path) -> Path | None:
    """The normir source checkout holding `start`, if any: its mlir/ folder."""
    for d in (start, *start.parents):
        if (d / "mlir" / "common").is_dir() and (d / "driver" / "cli.py").is_file():
            return d / "mlir"
    return None


def _resolver(a: argparse.Namespace, src: Path | None) -> template.Resolver:
    """--include folders, NORMIR_INCLUDE, the source file's own folder, then a checkout the
    working folder is in: all before the installed package."""
    dirs: list[Path] = [Path(d) for d in a.include or []]
    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"--include {d}: no such folder")
    dirs += template.env_include_dirs()
    if src is not None:
        dirs.append(src.resolve().parent)
    checkout = find_checkout(Path.cwd().resolve())
    if checkout is not None:
        dirs.append(checkout)
    package = template.mlir_root().resolve()
    unique: list[Path] = []
    for d in dirs:
        if d.resolve() != package and d.resolve() not in unique:
            unique.append(d.resolve())
    return template.Resolver(tuple(unique))


def _parse_sets(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        if not eq:
            raise UsageError(f"--set {item}: give NAME=VALUE (e.g. --set EPS=1.0e-05)")
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            raise UsageError(f"--set {item}: {name!r} is not a placeholder name (capitals, digits and _)")
        if name in LAYOUT_VALUES:
            flag = LAYOUT_VALUES[name]
            raise UsageError(f"--set {name}: ${{{name}}} follows from the row layout, which is checked as a whole; "
                             + (f"force it with {flag}" if flag else "force the layout with --tpr/--cluster/--vec"))
        out[name] = value
    return out


def _given_flags(argv: list[str]) -> set[str]:
    """Compile's value flags the user wrote (by field name), whatever their value."""
    given = set()
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--"):
            given.add(flag[2:].replace("-", "_"))
    return given


def _kernel_of(src: Path) -> str:
    """The kernel a file is: its stem when that names a kernel, else the kernel whose template has
    this file's name; of several, the plain one (fewest features: --kernel picks another)."""
    if src.stem in KERNELS:
        return src.stem
    users = sorted((len(spec.features), k) for k, spec in KERNELS.items() if Path(spec.template.path).name == src.name)
    if len(users) > 1 and users[0][0] == users[1][0]:
        raise UsageError(f"{src} is the template of {', '.join(k for _, k in users)}: pass --kernel")
    return users[0][1] if users else src.stem


def cmd_compile(a: argparse.Namespace) -> int:
    src = Path(a.source)
    is_file = src.suffix == ".mlir" or os.sep in a.source
    if is_file and not src.is_file():
        raise UsageError(f"{a.source}: no such file (give a .mlir file or one of {sorted(KERNELS)})")
    kernel = a.kernel or (_kernel_of(src) if is_file else a.source)
    if kernel not in KERNELS:
        raise UsageError(f"cannot tell which kernel {a.source} is; pass --kernel (one of {sorted(KERNELS)})")
    opts = _build_from_args(a, kernel)
    sets = _parse_sets(a.set)
    values = {**values_for(opts), **sets}
    resolver = _resolver(a, src if is_file else None)
    if is_file:
        source = template.render(src.read_text(), values, origin=str(src), resolver=resolver, strict_unused=False)
    else:
        source = template.render_file(KERNELS[kernel].template.path, values, resolver=resolver)
    unused_sets = sorted(set(sets) - source.used)
    if unused_sets:
        raise UsageError(f"--set {', '.join(unused_sets)}: the text has no such placeholder; it uses "
                         f"{', '.join(sorted(source.used))}")
    for field in sorted(a.given & set(USER_VALUES)):
        names = USER_VALUES[field]
        if not set(names) & source.used:
            raise UsageError(f"--{field.replace('_', '-')} was given, but the text uses no "
                             f"{' or '.join('${' + n + '}' for n in names)}: drop the flag or use the placeholder")
    if source.include_hits:
        print("normir: from outside the installed package: " + ", ".join(map(template._display, source.include_hits)),
              file=sys.stderr)
    if a.emit == "input":
        out: str | bytes = source.text
    else:
        fmt = "bin" if a.emit == "bin" else "isa"
        keep = (a.emit,) if a.emit in ("unroll", "llvm", "isa") else ()
        target = opts.problem.target
        art = compiler.compile_text(source, target, fmt, keep=keep, unroll_limit=opts.layout.unroll_limit,
                                    label=compiler.default_label(source.text, target), what=opts.describe())
        out = art.data if a.emit == "bin" else art.stages[a.emit]
    _write(out, a.output, "--emit bin writes binary: give -o FILE")
    return 0


def _write(out: str | bytes, path: str | None, binary_needs_file: str) -> None:
    if path:
        try:
            Path(path).write_bytes(out if isinstance(out, bytes) else out.encode())
        except OSError as e:
            raise UsageError(f"-o {path}: cannot write it ({e.strerror or e})") from None
    elif isinstance(out, bytes):
        raise UsageError(binary_needs_file)
    else:
        sys.stdout.write(out)


def cmd_opt(a: argparse.Namespace) -> int:
    """Run one pass pipeline over a file with the bundled bindings (what a failing stage prints)."""
    path = Path(a.file)
    if not path.is_file():
        raise UsageError(f"{a.file}: no such file")
    out = compiler.run_pipeline(path.read_text(), a.pass_pipeline, expect_lowered=a.expect_lowered, name=a.file)
    _write(out, a.output, "")
    return 0


def _load_plan(path: str) -> list[dict]:
    """A plan: a JSON list of objects of Problem and Overrides fields. Every entry is checked
    before anything compiles."""
    try:
        plan = json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"{path}: cannot read the plan ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not JSON ({e})") from None
    if not isinstance(plan, list):
        raise UsageError(f"{path}: a plan is a JSON list of objects of Problem and Overrides fields")
    for i, entry in enumerate(plan):
        if not isinstance(entry, dict):
            raise UsageError(f"{path}: entry {i} is not an object of Problem and Overrides fields")
        try:
            build(**entry)
        except (TypeError, ValueError) as e:
            raise UsageError(f"{path}: entry {i}: {e}") from None
    return plan


def _aot_one(fields: dict, out: Path) -> tuple[bool, str]:
    b = build(**fields)
    try:
        binary = library.get_binary(b, compile_missing=True, root=out)
    except Exception as e:  # noqa: BLE001 - reported by the parent as one line per entry
        return False, f"{b.describe()}: {type(e).__name__}: {e}"
    return True, f"{b.describe()} vec={b.problem.vec} -> {binary.fmt} {len(binary.data)} B"


def cmd_aot(a: argparse.Namespace) -> int:
    """Compile every specialization of a plan (a JSON list of Problem and Overrides fields) into --out."""
    plan = _load_plan(a.plan)
    out = Path(a.out).resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out):
            pass
    except OSError as e:
        raise UsageError(f"--out {a.out}: cannot write there ({e.strerror or e})") from None
    failed = []
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        for ok, line in pool.map(partial(_aot_one, out=out), plan, chunksize=4):
            if not ok:
                failed.append(line)
            elif a.verbose:
                print(line)
    if failed:
        first = failed[0].splitlines()
        raise UsageError(f"aot: {len(failed)} of {len(plan)} specializations failed; the first: "
                         + "\n".join(first[:12]))
    print(f"aot: {len(plan)} specializations in {a.out}")
    return 0


REPORT_SHAPES = {
    "rmsnorm_fwd": [(1024, "bf16"), (2880, "bf16"), (4096, "bf16"), (7168, "bf16"), (65536, "bf16"), (4096, "f32")],
    "rmsnorm_bwd": [(1024, "bf16"), (4096, "bf16"), (16384, "bf16"), (65536, "bf16"), (4096, "f32")],
    "fused_add_rmsnorm_fwd": [(4096, "bf16"), (65536, "bf16")],
    "fused_add_rmsnorm_bwd": [(4096, "bf16"), (65536, "bf16")],
    "layernorm_fwd": [(1024, "bf16"), (4096, "bf16"), (65536, "bf16"), (4096, "f32")],
    "layernorm_bwd": [(1024, "bf16"), (4096, "bf16"), (65536, "bf16"), (4096, "f32")],
    "rmsnorm_dw_reduce": [(4096, "f32")],
    "rmsnorm_quant_fwd": [(4096, "bf16", dict(qdtype="f8e4m3", qdynamic=True, store_y=False)),
                          (4096, "bf16", dict(qdtype="i8", qdynamic=True, store_y=False))],
    "layernorm_quant_fwd": [(4096, "bf16", dict(qdtype="f8e4m3", qdynamic=True, store_y=False))],
}


def isa_facts(target: targets.Target, isa: str, binary: bytes) -> dict:
    """Registers/VGPRs, spills/scratch and the widest global accesses, read off the ISA."""
    if target.is_nvidia:
        facts = {"ld.v4": len(re.findall(r"ld\.global(?:\.nc)?\.v4", isa)),
                 "st.v4": len(re.findall(r"st\.global\.v4", isa)), "local": isa.count(".local")}
        ptxas = targets.ptxas_path()
        if ptxas:
            with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                f.write(isa)
            r = subprocess.run([ptxas, "-v", f"-arch={target.chip}", f.name, "-o", os.devnull],
                               capture_output=True, text=True)
            os.unlink(f.name)
            m = re.search(r"Used (\d+) registers", r.stderr)
            facts["regs"] = int(m.group(1)) if m else None
            m = re.search(r"(\d+) bytes spill stores", r.stderr)
            facts["spill"] = int(m.group(1)) if m else None
        return facts
    get = lambda pat: int(m.group(1)) if (m := re.search(pat, isa)) else None  # noqa: E731
    return {"load_x4": isa.count("global_load_dwordx4"), "store_x4": isa.count("global_store_dwordx4"),
            "vgpr": get(r"\.vgpr_count:\s+(\d+)"), "scratch": get(r"\.private_segment_fixed_size:\s+(\d+)")}


def cmd_report(a: argparse.Namespace) -> int:
    chips = a.target or list(targets.PRIMARY)
    print(f"{'kernel':18} {'target':7} {'N':>6} {'dtype':5} {'block':>5} {'vec':>3} {'mode':6} {'bytes':>7}  ISA facts")
    for chip in chips:
        tgt = targets.get(chip)
        for kernel, shapes in REPORT_SHAPES.items():
            for n, dt, *extra in shapes:
                if extra and extra[0].get("qdtype") and not tgt.quant_piece:
                    continue  # no fp8 and int8 conversions on this target
                opts = build(kernel=kernel, n=n, dtype=dt, wdtype=dt if kernel != "rmsnorm_dw_reduce" else "bf16",
                             target=chip, **(extra[0] if extra else {}))
                fmt = tgt.default_format()
                art = compiler.compile_text(specialize_source(opts), chip, fmt, keep=("isa",),
                                            unroll_limit=opts.layout.unroll_limit, what=opts.describe())
                lay = opts.layout
                mode = "regs" if lay.cache_row else "stream"
                facts = " ".join(f"{k}={v}" for k, v in isa_facts(tgt, art.stages["isa"], art.data).items())
                print(f"{kernel:18} {chip:7} {n:>6} {dt:5} {lay.block:>5} {lay.vec:>3} {mode:6} {len(art.data):>7}  {facts}")
    return 0


def cmd_env(a: argparse.Namespace) -> int:
    print("settings (value in effect, where it came from):")
    print(env.describe())
    print("toolchain:")
    for name, t in compiler.tools().items():
        print(f"  {name}: {t['version']}" + (f" at {t['path']}" if t["path"] else ""))
    print(f"  cache key toolchain part: {compiler.toolchain_version()}")
    print(f"  kernel files: {template.mlir_root()}")
    return 0


def _knob_flags(p: argparse.ArgumentParser) -> None:
    """A flag per layout knob (options.KNOBS), the policy's choice unless given."""
    for knob in KNOBS:
        choices = knob.values or None
        p.add_argument(f"--{knob.name.replace('_', '-')}", type=int, default=None, choices=choices,
                       metavar=None if choices else "N", help=f"{knob.help}; None: the policy's")


def cmd_explain(a: argparse.Namespace) -> int:
    """The policy's rules that fired for a kernel's problem, in order, and the layout they gave."""
    if a.kernel not in KERNELS:
        raise UsageError(f"{a.kernel}: not a kernel; choose one of {sorted(KERNELS)}")
    b = _build_from_args(a, a.kernel)
    print(b.describe())
    print("rules that fired: " + (", ".join(b.rules) if b.rules else "none (the geometry's layout)"))
    knobs = forced(b.overrides)
    if knobs:
        print("forced: " + " ".join(f"{k}={v}" for k, v in knobs.items()))
    print("layout: " + " ".join(f"{f.name}={getattr(b.layout, f.name)}" for f in dataclasses.fields(Layout)))
    return 0


def _problem_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--target", default="sm_90", choices=sorted(targets.TARGETS), help="the chip")
    c.add_argument("--n", type=int, default=4096, help="row length N")
    c.add_argument("--dtype", default="bf16", help="x's type: bf16, f16 or f32")
    c.add_argument("--wdtype", default=None, help="the weight's type (default: --dtype)")
    c.add_argument("--eps", type=float, default=1e-6, help="epsilon")
    c.add_argument("--vec", type=int, default=0, help="elements per vector access (0: the widest N allows)")
    c.add_argument("--no-weight", action="store_true", help="no weight")
    c.add_argument("--store-rstd", action="store_true", help="the forward stores rstd")
    c.add_argument("--atomic-dw", action="store_true", help="the backward adds dw with fp32 atomics")
    feature = "(a kernel that takes it: see normir.kernels)"
    c.add_argument("--rdtype", default="", help=f"forward: the residual's type; backward: dresidual's own {feature}")
    c.add_argument("--sdtype", default="", help=f"forward: residual_out's type (default: --rdtype) {feature}")
    c.add_argument("--odtype", default="", help=f"forward: y's type; backward: dy's (default: --dtype) {feature}")
    c.add_argument("--xdtype", default="", help=f"backward: dx's type (default: --dtype) {feature}")
    c.add_argument("--gdtype", default="", help=f"backward: d_residual_out's type (default: --dtype) {feature}")
    c.add_argument("--bdtype", default="", help=f"the bias's type (default: no bias) {feature}")
    c.add_argument("--store-residual", action="store_true", help=f"forward: write residual_out {feature}")
    c.add_argument("--has-dres-out", action="store_true", help=f"backward: add d_residual_out to dx {feature}")
    c.add_argument("--weight-offset", type=float, default=0.0, help=f"scale by (w + offset) {feature}")
    c.add_argument("--qdtype", default="", help=f"a quantized forward's q: f8e4m3 or i8 {feature}")
    c.add_argument("--qdynamic", action="store_true", help=f"per-row scales from the row's amax {feature}")
    c.add_argument("--has-smooth", action="store_true", help=f"y * smooth quantized (SmoothQuant) {feature}")
    c.add_argument("--has-scale-ub", action="store_true", help=f"the amax capped at scale_ub (dynamic fp8) {feature}")
    c.add_argument("--no-y", action="store_true", help=f"a quantized forward writes q alone {feature}")
    c.add_argument("--inplace", action="store_true",
                   help=f"a forward whose y may be x and residual_out the residual (the serving forms) {feature}")
    c.add_argument("--pdl", action="store_true",
                   help=f"a forward launched with programmatic dependent launch (sm_90+) {feature}")
    c.add_argument("--sum-f32", action="store_true",
                   help=f"the norm of the fp32 sum x + residual (vLLM's dynamic rule) {feature}")
    c.add_argument("--round-xhat", action="store_true",
                   help=f"x_hat rounded to x's type before the weight (vLLM's dynamic rule) {feature}")
    _knob_flags(c)


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    p = argparse.ArgumentParser(prog="normir", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                parents=[common])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="specialize and compile one kernel; print or write any stage",
                       formatter_class=fmt, parents=[common])
    c.add_argument("source", help="a .mlir file (placeholders allowed) or a registered kernel name")
    c.add_argument("--kernel", help="registry entry whose layout fills the placeholders (default: the file's stem)")
    _problem_flags(c)
    c.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="fill a placeholder the text uses with VALUE (not the layout's: use the knobs above)")
    c.add_argument("--include", action="append", metavar="DIR",
                   help="a folder searched first for the template and spliced pieces (paths as below mlir/)")
    c.add_argument("--emit", default="isa", choices=["input", "unroll", "llvm", "isa", "bin"], help="the stage to print")
    c.add_argument("-o", "--output", help="write the output here instead of stdout")
    c.set_defaults(fn=cmd_compile)
    x = sub.add_parser("explain", help="the layout policy's rules that fired for a kernel, and its layout",
                       formatter_class=fmt, parents=[common])
    x.add_argument("kernel", help="a registered kernel name")
    _problem_flags(x)
    x.set_defaults(fn=cmd_explain)
    op = sub.add_parser("opt", help="run one pass pipeline over a file (the reproduction a failing stage prints)",
                        formatter_class=fmt, parents=[common])
    op.add_argument("file", help="an MLIR file")
    op.add_argument("--pass-pipeline", required=True, help="a PassManager pipeline, e.g. 'builtin.module(canonicalize)'")
    op.add_argument("--expect-lowered", action="store_true",
                    help="fail when an op outside llvm/nvvm/rocdl remains (what the llvm stage checks)")
    op.add_argument("-o", "--output", help="write the module here instead of stdout")
    op.set_defaults(fn=cmd_opt)
    o = sub.add_parser("aot", help="compile a plan of specializations into a cache folder", formatter_class=fmt,
                       parents=[common])
    o.add_argument("plan", help="a JSON list of objects of Problem and Overrides fields")
    o.add_argument("--out", required=True, help="the cache folder to fill")
    o.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile processes")
    o.add_argument("-v", "--verbose", action="store_true", help="a line per specialization")
    o.set_defaults(fn=cmd_aot)
    r = sub.add_parser("report", help="per-kernel binary report for gfx950 and sm_90", formatter_class=fmt,
                       parents=[common])
    r.add_argument("--target", action="append", choices=sorted(targets.TARGETS), help="a chip (default: sm_90 and gfx950)")
    r.set_defaults(fn=cmd_report)
    e = sub.add_parser("env", help="the settings in effect and the toolchain", formatter_class=fmt, parents=[common])
    e.set_defaults(fn=cmd_env)
    return p


# Errors reported in one line; anything else is a bug and keeps its traceback.
_REPORTED = (UsageError, compiler.CompileError, ValueError, library.KernelNotAvailable, OSError, RuntimeError)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _parser().parse_args(argv)
    a.given = _given_flags(argv[1:]) if a.cmd == "compile" else set()
    try:
        return a.fn(a)
    except _REPORTED as err:
        if a.debug:
            traceback.print_exc()
        msg = str(err) if not isinstance(err, OSError) or not err.filename else \
            f"{err.filename}: {err.strerror or err}"
        print(f"normir: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
