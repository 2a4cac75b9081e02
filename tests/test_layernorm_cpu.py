"""LayerNorm without a GPU: the custom ops' schemas and fake implementations, the argument checks,
the modules against torch.nn.LayerNorm's construction and state_dict, the kernels' options and
the flags the LayerNorm kernels are specialized with."""

from __future__ import annotations

import pytest
import torch

import normir
from normir.options import build
from normir.specialize import values_for

pytestmark = pytest.mark.cpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def test_schemas():
    normir.layernorm  # noqa: B018  (binds the API, registering the ops)
    assert str(torch.ops.normir.layernorm_fwd.default._schema) == (
        "normir::layernorm_fwd(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, float eps, "
        "ScalarType? residual_dtype, ScalarType? out_dtype, bool store_stats, bool store_residual) "
        "-> (Tensor, Tensor, Tensor, Tensor)")
    assert str(torch.ops.normir.layernorm_bwd.default._schema) == (
        "normir::layernorm_bwd(Tensor dy, Tensor residual_out, Tensor? weight, Tensor mean, Tensor rstd, "
        "Tensor? d_residual_out, ScalarType? bias_dtype, ScalarType? dx_dtype, ScalarType? dres_dtype) "
        "-> (Tensor, Tensor, Tensor, Tensor)")


def test_fake_forward(fake):
    x, r, w, b = fake((3, 5, 1024)), fake((3, 5, 1024), F32), fake((1024,), F32), fake((1024,))
    y, h, mean, rstd = torch.ops.normir.layernorm_fwd(x, r, w, b, 1e-5, None, F16, True, True)
    assert (y.dtype, h.dtype, h.shape, mean.shape, rstd.dtype) == (F16, F32, x.shape, (3, 5), F32)
    y, mean, rstd = normir.layernorm_fwd(x, w, b)
    assert y.dtype == BF16 and mean is None and rstd is None
    y, mean, rstd = normir.layernorm_fwd(x, None, None, store_stats=True)
    assert mean.shape == rstd.shape == (3, 5)
    y, h = normir.layernorm(x, w, b, residual=r, prenorm=True)
    assert (y.dtype, h.dtype) == (BF16, F32)
    y, h, mean, rstd = normir.fused_add_layernorm_fwd(x, None, w, None)
    assert h is x


def test_fake_backward(fake):
    h, w, stat = fake((7, 1024), F32), fake((1024,), BF16), fake((7,), F32)
    dy = fake((7, 1024), BF16)
    dx, dres, dw, db = torch.ops.normir.layernorm_bwd(dy, h, w, stat, stat, None, F32, BF16, F32)
    assert (dx.dtype, dres.dtype, dw.dtype, db.dtype) == (BF16, F32, BF16, F32)
    dx, dw, db = normir.layernorm_bwd(h, w, fake((7, 1024), F32), stat, stat, has_bias=True)
    assert (dx.dtype, dw.dtype, db.dtype) == (F32, BF16, BF16)
    (dx, dres), dw, db = normir.fused_add_layernorm_bwd(dy, h, None, stat, stat, dx_dtype=BF16,
                                                        dresidual_dtype=F32)
    assert (dx.dtype, dres.dtype, dw, db) == (BF16, F32, None, None)


def test_fake_checks(fake):
    x, stat = fake((4, 256)), fake((4,), F32)
    with pytest.raises(ValueError, match=r"mean must be the float32 tensor of shape residual_out\.shape\[:-1\]"):
        normir.layernorm_bwd(x, None, x, fake((5,), F32), stat)
    with pytest.raises(ValueError, match=r"rstd must be the float32 tensor .* that layernorm_fwd\(\.\.\., "
                                         r"store_stats=True\) returned"):
        normir.layernorm_bwd(x, None, x, stat, fake((4,), BF16))
    with pytest.raises(ValueError, match=r"bias has shape \(3,\); it must be \(256,\)"):
        normir.layernorm(x, None, fake((3,)))
    with pytest.raises(TypeError, match=r"prenorm must be a bool, got int"):
        normir.layernorm(x, prenorm=1)
    with pytest.raises(ValueError, match=r"eps=-1\.0 must be a finite float"):
        normir.layernorm(x, eps=-1.0)


def test_module_matches_torch_construction():
    for kw in ({}, {"bias": False}, {"elementwise_affine": False}):
        ours, theirs = normir.LayerNorm(16, **kw), torch.nn.LayerNorm(16, **kw)
        assert list(ours.state_dict()) == list(theirs.state_dict())
        assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
        ours.load_state_dict(theirs.state_dict())
    m = normir.LayerNorm((32,), eps=1e-6, dtype=BF16)
    assert m.normalized_shape == (32,) and m.eps == 1e-6 and m.weight.dtype == BF16
    assert torch.equal(m.weight, torch.ones(32, dtype=BF16)) and torch.equal(m.bias, torch.zeros(32, dtype=BF16))
    assert normir.LayerNorm(8, device="meta").weight.is_meta  # built where Hugging Face builds models
    with pytest.raises(ValueError, match=r"normalized_shape=\(4, 8\): normir normalizes the last dimension only"):
        normir.LayerNorm((4, 8))
    f = normir.FusedAddLayerNorm(16, residual_dtype=F32)
    assert f.residual_dtype == F32 and list(f.state_dict()) == ["weight", "bias"]


def test_module_forward(fake):
    m = normir.FusedAddLayerNorm(256, residual_dtype=F32, device="cuda", dtype=BF16)
    y, h = m(fake((2, 256)), fake((2, 256)))
    assert (y.dtype, h.dtype) == (BF16, F32)
    assert normir.LayerNorm(256, device="cuda", dtype=BF16)(fake((2, 256))).shape == (2, 256)


def test_options_and_flags():
    with pytest.raises(ValueError, match=r"layernorm_fwd takes no weight offset"):
        build(kernel="layernorm_fwd", n=1024, weight_offset=1.0)
    fwd = values_for(build(kernel="layernorm_fwd", n=1024, store_rstd=True))
    assert (fwd["HAS_MEAN"], fwd["NR"], fwd["FWD_ACC"]) == ("true", "3", "vector<2xf32>")  # the thread's mean, M2
    # 1024 = 32 threads x 4 chunks of 8: equal counts, the butterfly skips the count; one warp.
    assert (fwd["EQUAL_COUNTS"], fwd["PAIR_FIRST"], fwd["WPR_P2"], fwd["WARP_STEPS"]) == ("true", "1", "1", "0")
    tail = values_for(build(kernel="layernorm_fwd", n=2880, two_pass=0))  # 360 chunks over 96 threads
    assert (tail["EQUAL_COUNTS"], tail["PAIR_FIRST"]) == ("false", "0")
    # The policy's form there: a two-pass variance, plain sums of the summary's last value alone.
    two = values_for(build(kernel="layernorm_fwd", n=2880))
    assert (two["TWO_PASS"], two["PAIR_FIRST"], two["COMBINE_PIECE"]) == ("true", "2", "common/combine_sum.mlir")
    assert fwd["COMBINE_PIECE"] == "common/combine_chan.mlir" and fwd["STATS_PIECE"] == "common/stats_layer.mlir"
    bwd = values_for(build(kernel="layernorm_bwd", n=1024, bdtype="f32"))
    assert (bwd["NR"], bwd["BWD_ACC"], bwd["COMBINE_PIECE"]) == ("2", "vector<16xf32>", "common/combine_sum.mlir")
    rms = values_for(build(kernel="rmsnorm_fwd", n=1024))
    assert (rms["HAS_MEAN"], rms["NR"], rms["FWD_ACC"], rms["PAIR_FIRST"]) == ("false", "1", "vector<8xf32>", "0")


def test_layout_sees_one_read_without_a_residual():
    # LayerNorm's one kernel takes the streamed layout of one read without a residual, with 4
    # chunks per thread where RMSNorm takes 2 (its row summary is 3 values), and the fused add's
    # with one (two rows read in pass 1) up to 512 threads where RMSNorm's takes 1024, and 4
    # where the chunks do not split evenly over whole warps (2880: 360 chunks).
    plain = build(kernel="layernorm_fwd", n=4096).layout
    assert (plain.tpr, plain.k, plain.batch_reload) == (build(kernel="rmsnorm_fwd", n=4096).layout.tpr // 2, 4, True)
    assert (build(kernel="layernorm_fwd", n=1024).layout.tpr, build(kernel="layernorm_fwd", n=32768).layout.k) \
        == (32, 4)
    fused = build(kernel="layernorm_fwd", n=4096, rdtype="bf16", store_residual=True).layout
    assert (fused.tpr, fused.k) == (512, 1)
    fused = build(kernel="layernorm_fwd", n=8192, rdtype="bf16", store_residual=True).layout
    rms = build(kernel="fused_add_rmsnorm_fwd", n=8192, rdtype="bf16", store_residual=True).layout
    assert (fused.tpr, fused.k, rms.tpr, rms.k) == (512, 2, 1024, 1)
    fused = build(kernel="layernorm_fwd", n=2880, rdtype="bf16", store_residual=True).layout
    rms = build(kernel="fused_add_rmsnorm_fwd", n=2880, rdtype="bf16", store_residual=True).layout
    assert (fused.tpr, fused.k, rms.tpr, rms.kfull) == (96, 4, 352, 1)


@pytest.mark.parametrize("n", [4096, 8192])  # (2880's masked halves and 3072: one block, below)
def test_backward_holds_its_rows_where_rmsnorm_rereads_them(n):
    # The backward's two row sums (c1, c2): rows of 2 chunks per thread stay in registers between
    # the passes (with a weight and a bias, whose column sums take registers too), where
    # RMSNorm's backward of the same shape reads them again; and over 2 blocks of at most 4
    # warps (8192: 2 blocks for its column sums already), where RMSNorm's takes one.
    ln = build(kernel="layernorm_bwd", n=n, bdtype="f32").layout
    rms = build(kernel="rmsnorm_bwd", n=n).layout
    assert (ln.k, ln.cache_row, ln.dw_regs, ln.cluster, rms.cache_row, rms.cluster) == (2, True, True, 2, False, 1)
    assert ln.tpr == rms.tpr // 2 if n < 8192 else ln.tpr == rms.tpr
    # The fused add's backward (d_residual_out read in pass 2 too) re-reads its rows, as RMSNorm's,
    # but over a cluster (8192), where it holds them with its column sums in shared memory.
    fused = build(kernel="layernorm_bwd", n=n, bdtype="f32", has_dres_out=True).layout
    assert (fused.cache_row, fused.tpr, fused.db_smem) == (n == 8192, rms.tpr, 3 if n == 8192 else fused.db_smem)


def test_db_sums_in_shared_memory_knob(monkeypatch):
    # Forced: the backward's db sums move to K x BLOCK x V fp32 of workgroup memory, aligned for
    # 16-byte accesses, at [k][tid] (1) or in 16-byte quarters at [k][quarter][tid] (2; 3: dw's
    # too, or db's alone without a weight); without a bias there is nothing to move; a forward
    # refuses it.
    from normir.launch import tpr_overrides
    from normir.specialize import values_for

    bwd = dict(kernel="layernorm_bwd", n=8192, bdtype="f32")
    lay = build(**bwd, db_smem=1).layout
    assert lay.db_smem == 1 and build(**bwd).layout.db_smem == 3  # the policy's: dw's sums too
    assert not build(kernel="layernorm_bwd", n=4096, bdtype="f32", db_smem=0).layout.db_smem
    shared = f"memref<{lay.k}x{lay.block}x{lay.vec}xf32, #gpu.address_space<workgroup>>"
    v = values_for(build(**bwd, db_smem=1))
    assert v["DB_GET"] == f"vector.load %dbbuf[%k, %tid, %c0] : {shared}, vector<{lay.vec}xf32>"
    assert "llvm.align = 16" in v["DB_IN_WORKGROUP"] and v["DB_IN_PRIVATE"] == ""
    assert v["DW_PUT"] == "vector.store" and "%dwbuf[%k, %c0]" in v["DW_PUT_TO"] and v["DW_IN_WORKGROUP"] == ""
    quarters = f"memref<{lay.k}x2x{lay.block}x4xf32, #gpu.address_space<workgroup>>"
    v = values_for(build(**bwd, db_smem=3))
    assert v["DB_GET"].startswith("func.call @normir_db_get(%dbbuf, %k, %tid)") and quarters in v["DB_GET"]
    assert v["DW_PUT"] == "func.call @normir_dw_put(" and quarters in v["DW_IN_WORKGROUP"]
    assert v["DB_SLOTS_PIECE"] == v["DW_SLOTS_PIECE"] == "common/slots_split.mlir"
    assert values_for(build(**bwd, db_smem=1))["DB_SLOTS_PIECE"] == "common/slots_none.mlir"
    assert build(**bwd, db_smem=3, has_weight=False).layout.db_smem == 2  # no dw sums to move
    assert not build(kernel="layernorm_bwd", n=4096, db_smem=1).layout.db_smem
    with pytest.raises(ValueError, match=r"db_smem=1 needs a backward"):
        build(kernel="layernorm_fwd", n=4096, db_smem=1)
    with pytest.raises(ValueError, match=r"db_smem=4: choose one of 0, 1, 2, 3 "):
        build(kernel="layernorm_bwd", n=4096, db_smem=4)
    monkeypatch.setenv("NORMIR_TPR", "layernorm_bwd:4096=128m5d1,layernorm_bwd:8192=256x2d3")
    over = tpr_overrides()
    assert (over[("layernorm_bwd", 4096)]["min_blocks"], over[("layernorm_bwd", 8192)]["db_smem"]) == (5, 3)


SPLIT = dict(cluster=2)  # rows over 2 blocks, which the even_halves rule's one block would take to one
# The rows the held_quads rule holds in 4 chunks, over the cluster they had before it (a forced
# cluster leaves them to the rules below).
C4, C8 = dict(cluster=4), dict(cluster=8)


@pytest.mark.parametrize(("n", "dres", "db_smem", "blocks", "held", "kw"), [
    (1024, False, 1, 10, True, {}), (2048, False, 1, 5, True, {}), (4096, False, 1, 5, True, {}),
    (2880, True, 3, 4, False, {}), (4096, True, 1, 3, False, {}), (8192, False, 3, 3, True, {}),
    (16384, False, 3, 3, True, C4), (32768, False, 3, 3, True, C8), (1024, True, 3, 12, True, {}),
    (2048, True, 3, 6, True, {}), (8192, True, 3, 3, True, {}), (32768, True, 3, 3, True, C8),
    (3072, False, 3, 6, True, SPLIT), (4608, False, 3, 4, True, SPLIT), (6144, False, 3, 3, True, SPLIT),
    (4608, True, 3, 4, False, SPLIT), (7680, True, 3, 3, False, {}), (5120, True, 3, 4, False, SPLIT),
    (3456, True, 3, 4, False, {}), (2400, True, 3, 5, False, {})])
def test_policy_moves_db_sums_where_a_block_is_gained(n, dres, db_smem, blocks, held, kw):
    # The policy's db_smem: 16-bit rows of 2 chunks a thread, with a weight and a bias, whose
    # freed registers let a cap add resident blocks: db's sums alone (1; 96 registers for held
    # rows and rows with a masked chunk, 80 for rows read again) where that adds one, else dw's
    # too (3, 80 registers), the fused add's rows held over a cluster for it; over a cluster
    # where that is not taken (a masked chunk; 3, 5, 6 or 7 warps), both sums at 96 registers
    # for rows held (3072, 4608, 6144), 80 for the fused add's read again (4608, 5120, 7680); in
    # one block with a masked chunk, read again, the choice of the most blocks: both sums at 72
    # registers (rules._one_block_blocks: 2400 in 5 warps, 2880 in 6, 3456 in 7).
    # (SPLIT: forced over 2 blocks, as the policy's layout was before the even_halves rule's one block.)
    lay = build(kernel="layernorm_bwd", n=n, bdtype="f32", has_dres_out=dres, **kw).layout
    assert (lay.db_smem, lay.min_blocks, lay.k, lay.cache_row) == (db_smem, blocks, 2, held)
    # Not where no block is gained or the cap spilled (tests/test_sm90_spill.py): 4-byte rows read
    # again (2240, the even_halves rule), over a cluster in 7 warps beside an fp32 weight (7168: 2
    # blocks either way; with a 16-bit one it goes to one block, the even_halves rule's one block), beside an
    # fp32 weight (4096 over a cluster, the fused add's 7680); not in fp32 rows (64-72 registers
    # already), not without a bias or a weight, not on gfx950 (measured on the H200 only).
    for kw in (dict(n=2240), dict(n=7168, wdtype="f32"), dict(n=4096, wdtype="f32"),
               dict(n=7680, has_dres_out=True, wdtype="f32"),
               dict(n=1024, dtype="f32"), dict(n=2048, has_weight=False), dict(n=1024, target="gfx950")):
        other = build(kernel="layernorm_bwd", **{"bdtype": "f32", **kw}).layout
        assert not other.db_smem and not other.min_blocks, kw
    assert not build(kernel="layernorm_bwd", n=1024).layout.db_smem  # no bias
    forced = build(kernel="layernorm_bwd", n=1024, bdtype="f32", min_blocks=8).layout
    assert (forced.db_smem, forced.min_blocks) == (1, 8)  # a forced cap stays


def test_policy_moves_db_sums_of_4_chunk_rows_over_a_cluster():
    # LayerNorm's backwards of 4 chunks a thread over a cluster, read again (16-bit, 40960-81920):
    # both sums in shared memory (65536: 64 KB a block, in the dynamic), capped for 2 blocks;
    # beside an fp32 weight, or where one block is left (81920), db's alone; not in fp32 rows, not
    # on gfx950. 40960: 160 threads, 3 blocks, its slots (40 KB) static. Pass 2's chunks inside the
    # exchange: all 4 in 8 warps without d_residual_out (the overlap rule), else 2.
    for n, blocks in ((40960, 3), (65536, 2)):
        for dres in (False, True):
            held = dict(cache_row=0) if n == 65536 else {}  # the policy holds 65536's (rule held_quads)
            lay = build(kernel="layernorm_bwd", n=n, bdtype="f32", has_dres_out=dres, **held).layout
            got = (lay.k, lay.cluster, lay.cache_row, lay.db_smem, lay.min_blocks, lay.overlap)
            early = 4 if n == 65536 and not dres else 2
            assert got == (4, 8, False, 3, blocks, early), (n, dres)
            assert lay.dyn_slots == (n == 65536)
    for kw in (dict(dtype="f32", wdtype="f32"), dict(target="gfx950")):
        lay = build(kernel="layernorm_bwd", n=65536, bdtype="f32", **kw).layout
        assert not lay.db_smem and not lay.min_blocks, kw
    # db's alone beside an fp32 weight (both moved spilled there); the fused add's pass 2 then not
    # loaded early (it spilled at the cap); LayerNorm's is.
    for n, kw, blocks in ((65536, dict(wdtype="f32"), 2), (81920, {}, 1)):
        for dres, overlap in ((True, 0), (False, 2)):
            lay = build(kernel="layernorm_bwd", n=n, bdtype="f32", has_dres_out=dres, **kw).layout
            assert (lay.db_smem, lay.min_blocks, lay.overlap) == (1, blocks, overlap), (n, kw, dres)


def test_long_bf16_rows_held_in_4_chunks():
    # rule held_quads: LayerNorm's backwards of bf16 rows, a weight and a bias, at 16384-65536:
    # 256 threads of 4 chunks over 2-8 blocks, held, both sums in dynamic shared memory, uncapped
    # (ptxas: 2 blocks), d_residual_out staged and no L2 prefetch of the next row; RMSNorm's fused
    # add at 32768-65536 held in its 512 threads, d_residual_out staged.
    for n, cluster in ((16384, 2), (32768, 4), (65536, 8)):
        for dres in (False, True):
            lay = build(kernel="layernorm_bwd", n=n, bdtype="f32", has_dres_out=dres).layout
            got = (lay.tpr, lay.cluster, lay.k, lay.cache_row, lay.db_smem, lay.min_blocks, lay.overlap)
            assert got == (256, cluster, 4, True, 3, 0, 0), (n, dres)
            assert lay.stage_dres == dres and lay.dyn_slots
            assert lay.l2_prefetch != dres  # the fused add's without the next row's L2 prefetch
    for n, cluster in ((32768, 2), (65536, 4)):
        lay = build(kernel="fused_add_rmsnorm_bwd", n=n, has_dres_out=True).layout
        assert (lay.tpr, lay.cluster, lay.k, lay.cache_row, lay.overlap, lay.stage_dres) == (512, cluster, 4, True, 0, True)
    # Not: f16 rows (held as fp32), an fp32 weight, fp32 dy, no bias, non-power-of-two clusters
    # (49152), gfx950, a forced knob; RMSNorm's fused add with a bias or in atomic mode (8 bytes
    # spilled), RMSNorm's own backward.
    for kw in (dict(dtype="f16", wdtype="f16"), dict(wdtype="f32"), dict(odtype="f32"), dict(bdtype=""),
               dict(n=49152), dict(target="gfx950"), dict(cache_row=0), dict(min_blocks=2), dict(overlap=0),
               dict(stage_dres=0)):
        lay = build(kernel="layernorm_bwd", **{"n": 32768, "bdtype": "f32", **kw}).layout
        assert not (lay.cache_row and lay.k == 4), kw
    for kw in (dict(bdtype="bf16"), dict(atomic_dw=True), dict(has_dres_out=False), dict(stage_dres=0)):
        lay = build(**{"kernel": "fused_add_rmsnorm_bwd", "n": 65536, "has_dres_out": True, **kw}).layout
        assert not lay.cache_row, kw
    assert not build(kernel="rmsnorm_bwd", n=65536).layout.cache_row


def test_long_bf16_rows_without_w_and_b_held_over_a_cluster():
    # the hold_unweighted rule: LayerNorm's backward without w and b (no column sums) at 32768-131072 in
    # bf16, 512 threads of 4 chunks over 2-8 blocks, holds its rows (no early chunks of pass 2);
    # read again: f16 and f32 rows (held as fp32), a bias (db's sums), d_residual_out, 6 chunks a
    # thread (49152 over 384), a forced cache_row, the rows with a weight (held_quads' 256).
    for n, cluster in ((32768, 2), (65536, 4), (131072, 8)):
        lay = build(kernel="layernorm_bwd", n=n, has_weight=False).layout
        assert (lay.tpr, lay.cluster, lay.k, lay.cache_row, lay.overlap) == (512, cluster, 4, True, 0), n
    for kw in (dict(dtype="f16", wdtype="f16"), dict(dtype="f32", wdtype="f32"), dict(bdtype="f32"),
               dict(has_dres_out=True), dict(n=49152), dict(cache_row=0), dict(has_weight=True)):
        lay = build(kernel="layernorm_bwd", **{"n": 65536, "has_weight": False, **kw}).layout
        assert not (lay.cache_row and lay.tpr == 512), kw
    assert build(kernel="layernorm_bwd", n=65536, has_weight=False, cache_row=0).layout.overlap == 4


def test_held_masked_rows_of_7_or_8_warps_over_2_blocks_are_read_again():
    # LayerNorm's backward held over 2 blocks of 8 warps with a masked chunk (7200-7936; 6176-7136
    # in 7 warps go to one block, the even_halves rule's one block): read again with both sums in shared memory,
    # 3 blocks; not whole warps beside an fp32 weight (7168), not over 4 blocks (14848), not where
    # cache_row is forced.
    for n in (7424, 7680):
        lay = build(kernel="layernorm_bwd", n=n, bdtype="f32").layout
        assert (lay.cluster, lay.cache_row, lay.db_smem, lay.min_blocks) == (2, False, 3, 3), n
    for n, kw in ((7168, dict(wdtype="f32")), (14848, {}), (7680, dict(cache_row=1))):
        lay = build(kernel="layernorm_bwd", n=n, bdtype="f32", **kw).layout
        assert lay.cache_row and not lay.db_smem, (n, kw)
    # Cache hints only where every row tensor moves in 16-byte chunks (an fp32 residual_out beside
    # 16-bit dy and dx: none; sm_90 verifies no narrower hinted access).
    assert build(kernel="layernorm_bwd", n=7680, bdtype="f32").layout.hints
    mixed = build(kernel="layernorm_bwd", n=7424, dtype="f32", rdtype="f32", odtype="bf16", xdtype="bf16",
                    bdtype="f32").layout
    assert not mixed.cache_row and mixed.hints == 0


def test_one_read_rows_of_a_masked_chunk_are_held():
    # LayerNorm's forward at N=2880 (360 chunks: not whole warps) holds the row at the streamed
    # layout's 96 threads, without its L2 hints; 4096 stays streamed.
    lay = build(kernel="layernorm_fwd", n=2880, bdtype="bf16").layout
    assert (lay.tpr, lay.k, lay.cache_row, lay.hints) == (96, 4, True, 0)
    assert not build(kernel="layernorm_fwd", n=4096, bdtype="bf16").layout.cache_row
    fused = build(kernel="layernorm_fwd", n=2880, bdtype="bf16", rdtype="bf16", store_residual=True).layout
    assert not fused.cache_row  # two reads: streamed


@pytest.mark.parametrize(("n", "tpr", "vec", "k"), [(896, 32, 4, 7), (1152, 32, 4, 9), (1280, 32, 8, 5),
                                                   (1600, 16, 4, 25), (2560, 32, 8, 10), (3584, 64, 8, 7)])
def test_forward_rows_of_a_masked_chunk_split_evenly(n, tpr, vec, k):
    # LayerNorm's forward where the policy's rows leave a masked chunk: the fewest whole warps
    # (else a sub-warp) in 16-byte chunks, else 8-byte ones, at most 100 elements a thread, held.
    lay = build(kernel="layernorm_fwd", n=n, bdtype="bf16").layout
    assert (lay.tpr, lay.vec, lay.k, lay.kfull, lay.cluster, lay.cache_row) == (tpr, vec, k, k, 1, True)
    assert lay.rows == (256 // tpr if tpr <= 32 else 1)
    # Not for RMSNorm's, a forced layout, nor gfx950 (not measured); the fused add's (two reads)
    # has its own rule (test_fused_forward_rows_over_warps_not_a_power_of_two_are_held).
    for other in (build(kernel="rmsnorm_fwd", n=n), build(kernel="layernorm_fwd", n=n, tpr=96),
                  build(kernel="layernorm_fwd", n=n, target="gfx950")):
        assert other.layout.vec != vec or other.layout.tpr != tpr, other


def test_fused_forward_rows_over_warps_not_a_power_of_two_are_held():
    # The fused add's LayerNorm forward (two reads) at one chunk a thread over 5-15 warps: held at
    # 2 chunks a thread where those fill whole warps, else split evenly; 4, 8, 16 warps streamed.
    def lay(n, **kw):
        return build(kernel="layernorm_fwd", n=n, bdtype="bf16", rdtype="bf16", store_residual=True, **kw).layout

    for n, shape in ((1536, (96, 8, 2)), (2560, (160, 8, 2)), (3584, (224, 8, 2)), (1280, (32, 8, 5))):
        got = lay(n)
        assert (got.tpr, got.vec, got.k, got.kfull, got.cache_row) == (*shape, shape[2], True), (n, got)
    for n in (1024, 2048, 4096):
        assert (lay(n).k, lay(n).cache_row) == (1, False), n
    assert not build(kernel="fused_add_rmsnorm_fwd", n=2560, rdtype="bf16", store_residual=True).layout.cache_row
    assert not lay(2560, target="gfx950").cache_row or lay(2560, target="gfx950").tpr != 160


def test_forward_rows_without_an_even_split_keep_their_layout():
    # 2880 (360 chunks of 16 bytes, 720 of 8): no split of whole warps or 16 threads within 100
    # elements a thread; held with its masked chunk (test_one_read_rows_of_a_masked_chunk_are_held).
    lay = build(kernel="layernorm_fwd", n=2880, bdtype="bf16").layout
    assert (lay.vec, lay.k, lay.kfull) == (8, 4, 3)
    assert build(kernel="layernorm_fwd", n=4096, bdtype="bf16").layout.tpr == 128  # even: streamed as before


@pytest.mark.parametrize(("kernel", "extra"), [("rmsnorm_bwd", {}), ("fused_add_rmsnorm_bwd", {"has_dres_out": True}),
                                               ("layernorm_bwd", {"bdtype": "f32"}),
                                               ("layernorm_bwd", {"bdtype": "f32", "has_dres_out": True})])
def test_backward_short_rows_of_a_masked_chunk_split_evenly(kernel, extra):
    # One chunk a thread where the row's chunks fill whole warps (768: 96, 1280: 160), every op.
    for n, tpr in ((768, 96), (1280, 160)):
        lay = build(kernel=kernel, n=n, **extra).layout
        assert (lay.tpr, lay.vec, lay.k, lay.kfull, lay.cluster) == (tpr, 8, 1, 1, 1), (n, lay)
    # Else narrower chunks over as many threads or up to twice as many, with dw's and db's sums
    # (1152 as 96 x 3 of 8 bytes, 1600 as 160 x 5 of 4); with one sum, RMSNorm's fused add takes
    # 8-byte chunks at one a thread (1152 as 288 x 1), RMSNorm's own keeps the masked rows.
    for n, shape in ((1152, (96, 4, 3)), (1600, (160, 2, 5))):
        lay = build(kernel=kernel, n=n, **extra).layout
        if "bdtype" in extra:
            assert (lay.tpr, lay.vec, lay.k, lay.kfull) == (*shape, shape[2]), (n, lay)
        elif n == 1152 and "has_dres_out" in extra:
            assert (lay.tpr, lay.vec, lay.k, lay.kfull) == (288, 4, 1, 1), (n, lay)
        else:
            assert (lay.vec, lay.k, lay.kfull) == (8, 2, 1), (n, lay)
    # Not on gfx950 (not measured), nor a forced layout, nor rows past 256 chunks (3520: 440), nor
    # masked rows that fill over 80% of their slots (1920: 240 of 256; 896, 112 of 128, but for
    # RMSNorm's fused add's half-width rule, 7/8).
    half = "has_dres_out" in extra and "bdtype" not in extra
    others = (dict(n=768, target="gfx950"), dict(n=768, tpr=64), dict(n=3520), dict(n=1920))
    for kw in others + ((dict(n=896),) if not half else ()):
        lay = build(kernel=kernel, **{**extra, **kw}).layout
        assert lay.k != lay.kfull, (kw, lay)


def test_fused_add_backward_rows_take_half_width_chunks_where_the_slots_fill_little():
    # RMSNorm's fused add (one column sum, d_residual_out read): 8-byte chunks at one a thread
    # where they fill whole warps and the masked rows fill at most 7/8 of their slots (896: 112 of
    # 128, 1664: 208 of 256); not fuller ones (1408: 176 of 192, 1920: 240 of 256), not without
    # d_residual_out, not with a bias (two sums: the narrow-chunk rule), not in f32, not on gfx950.
    def lay(n, **kw):
        return build(kernel="fused_add_rmsnorm_bwd", n=n, **{"has_dres_out": True, **kw}).layout

    assert [(lay(n).tpr, lay(n).vec, lay(n).k) for n in (896, 1664)] == [(224, 4, 1), (416, 4, 1)]
    for n, kw in ((1408, {}), (1920, {}), (896, dict(has_dres_out=False)), (896, dict(target="gfx950"))):
        assert (lay(n, **kw).vec, lay(n, **kw).k) == (8, 2), (n, kw)
    assert (lay(576, dtype="f32").vec, lay(576, dtype="f32").k) == (4, 2)  # f32 rows: not measured
    assert lay(1664, bdtype="bf16").vec == 8


def test_fused_add_backward_short_full_rows_take_one_chunk_a_thread():
    # RMSNorm's fused add (one column sum, d_residual_out read): rows of at most 256 chunks that 2
    # a thread fill take one (1024 as 128 x 1, 1536 as 192, 2048 as 256; f32's 1024 as 256 of 4
    # elements); not without d_residual_out, not with a bias (two sums), not the other backwards,
    # not on gfx950 (not measured), not rows past 256 chunks (4096, streamed) or of several rows a
    # block (512).
    def lay(n, kernel="fused_add_rmsnorm_bwd", **kw):
        return build(kernel=kernel, n=n, **{"has_dres_out": True, **kw}).layout

    assert [(lay(n).tpr, lay(n).k, lay(n).cache_row) for n in (1024, 1536, 2048)] == [(128, 1, True), (192, 1, True),
                                                                                      (256, 1, True)]
    assert (lay(1024, dtype="f32").tpr, lay(1024, dtype="f32").vec, lay(1024, dtype="f32").k) == (256, 4, 1)
    for n, kw in ((2048, dict(has_dres_out=False)), (2048, dict(bdtype="bf16")), (2048, dict(target="gfx950")),
                  (2048, dict(kernel="layernorm_bwd", bdtype="f32")), (4096, {}), (512, {})):
        assert lay(n, **kw).k == 2, (n, kw)
    assert build(kernel="rmsnorm_bwd", n=2048).layout.k == 2


def test_fused_layernorm_backward_over_6_or_7_warps_goes_to_4_blocks_of_4():
    # The fused add's LayerNorm backward over 2 blocks of 6 or 7 warps (5632-7168) without a weight
    # (the pow2_warps rule): 4 blocks of 4 warps, held, both sums' slots in shared memory, capped for
    # 6 blocks. With a 16-bit weight those rows go to one block first (the even_halves rule's one block: 352-448
    # threads, 2 blocks); not 5 warps (5120, 4608), not LayerNorm's own, not beside an fp32
    # weight, not without a bias, not on gfx950.
    def lay(n, **kw):
        return build(kernel="layernorm_bwd", n=n, **{"bdtype": "f32", "has_dres_out": True, **kw}).layout

    for n in (5632, 6144, 6656, 7168):
        got = lay(n, has_weight=False)
        assert (got.tpr, got.cluster, got.k, got.cache_row, got.db_smem, got.min_blocks) == (128, 4, 2, True, 3, 6), n
        got = lay(n)
        assert (got.tpr, got.cluster, got.k, got.cache_row, got.db_smem, got.min_blocks) == (n // 16, 1, 2, False, 3, 2)
    for n, kw in ((5120, {}), (4608, {}), (7168, dict(has_dres_out=False)), (7168, dict(wdtype="f32")),
                  (7168, dict(bdtype="")), (7168, dict(target="gfx950"))):
        assert (lay(n, **kw).tpr, lay(n, **kw).cluster) != (128, 4), (n, kw)


def test_layernorm_backward_halves_of_a_masked_chunk_go_to_one_block():
    # LayerNorm's 16-bit backward held over 2 blocks with a masked chunk (the even_halves rule): one
    # block, where more rows are held at once, of 4-byte chunks read again, the fewest whole warps
    # at up to 5 a thread (2240: 4 a multiprocessor against 2.5), or of 16-byte chunks read again
    # with both column sums in shared memory, capped (2880: 4 against the 4-byte rows' 3; 3520 and
    # 3200: 4 against 2 and 3; 2112: 4 against 2.5); on a tie the 4-byte rows (2240). Not the fused add's, not
    # without a bias, not in f32 rows, not on gfx950; without a weight or beside an fp32 one, not
    # the shared sums.
    def lay(n, **kw):
        return build(kernel="layernorm_bwd", n=n, **{"bdtype": "f32", **kw}).layout

    def shape(got):
        return got.tpr, got.vec, got.k, got.cluster, got.cache_row, got.db_smem, got.min_blocks

    assert shape(lay(2240)) == (224, 2, 5, 1, False, 0, 0)
    assert [shape(lay(n)) for n in (2112, 2880, 3200, 3520)] == [
        (160, 8, 2, 1, False, 3, 4), (192, 8, 2, 1, False, 3, 4), (224, 8, 2, 1, False, 3, 4), (224, 8, 2, 1, False, 3, 4)]
    assert shape(lay(2880, wdtype="f32"))[:2] == shape(lay(2880, has_weight=False))[:2] == (288, 2)
    assert lay(2880, has_dres_out=True).vec == 8  # the fused add's one block comes from the db_smem rule
    for n, kw in ((2880, dict(bdtype="")), (2880, dict(dtype="f32")), (2880, dict(target="gfx950"))):
        got = lay(n, **kw)
        assert got.vec != 2 and not (got.cluster == 1 and got.db_smem == 3), (n, kw)


def test_backward_rows_split_over_a_cluster_only_where_the_halves_are_even():
    # LayerNorm's backward takes 2 blocks of half the threads for rows of over 4 warps at 2
    # chunks, unless the row splits evenly in one block and its halves would not (2560, 3584);
    # the halves may then go to one block again (the even_halves rule's one block: 3072 as 192 x 2).
    def lay(n):
        return build(kernel="layernorm_bwd", n=n, bdtype="f32").layout

    assert [(lay(n).tpr, lay(n).cluster) for n in (2560, 3584)] == [(160, 1), (224, 1)]
    assert [(lay(n).tpr, lay(n).cluster) for n in (4096, 5120)] == [(128, 2), (160, 2)]
    assert (lay(3072).tpr, lay(3072).cluster, lay(3072).db_smem) == (192, 1, 3)


def test_fused_add_long_rows_are_held_over_8_blocks_of_128():
    # The fused add's LayerNorm forward at N=32768 (two reads, a wider summary: 1024 x 4
    # streamed) and 65536 (over 2 blocks of 512) is held over 8 blocks of 128 threads, 4 and 8
    # chunks a thread (the wide_sums_held rule); LayerNorm's own (one read) and RMSNorm's fused
    # add keep theirs, as do f32 rows, other lengths and gfx950 (no clusters).
    fused = dict(kernel="layernorm_fwd", bdtype="bf16", rdtype="bf16", store_residual=True)
    for n, k in ((32768, 4), (65536, 8)):
        lay = build(**fused, n=n).layout
        assert (lay.tpr, lay.cluster, lay.k, lay.kfull, lay.cache_row) == (128, 8, k, k, True)
        assert build(**fused, n=n, target="gfx950").layout.cluster == 1
    assert not build(kernel="layernorm_fwd", n=32768, bdtype="bf16").layout.cache_row
    rms = build(kernel="fused_add_rmsnorm_fwd", n=32768, rdtype="bf16", store_residual=True).layout
    assert (rms.tpr, rms.cluster, rms.cache_row) == (1024, 1, False)
    f32 = build(kernel="layernorm_fwd", n=65536, dtype="f32", bdtype="f32", rdtype="f32", store_residual=True).layout
    assert (f32.tpr, f32.cluster) == (512, 4)
    assert build(**fused, n=16384).layout.cluster == 1  # 512 x 4 streamed
    assert build(**fused, n=49152).layout.cluster == 2  # 6 chunks a thread over 8: not taken


def test_backward_in_one_block_with_the_slots_in_dynamic_shared_memory():
    # LayerNorm's 16-bit backward over 2 blocks goes to one block of 2 chunks a thread, read again,
    # both sums in shared memory (the even_halves rule's one block), where it holds more rows at once: 7168's
    # slots (2 sums x 2 chunks x 448 threads x 32 bytes = 56 KB) pass the static limit and go to
    # the launch's dynamic shared memory, dw's from its base and db's after them; the fused add's
    # too (6144, 7168). Not where db's sums alone moved keep the rows held (4096), nor where one
    # block holds fewer rows (8192), nor beside an fp32 weight, nor on gfx950.
    from normir.specialize import values_for

    def lay(n, **kw):
        return build(kernel="layernorm_bwd", n=n, **{"bdtype": "f32", **kw}).layout

    def shape(got):
        return got.tpr, got.cluster, got.k, got.cache_row, got.db_smem, got.min_blocks

    got = lay(7168)
    assert shape(got) == (448, 1, 2, False, 3, 2) and got.dyn_slots and got.smem_bytes == 2 * 2 * 448 * 8 * 4
    assert shape(lay(6144, has_dres_out=True)) == (384, 1, 2, False, 3, 2)
    assert shape(lay(4608, has_dres_out=True)) == (288, 1, 2, False, 3, 3) and not lay(4608).dyn_slots
    assert (lay(4096).tpr, lay(4096).cluster, lay(4096).db_smem) == (128, 2, 1)
    assert (lay(8192).tpr, lay(8192).cluster) == (256, 2)
    for kw in (dict(wdtype="f32"), dict(target="gfx950")):
        assert lay(7168, **kw).cluster > 1 or lay(7168, **kw).tpr != 448, kw
    v = values_for(build(kernel="layernorm_bwd", n=7168, bdtype="f32"))
    assert v["SLOT_BUF"] == "index" and v["DB_IN_WORKGROUP"] == v["DW_IN_WORKGROUP"] == ""
    assert v["STAGE_PIECE"] == "common/stage_nvvm.mlir" and v["SLOTS_DYN_PIECE"] == "common/slots_dyn.mlir"
    assert "%db_slots_at = arith.constant 28672 : index" in v["SLOT_BASES"]
    assert v["SLOT_LOAD"].startswith("func.call @normir_slot_load(%buf, %k, %h, %tid)")
    static = values_for(build(kernel="layernorm_bwd", n=4096, bdtype="f32", db_smem=3))
    assert static["SLOT_BASES"] == "" and static["SLOT_LOAD"].startswith("vector.load %buf[%k, %h, %tid, %c0]")
    # Forced: the quarter slots may pass the static limit on NVIDIA, up to MAX_DYN_SLOT_BYTES; gfx950
    # (no dynamic base here) refuses past 40 KB, naming the limit.
    forced = lay(8192, tpr=512, cluster=1, cache_row=0, db_smem=3, min_blocks=2)
    assert forced.dyn_slots and forced.smem_bytes == 64 * 1024
    with pytest.raises(ValueError, match=r"db_smem=3 needs .* in at most 40960 bytes"):
        assert build(kernel="layernorm_bwd", n=8192, bdtype="f32", target="gfx950", tpr=512, cluster=1,
                       cache_row=0, db_smem=3).layout
    with pytest.raises(ValueError, match=r"db_smem=1 needs .* in at most 40960 bytes"):
        lay(16384, tpr=1024, cluster=1, cache_row=0, db_smem=1)  # db's [k][tid] slots stay static
