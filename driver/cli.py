"""normir's command line, for compiler engineers and deployments.

  normir compile FILE.mlir|KERNEL --target sm_90 --n 4096 [--dtype bf16 ...] [--set NAME=VALUE]
                 [--tpr T --cluster C --l2-prefetch 0|1 --stage 0|1 --min-blocks B --hints H --overlap C --cache-row 0|1
                  --push 0|1 --batch-reload 0|1]
                 [--emit input|unroll|llvm|isa|bin] [-o OUT]
  normir aot --out DIR PLAN.json       compile a list of specializations into a cache folder
  normir report [--target ...]         compile every kernel at representative shapes; print sizes,
                                       registers (or VGPRs and scratch) and vector widths
  normir env                           the environment variables normir reads
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from . import compiler, env, library, targets
from .kernels import KERNELS
from .specialize import MAX_HINTS, Options, common_values, mlir_root, specialize, substitute


def _options_from_args(a: argparse.Namespace, kernel: str) -> Options:
    return Options(kernel=kernel, n=a.n, dtype=a.dtype, wdtype=a.wdtype or a.dtype, eps=a.eps, target=a.target,
                   has_weight=not a.no_weight, store_rstd=a.store_rstd, vec=a.vec, atomic_dw=a.atomic_dw,
                   tpr=a.tpr, cluster=a.cluster, l2_prefetch=a.l2_prefetch, stage=a.stage,
                   min_blocks=a.min_blocks, hints=a.hints, overlap=a.overlap,
                   cache_row=a.cache_row, push=a.push, batch_reload=a.batch_reload)


def cmd_compile(a: argparse.Namespace) -> int:
    src = Path(a.source)
    kernel = a.kernel or (src.stem if src.suffix == ".mlir" else a.source)
    if kernel not in KERNELS:
        raise SystemExit(f"cannot tell which kernel {a.source} is; pass --kernel (one of {sorted(KERNELS)})")
    opts = _options_from_args(a, kernel)
    values = {**common_values(opts), **KERNELS[kernel].extra_values(opts)}
    for item in a.set or []:
        name, _, value = item.partition("=")
        values[name] = value
    if src.suffix != ".mlir":
        src = mlir_root() / KERNELS[kernel].template
    text = substitute(src.read_text(), values, origin=str(src), strict_unused=False)
    if a.emit == "input":
        out = text
    else:
        fmt = "bin" if a.emit == "bin" else "isa"
        keep = (a.emit,) if a.emit in ("unroll", "llvm", "isa") else ()
        art = compiler.compile_text(text, opts.target, fmt, keep=keep, unroll_limit=opts.layout.unroll_limit)
        out = art.data if a.emit == "bin" else art.stages[a.emit]
    if a.output:
        Path(a.output).write_bytes(out if isinstance(out, bytes) else out.encode())
    elif isinstance(out, bytes):
        raise SystemExit("--emit bin writes binary: give -o FILE")
    else:
        sys.stdout.write(out)
    return 0


def _aot_one(fields: dict) -> str:
    opts = Options(**fields)
    b = library.get_binary(opts, compile_missing=True)
    return f"{opts.kernel} n={opts.n} {opts.dtype}/{opts.wdtype} {opts.target} vec={opts.vec} -> {b.fmt} {len(b.data)} B"


def cmd_aot(a: argparse.Namespace) -> int:
    """Compile every specialization of a plan (a JSON list of Options fields) into --out."""
    plan = json.loads(Path(a.plan).read_text())
    # The workers inherit the environment: make --out the cache they write, with no read-only
    # folders in front of it; restore the caller's environment afterwards.
    saved = {v.name: os.environ.get(v.name) for v in (env.CACHE_DIR, env.AOT_DIRS)}
    os.environ[env.CACHE_DIR.name] = str(Path(a.out).resolve())
    os.environ[env.AOT_DIRS.name] = ""
    try:
        with ProcessPoolExecutor(max_workers=a.jobs) as pool:
            for line in pool.map(_aot_one, plan, chunksize=4):
                if a.verbose:
                    print(line)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    print(f"aot: {len(plan)} specializations in {a.out}")
    return 0


REPORT_SHAPES = {
    "rmsnorm_fwd": [(1024, "bf16"), (2880, "bf16"), (4096, "bf16"), (7168, "bf16"), (65536, "bf16"), (4096, "f32")],
    "rmsnorm_bwd": [(1024, "bf16"), (4096, "bf16"), (16384, "bf16"), (65536, "bf16"), (4096, "f32")],
    "rmsnorm_dw_reduce": [(4096, "f32")],
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
            for n, dt in shapes:
                opts = Options(kernel=kernel, n=n, dtype=dt, wdtype=dt if kernel != "rmsnorm_dw_reduce" else "bf16",
                               target=chip)
                fmt = tgt.default_format()
                art = compiler.compile_text(specialize(opts), chip, fmt, keep=("isa",),
                                            unroll_limit=opts.layout.unroll_limit)
                lay = opts.layout
                mode = "regs" if lay.cache_row else "stream"
                facts = " ".join(f"{k}={v}" for k, v in isa_facts(tgt, art.stages["isa"], art.data).items())
                print(f"{kernel:18} {chip:7} {n:>6} {dt:5} {lay.block:>5} {lay.vec:>3} {mode:6} {len(art.data):>7}  {facts}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="normir", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="specialize and compile one kernel; print or write any stage")
    c.add_argument("source", help="a .mlir file (placeholders allowed) or a registered kernel name")
    c.add_argument("--kernel", help="registry entry whose layout fills the placeholders (default: file stem)")
    c.add_argument("--target", default="sm_90", choices=sorted(targets.TARGETS))
    c.add_argument("--n", type=int, default=4096)
    c.add_argument("--dtype", default="bf16")
    c.add_argument("--wdtype", default=None)
    c.add_argument("--eps", type=float, default=1e-6)
    c.add_argument("--vec", type=int, default=0)
    c.add_argument("--no-weight", action="store_true")
    c.add_argument("--store-rstd", action="store_true")
    c.add_argument("--atomic-dw", action="store_true")
    c.add_argument("--tpr", type=int, default=0, help="threads per row (default: the layout policy's)")
    c.add_argument("--cluster", type=int, default=0, help="blocks per row, a thread-block cluster (sm_90+)")
    c.add_argument("--l2-prefetch", type=int, default=-1, choices=(-1, 0, 1), help="L2 prefetch of the next row")
    c.add_argument("--stage", type=int, default=-1, choices=(-1, 0, 1), help="stage rows in shared memory")
    c.add_argument("--min-blocks", type=int, default=0,
                   help="blocks per multiprocessor the registers must allow (NVVM minctasm; 0: the policy's)")
    c.add_argument("--hints", type=int, default=-1, choices=range(-1, MAX_HINTS + 1), metavar="H",
                   help="L2 eviction hints, a sum of 1 (last reads evict first), 2 (stores evict first), "
                   "4 (reads repeated later evict last), 8 (no .nc loads), 16 (loads ask L1 to keep their lines), "
                   "32 (the forward's last reads ask L1 to evict them first), 64 (loads ask L2 for 256-byte blocks); "
                   "0 none, -1 the policy's")
    c.add_argument("--overlap", type=int, default=-1,
                   help="backward over a cluster: pass 2's chunks loaded inside the cluster exchange")
    c.add_argument("--cache-row", type=int, default=-1, choices=(-1, 0, 1),
                   help="hold the row (x; the backward's x and dy) in registers between the passes (1) or "
                        "read it again (0)")
    c.add_argument("--push", type=int, default=-1, choices=(-1, 0, 1),
                   help="rows over a cluster: exchange the row totals by pushes (st.async and mbarriers, 1) or "
                        "by the cluster barrier (0)")
    c.add_argument("--batch-reload", type=int, default=-1, choices=(-1, 0, 1),
                   help="forward rows read twice: pass 2 loads all its chunks of x and w before computing (1) "
                        "or chunk by chunk (0)")
    c.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a placeholder")
    c.add_argument("--emit", default="isa", choices=["input", "unroll", "llvm", "isa", "bin"])
    c.add_argument("-o", "--output")
    c.set_defaults(fn=cmd_compile)
    o = sub.add_parser("aot", help="compile a plan of specializations into a cache folder")
    o.add_argument("plan")
    o.add_argument("--out", required=True)
    o.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    o.add_argument("-v", "--verbose", action="store_true")
    o.set_defaults(fn=cmd_aot)
    r = sub.add_parser("report", help="per-kernel binary report for gfx950 and sm_90")
    r.add_argument("--target", action="append", choices=sorted(targets.TARGETS))
    r.set_defaults(fn=cmd_report)
    e = sub.add_parser("env", help="the environment variables normir reads")
    e.set_defaults(fn=lambda a: print(env.describe()) or 0)
    a = p.parse_args(argv)
    try:
        return a.fn(a)
    except (compiler.CompileError, ValueError, library.KernelNotAvailable) as err:
        print(f"normir: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
