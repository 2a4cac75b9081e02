"""The GPU tier's case tables, shared with scripts/aot_plan.py so that the AOT cache carried to
the GPU machine holds exactly the specializations the tests and the benchmark launch."""

from __future__ import annotations

from normir.layout import DTYPES, max_vec
from normir.ops._rows import BWD_KEY_EPS

DTYPE_NAMES = ("f32", "f16", "bf16")
# N: 1 and 100 -> several rows per block with narrow vectors (vec 1 / 4); 1024, 2048 -> rows
# that fit one warp or a few; 2880, 5120 -> tail chunks (N not a multiple of threads x 8);
# 8192 -> one multi-warp row per block; 65536 -> the longest register rows (bf16) or the
# re-reading path (f32); see layout.geometry.row_layout.
FWD_N = (1, 100, 1024, 2048, 2880, 5120, 8192, 16384, 65536)
FWD_M = (1, 199, 4096)
EPS = (1e-6, 1e-5, 1e-2)
LARGE_N = (131072,)  # past the register range in every dtype: the re-reading path
TRAIN_N = 256
# (N, row pitch in elements, element offset of the first row): unaligned pointers and pitches
# must pick narrower vectors, never fault and never read the wrong bytes.
ALIGN_CASES = ((4096, 4096, 1), (4096, 4100, 0), (4096, 4104, 0), (1023, 1023, 0), (2880, 2888, 2))
# (N, blocks per row, dtype) forced through NORMIR_TPR: rows split over thread-block clusters of
# every size, with a masked tail (2880 / 4: 90 chunks per block), f32, and 65536 kept in one block
# (the layout sm_80 gets: x, dy re-read and the dw sums in memory), which the H200's own policy
# no longer reaches; 65536 over 16, a non-portable cluster (the launch asks the driver for it).
CLUSTER_CASES = ((2880, 4, "bf16"), (5120, 2, "f32"), (8192, 8, "bf16"), (65536, 1, "bf16"), (65536, 8, "f16"),
                 (65536, 16, "bf16"))
# (N, dtype, forward layout, backward layout) forced through NORMIR_TPR where the policy does
# not go: staging off where it is on and on where it is off, hints, register caps, clusters.
FORCED_CASES = (
    (7168, "bf16", {}, {"stage": 0}),  # backward re-read with the L2 prefetch
    (32768, "bf16", {"cluster": 1}, {"stage": 1}),  # forward in one block; backward staged, 2-block clusters
    (65536, "bf16", {"cluster": 1}, {"l2_prefetch": 0}),  # forward in one 1024-thread block; backward without prefetch
    (4096, "bf16", {"hints": 23}, {"hints": 23}),  # every L2 hint and L1 keep (as scripts/sanitize.py forces them)
    (65536, "f32", {}, {}),  # forward split over a 2-block cluster
    # Cache hints (23: the last reads, stores and first reads under L2 policies, loads keeping L1 lines):
    (2880, "bf16", {"hints": 23}, {"hints": 23}),  # forward row in registers; backward re-read
    (32768, "bf16", {"hints": 3}, {"hints": 23}),  # backward over 2-block clusters
    (8192, "bf16", {"hints": 2, "min_blocks": 4}, {"hints": 2}),  # backward staged: dx stores only
    (16384, "bf16", {}, {"stage": 1, "hints": 0}),  # backward staged at 512 threads x 4 chunks, no hints
    (16384, "bf16", {}, {"stage": 0}),  # the backward's former default: re-read with the L2 prefetch
    (262144, "bf16", {"cluster": 1, "hints": 23}, {"hints": 3}),  # forward re-read: pass 1 keeps the row
    (65536, "bf16", {}, {"overlap": 4}),  # backward over a cluster: all of pass 2's loads inside the exchange
    (32768, "f16", {}, {"overlap": 1, "hints": 0}),  # one chunk inside the exchange, no hints
    (4096, "bf16", {"cache_row": 1}, {"cache_row": 1}),  # forward and backward rows held in registers
    (8192, "f32", {"cache_row": 1}, {}),  # the forward's former f32 default, held
    (16384, "f16", {}, {"cache_row": 0}),  # without a weight: re-read, not staged
    (32768, "bf16", {"cluster": 2}, {}),  # the forward over 2 blocks (pushes)
    (65536, "f16", {"cluster": 4}, {"overlap": 4}),  # 4 blocks, all of pass 2 inside the exchange
    (65536, "bf16", {"overlap": 4}, {}),  # the forward held over a cluster: w's first 4 chunks before the reductions
)
OTHER_WEIGHT_N = (100, 2880, 65536)  # test_weight_in_another_dtype: each type read in its own
# (N, dtype) for the backward without a weight, whose policy differs (the hold_unweighted rule):
# the row held in registers, staged through shared memory, every chunk loaded inside the barrier,
# and the cache hints of held rows neither staged nor split (2048, 2880, 4096).
# Rows past 16384 whose dw sums fill BWD_SPLIT_DW registers: split over a cluster (layout.geometry.bwd_layout's
# crowded rows; one block of 544-896 threads spilled): RMSNorm's backward and its fused add's.
SUMS_SPLIT_N = (20480, 24576, 49152)
NO_WEIGHT_CASES = ((2048, "bf16"), (4096, "bf16"), (4096, "f16"), (2880, "f32"), (16384, "bf16"), (32768, "bf16"),
                   (65536, "f16"))


def tpr_value(layout: dict) -> str:
    """A forced layout as a NORMIR_TPR value: TPR[xCLUSTER][pN][sN][mN][hN][oN][rN][bN][dN][nN][wN][tN][gN]."""
    out = f"{layout.get('tpr', 0)}x{layout.get('cluster', 0)}"
    if layout.get("l2_prefetch", -1) >= 0:
        out += f"p{layout['l2_prefetch']}"
    if layout.get("stage", -1) >= 0:
        out += f"s{layout['stage']}"
    if layout.get("min_blocks", 0):
        out += f"m{layout['min_blocks']}"
    if layout.get("hints", -1) >= 0:
        out += f"h{layout['hints']}"
    if layout.get("overlap", -1) >= 0:
        out += f"o{layout['overlap']}"
    if layout.get("cache_row", -1) >= 0:
        out += f"r{layout['cache_row']}"
    if layout.get("batch_reload", -1) >= 0:
        out += f"b{layout['batch_reload']}"
    if layout.get("db_smem", -1) >= 0:
        out += f"d{layout['db_smem']}"
    if layout.get("max_regs", 0):
        out += f"n{layout['max_regs']}"
    if layout.get("cast_words", -1) >= 0:
        out += f"w{layout['cast_words']}"
    if layout.get("two_pass", -1) >= 0:
        out += f"t{layout['two_pass']}"
    if layout.get("stage_dres", -1) >= 0:
        out += f"g{layout['stage_dres']}"
    return out

# Fused residual-add RMSNorm (test_gpu_fused_add.py). Each combination of dtypes and features:
# (x, residual, weight, bias, residual_dtype, out_dtype, weight_offset); None: absent / default.
FUSED_COMBOS = (
    ("bf16", "f32", "bf16", None, None, None, 0.0),  # the fp32 residual stream: dx bf16, dresidual f32
    ("bf16", "bf16", "bf16", None, "f32", None, 0.0),  # residual_out in fp32 from 16-bit inputs
    ("f16", "f16", "bf16", None, None, None, 0.0),  # a bf16 weight with f16 x
    ("bf16", "bf16", "f32", None, None, None, 0.0),  # an fp32 weight with bf16 x
    ("bf16", "bf16", "bf16", None, None, "f32", 0.0),  # out_dtype
    ("bf16", "bf16", "bf16", None, None, None, 1.0),  # weight_offset (Gemma's 1 + w)
    ("bf16", "bf16", "bf16", "bf16", None, None, 0.0),  # a bias
    ("f16", "f16", "f32", "f32", "f32", "f32", 1.0),  # all of them at once
    ("f32", "f32", "f32", None, "bf16", None, 0.0),  # a 16-bit residual_out from fp32 inputs
    ("bf16", None, "bf16", "bf16", None, None, 0.0),  # a bias without a residual
    ("bf16", "bf16", None, "bf16", None, None, 0.0),  # a bias without a weight: db's sums alone
)
# 100: narrow vectors; 768, 1152, 1600: the backward's rows split evenly (one chunk a thread;
# with dw's and db's sums 8- and 4-byte chunks); 1536: full rows at one chunk a thread (with
# d_residual_out; 1024 and 2048 in FWD_N); 2880: a masked tail; 8192: a multi-warp row; 65536:
# clusters, the re-reading path with two fp32 row tensors, the column sums in memory.
FUSED_N = (100, 768, 1152, 1536, 1600, 2880, 8192, 65536)
# scripts/sanitize.py: (N, x's dtype) with two combinations: the residual in x's type, and an fp32
# residual with a bias and a weight offset (dx and dresidual both written, db summed).
SANITIZE_FUSED = ((100, "bf16"), (1152, "bf16"), (2880, "bf16"), (4096, "f16"), (16384, "bf16"), (65536, "bf16"),
                  (131072, "f32"))


def sanitize_combos(dt: str) -> tuple[tuple, ...]:
    return (dt, dt, dt, None, None, None, 0.0), (dt, "f32", dt, dt, None, None, 1.0)


FUSED_EPS_N = 4096
FUSED_ATOMIC_N = 4096

BENCH_N = (1024, 2048, 2880, 4096, 7168, 8192, 16384, 32768, 65536)
# Models' hidden sizes, where the 16-byte chunks often do not split evenly over whole warps (the
# policy splits them evenly: the even_rows rule, _even_bwd): 768 (BERT-base, ViT-B), 896, 1536 and
# 3584 (Qwen2.5), 1152 (DiT-XL), 1280 (ViT-H), 1600 (GPT-2 XL), 2560, 5120. In the GPU tier and
# in `scripts/bench.py --ns`.
MODEL_N = (768, 896, 1152, 1280, 1536, 1600, 2560, 3584, 5120)
PROFILE_N = 4096  # scripts/host_profile.py


def _fwd(n, dt, wdt, eps=1e-6, has_weight=True, store_rstd=True, vec=0, **layout):
    return dict(kernel="rmsnorm_fwd", n=n, dtype=dt, wdtype=wdt, eps=eps, target="sm_90",
                has_weight=has_weight, store_rstd=store_rstd, vec=vec or max_vec(n, DTYPES[dt]), **layout)


def _bwd(n, dt, wdt, has_weight=True, atomic=False, vec=0, **layout):
    out = [dict(kernel="rmsnorm_bwd", n=n, dtype=dt, wdtype=wdt, eps=BWD_KEY_EPS, target="sm_90",
                has_weight=has_weight, store_rstd=False, vec=vec or max_vec(n, DTYPES[dt]), atomic_dw=atomic,
                **layout)]
    if has_weight:
        out.append(dict(kernel="rmsnorm_dw_reduce", n=n, dtype="f32", wdtype=wdt, eps=BWD_KEY_EPS, target="sm_90",
                        has_weight=True, store_rstd=False, vec=max_vec(n, 4)))
    return out


def fused_fwd(n, x, r=None, w="", b=None, s=None, o=None, offset=0.0, *, eps=1e-6, store_rstd=True,
              store_residual=True, vec=0, kernel="fused_add_rmsnorm_fwd") -> dict:
    """The forward specialization normir.ops.fused_add_rmsnorm._fwd launches for these dtypes (a
    weight of w's type; "" its default, x's; None no weight); kernel: LayerNorm's too."""
    return dict(kernel=kernel, n=n, dtype=x, wdtype=w or x, eps=eps, target="sm_90",
                has_weight=w is not None, store_rstd=store_rstd, vec=vec, rdtype=r or "", sdtype=(s or "") if r else "",
                odtype=o or "", bdtype=b or "", store_residual=bool(r) and store_residual, weight_offset=offset)


def fused_bwd(n, x, r=None, w="", b=None, s=None, o=None, offset=0.0, *, dres_out=True, atomic=False,
              vec=0, kernel="fused_add_rmsnorm_bwd", g=None) -> list[dict]:
    """The backward specializations autograd launches after fused_fwd with these dtypes: the
    row kernel (residual_out in s or r or x, dy in o or x, dx in x, dresidual in r where it
    differs, d_residual_out in g or residual_out's) and the column sums of dw and db."""
    h = (s or r) if r else x
    out = [dict(kernel=kernel, n=n, dtype=h, wdtype=w or x, eps=BWD_KEY_EPS, target="sm_90",
                has_weight=w is not None, store_rstd=False, vec=vec, atomic_dw=atomic,
                rdtype=r if r and r != x else "", odtype=o or x, xdtype=x, bdtype="f32" if b else "",
                has_dres_out=(bool(r) or bool(g)) and dres_out, weight_offset=offset, gdtype=g or "")]
    sums = [t for t in ((w or x) if w is not None else None, b) if t]  # dw's type, db's (one launch)
    if sums and not atomic:
        out.append(dict(kernel="rmsnorm_dw_reduce", n=n, dtype="f32", wdtype=sums[0], eps=BWD_KEY_EPS, target="sm_90",
                        has_weight=True, store_rstd=False, vec=max_vec(n, 4), bdtype=sums[1] if len(sums) > 1 else ""))
    return out


def _vecs(n: int, dt: str) -> list[int]:
    v, out = max_vec(n, DTYPES[dt]), []
    while v >= 1:
        out.append(v)
        v //= 2
    return out


def specializations() -> list[dict]:
    plan: list[dict] = []
    for dt in DTYPE_NAMES:
        for n in FWD_N + LARGE_N:
            plan += [_fwd(n, dt, dt), _fwd(n, dt, "f32"), _fwd(n, dt, dt, has_weight=False),
                     _fwd(n, dt, dt, store_rstd=False)]
            plan += _bwd(n, dt, dt) + _bwd(n, dt, "f32") + _bwd(n, dt, dt, has_weight=False)
        for n in MODEL_N:  # (and scripts/sanitize.py's backward without a weight at 768)
            plan += [_fwd(n, dt, dt)] + _bwd(n, dt, dt) + _bwd(n, dt, dt, has_weight=False)
        for eps in EPS:
            plan.append(_fwd(4096, dt, dt, eps=eps))
            plan.append(_fwd(100, dt, dt, eps=eps))
        plan.append(_fwd(2880, dt, dt, eps=1e-5))  # test_autograd_3d
        for n, _, _ in ALIGN_CASES:
            for v in _vecs(n, dt):
                plan.append(_fwd(n, dt, dt, vec=v))
                plan.append(_fwd(n, dt, dt, vec=v, store_rstd=False))  # the fast-path fallback test
                plan += _bwd(n, dt, dt, vec=v)
    for n in OTHER_WEIGHT_N:
        for dt, wdt in (("bf16", "f16"), ("f16", "bf16"), ("f32", "bf16")):
            plan += [_fwd(n, dt, wdt)] + _bwd(n, dt, wdt)
    plan += _bwd(4096, "bf16", "bf16", atomic=True) + _bwd(1024, "f32", "f32", atomic=True)
    plan += _bwd(32768, "bf16", "bf16", atomic=True)
    for n, dt, fwd, bwd in FORCED_CASES:
        plan += [_fwd(n, dt, dt, **fwd), _fwd(n, dt, dt, has_weight=False, **fwd)]
        plan += _bwd(n, dt, dt, **bwd) + _bwd(n, dt, dt, has_weight=False, **bwd)
    for n, dt in NO_WEIGHT_CASES:
        plan += [_fwd(n, dt, dt, has_weight=False)] + _bwd(n, dt, dt, has_weight=False)
    for n in SUMS_SPLIT_N:
        for dt in ("bf16", "f16"):
            plan += [_fwd(n, dt, dt)] + _bwd(n, dt, dt)
            plan += [fused_fwd(n, dt, dt)] + fused_bwd(n, dt, dt)
    for n, c, dt in CLUSTER_CASES:
        plan += [_fwd(n, dt, dt, cluster=c), _fwd(n, dt, dt, cluster=c, has_weight=False)]
        plan += _bwd(n, dt, dt, cluster=c) + _bwd(n, dt, dt, cluster=c, has_weight=False)
        if c > 1:
            plan += _bwd(n, dt, dt, cluster=c, atomic=True)
    plan += [_fwd(TRAIN_N, "bf16", "bf16"), _fwd(TRAIN_N, "bf16", "bf16", store_rstd=False)] + _bwd(TRAIN_N, "bf16", "bf16")
    plan += [_fwd(4096, "bf16", "bf16", store_rstd=False)]
    # The custom-op tests (test_custom_op*): forwards without a weight and without rstd.
    plan += [_fwd(n, "bf16", "bf16", has_weight=False, store_rstd=False) for n in (1024, 2880)]
    for n in BENCH_N + MODEL_N:
        plan += [_fwd(n, "bf16", "bf16", store_rstd=False), _fwd(n, "bf16", "bf16")]
        plan += _bwd(n, "bf16", "bf16") + _bwd(n, "bf16", "bf16", atomic=True)
    plan += fused_specializations() + layer_specializations() + swap_specializations() + integration_specializations()
    plan += stage_dres_specializations() + training_specializations() + distributed_specializations()
    plan += quant_specializations()
    plan += serving_specializations()
    seen, out = set(), []
    for p in plan:
        k = tuple(sorted(p.items()))
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out


def fused_specializations() -> list[dict]:
    """What test_gpu_fused_add.py and the benchmark's fused rows launch."""
    plan: list[dict] = []
    for dt in DTYPE_NAMES:  # the shared N and M sets, residual in x's type, d_residual_out given
        for n in FWD_N:
            plan += [fused_fwd(n, dt, dt)] + fused_bwd(n, dt, dt)
    for combo in FUSED_COMBOS:
        for n in FUSED_N:
            plan.append(fused_fwd(n, *combo))
            plan += fused_bwd(n, *combo) + fused_bwd(n, *combo, dres_out=False)
    for n, dt in SANITIZE_FUSED:
        for combo in sanitize_combos(dt):
            plan += [fused_fwd(n, *combo)] + fused_bwd(n, *combo)
    for eps in EPS:
        plan.append(fused_fwd(FUSED_EPS_N, "bf16", "bf16", eps=eps, store_rstd=False, store_residual=True))
    n = FUSED_ATOMIC_N
    plan += fused_bwd(n, "bf16", "bf16", b="bf16", atomic=True) + fused_bwd(n, "bf16", "bf16", b="bf16")
    plan += [fused_fwd(n, "bf16", "bf16", b="bf16")]
    # No weight; prenorm without a residual (x normalized, residual_out = x); only the residual
    # requiring grad; one row; 3D; the standalone forward without rstd.
    plan += [fused_fwd(1024, "bf16", w=None), fused_fwd(1024, "bf16", w=None, store_rstd=False)]
    plan += fused_bwd(1024, "bf16", w=None) + [fused_fwd(1024, "bf16")] + fused_bwd(1024, "bf16")
    plan += [fused_fwd(2880, "f32", "f32", s="bf16", store_rstd=False)]
    plan += [fused_fwd(1024, "bf16", "f32", b="bf16", offset=o) for o in (0.0, 1.0)]  # opcheck
    plan += fused_bwd(1024, "bf16", "f32", b="bf16") + fused_bwd(1024, "bf16", "f32", b="bf16", offset=1.0)
    for n, _, _ in ALIGN_CASES[:3]:
        for v in _vecs(n, "bf16"):
            plan += [fused_fwd(n, "bf16", "bf16", vec=v)] + fused_bwd(n, "bf16", "bf16", vec=v)
    gradcheck = ("f32", "f32", "f32", "f32", None, None, 1.0)
    plan += [fused_fwd(100, *gradcheck)] + fused_bwd(100, *gradcheck)
    # The fast path of repeated calls (both norms, a bias, d_residual_out): x 16- and 2-byte aligned.
    for v in (0, 1):
        plan += [fused_fwd(4096, "bf16", "bf16", b="bf16", vec=v), layer_fwd(4096, "bf16", "bf16", b="bf16", vec=v)]
    plan += fused_bwd(4096, "bf16", "bf16", b="bf16") + layer_bwd(4096, "bf16", "bf16", b="bf16")
    plan += [fused_fwd(TRAIN_N, "bf16", "f32")] + fused_bwd(TRAIN_N, "bf16", "f32")
    for n in BENCH_N + MODEL_N:
        plan += [fused_fwd(n, "bf16", "bf16", store_rstd=False), fused_fwd(n, "bf16", "bf16")]
        plan += fused_bwd(n, "bf16", "bf16") + fused_bwd(n, "bf16", "bf16", atomic=True) + fused_bwd(n, "bf16", "f32")
        plan += [fused_fwd(n, "bf16", "f32", store_rstd=False), fused_fwd(n, "bf16", "f32")]
    return plan


# LayerNorm and fused-add LayerNorm (test_gpu_layernorm.py): (x, weight, bias) without a residual,
# and (x, residual, weight, bias, residual_dtype, out_dtype) with one; None: absent / default.
LN_EPS = 1e-5
LN_COMBOS = (("bf16", None, None), ("bf16", "bf16", None), ("bf16", None, "bf16"), ("bf16", "f32", "f32"),
             ("f16", "bf16", "bf16"), ("f32", "bf16", None))
LN_COMBO_N = (100, 2880, 65536)
LN_NO_WB_HELD_N = (32768, 131072)  # bf16 rows without w and b held over 2 and 8 blocks (the hold_unweighted rule)
LN_FUSED_COMBOS = (
    ("bf16", "f32", "bf16", "bf16", None, None),  # the fp32 residual stream
    ("bf16", "bf16", "bf16", "bf16", None, None),
    ("f16", "f16", "f32", None, "f32", "f32"),  # residual_out and y in fp32, an fp32 weight, no bias
    ("f32", "f32", "f32", "f32", "bf16", None),  # a 16-bit residual_out from fp32 inputs
)
LN_STATS_N = (100, 2880, 65536)
LN_ACCURACY_N = (1024, 2880, 4096)  # 2880: the two-pass variance (the two_pass rule)
LN_BIT_N = (1024, 65536)
# 1280, 2560: the fused add's forward held over 1 and 5 warps (32 x 5, 160 x 2); 4096: its backward
# with db's sums in shared memory, capped; 6144, 7168: its backward's rows of 6 and 7 warps in one
# block, read again, both sums in dynamic shared memory (the even_halves rule's one block); 32768: its forward held
# over a 4-block cluster; 512: its backward in blocks of 8 rows under a register cap
# (the rows_cap rule); 3456, 4608, 7424, 12288: its backward's rows read again in one block (3456,
# 4608: the even_halves rule's one block) and over clusters of 2 and 4 blocks, a masked chunk at 3456 and 7424,
# 6 warps at 12288, both sums in shared memory; 40960: its backward over 8 blocks of 5 warps, 4
# chunks a thread, d_residual_out's early chunks loaded inside the exchange (OVERLAP_DRES).
LN_FUSED_N = (*FUSED_N, 512, 1280, 2560, 3456, 4096, 4608, 6144, 7168, 7424, 12288, 32768, 40960)
# Beside the shared N set: LayerNorm's own backward read again over 2 blocks of 8 warps with a
# masked chunk (7680), and in one block of 2 chunks a thread, read again, both sums in shared
# memory (the even_halves rule's one block): 5 and 7 warps with a masked chunk (2112, 3520), 6, 9 and 12 warps
# (3072, 4608, 6144), 14 warps with the slots in dynamic shared memory (7168); its forward
# streamed in 1024 threads capped for 2 blocks (32768).
LN_LAYOUT_N = (2112, 3072, 3520, 4608, 6144, 7168, 7680, 32768)
# scripts/sanitize.py: (N, x's dtype): several rows per block with narrow vectors (100; 512 under
# the fused add's register cap), rows split evenly (1600: the forward 16 threads a row, the
# backward 4-byte chunks; 2560: the fused add's forward held at 2 chunks a thread), a masked tail
# (2880), rows in registers (4096),
# multi-warp rows (16384), the backward in one block with both sums in shared memory (4608; 7168
# in the dynamic), both sums in shared memory over 2 blocks read again (7680),
# rows over clusters of 2 / 4 / 8 blocks (32768, 65536, 131072 in f32);
# each with every SANITIZE_LN_COMBOS entry, (name, weight, bias, the residual's dtype, "x" for
# x's, or None): weight and bias of x's type; the fused add gets d_residual_out. Atomic column
# sums at SANITIZE_LN_ATOMIC_N (bf16), with and without an fp32 residual.
SANITIZE_LN = ((100, "bf16"), (512, "bf16"), (1600, "bf16"), (2560, "bf16"), (2880, "bf16"), (4096, "f16"),
               (4608, "bf16"), (7168, "bf16"), (7680, "bf16"), (16384, "bf16"), (32768, "bf16"), (65536, "bf16"),
               (131072, "f32"))
SANITIZE_LN_COMBOS = (("plain", True, False, None), ("bias", True, True, None), ("no weight", False, False, None),
                      ("fused f32 residual", True, True, "f32"), ("fused", True, True, "x"))
SANITIZE_LN_ATOMIC_N = (4096, 32768)


def layer_fwd(n, x, r=None, w="", b=None, s=None, o=None, *, eps=LN_EPS, **kw) -> dict:
    return fused_fwd(n, x, r, w, b, s, o, eps=eps, kernel="layernorm_fwd", **kw)


def layer_bwd(n, x, r=None, w="", b=None, s=None, o=None, **kw) -> list[dict]:
    return fused_bwd(n, x, r, w, b, s, o, kernel="layernorm_bwd", **kw)


# LayerNorm's backward with db's sums in shared memory, forced on layouts the policy does not give
# it (the policy's own: 1024, 2048, 4096 plain; 2880, 4096 fused, in FWD_N and LN_FUSED_N):
# test_db_sums_in_shared_memory runs each, scripts/sanitize.py those of SANITIZE_LN's N.
# db_smem 2 and 3: the slots in 16-byte quarters (db's; dw's too), 16384's in the sanitizer; 65536
# over a non-portable cluster of 16 (2 chunks a thread, so both sums fit the slots), there too;
# 8192 in one block of 512 threads, its slots (64 KB) in dynamic shared memory.
DB_SMEM_CASES = ((1024, dict(tpr=64, db_smem=1)), (2880, dict(tpr=96, cluster=2, cache_row=1, db_smem=1)),
                 (4096, dict(tpr=128, db_smem=1)), (4096, dict(tpr=256, cache_row=0, db_smem=1)),
                 (8192, dict(tpr=256, cluster=2, db_smem=1)), (32768, dict(tpr=256, cluster=8, db_smem=1)),
                 (1024, dict(tpr=64, db_smem=2)), (4096, dict(tpr=128, db_smem=3)),
                 (16384, dict(tpr=256, cluster=4, db_smem=3)),
                 (65536, dict(tpr=256, cluster=16, min_blocks=3, db_smem=3)),
                 (8192, dict(tpr=512, cluster=1, cache_row=0, min_blocks=2, db_smem=3)))


# d_residual_out copied into shared memory in pass 1 (the stage_dres knob), forced: (kernel, N, knobs),
# the rows with d_residual_out in bf16 (and with a bias); test_d_residual_out_staged in
# test_gpu_fused_add.py and test_gpu_layernorm.py, and scripts/sanitize.py. A masked last chunk
# (2880), RMSNorm's fused add held over a cluster, LayerNorm's slots past its dynamic ones (65536)
# and after its held rows' both sums (16384).
STAGE_DRES_CASES = (("fused_add_rmsnorm_bwd", 2880, dict(stage_dres=1)),
                    ("fused_add_rmsnorm_bwd", 65536, dict(cache_row=1, stage_dres=1)),
                    ("layernorm_bwd", 2880, dict(stage_dres=1)),
                    ("layernorm_bwd", 65536, dict(stage_dres=1)),
                    ("layernorm_bwd", 16384, dict(tpr=256, cluster=2, cache_row=1, db_smem=3, stage_dres=1)))


def stage_dres_specializations() -> list[dict]:
    """STAGE_DRES_CASES' kernels: each forward, and the backward with its knobs forced."""
    plan: list[dict] = []
    for kernel, n, knobs in STAGE_DRES_CASES:
        fwd, bwd = (layer_fwd, layer_bwd) if kernel == "layernorm_bwd" else (fused_fwd, fused_bwd)
        for b in (None, "bf16"):
            plan.append(fwd(n, "bf16", "bf16", b=b))
            plan += [{**d, **knobs} if d["kernel"] == kernel else d for d in bwd(n, "bf16", "bf16", b=b)]
    return plan


def _forced_bwd(specs: list[dict], knobs: dict) -> list[dict]:
    """specs with knobs forced on LayerNorm's backward row kernel (not on the column sums)."""
    return [{**d, **knobs} if d["kernel"] == "layernorm_bwd" else d for d in specs]


def layer_specializations() -> list[dict]:
    """What test_gpu_layernorm.py, scripts/sanitize.py's and the benchmark's LayerNorm rows launch."""
    plan: list[dict] = []
    for dt in DTYPE_NAMES:  # the shared N and M sets with a weight and a bias of x's type
        for n in FWD_N + MODEL_N + LN_LAYOUT_N:
            plan += [layer_fwd(n, dt, b=dt)] + layer_bwd(n, dt, b=dt)
        for n in LN_STATS_N:
            plan += [layer_fwd(n, dt, b=dt, store_rstd=False)]
    for x, w, b in LN_COMBOS:
        for n in LN_COMBO_N:
            plan += [layer_fwd(n, x, w=w, b=b)] + layer_bwd(n, x, w=w, b=b)
    for n in LN_NO_WB_HELD_N:
        plan += [layer_fwd(n, "bf16", w=None)] + layer_bwd(n, "bf16", w=None)
    for combo in LN_FUSED_COMBOS:
        for n in LN_FUSED_N:
            plan.append(layer_fwd(n, *combo))
            plan += layer_bwd(n, *combo) + layer_bwd(n, *combo, dres_out=False)
    for n in LN_ACCURACY_N:
        plan.append(layer_fwd(n, "f32", w=None, store_rstd=False))
    for eps in EPS:
        plan.append(layer_fwd(4096, "bf16", b="bf16", eps=eps, store_rstd=False))
    for n in LN_BIT_N:
        plan += layer_bwd(n, "bf16", b="bf16", atomic=True)
    for n, dt in SANITIZE_LN:
        for _, has_w, has_b, r in SANITIZE_LN_COMBOS:
            w, b, r = (dt if has_w else None), (dt if has_b else None), (dt if r == "x" else r)
            plan += [layer_fwd(n, dt, r, w, b)] + layer_bwd(n, dt, r, w, b)
    for n in SANITIZE_LN_ATOMIC_N:
        for r in (None, "f32"):
            plan += [layer_fwd(n, "bf16", r, b="bf16")] + layer_bwd(n, "bf16", r, b="bf16", atomic=True)
    for n, knobs in DB_SMEM_CASES:
        plan += [layer_fwd(n, "bf16", b="bf16"), layer_fwd(n, "bf16", "f32", b="bf16")]
        plan += _forced_bwd(layer_bwd(n, "bf16", b="bf16") + layer_bwd(n, "bf16", "f32", b="bf16")
                            + layer_bwd(n, "bf16", b="bf16", atomic=True), knobs)
        for sn, dt in SANITIZE_LN:
            if sn == n:
                for _, has_w, has_b, r in SANITIZE_LN_COMBOS:
                    r = dt if r == "x" else r
                    plan += _forced_bwd(layer_bwd(n, dt, r, dt if has_w else None, dt if has_b else None), knobs)
    gradcheck = ("f32", "f32", "f32", "f32")
    plan += [layer_fwd(100, *gradcheck)] + layer_bwd(100, *gradcheck)
    plan += [layer_fwd(1024, "bf16", "bf16", b="bf16")] + layer_bwd(1024, "bf16", "bf16", b="bf16")
    plan += [layer_fwd(1024, "bf16", "f32", w="f32", b="bf16")] + layer_bwd(1024, "bf16", "f32", w="f32", b="bf16")
    plan += [layer_fwd(TRAIN_N, "bf16", b="bf16")] + layer_bwd(TRAIN_N, "bf16", b="bf16")
    plan += [layer_fwd(1024, "bf16", b="bf16", store_rstd=False), layer_fwd(1024, "bf16", w=None, store_rstd=False)]
    for n in BENCH_N + MODEL_N:
        plan += [layer_fwd(n, "bf16", b="bf16", store_rstd=False), layer_fwd(n, "bf16", b="bf16")]
        plan += layer_bwd(n, "bf16", b="bf16") + layer_bwd(n, "bf16", b="bf16", atomic=True)
        plan += [layer_fwd(n, "bf16", "bf16", b="bf16", store_rstd=False), layer_fwd(n, "bf16", "bf16", b="bf16")]
        plan += layer_bwd(n, "bf16", "bf16", b="bf16") + layer_bwd(n, "bf16", "bf16", b="bf16", atomic=True)
    return plan


SWAP_N = 256  # test_gpu_swap.py's hidden size


def swap_specializations() -> list[dict]:
    """What test_gpu_swap.py launches: the probes (bf16, no gradient), then the swapped model's
    forward and backward: Llama's RMSNorm (eps 1e-6), torch.nn.RMSNorm (eps None: float32's), torch's
    LayerNorm (a bias, eps 1e-5), Gemma's RMSNorm (weight offset 1), and the probe of Cohere's LayerNorm (eps 1e-5) that
    keeps it."""
    n, none_eps = SWAP_N, 1.1920928955078125e-07  # torch.nn.RMSNorm(eps=None): float32's epsilon
    plan: list[dict] = []
    plan.append(_fwd(n, "bf16", "bf16", eps=1e-5, store_rstd=False))  # the probe of Cohere's LayerNorm, refused
    for store in (False, True):
        plan += [_fwd(n, "bf16", "bf16", store_rstd=store), _fwd(n, "bf16", "bf16", eps=none_eps, store_rstd=store),
                 layer_fwd(n, "bf16", b="bf16", store_rstd=store),
                 fused_fwd(n, "bf16", offset=1.0, store_rstd=store)]
    plan += _bwd(n, "bf16", "bf16") + layer_bwd(n, "bf16", b="bf16") + fused_bwd(n, "bf16", offset=1.0)
    return plan


INTEGRATION_N = 512  # test_gpu_integration.py's hidden size


def integration_specializations() -> list[dict]:
    """What test_gpu_integration.py launches (N = INTEGRATION_N; RMSNorm's eps 1e-6, LayerNorm's
    1e-5): each op with and without a gradient (rstd stored or not), its backward with and
    without d_residual_out: torch.compile, CUDA graphs, double backward, the first load inside a
    capture; and the autocast cases (fp32 x and parameters, bf16 x with bf16 or fp32 ones),
    with y in x's dtype (torch.rms_norm before torch 2.12) or in fp32 (layer_norm, and rms_norm
    from 2.12)."""
    n, plan = INTEGRATION_N, []
    for dt, wdt in (("bf16", "bf16"), ("f32", "f32"), ("bf16", "f32")):  # plain RMSNorm
        plan += [_fwd(n, dt, wdt, store_rstd=s) for s in (True, False)] + _bwd(n, dt, wdt)
    plan += [_fwd(n, "bf16", "bf16", has_weight=False, store_rstd=s) for s in (True, False)]
    plan += _bwd(n, "bf16", "bf16", has_weight=False)
    # (x, residual, weight, bias, out_dtype): the fused add with and without a bias; y in fp32
    # under autocast without a residual (bf16 or fp32 weight) and with one.
    fused = (("bf16", "bf16", "", None, None), ("bf16", "bf16", "", "bf16", None), ("bf16", None, "", None, "f32"),
             ("bf16", None, "f32", None, "f32"), ("bf16", "bf16", "", None, "f32"))
    # LayerNorm: (x, residual, weight, bias, out_dtype): weight and bias, neither, the fused add,
    # and the autocast cases (fp32 throughout; bf16 x, y in fp32, with bf16 or fp32 parameters).
    layer = (("bf16", None, "", "bf16", None), ("bf16", None, None, None, None), ("bf16", "bf16", "", "bf16", None),
             ("f32", None, "", "f32", None), ("bf16", None, "", "bf16", "f32"), ("bf16", None, "f32", "f32", "f32"),
             ("bf16", "bf16", "", "bf16", "f32"))
    for table, fwd, bwd in ((fused, fused_fwd, fused_bwd), (layer, layer_fwd, layer_bwd)):
        for x, r, w, b, o in table:
            plan += [fwd(n, x, r, w, b, o=o, store_rstd=s) for s in (True, False)]
            plan += bwd(n, x, r, w, b, o=o) + (bwd(n, x, r, w, b, o=o, dres_out=False) if r else [])
    return plan


# test_gpu_training.py: the compiled keyword families' (eps, weight_offset) values, torch.func's
# hidden size, the backwards' dtype rule's N, LayerNorm's tiny rows.
TRAINING_FLOATS = ((1e-6, 0.5), (1e-5, 1.0))
FUNC_N = 64
GRAD_DTYPE_N = (100, 4096)
TINY_N = (2, 3, 4, 5, 8)


def training_specializations() -> list[dict]:
    """What test_gpu_training.py launches: the compiled forms (bf16, N = INTEGRATION_N) at each
    eps and weight offset, with their backwards; torch.func's (fp32, FUNC_N), each forward with and
    without its statistics and residual_out (a transform without a gradient stores none), each
    backward with and without d_residual_out (an unused residual_out's gradient may come as
    zeros); the dtype rule's forwards and backwards with dy and d_residual_out in other types; and
    LayerNorm's tiny rows (fp32, no weight)."""
    n, plan = INTEGRATION_N, []
    for eps, offset in TRAINING_FLOATS:
        plan += [_fwd(n, "bf16", "bf16", eps=eps)] + _bwd(n, "bf16", "bf16")
        plan += [fused_fwd(n, "bf16", "bf16", "", "bf16", offset=offset, eps=eps)]
        plan += fused_bwd(n, "bf16", "bf16", "", "bf16", offset=offset)
        plan += [fused_fwd(n, "bf16", "bf16", "", None, s="f32", o="f32", eps=eps)]
        plan += fused_bwd(n, "bf16", "bf16", "", None, s="f32", o="f32")
        plan += [layer_fwd(n, "bf16", None, "", "bf16", eps=eps)] + layer_bwd(n, "bf16", None, "", "bf16")
        plan += [layer_fwd(n, "bf16", "bf16", "", "bf16", s="f32", eps=eps)]
        plan += layer_bwd(n, "bf16", "bf16", "", "bf16", s="f32")
    n = FUNC_N
    for stored in (False, True):
        plan += [_fwd(n, "f32", "f32", store_rstd=stored),
                 fused_fwd(n, "f32", "f32", "", "f32", store_rstd=stored, store_residual=stored),
                 layer_fwd(n, "f32", None, "", "f32", store_rstd=stored),
                 layer_fwd(n, "f32", "f32", "", "f32", store_rstd=stored)]
    plan += _bwd(n, "f32", "f32") + layer_bwd(n, "f32", None, "", "f32")
    for dres_out in (False, True):
        plan += fused_bwd(n, "f32", "f32", "", "f32", dres_out=dres_out)
        plan += layer_bwd(n, "f32", "f32", "", "f32", dres_out=dres_out)
    dts = ("f32", "f16", "bf16")
    for n in GRAD_DTYPE_N:
        for x in dts:
            plan += [_fwd(n, x, x), fused_fwd(n, x, None, "", x), layer_fwd(n, x, None, "", x)]
            for g in dts:
                if g == x:
                    continue
                # the vector is 16 bytes of the narrowest row tensor (dy's where it is narrower)
                vec = max_vec(n, min(DTYPES[x], DTYPES[g]))
                plan += [dict(d, odtype=g) if d["kernel"] == "rmsnorm_bwd" else d for d in _bwd(n, x, x, vec=vec)]
                y = next(d for d in dts if d not in (x, g))
                plan += fused_bwd(n, x, None, "", x, o=y, g=g) + layer_bwd(n, x, None, "", x, o=y, g=g)
    plan += [fused_fwd(2048, "bf16", "bf16", "", None)] + fused_bwd(2048, "bf16", "bf16", "", None, o="f32", g="f32")
    for n in TINY_N:
        plan += [layer_fwd(n, "f32", None, None, None)] + layer_bwd(n, "f32", None, None, None)
    return plan


# test_gpu_distributed.py's and scripts/train_demo.py's hidden size (the demo's Config.hidden).
DIST_N = SWAP_N
DIST_OTHER = {"bf16": "f32", "f32": "bf16"}  # dresidual's dtype where it is not dx's


def distributed_specializations() -> list[dict]:
    """What test_gpu_distributed.py and scripts/train_demo.py launch (N = DIST_N; RMSNorm's eps 1e-6,
    LayerNorm's 1e-5): test_distributed_cpu.CASES in bf16 and fp32 (rows, weight and bias in one
    dtype), one row each; autograd through DTensors (fused_add_layernorm, then rmsnorm of its y);
    the test block's four modules in bf16 (RMSNorm, FusedAddRMSNorm with a bias, LayerNorm,
    FusedAddLayerNorm; FSDP2, TP+SP, DDP) and torch's RMSNorm and LayerNorm swapped by replace_norms
    (the same kernels; their probes' are swap_specializations', SWAP_N = DIST_N); the demo's RMSNorm
    and FusedAddRMSNorm (bf16, and fp32 for its --dtype fp32). Shards change the rows only, never a
    kernel; test_distributed_cpu.py checks that these paths ask for nothing else."""
    n, plan = DIST_N, []
    for dt in ("bf16", "f32"):
        plan += [_fwd(n, dt, dt, store_rstd=s) for s in (True, False)]  # rmsnorm_fwd, no rstd
        plan += _bwd(n, dt, dt) + _bwd(n, dt, dt, has_weight=False)  # rmsnorm_bwd, no weight
        plan.append(fused_fwd(n, dt, dt, dt, dt, offset=0.5))  # fused_add_rmsnorm_fwd
        # Inference: residual_out in bf16 is not stored, so x's dtype alone sets the vector width.
        plan.append(fused_fwd(n, dt, dt, dt, None, s="bf16", store_rstd=False, store_residual=False,
                              vec=max_vec(n, DTYPES[dt])))
        plan += fused_bwd(n, dt, dt, dt, "f32", offset=0.5)  # fused_add_rmsnorm_bwd: db in fp32
        plan += fused_bwd(n, dt, DIST_OTHER[dt], dt, None, s=dt, dres_out=False)  # two dtypes
        plan.append(layer_fwd(n, dt, dt, dt, dt))  # layernorm_fwd
        plan.append(layer_fwd(n, dt, None, None, dt, o="bf16", store_rstd=False))  # no residual, y in bf16
        plan += layer_bwd(n, dt, dt, dt, "f32") + layer_bwd(n, dt, None, None, None)  # layernorm_bwd, no weight
        plan += layer_bwd(n, dt, dt, dt, dt)  # autograd: the forward is layernorm_fwd's above, then rmsnorm's
        plan += [fused_fwd(n, dt, dt)] + fused_bwd(n, dt, dt)  # the demo's FusedAddRMSNorm
    dt = "bf16"  # the test block (its RMSNorm is rmsnorm_fwd's above)
    plan += [fused_fwd(n, dt, dt, b=dt)] + fused_bwd(n, dt, dt, b=dt)
    plan += [layer_fwd(n, dt, b=dt)] + layer_bwd(n, dt, b=dt)
    plan += [layer_fwd(n, dt, dt, b=dt)] + layer_bwd(n, dt, dt, b=dt)
    return plan


# The quantized forwards (test_gpu_quant.py): bf16 rows, weight (and LayerNorm's bias) in bf16;
# each (kernel, quant, static or dynamic) at QUANT_N with and without the residual add, q and y
# written and the statistics stored (the reference takes the kernel's rstd and mean).
QUANT_KERNELS = ("rmsnorm_quant_fwd", "layernorm_quant_fwd")
QUANT_N = (1, 7, 769, 1025, 5137, 32768)
QUANT_M = 37
QUANT_ROW_N = 1025  # the special rows: zeros, one huge value, NaN, +-inf
QUANT_BATCH_N = 4096  # batch invariance, the options (smooth, scale_ub), compile, CUDA graphs, strides
QUANT_BATCH_M = (1, 7, 256, 4096)
QUANT_OFFSET_N = (1025, 4096)  # x one element past an aligned start: narrower vectors


def quant_fwd(n, kernel, quant, dynamic, *, residual=False, smooth=False, ub=False, return_y=True, store_stats=True,
              vec=0, dt="bf16", pdl=True) -> dict:
    """The specialization normir.ops.quant.launch_quant builds for these arguments (pdl: on the
    H200 by default, NORMIR_PDL)."""
    ln = kernel == "layernorm_quant_fwd"
    return dict(kernel=kernel, n=n, dtype=dt, wdtype=dt, eps=1e-5 if ln else 1e-6, target="sm_90", has_weight=True,
                store_rstd=store_stats, vec=vec or max_vec(n, DTYPES[dt]), rdtype=dt if residual else "",
                bdtype=dt if ln else "", store_residual=residual, qdtype="f8e4m3" if quant == "fp8" else "i8",
                qdynamic=dynamic, has_smooth=smooth, has_scale_ub=ub, store_y=return_y, pdl=pdl)


def quant_specializations() -> list[dict]:
    """What test_gpu_quant.py and the benchmark's quantized rows launch."""
    plan: list[dict] = []
    for kernel in QUANT_KERNELS:
        for quant in ("fp8", "int8"):
            for dynamic in (False, True):
                for n in QUANT_N:
                    plan += [quant_fwd(n, kernel, quant, dynamic, residual=r) for r in (False, True)]
                plan.append(quant_fwd(QUANT_ROW_N, kernel, quant, dynamic))
                n = QUANT_BATCH_N
                plan += [quant_fwd(n, kernel, quant, dynamic, return_y=False, store_stats=False)]  # API, graphs
                plan += [quant_fwd(n, kernel, quant, dynamic, residual=True, return_y=False, store_stats=False)]
            for n in QUANT_OFFSET_N:  # unaligned x and its contiguous twin (the functions' defaults)
                plan += [quant_fwd(n, kernel, quant, True, vec=v, return_y=False, store_stats=False)
                         for v in _vecs(n, "bf16")]
            plan += [quant_fwd(QUANT_BATCH_N, kernel, quant, True, smooth=True)]
            plan += [quant_fwd(QUANT_BATCH_N, kernel, quant, True, residual=True, store_stats=False)]  # y, residual_out
        plan += [quant_fwd(QUANT_BATCH_N, kernel, "fp8", True, smooth=s, ub=True) for s in (False, True)]
        plan += [quant_fwd(QUANT_BATCH_N, kernel, "fp8", True, ub=True, return_y=False, store_stats=False)]  # graphs
    for n in BENCH_N + (4096,):
        for kernel in QUANT_KERNELS:
            for quant in ("fp8", "int8"):
                for dynamic in (False, True):
                    plan += [quant_fwd(n, kernel, quant, dynamic, residual=r, return_y=False, store_stats=False,
                                       pdl=pdl) for r in (False, True) for pdl in (True, False)]
    return plan


# test_gpu_serving.py: the serving forms (normir.serving) at SERVING_N (odd N, tails, one row split
# over a cluster) over SERVING_M rows, the CUDA graphs and batch invariance at 4096, and the
# out-of-place kernels they are compared with.
SERVING_N = (1, 7, 769, 1025, 5137, 32768)
SERVING_M = 37
SERVING_BATCH_M = (1, 7, 256, 4096)
SANITIZE_SERVING_N = (7, 1025, 5137, 32768)  # scripts/sanitize.py serving: every layout of the forwards


def serving_specializations() -> list[dict]:
    """What test_gpu_serving.py launches (its serving calls through normir.ops.serving.problem)."""
    import torch

    from normir.ops.serving import LN, RMS, RMS_Q, problem

    bf = torch.bfloat16

    def spec(fields: dict, pdl: bool = True) -> dict:  # PDL: on by default (NORMIR_PDL)
        return dict(fields, target="sm_90", vec=max_vec(fields["n"], DTYPES["bf16"]), pdl=pdl)

    plan: list[dict] = []
    for n in (*SERVING_N, 4096):
        for layer, kernel, eps in ((False, RMS, 1e-6), (True, LN, 1e-6)):
            b = bf if layer else None
            plan += [spec(problem(kernel, n, eps, bf, bf, bf, b, bf, in_place=ip)) for ip in (False, True)]
        for kernel, eps, b in (("rmsnorm_fwd", 1e-5, None), (LN, 1e-5, bf)):  # rms_norm, layer_norm; out = x
            plan += [spec(problem(kernel, n, eps, bf, bf, None, b, bf, in_place=ip)) for ip in (False, True)]
        for r in (None, bf):
            plan.append(spec(problem(RMS_Q, n, 1e-6, bf, bf, r, None, torch.float8_e4m3fn, q="fp8", static=True,
                                     in_place=r is not None)))
            plan += [spec(problem(RMS_Q, n, 1e-6, bf, bf, r, None, None, q=q, in_place=r is not None,
                                  vllm_dynamic=True)) for q in ("fp8", "int8")]
            plan.append(quant_fwd(n, RMS_Q, "fp8", False, residual=r is not None, return_y=False, store_stats=False))
    plan.append(spec(problem(RMS_Q, 4096, 1e-6, bf, bf, None, None, None, q="fp8", scale_ub=True,
                             vllm_dynamic=True)))
    # test_pdl_on_and_off_agree: rms_norm at the test's eps
    plan += [spec(problem("rmsnorm_fwd", 4096, 1e-6, bf, bf, None, None, bf, in_place=ip)) for ip in (False, True)]
    # scripts/sanitize.py serving: the quantized functions with the fused add, LayerNorm's in place
    for n in SANITIZE_SERVING_N:
        for kernel in QUANT_KERNELS:
            plan += [quant_fwd(n, kernel, quant, dynamic, residual=True, return_y=False, store_stats=False)
                     for quant in ("fp8", "int8") for dynamic in (False, True)]
        plan.append(spec(problem(LN, n, 1e-5, bf, bf, bf, bf, bf, in_place=True)))
    for n in BENCH_N:  # scripts/bench.py's serving rows (ip_add_fwd, q8_fwd, qi8_fwd, add_q8_fwd)
        plan.append(spec(problem(RMS, n, 1e-6, bf, bf, bf, None, bf, in_place=True)))
        plan += [spec(problem(RMS_Q, n, 1e-6, bf, bf, None, None, None, q=q, vllm_dynamic=True)) for q in ("fp8", "int8")]
        plan.append(spec(problem(RMS_Q, n, 1e-6, bf, bf, bf, None, None, q="fp8", in_place=True, vllm_dynamic=True)))
    # PDL off too: test_pdl_on_and_off_agree, the benchmark's normir-nopdl rows, and the training
    # functions' out-of-place kernels the tests compare with (launched without it)
    return plan + [dict(p, pdl=False) for p in plan if p.get("pdl")]
