"""The problem and its tuning overrides: one frozen dataclass that validates itself and carries the
layout the policy (layout.decide) gives it. Pure Python: no MLIR, no torch."""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field, fields

from . import targets
from .kernels import KERNELS
from .layout import (
    DTYPES,
    HINT_BITS,
    HINT_KEEP,
    HINT_L1_FIRST,
    HINT_L1_KEEP,
    HINT_LAST_READ,
    HINT_STORES,
    MAX_CLUSTER,
    MAX_MIN_BLOCKS,
    MAX_THREADS,
    Layout,
    decide,
    max_vec,
    row_types,
)

MAX_N = 1 << 20
MIN_MAX_REGS = 16  # the lowest register cap a kernel may ask for (max_regs)
FLT_MIN = 1.1754943508222875e-38


def f32(x: float) -> float:
    """x rounded to float32, as the kernel will see it."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass(frozen=True)
class Options:
    """Everything fixed at compile time for one kernel binary. Validates itself."""

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
    tpr: int = 0  # threads per row; 0: the kernel's layout policy decides (tuning knob)
    cluster: int = 0  # blocks per row (a thread-block cluster); 0: the layout policy decides
    l2_prefetch: int = -1  # 1/0: prefetch the next row into L2 or not; -1: the layout policy decides
    stage: int = -1  # persistent kernels, 1/0: stage the rows read through shared memory or not; -1: the policy's
    min_blocks: int = 0  # NVVM: blocks per multiprocessor the registers must allow; 0: the policy's
    max_regs: int = 0  # NVVM: registers a thread may take at most (PTX .maxnreg); 0: ptxas's choice
    hints: int = -1  # cache hints, a sum of the layout.HINT_* bits (0: none); -1: the policy's
    overlap: int = -1  # pass 2's chunks loaded early: a backward's inside the exchange, a held forward's w and b
    # before the reductions (0: none); -1: policy
    cache_row: int = -1  # 1/0: the rows read held in registers between the passes, or read again; -1: policy
    batch_reload: int = -1  # rows read twice, 1/0: pass 2 loads all its chunks before computing or not; -1: policy
    db_smem: int = -1  # backward with a bias: db's column sums in shared memory (1; 2 in conflict-free quarters; 3 dw's
    # too, in quarters) or registers (0); -1: the policy's
    two_pass: int = -1  # 1/0: LayerNorm's held rows: the variance from a second pass and a second sum, or Chan; -1: policy
    cast_words: int = -1  # 1/0: pass 2's bf16 casts by 32-bit words (forward: x_hat * w + b one fma) or not; -1: policy
    stage_dres: int = -1  # 1/0: a backward's d_residual_out copied into shared memory in pass 1 or loaded in pass 2;
    # -1: the policy's
    layout: Layout = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel {self.kernel!r} is unknown; choose one of {sorted(KERNELS)}")
        tgt = targets.get(self.target)
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
        narrowest = min(DTYPES[t] for t in row_types(spec.work, self)) if spec.work else DTYPES[self.dtype]
        widest = max_vec(self.n, narrowest)
        vec = self.vec or widest
        if vec & (vec - 1) or vec > widest:
            raise ValueError(f"vec={self.vec} must be a power of two dividing N, at most {widest}")
        object.__setattr__(self, "vec", vec)
        if self.tpr and not (0 < self.tpr <= MAX_THREADS and (self.tpr % tgt.warp == 0 or (
                self.tpr < tgt.warp and self.tpr & (self.tpr - 1) == 0))):
            raise ValueError(f"tpr={self.tpr} must be a power of two below the warp ({tgt.warp}) or a "
                             f"multiple of it, at most {MAX_THREADS}")
        if self.cluster > 1 and not tgt.clusters:
            raise ValueError(f"cluster={self.cluster}: {self.target} has no thread-block clusters; use cluster=1")
        top = max(MAX_CLUSTER, tgt.max_cluster)
        if self.cluster and not (self.cluster & (self.cluster - 1) == 0 and self.cluster <= top):
            raise ValueError(f"cluster={self.cluster} must be a power of two, at most {top} on {self.target} "
                             f"({MAX_CLUSTER} portable; past it the driver is asked for a non-portable size)")
        if self.cluster > 1 and self.n % (self.cluster * vec):
            raise ValueError(f"cluster={self.cluster} must split N={self.n} into whole vectors of {vec}")
        _check_int("l2_prefetch", self.l2_prefetch, -1, 1, "choose 1 (on), 0 (off) or -1 (the policy's)")
        if self.l2_prefetch == 1 and tgt.prefetch_piece is None:
            raise ValueError(f"l2_prefetch=1: {self.target} has no L2 prefetch instruction; use -1 or 0")
        _check_int("stage", self.stage, -1, 1, "choose 1 (on), 0 (off) or -1 (the policy's)")
        _check_int("min_blocks", self.min_blocks, 0, MAX_MIN_BLOCKS,
                   f"must be an int from 0 (the policy's) to {MAX_MIN_BLOCKS}")
        _check_int("hints", self.hints, -1, HINT_BITS,
                   f"choose -1 (the policy's), 0 (none), or a sum of {HINT_LAST_READ} (last reads evict first), "
                   f"{HINT_STORES} (stores evict first), {HINT_KEEP} (reads repeated later evict last), "
                   f"{HINT_L1_KEEP} (loads ask L1 to keep their lines) and {HINT_L1_FIRST} (last reads ask L1 "
                   "to evict them first)")
        if self.hints > 0 and self.hints & ~HINT_BITS:
            raise ValueError(f"hints={self.hints}: bits {self.hints & ~HINT_BITS} are not hints; choose a sum of "
                             f"{HINT_LAST_READ}, {HINT_STORES}, {HINT_KEEP}, {HINT_L1_KEEP} and {HINT_L1_FIRST}")
        _check_int("cache_row", self.cache_row, -1, 1,
                   "choose 1 (the row held in registers), 0 (read again) or -1 (the policy's)")
        _check_int("batch_reload", self.batch_reload, -1, 1,
                   "choose 1 (pass 2 loads every chunk first), 0 (chunk by chunk) or -1 (the policy's)")
        _check_int("db_smem", self.db_smem, -1, 3,
                   "choose 1 (db's column sums in shared memory), 2 (in conflict-free quarters), 3 (dw's too), "
                   "0 (in registers) or -1 (the policy's)")
        _check_int("two_pass", self.two_pass, -1, 1,
                   "choose 1 (the variance by a second pass over the held row), 0 (Chan's merges) or -1 (the policy's)")
        _check_int("cast_words", self.cast_words, -1, 1,
                   "choose 1 (pass 2's bf16 casts by 32-bit words), 0 (element by element) or -1 (the policy's)")
        _check_int("stage_dres", self.stage_dres, -1, 1,
                   "choose 1 (d_residual_out copied into shared memory in pass 1), 0 (loaded in pass 2) or -1 "
                   "(the policy's)")
        _check_int("max_regs", self.max_regs, 0, tgt.max_regs,
                   f"must be an int from {MIN_MAX_REGS} to {tgt.max_regs} (registers a thread), or 0 (ptxas's choice)")
        if 0 < self.max_regs < MIN_MAX_REGS:
            raise ValueError(f"max_regs={self.max_regs}: must be at least {MIN_MAX_REGS} (registers a thread), or 0")
        if self.max_regs and not tgt.max_regs_attr:
            raise ValueError(f"max_regs={self.max_regs}: {self.target} has no register cap attribute; use 0")
        if self.min_blocks and not tgt.min_blocks_attr:
            raise ValueError(f"min_blocks={self.min_blocks}: {self.target} has no blocks-per-multiprocessor bound; use 0")
        object.__setattr__(self, "layout", decide(self, tgt, spec))

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
        if self.store_residual and not self.rdtype:
            raise ValueError("store_residual=True needs a residual (rdtype): without one residual_out is x itself")

    @property
    def held_dtype(self) -> str:
        """The type of the row normalized and held between the passes: residual_out's with a
        residual (the forward), else the input's."""
        if KERNELS[self.kernel].grid == "rows" and self.rdtype:
            return self.sdtype or self.rdtype
        return self.dtype

    def key_string(self) -> str:
        """Stable text of the fields (Python's hash() is salted per process)."""
        return ";".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.compare)

    def describe(self) -> str:
        """The kernel, N, target and every field that differs from its default: for messages."""
        defaults = {f.name: f.default for f in fields(self) if f.init}
        parts = [f"{self.kernel} n={self.n} {self.target}"]
        parts += [f"{name}={getattr(self, name)!r}" for name, d in defaults.items()
                  if name not in ("kernel", "n", "target", "vec", "eps") and getattr(self, name) != d]
        return " ".join(parts)

    def digest(self) -> str:
        return hashlib.sha256(self.key_string().encode()).hexdigest()


def _check_int(name: str, value: object, lo: int, hi: int, what: str) -> None:
    """A knob that must be an int (not a bool) in [lo, hi]; else an error naming it and the choices."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}={value!r}: {what}")
