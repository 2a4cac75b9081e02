"""Per-target tables: the chip, its target attribute, conversion pass, warp size, binary formats.

One entry per chip; kernels stay vendor-neutral and take target spellings from here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

from . import env

# Chunk loops up to this trip count are unrolled in MLIR (kernels that keep the row in registers).
UNROLL_LIMIT = 64


@dataclass(frozen=True)
class Target:
    chip: str
    vendor: str  # "nvidia" | "amd"
    warp: int
    regs_per_sm: int  # 32-bit registers one multiprocessor / CU holds
    max_regs: int  # per thread
    target_attr: str
    convert_pass: str
    rsqrt_piece: str  # common piece spliced for rsqrt
    atomic_scope: str  # common/atomic_add.mlir's fp32 atomics: their LLVM syncscope ...
    atomic_attrs: str  # ... and attributes
    binary_formats: tuple[str, ...]  # runtime preference order: loadable formats
    isa_suffix: str
    bin_suffix: str
    # LLVM's AMDGPU pipeline hoists the loop-invariant weight loads out of the backward's
    # persistent row loop, so w (as fp32) sits in registers beside the dw sums there.
    hoists_weight: bool = False
    # Thread-block clusters with distributed shared memory (sm_90+): a long row may be split
    # over the blocks of a cluster, which push their partial sums into each other's shared memory
    # (st.async and mbarriers: no cluster barrier per row).
    cluster_piece: str | None = None
    # The largest cluster a forced layout may take: past the portable 8 blocks, the launch asks the
    # driver for a non-portable size (H100 and H200: 16). The policy stays within 8 (layout.MAX_CLUSTER).
    max_cluster: int = 1
    # An L2 prefetch instruction (NVIDIA's prefetch.global.L2), for the rows a block takes next.
    prefetch_piece: str | None = None
    # Asynchronous 16-byte global -> shared copies (cp.async, sm_80+), for staging rows.
    stage_piece: str | None = None
    # The kernel attribute that makes the register allocator leave room for N resident blocks
    # ({} is N), appended to a gpu.func's attributes: NVVM's minctasm (PTX .minnctapersm).
    min_blocks_attr: str | None = None
    # The kernel attribute that caps a thread's registers ({} is the cap): NVVM's maxnreg (PTX
    # .maxnreg). Where a kernel states its block size (.maxntid) and no cap, ptxas may trade a few
    # bytes of spill for a resident block; a cap above what it chose lets it keep them in registers.
    max_regs_attr: str | None = None
    # 16-byte loads and stores with an L2 eviction policy (createpolicy + .L2::cache_hint, sm_80+):
    # the policies (once per kernel) and the hinted loads and stores (once per row tensor).
    policy_piece: str | None = None
    hint_io_piece: str | None = None
    # Programmatic dependent launch (sm_90+): the column sums' kernel starts while the row kernel
    # ends and waits for it in-kernel (griddepcontrol); none: stream order alone.
    grid_dep_piece: str | None = None
    # A quantized forward's conversions to OCP fp8 e4m3fn and int8 (sm_89+ cvt, gfx950's OCP fp8);
    # none: the quantized forwards are refused.
    quant_piece: str | None = None

    @property
    def hints(self) -> bool:
        return self.policy_piece is not None

    @property
    def clusters(self) -> bool:
        return self.cluster_piece is not None

    def reg_budget_bytes(self, block: int, overhead_regs: int = 28) -> int:
        """Bytes of row data (as fp32) a thread may keep in registers, leaving overhead_regs for
        addresses and temporaries, so that one block still fits a multiprocessor unspilled."""
        regs = min(self.max_regs // 2, self.regs_per_sm // block)
        return 4 * max(0, regs - overhead_regs)

    @property
    def is_nvidia(self) -> bool:
        return self.vendor == "nvidia"

    def stages(self, fmt: str, unroll_limit: int = UNROLL_LIMIT, *, for_key: bool = False) -> dict[str, str]:
        """Ordered, named pass pipelines from the verified input to the binary.

        unroll_limit: affine loops with at most this many trips are unrolled fully (0: none, for
        kernels that stream a long row instead of keeping it in registers). for_key: the text
        for cache keys, without machine-local paths (the hsaco linker's folder).
        """
        unroll = f"affine-loop-unroll{{unroll-factor=-1 unroll-full-threshold={unroll_limit}}}"
        return {
            # Unroll the constant-trip chunk loops in MLIR, not LLVM: the row must stay in
            # registers, and AMDGPU's promote-alloca turns a not-yet-unrolled private array into
            # a vector indexed through select chains before LLVM's own unroller runs.
            "unroll": f"builtin.module(gpu.module(gpu.func({unroll}), func.func({unroll})), "
            "lower-affine, canonicalize, cse)",
            "llvm": f"builtin.module(gpu.module(convert-scf-to-cf, {self.convert_pass}), "
            "reconcile-unrealized-casts)",
            fmt: f"builtin.module(gpu-module-to-binary{{format={fmt}{'' if for_key else self._toolkit_option(fmt)}}})",
        }

    def _toolkit_option(self, fmt: str) -> str:
        if self.vendor == "amd" and fmt == "bin":
            return f" toolkit={rocm_toolkit()}"
        return ""

    def default_format(self) -> str:
        """The binary a compile produces by default: cubin/hsaco where the tools exist, else ISA."""
        if self.vendor == "nvidia":
            return "bin" if ptxas_path() else "isa"
        return "bin"


def _nv(chip: str, ptx: str, clusters: bool, prefetch: bool) -> Target:
    return Target(
        chip=chip, vendor="nvidia", warp=32, regs_per_sm=65536, max_regs=255,
        target_attr=f'#nvvm.target<chip = "{chip}", features = "+{ptx}", O = 3>',
        convert_pass="convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=1}",
        rsqrt_piece="common/rsqrt_nvvm.mlir", atomic_scope="device", atomic_attrs="",
        binary_formats=("bin", "isa"), isa_suffix=".ptx", bin_suffix=".cubin",
        cluster_piece="common/cluster_push_nvvm.mlir" if clusters else None, max_cluster=16 if clusters else 1,
        # NVPTX selects llvm.nvvm.prefetch.global.L2 only from sm_90 (PTX 8.0) on.
        prefetch_piece="common/prefetch_nvvm.mlir" if prefetch else None, stage_piece="common/stage_nvvm.mlir",
        min_blocks_attr=", nvvm.minctasm = {} : i32", max_regs_attr=", nvvm.maxnreg = {} : i32",
        policy_piece="common/cache_policy_nvvm.mlir",
        grid_dep_piece="common/grid_dep_nvvm.mlir" if clusters else None,
        hint_io_piece="common/hint_io_nvvm.mlir",
        quant_piece="common/quant_nvvm.mlir" if clusters else None,  # fp8 conversions from sm_89; sm_80 has none
    )


def _amd(chip: str) -> Target:
    return Target(
        # gfx950's fp8 is OCP e4m3fn; gfx942's is the FNUZ variant, which torch.float8_e4m3fn is not.
        quant_piece="common/quant_rocdl.mlir" if chip == "gfx950" else None,
        chip=chip, vendor="amd", warp=64, regs_per_sm=131072, max_regs=256, hoists_weight=True,
        target_attr=f'#rocdl.target<chip = "{chip}", O = 3>',
        convert_pass=f"convert-gpu-to-rocdl{{chipset={chip} use-bare-ptr-memref-call-conv=1}}",
        rsqrt_piece="common/rsqrt_rocdl.mlir", atomic_scope="agent",
        atomic_attrs="{rocdl.no_fine_grained_memory, rocdl.no_remote_memory} ",
        binary_formats=("bin",), isa_suffix=".s", bin_suffix=".hsaco",
    )


TARGETS: dict[str, Target] = {
    t.chip: t
    for t in (_nv("sm_90", "ptx81", clusters=True, prefetch=True),
              _nv("sm_80", "ptx70", clusters=False, prefetch=False),
              _nv("sm_100", "ptx86", clusters=True, prefetch=True), _amd("gfx950"), _amd("gfx942"))
}
# The two targets every kernel is checked on in CI.
PRIMARY = ("sm_90", "gfx950")


def get(chip: str) -> Target:
    try:
        return TARGETS[chip]
    except KeyError:
        raise ValueError(f"target {chip!r} is not supported; choose one of {sorted(TARGETS)}") from None


def ptxas_path() -> str | None:
    return env.PTXAS.get() or shutil.which("ptxas")


_LLD_CANDIDATES = ("/usr/lib/llvm-22/bin/ld.lld", "/usr/lib/llvm-21/bin/ld.lld", "/usr/lib/llvm-20/bin/ld.lld")


def _toolkit_roots() -> list[str]:
    return [v for v in (env.ROCM_PATH.get(), env.SYSTEM_ROCM_PATH.get(), "/opt/rocm") if v]


def lld_path() -> str | None:
    """The ld.lld that links gfx hsaco: a ROCm folder's, else Debian's (see rocm_toolkit)."""
    for root in _toolkit_roots():
        lld = os.path.join(root, "llvm", "bin", "ld.lld")
        if os.path.exists(lld):
            return lld
    return next((lld for lld in _LLD_CANDIDATES if os.path.exists(lld)), None)


def rocm_toolkit() -> str:
    """A folder holding llvm/bin/ld.lld, as gpu-module-to-binary wants for hsaco."""
    for root in _toolkit_roots():
        if os.path.exists(os.path.join(root, "llvm", "bin", "ld.lld")):
            return root
    lld = lld_path()
    if lld is None:
        raise RuntimeError(
            "no ld.lld found to link gfx hsaco: install one with `bash scripts/setup.sh` "
            "(Debian lld-22) or point NORMIR_ROCM_PATH at a ROCm folder that has llvm/bin/ld.lld"
        )
    # Debian's lld lives in /usr/lib/llvm-N/bin; its parent's parent/llvm/bin does not exist, so
    # make a tiny toolkit folder with a link to it: in the cache folder, else (read-only) in the
    # temporary folder.
    for base in (env.CACHE_DIR.get(), os.path.join(tempfile.gettempdir(), "normir")):
        kit = os.path.join(base, "rocm-toolkit")
        link = os.path.join(kit, "llvm", "bin", "ld.lld")
        try:
            if os.path.realpath(link) != os.path.realpath(lld):
                os.makedirs(os.path.dirname(link), exist_ok=True)
                tmp = f"{link}.{os.getpid()}"
                os.symlink(lld, tmp)
                os.replace(tmp, link)
            return kit
        except OSError:
            continue
    raise RuntimeError(f"cannot make a toolkit folder linking {lld} under {env.CACHE_DIR.get()} or the "
                       "temporary folder: set NORMIR_ROCM_PATH to a folder that has llvm/bin/ld.lld")
