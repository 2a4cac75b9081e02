"""Lines of code of the layout policy (driver/layout.py or the driver/layout/ package): every line
holding a token that is neither a comment nor part of a docstring. Issue 46's target: under 600.

    python3 scripts/policy_lines.py [PATH ...]
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def code_lines(src: str) -> int:
    docs: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and ast.get_docstring(node) is not None:
            first = node.body[0]
            docs.update(range(first.lineno, first.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}
    lines = {n for tok in tokenize.generate_tokens(io.StringIO(src).readline) if tok.type not in skip
             for n in range(tok.start[0], tok.end[0] + 1)}
    return len(lines - docs)


if __name__ == "__main__":
    layout = ROOT / "driver" / "layout"
    paths = [Path(p) for p in sys.argv[1:]] or (sorted(layout.glob("*.py")) if layout.is_dir()
                                                  else [ROOT / "driver" / "layout.py"])
    total = 0
    for p in paths:
        n = code_lines(p.read_text())
        total += n
        print(f"{n:5d}  {p.relative_to(ROOT) if p.is_absolute() else p}")
    print(f"{total:5d}  in all")
