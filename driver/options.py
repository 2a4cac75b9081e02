"""What one kernel binary is: the problem (what the caller asked for), the overrides (the layout's
tuning knobs a caller forced; None is the policy's choice) and the layout decided for both.

Problem and Overrides are frozen dataclasses that validate themselves and are cheap to build and
hash; neither runs the policy. layout.decide turns them into a Layout and the list of rules that
fired; build() does all three and returns the Build that specialize, the compiler and the caches
take. KNOBS is the one table of the knobs: Overrides' fields, the NORMIR_TPR parser (launch.py),
`normir compile`'s flags and `normir env`'s help are made from it. Pure Python: no MLIR, no torch.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field, fields, make_dataclass

from . import targets
from .kernels import KERNELS
from .layout import decide
from .layout.geometry import (
    DTYPES,
    HINT_BITS,
    HINT_KEEP,
    HINT_L1_FIRST,
    HINT_L1_KEEP,
    HINT_LAST_READ,
    HINT_STORES,
    MAX_MIN_BLOCKS,
    MAX_THREADS,
    QDTYPES,
    Layout,
    max_vec,
)

MAX_N = 1 << 20
MIN_MAX_REGS = 16  # the lowest register cap a kernel may ask for (max_regs)
FLT_MIN = 1.1754943508222875e-38


def f32(x: float) -> float:
    """x rounded to float32, as the kernel will see it."""
    return struct.unpack("f", struct.pack("f", x))[0]


# ---------------------------------------------------------------------------- the problem


@dataclass(frozen=True)
class Problem:
    """What the caller asked for: the kernel, N, the tensors' types, eps and the op's features.
    Validates itself; a feature equal to its default is spelled "" (one kernel, one key)."""

    kernel: str
    n: int
    dtype: str = "bf16"
    wdtype: str = "bf16"
    eps: float = 1e-6
    target: str = "sm_90"
    has_weight: bool = True
    store_rstd: bool = False
    vec: int = 0  # 0: the widest the row allows
    atomic_dw: bool = False
    # The fused ops' features (kernels.KernelSpec.features says which kernel takes which):
    rdtype: str = ""  # forward: the residual's type; backward: dresidual's own type (when not dx's); "" none
    sdtype: str = ""  # forward: residual_out's type, which h = x + residual is rounded to ("" = rdtype)
    odtype: str = ""  # forward: y's type; backward: dy's ("" = dtype)
    xdtype: str = ""  # backward: dx's type ("" = dtype)
    gdtype: str = ""  # backward: d_residual_out's type ("" = dtype, residual_out's)
    bdtype: str = ""  # the bias's type; "" no bias
    store_residual: bool = False  # forward: write residual_out
    has_dres_out: bool = False  # backward: read d_residual_out and add it to dx
    weight_offset: float = 0.0  # the weight is used as w + weight_offset
    qdtype: str = ""  # a quantized forward: q's type, "f8e4m3" (e4m3fn) or "i8"
    qdynamic: bool = False  # a quantized forward: per-row scales from the row's amax (else one scale given)
    has_smooth: bool = False  # a quantized forward: y * smooth (fp32 per column) quantized (SmoothQuant)
    has_scale_ub: bool = False  # a dynamic fp8 forward: the amax capped at scale_ub
    store_y: bool = True  # a forward writes y (a quantized one, only where asked: return_y)
    inplace: bool = False  # a forward whose y may be x and residual_out the residual (the serving forms)
    sum_f32: bool = False  # a fused add's norm of the fp32 sum (residual_out its rounding): vLLM's dynamic rule
    round_xhat: bool = False  # x_hat rounded to x's type before the weight: vLLM's dynamic rule
    pdl: bool = False  # a forward launched with programmatic dependent launch (sm_90+: the grid_dep piece)

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel {self.kernel!r} is unknown; choose one of {sorted(KERNELS)}")
        targets.get(self.target)
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n={self.n!r} is out of range: normir supports 1 <= N <= {MAX_N}")
        for name in ("dtype", "wdtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r}: choose one of {sorted(DTYPES)}")
        for name in ("rdtype", "sdtype", "odtype", "xdtype", "bdtype", "gdtype"):
            if getattr(self, name) not in ("", *DTYPES):
                raise ValueError(f"{name}={getattr(self, name)!r}: choose one of {sorted(DTYPES)} or '' (none)")
        eps = float(self.eps)
        if not (math.isfinite(eps) and eps >= FLT_MIN and math.isfinite(f32(eps))):
            raise ValueError(f"eps={self.eps!r} must be a finite float32 >= {FLT_MIN:g} (e.g. 1e-6)")
        object.__setattr__(self, "eps", f32(eps))
        self._features()
        spec = KERNELS[self.kernel]
        # The float tensors set the vector width (a quantized q's chunk is their chunk's bytes / EB).
        narrowest = min(DTYPES[t] for t in spec.work.types_for(self) if t in DTYPES) if spec.work \
            else DTYPES[self.dtype]
        widest = max_vec(self.n, narrowest)
        vec = self.vec or widest
        if vec & (vec - 1) or vec > widest:
            raise ValueError(f"vec={self.vec} must be a power of two dividing N, at most {widest}")
        object.__setattr__(self, "vec", vec)

    def _features(self) -> None:
        """Check that the kernel takes the fused ops' fields given, and put them in one canonical
        spelling (a type equal to its default is "", so that one kernel has one key)."""
        spec = KERNELS[self.kernel]
        forward = spec.grid == "rows"
        for name, default in (("odtype", self.dtype), ("xdtype", self.dtype), ("sdtype", self.rdtype),
                              ("gdtype", self.dtype)):
            if getattr(self, name) == default:
                object.__setattr__(self, name, "")
        if self.bdtype and spec.grid == "persistent":
            object.__setattr__(self, "bdtype", "f32")  # the backward reads no bias: it sums db in fp32
        offset = float(self.weight_offset)
        if not math.isfinite(f32(offset)):
            raise ValueError(f"weight_offset={self.weight_offset!r} must be a finite float32 (e.g. 1.0)")
        object.__setattr__(self, "weight_offset", f32(offset))
        given = {
            "residual" if forward else "dres": bool(self.rdtype), "store_residual": self.store_residual,
            "bias": bool(self.bdtype), "weight_offset": self.weight_offset != 0.0,
            "odtype": bool(self.odtype), "xdtype": bool(self.xdtype), "dres_out": self.has_dres_out,
            "quant": bool(self.qdtype), "qdynamic": self.qdynamic, "smooth": self.has_smooth,
            "scale_ub": self.has_scale_ub, "no_y": not self.store_y, "inplace": self.inplace,
            "sum_f32": self.sum_f32, "round_xhat": self.round_xhat, "pdl": self.pdl,
        }
        for feature, on in given.items():
            if on and feature not in spec.features:
                others = sorted(k for k, v in KERNELS.items() if feature in v.features)
                raise ValueError(f"{self.kernel} takes no {feature.replace('_', ' ')} "
                                 f"(kernels that do: {', '.join(others) or 'none'})")
        if self.sdtype and not (forward and self.rdtype):
            raise ValueError(f"sdtype={self.sdtype!r}: residual_out's type needs a residual (rdtype) in a forward")
        if self.gdtype and not self.has_dres_out:
            raise ValueError(f"gdtype={self.gdtype!r}: d_residual_out's type needs a backward that reads it "
                             "(has_dres_out=True)")
        if self.qdtype not in ("", *QDTYPES):
            raise ValueError(f"qdtype={self.qdtype!r}: choose one of {sorted(QDTYPES)} or '' (none)")
        if "quant" in spec.features and not self.qdtype:
            raise ValueError(f"{self.kernel} quantizes y: give qdtype ({' or '.join(sorted(QDTYPES))})")
        if self.qdtype and not targets.get(self.target).quant_piece:
            raise ValueError(f"qdtype={self.qdtype!r}: {self.target} has no OCP fp8 and int8 conversions normir "
                             "uses (sm_89+ and gfx950 do)")
        if self.has_scale_ub and not (self.qdynamic and self.qdtype == "f8e4m3"):
            raise ValueError("has_scale_ub=True caps a dynamic fp8 forward's amax: it needs qdynamic=True and "
                             "qdtype='f8e4m3'")
        if self.pdl and not targets.get(self.target).grid_dep_piece:
            raise ValueError(f"pdl=True: {self.target} has no programmatic dependent launch (sm_90+ has)")
        if self.sum_f32 and not self.rdtype:
            raise ValueError("sum_f32=True normalizes the fp32 sum x + residual: it needs a residual (rdtype)")
        if self.store_residual and not self.rdtype:
            raise ValueError("store_residual=True needs a residual (rdtype): without one residual_out is x itself")

    @property
    def types(self) -> dict[str, str]:
        """The element type of each type placeholder (see kernels.py)."""
        return {"T": self.dtype, "WT": self.wdtype, "RT": self.rdtype or self.dtype, "HT": self.held_dtype,
                "ST": self.sdtype or self.rdtype or self.dtype,
                "YT": self.odtype or self.dtype, "XT": self.xdtype or self.dtype, "BT": self.bdtype or self.wdtype,
                "GT": self.gdtype or self.dtype, "QT": "i8", "f32": "f32"}

    @property
    def held_dtype(self) -> str:
        """The type of the row normalized and held between the passes: residual_out's with a
        residual (the forward; f32 with sum_f32), else the input's."""
        if KERNELS[self.kernel].grid == "rows" and self.rdtype:
            return "f32" if self.sum_f32 else self.sdtype or self.rdtype
        return self.dtype

    def key_string(self) -> str:
        """Stable text of the fields (Python's hash() is salted per process): those that differ
        from their defaults, so that a new field leaves the keys of the kernels that do not use it."""
        return ";".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                        if f.name in ("kernel", "n") or getattr(self, f.name) != f.default)

    def describe(self) -> str:
        """The kernel, N, target and every field that differs from its default: for messages."""
        parts = [f"{self.kernel} n={self.n} {self.target}"]
        parts += [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                  if f.name not in ("kernel", "n", "target", "vec", "eps") and getattr(self, f.name) != f.default]
        return " ".join(parts)


# ---------------------------------------------------------------------------- the knobs


@dataclass(frozen=True)
class Knob:
    """A layout knob a caller may force (None: the policy's choice): its values (a tuple, or the
    range lo..hi), what they do, its NORMIR_TPR letter ("" for tpr, the item's leading number) and
    the kernel placeholders it moves (which `normir compile --set` then refuses)."""

    name: str
    help: str
    tpr: str
    values: tuple[int, ...] = ()
    lo: int = 0
    hi: int = 0  # (with bits: the bits a value may sum)
    placeholders: tuple[str, ...] = ()
    bits: bool = False

    def check(self, value: object) -> None:
        ok = self.values if self.values else range(self.lo, self.hi + 1)
        if isinstance(value, bool) or not isinstance(value, int) or value not in ok:
            choices = f"one of {', '.join(map(str, self.values))}" if self.values else f"an int from {self.lo} to {self.hi}"
            raise ValueError(f"{self.name}={value!r}: choose {choices} ({self.help}), or None (the policy's)")
        if self.bits and value & ~self.hi:
            raise ValueError(f"{self.name}={value}: bits {value & ~self.hi} are not {self.name}; {self.help}")


ONOFF = (0, 1)
HINT_HELP = (f"cache hints, a sum of {HINT_LAST_READ} (last reads evict first from L2), {HINT_STORES} (stores evict "
             f"first), {HINT_KEEP} (reads repeated later evict last), {HINT_L1_KEEP} (loads ask L1 to keep their "
             f"lines), {HINT_L1_FIRST} (last reads ask L1 to evict them first); 0 none")
# In NORMIR_TPR's order: TPR[xCLUSTER][pN][sN][mN][hN][vVEC][oN][rN][bN][dN][nN][wN][tN][gN] (v, a narrower
# vector than the tensors allow, is the problem's vec, not a knob; launch.tpr_overrides reads it).
KNOBS = (
    Knob("tpr", "threads per row", "", lo=1, hi=MAX_THREADS, placeholders=("TPR",)),
    Knob("cluster", "blocks per row, a thread-block cluster (sm_90+; past 8 a non-portable size)", "x",
         (1, 2, 4, 8, 16), placeholders=("CLUSTER", "CLUSTER_PIECE")),
    Knob("l2_prefetch", "the backward's L2 prefetch of the next row: 1 on, 0 off", "p", ONOFF,
         placeholders=("L2_PREFETCH", "PREFETCH_PIECE")),
    Knob("stage", "persistent kernels: the rows read staged through shared memory (1) or not (0)", "s", ONOFF,
         placeholders=("STAGE", "STAGE_PIECE", "STAGE_BLOCK_BYTES")),
    Knob("min_blocks", "NVVM: blocks per multiprocessor the registers must allow (.minnctapersm)", "m", lo=1,
         hi=MAX_MIN_BLOCKS, placeholders=("KERNEL_ATTRS",)),
    Knob("hints", HINT_HELP, "h", lo=0, hi=HINT_BITS, bits=True),
    Knob("overlap", "pass 2's first chunks loaded early: a backward's inside the cluster exchange, a held forward's "
         "w and b before the reductions (0: none)", "o", lo=0, hi=MAX_THREADS, placeholders=("OVERLAP", "OVERLAP_K",
                                                                                   "OVERLAP_DRES")),
    Knob("cache_row", "the rows read held in registers between the passes (1) or read again (0)", "r", ONOFF,
         placeholders=("CACHE_ROW",)),
    Knob("batch_reload", "forward rows read twice: pass 2 loads all its chunks before computing (1) or chunk by "
         "chunk (0)", "b", ONOFF, placeholders=("BATCH_RELOAD",)),
    Knob("db_smem", "backward with a bias: db's column sums in shared memory (1), in conflict-free 16-byte quarters "
         "(2), dw's too in quarters (3), or in registers (0)", "d", (0, 1, 2, 3),
         placeholders=("SLOT_Q", "SLOT_H", "SLOT_BUF", "SLOT_LOAD", "SLOT_STORE", "SLOTS_DYN_PIECE", "SLOT_BASES",
                       *(f"{t}_{k}" for t in ("DB", "DW")
                         for k in ("GET", "PUT", "PUT_TO", "IN_WORKGROUP", "IN_PRIVATE", "SLOTS_PIECE")))),
    Knob("max_regs", "NVVM: registers a thread may take at most (PTX .maxnreg)", "n", lo=MIN_MAX_REGS, hi=255,
         placeholders=("KERNEL_ATTRS",)),
    Knob("cast_words", "pass 2's bf16 casts by 32-bit words, the forward's x_hat * w + b one fma (1), or element by "
         "element (0)", "w", ONOFF),
    Knob("two_pass", "LayerNorm's held forward: the variance from a second pass over the held row (1), or Chan's "
         "merges (0)", "t", ONOFF, placeholders=("TWO_PASS",)),
    Knob("stage_dres", "a backward's d_residual_out copied into shared memory in pass 1 (1), or loaded in pass 2 (0)",
         "g", ONOFF, placeholders=("STAGE_DRES", "DRES_AT")),
)
KNOB = {k.name: k for k in KNOBS}


def _check_overrides(self) -> None:
    for knob in KNOBS:
        value = getattr(self, knob.name)
        if value is not None:
            knob.check(value)


Overrides = make_dataclass(
    "Overrides", [(k.name, "int | None", field(default=None)) for k in KNOBS], frozen=True,
    namespace={"__post_init__": _check_overrides, "__module__": __name__,
               "__doc__": "The layout knobs a caller forced (KNOBS: each one's values and meaning); None is the "
                          "policy's choice. Checked against the target and the kernel by layout.decide."})


def forced(overrides) -> dict[str, int]:
    """The knobs overrides sets, by name."""
    return {k.name: getattr(overrides, k.name) for k in KNOBS if getattr(overrides, k.name) is not None}


# ---------------------------------------------------------------------------- a kernel binary


@dataclass(frozen=True)
class Build:
    """One kernel binary: the problem, the knobs forced and the layout decided, with the names of
    the policy's rules that fired (`normir explain`). It reads as its problem and its overrides
    too: b.n is b.problem.n, b.tpr is b.overrides.tpr (None: the policy's)."""

    problem: Problem
    overrides: Overrides
    layout: Layout = field(compare=False)
    rules: tuple[str, ...] = field(compare=False, default=())

    def __getattr__(self, name: str):
        if name in PROBLEM_FIELDS or name == "held_dtype":
            return getattr(self.problem, name)
        if name in KNOB:
            return getattr(self.overrides, name)
        raise AttributeError(f"'Build' object has no attribute {name!r}")

    def key_string(self) -> str:
        """The problem's fields and every Layout field: part of the cache key (a knob forced to the
        policy's own value makes the same binary)."""
        lay = ";".join(f"{f.name}={getattr(self.layout, f.name)!r}" for f in fields(self.layout))
        return f"{self.problem.key_string()}|{lay}"

    def digest(self) -> str:
        return hashlib.sha256(self.key_string().encode()).hexdigest()

    def describe(self) -> str:
        knobs = " ".join(f"{k}={v}" for k, v in forced(self.overrides).items())
        return self.problem.describe() + (f" {knobs}" if knobs else "")


PROBLEM_FIELDS = tuple(f.name for f in fields(Problem))


def split(fields_: dict) -> tuple[Problem, Overrides]:
    """A flat dict of Problem and Overrides fields (an AOT plan's entry, the command line's) as
    the two; an unknown name is an error naming the fields."""
    unknown = sorted(set(fields_) - set(PROBLEM_FIELDS) - set(KNOB))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}: a problem takes {list(PROBLEM_FIELDS)}, the knobs are "
                         f"{list(KNOB)}")
    return (Problem(**{k: v for k, v in fields_.items() if k in PROBLEM_FIELDS}),
            Overrides(**{k: v for k, v in fields_.items() if k in KNOB}))


def build(problem: Problem | None = None, overrides: Overrides | None = None, **fields_) -> Build:
    """The Build of a problem and its overrides (or of the flat fields of both): the layout decided."""
    if problem is None:
        problem, overrides = split(fields_)
    elif fields_:
        raise TypeError("give a Problem (and Overrides) or the fields, not both")
    overrides = overrides if overrides is not None else Overrides()
    layout, rules = decide(problem, overrides, targets.get(problem.target), KERNELS[problem.kernel])
    return Build(problem, overrides, layout, rules)
