"""Kernel text: placeholder substitution, splicing, include folders and the line map (no MLIR)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from normir import template as T
from normir.options import build
from normir.specialize import specialize_source
from normir.template import Resolver, SpecializationError

pytestmark = pytest.mark.cpu

MLIR_DIR = Path(__file__).resolve().parent.parent / "mlir"


def test_substitute_fills_placeholders():
    assert T.substitute("a ${X} b ${Y_2} ${X}", {"X": "1", "Y_2": "two"}) == "a 1 b two 1"
    assert T.substitute("no placeholders, $X {X} $(X)", {}) == "no placeholders, $X {X} $(X)"


def test_substitute_unknown_placeholder_names_it_and_the_line():
    text = "line one\nline two\n  %c = arith.constant ${NOPE} : index\n"
    with pytest.raises(SpecializationError, match=r"^k\.mlir:3: placeholder \$\{NOPE\} has no value; known: A") as e:
        T.substitute(text, {"A": "1"}, origin="k.mlir", strict_unused=False)
    assert isinstance(e.value, ValueError)


def test_substitute_line_number_after_splice():
    text = "line one\n// normir:splice common/rsqrt_nvvm.mlir\n${NOPE}\n"
    with pytest.raises(SpecializationError, match=r"^k\.mlir:3: "):
        T.substitute(text, {}, origin="k.mlir")


def test_substitute_unused_value():
    with pytest.raises(SpecializationError, match=r"values given but never used: \['UNUSED'\]"):
        T.substitute("${A}", {"A": "1", "UNUSED": "2"}, origin="k.mlir")
    assert T.substitute("${A}", {"A": "1", "UNUSED": "2"}, strict_unused=False) == "1"


def test_substitute_splices_common_piece():
    text = "module {\n    // normir:splice ${RSQRT_PIECE}\n}\n"
    out = T.substitute(text, {"RSQRT_PIECE": "common/rsqrt_nvvm.mlir"}, origin="k.mlir")
    assert "normir:splice" not in out
    assert "func.func private @normir_rsqrt" in out and "llvm.nvvm.rsqrt.approx.ftz.f" in out
    assert out.startswith("module {\n") and out.endswith("}\n")
    # The piece text replaces the line; the line's own newline follows it (as a blank line).
    piece = (MLIR_DIR / "common" / "rsqrt_nvvm.mlir").read_text()
    assert out == "module {\n" + piece + "\n}\n"
    # The piece's own placeholders are filled, and count as used.
    out = T.substitute("// normir:splice common/atomic_add.mlir\n",
                       {"N": "128", "V": "4", "ATOMIC_SCOPE": "agent", "ATOMIC_ATTRS": ""})
    assert "memref<128xf32>" in out and "vector<4xf32>" in out and "${" not in out
    # splice=False leaves the line alone.
    assert T.substitute("// normir:splice x.mlir\n", {}, splice=False) == "// normir:splice x.mlir\n"
    # Only a line that is nothing but the directive splices.
    assert T.substitute("%a = 1 // normir:splice x.mlir\n", {}) == "%a = 1 // normir:splice x.mlir\n"


def test_substitute_missing_piece():
    with pytest.raises(SpecializationError, match=r"^<text>:1: kernel file 'common/nope.mlir' not found in "):
        T.substitute("// normir:splice common/nope.mlir\n", {})


def test_substitute_splice_depth(tmp_path):
    (tmp_path / "loop.mlir").write_text("// normir:splice loop.mlir\n")
    with pytest.raises(SpecializationError, match="splices nest too deep"):
        T.substitute("// normir:splice loop.mlir\n", {}, resolver=Resolver((tmp_path,)))


def test_line_map_names_template_and_piece_lines():
    src = specialize_source(build(kernel="rmsnorm_fwd", n=4096))
    lines = src.text.split("\n")
    assert len(src.origins) == len(lines)
    kernel = (MLIR_DIR / "norm_fwd.mlir").read_text().split("\n")
    piece = (MLIR_DIR / "common" / "row_sum.mlir").read_text().split("\n")
    for i, (line, o) in enumerate(zip(lines, src.origins), start=1):
        if o.file.endswith("norm_fwd.mlir") and "${" not in kernel[o.line - 1]:
            # a kernel line, or the blank line a splice directive leaves after its piece
            assert line == kernel[o.line - 1] or (line == "" and "normir:splice" in kernel[o.line - 1])
        if o.file.endswith("common/row_sum.mlir") and "${" not in piece[o.line - 1]:
            assert line == piece[o.line - 1]
        assert src.where(i).startswith(o.file)
    tid = lines.index("    %tid = gpu.thread_id x") + 1
    assert src.where(tid, 5) == f"{src.origins[tid - 1].file}:{kernel.index('    %tid = gpu.thread_id x') + 1}:5"
    assert src.translate(f'error: "-":{tid}:5: boom') == f"error: {src.where(tid, 5)}: boom"
    assert src.files[0].name == "norm_fwd.mlir" and any(f.name == "row_sum.mlir" for f in src.files)


def test_line_map_columns_move_with_filled_placeholders():
    src = T.render("  %c = arith.constant ${N} : ${T}\n", {"N": "4096", "T": "bf16"}, origin="k.mlir")
    o = src.origins[0]
    out = src.text.split("\n")[0]
    assert out == "  %c = arith.constant 4096 : bf16"
    assert o.column(out.index("%c") + 1) == 3  # before any placeholder: unchanged
    assert o.column(out.index("4096") + 2) == len("  %c = arith.constant ") + 1  # inside: the `$`
    assert o.column(out.index("bf16") + 1) == len("  %c = arith.constant ${N} : ") + 1  # after: shifted
    assert src.where(1, out.index(": bf16") + 1) == f"k.mlir:1:{len('  %c = arith.constant ${N} ') + 1}"


def test_include_folders_come_first(tmp_path):
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "rsqrt_nvvm.mlir").write_text("  // mine\n")
    r = Resolver((tmp_path,))
    src = T.render("// normir:splice common/rsqrt_nvvm.mlir\n// normir:splice common/rsqrt_rocdl.mlir\n", {},
                   resolver=r)
    assert "// mine" in src.text and "llvm.amdgcn.rsq" in src.text
    assert src.include_hits == (tmp_path / "common" / "rsqrt_nvvm.mlir",)


def test_include_env(tmp_path, monkeypatch):
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "rsqrt_nvvm.mlir").write_text("  // from NORMIR_INCLUDE\n")
    monkeypatch.setenv("NORMIR_INCLUDE", str(tmp_path))
    assert "// from NORMIR_INCLUDE" in T.substitute("// normir:splice common/rsqrt_nvvm.mlir\n", {})


def test_edited_file_is_read_again(tmp_path):
    f = tmp_path / "k.mlir"
    f.write_text("one\n")
    r = Resolver((tmp_path,))
    assert r.read("k.mlir")[1] == "one\n"
    f.write_text("two\n")
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert r.read("k.mlir")[1] == "two\n"


@pytest.mark.parametrize("kernel,n,extra,words", [
    ("layernorm_fwd", 2880, {}, True),  # held, 32 elements a thread
    ("layernorm_fwd", 32768, {}, True),  # streamed, capped for 2 blocks
    ("layernorm_fwd", 65536, {}, True),  # held over a cluster, capped for 4
    ("layernorm_fwd", 7168, {}, True),  # streamed, 7 warps: pass 2 chunk by chunk
    ("layernorm_fwd", 8192, {}, False),  # streamed, 8 warps: ptxas would take fewer registers, more blocks
    ("layernorm_fwd", 2560, {}, False),  # held, 80 elements a thread
    ("layernorm_fwd", 32768, {"rdtype": "bf16", "store_residual": True}, False),  # the fused add: two reads
    ("rmsnorm_fwd", 65536, {}, False),  # RMSNorm's: a tie, the former text
    ("layernorm_fwd", 2880, {"dtype": "f16", "wdtype": "f16"}, False),  # f16: the cast itself
    ("layernorm_fwd", 2880, {"target": "gfx950"}, False),  # measured on the H200 alone
])
def test_casts_in_words_where_the_layout_fixes_registers(kernel, n, extra, words):
    # The forward's pass-2 casts go by 32-bit words, with x_hat * w + b as one fma, only in rows read once whose
    # layout fixes the registers (the words_fwd and words_bwd rules); elsewhere the text is as before.
    opts = build(kernel=kernel, n=n, bdtype="bf16" if kernel == "layernorm_fwd" else "", **extra)
    assert opts.layout.cast_words == words
    text = specialize_source(opts).text
    assert ("// normir common piece: late_ext for the row tensor h in bf16, by 32-bit words" in text) == words
    assert ("arith.mulf %xn, %wf fastmath<contract>" in text) == words
    assert ("arith.addf %yf, %bf fastmath<contract>" in text) == words
    if words:
        assert "func.func private @normir_late_ext_w(%v: vector<" in text and "%hi_bits = arith.andi" in text


def test_streamed_rows_in_words_load_pass_2_chunk_by_chunk():
    # The streamed rows that take the words drop batch_reload (the pair measured together); forced
    # batch_reload keeps the user's choice, and the words stay off unless forced too.
    lay = build(kernel="layernorm_fwd", n=7168, bdtype="bf16").layout
    assert lay.cast_words and not lay.batch_reload and not lay.cache_row
    forced = build(kernel="layernorm_fwd", n=7168, bdtype="bf16", batch_reload=1).layout
    assert forced.batch_reload and not forced.cast_words
    assert build(kernel="layernorm_fwd", n=8192, bdtype="bf16").layout.batch_reload


@pytest.mark.parametrize("kernel,n,extra,words", [
    ("layernorm_bwd", 2880, {}, True),  # rows read again
    ("layernorm_bwd", 7168, {}, True),  # one block, both sums' slots in dynamic shared memory
    ("layernorm_bwd", 7168, {"has_dres_out": True}, True),  # the same for the fused add's rows
    ("layernorm_bwd", 4096, {}, True),  # LayerNorm's rows held
    ("layernorm_bwd", 7168, {"has_dres_out": True, "has_weight": False}, False),  # held over 4 blocks, capped: spill
    ("layernorm_bwd", 49152, {"has_dres_out": True}, True),  # the fused add's rows read again
    ("layernorm_bwd", 65536, {"has_dres_out": True}, False),  # held in 4 chunks (rule held_quads)
    ("layernorm_bwd", 4096, {"has_dres_out": True, "wdtype": "f32"}, False),  # an fp32 weight: spill at the cap
    ("layernorm_bwd", 8192, {"stage": 1, "cache_row": 0}, False),  # staged
    ("rmsnorm_bwd", 2880, {}, False),  # RMSNorm's: +1% read again, but held rows take 96 registers for 80
    ("fused_add_rmsnorm_bwd", 65536, {"has_dres_out": True}, False),  # a tie
    ("layernorm_bwd", 2880, {"dtype": "f16", "wdtype": "f16"}, False),  # no bf16 row
    ("layernorm_bwd", 2880, {"target": "gfx950"}, False),  # measured on the H200 alone
])
def test_backward_casts_in_words(kernel, n, extra, words):
    # The backward's x and dy go by words where the words_fwd and words_bwd rules takes them; its math is unchanged (no fma).
    opts = build(kernel=kernel, n=n, bdtype="f32" if kernel == "layernorm_bwd" else "", **extra)
    assert opts.layout.cast_words == words
    text = specialize_source(opts).text
    for tensor in ("x", "dy"):
        piece = f"// normir common piece: late_ext for the row tensor {tensor} in bf16, by 32-bit words"
        assert (piece in text) == words
    assert "fastmath<contract>" not in text


def test_forced_cast_words():
    on = build(kernel="rmsnorm_bwd", n=1024, cast_words=1)
    assert on.layout.cast_words and "by 32-bit words" in specialize_source(on).text
    off = build(kernel="layernorm_fwd", n=2880, bdtype="bf16", cast_words=0)
    assert not off.layout.cast_words and "row tensor h in bf16, by 32-bit words" not in specialize_source(off).text
    with pytest.raises(ValueError, match="cast_words=1 needs chunks of whole 32-bit words"):
        build(kernel="layernorm_fwd", n=1023, bdtype="bf16", cast_words=1)
    with pytest.raises(ValueError, match="cast_words"):
        build(kernel="layernorm_fwd", n=2880, cast_words=2)


@pytest.mark.parametrize("n,extra,two_pass", [
    (2880, {}, True),  # held, threads of 3 or 4 chunks: Chan's general merges
    (1728, {}, True),
    (1152, {}, False),  # held, equal counts: Chan's equal-count merges need no reciprocal
    (4096, {}, False),  # streamed: no second pass over registers
    (2880, {"rdtype": "bf16", "store_residual": True}, False),  # the fused add's 2880 is streamed
    (2880, {"target": "gfx950"}, False),  # measured on the H200 alone
])
def test_two_pass_variance_where_counts_are_unequal(n, extra, two_pass):
    # the two_pass rule: LayerNorm's held rows whose threads own unequal chunk counts take the exact
    # two-pass variance (plain block sums of the last summary value alone); the rest keep Chan's merges.
    opts = build(kernel="layernorm_fwd", n=n, bdtype="bf16", **extra)
    assert opts.layout.two_pass == two_pass
    text = specialize_source(opts).text
    assert ("%two_pass = arith.constant true" in text) == two_pass
    assert ("// normir common piece: two row summaries of 3 fp32 sums merged by adding them" in text) == two_pass


def test_forced_two_pass():
    assert build(kernel="layernorm_fwd", n=3584, bdtype="bf16", two_pass=1).layout.two_pass  # held, equal counts
    assert not build(kernel="layernorm_fwd", n=2880, bdtype="bf16", two_pass=0).layout.two_pass
    for bad in (dict(kernel="layernorm_fwd", n=4096), dict(kernel="rmsnorm_fwd", n=2880),
                dict(kernel="layernorm_bwd", n=2880), dict(kernel="layernorm_fwd", n=65536),  # a cluster
                dict(kernel="layernorm_fwd", n=1152)):  # 8 rows a block
        with pytest.raises(ValueError, match="two_pass=1 needs LayerNorm's forward with its rows held"):
            build(two_pass=1, **bad)
