"""Kernel text: placeholder substitution, splicing of shared pieces, and a line map back to the
files the text came from. Pure Python: no MLIR import, no torch.

A template is MLIR text with `${NAME}` placeholders and lines that are nothing but
`// normir:splice FILE [NAME=VALUE ...]` (FILE and the values may hold placeholders): the line is
replaced by FILE's text, itself substituted and spliced, with the given NAMEs filled by their
values inside that piece (so one piece can be spliced several times: a function per tensor).
Files are found by their path relative to the kernel folder (`mlir/`), looked up in the include
folders first (`--include`, NORMIR_INCLUDE), then in the package.

Every output line keeps its origin (file, line, and how substitution moved its columns), so that
an MLIR diagnostic at `"-":LINE:COL` of the specialized text can be reported at the line of the
file the author edited.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from . import env

PLACEHOLDER = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")
SPLICE = re.compile(r"^[ \t]*// normir:splice (\S+)((?:[ \t]+[A-Z_][A-Z0-9_]*=\S+)*)[ \t]*$")
MAX_DEPTH = 4
# A location in MLIR's diagnostics of text parsed from a string: "-":LINE:COL.
_MLIR_LOC = re.compile(r'"-":(\d+):(\d+)')


class SpecializationError(ValueError):
    pass


def mlir_root() -> Path:
    """The kernel sources of the installed package (mlir/ of a source checkout when editable)."""
    from . import mlir

    return Path(mlir.__file__).parent


def env_include_dirs() -> tuple[Path, ...]:
    return tuple(Path(p) for p in env.INCLUDE.get().split(os.pathsep) if p)


@cache
def _read_cached(path: Path, mtime_ns: int) -> str:
    return path.read_text()


def _read_file(path: Path) -> str:
    return _read_cached(path, path.stat().st_mtime_ns)  # an edited file is read again


@dataclass(frozen=True)
class Resolver:
    """Finds kernel files by their path relative to the kernel folder: include folders first."""

    include: tuple[Path, ...] = ()

    def find(self, rel: str) -> Path:
        for root in (*self.include, mlir_root()):
            path = root / rel
            if path.is_file():
                return path
        where = ", ".join(str(r) for r in (*self.include, mlir_root()))
        raise SpecializationError(f"kernel file {rel!r} not found in {where}")

    def read(self, rel: str) -> tuple[Path, str]:
        path = self.find(rel)
        return path, _read_file(path)


def default_resolver() -> Resolver:
    return Resolver(env_include_dirs())


@dataclass(frozen=True)
class Origin:
    """Where one line of specialized text came from. cols: (out_start, out_end, src_start,
    src_end) of each placeholder filled on the line, in order (0-based, end exclusive)."""

    file: str
    line: int
    cols: tuple[tuple[int, int, int, int], ...] = ()

    def column(self, out_col: int) -> int:
        """The source column (1-based) of a 1-based column of the output line."""
        c = out_col - 1
        shift = 0
        for o0, o1, s0, s1 in self.cols:
            if c < o0:
                break
            if c < o1:
                return s0 + 1  # inside a filled placeholder: its `$`
            shift = s1 - o1
        return c + shift + 1


@dataclass(frozen=True)
class Source:
    """Specialized text and its line map."""

    text: str
    origins: tuple[Origin, ...]
    used: frozenset[str] = frozenset()  # the placeholders the text filled
    files: tuple[Path, ...] = ()  # every file read, template first, in order
    include_hits: tuple[Path, ...] = field(default=(), compare=False)  # files found in include folders

    def where(self, line: int, col: int | None = None) -> str:
        """`file:line[:col]` of a 1-based line (and column) of the text."""
        if not 1 <= line <= len(self.origins):
            return f"<specialized>:{line}" + (f":{col}" if col else "")
        o = self.origins[line - 1]
        return f"{o.file}:{o.line}" + (f":{o.column(col)}" if col else "")

    def translate(self, message: str) -> str:
        """A diagnostic with every `"-":LINE:COL` replaced by the source file, line and column."""
        return _MLIR_LOC.sub(lambda m: self.where(int(m.group(1)), int(m.group(2))), message)


def _fill_line(line: str, values: dict[str, str], used: set[str], file: str, lineno: int
               ) -> tuple[str, tuple[tuple[int, int, int, int], ...]]:
    out: list[str] = []
    cols: list[tuple[int, int, int, int]] = []
    pos = 0
    length = 0
    for m in PLACEHOLDER.finditer(line):
        name = m.group(1)
        if name not in values:
            raise SpecializationError(
                f"{file}:{lineno}: placeholder ${{{name}}} has no value; known: {', '.join(sorted(values))}")
        used.add(name)
        before = line[pos:m.start()]
        out.append(before)
        length += len(before)
        value = values[name]
        out.append(value)
        cols.append((length, length + len(value), m.start(), m.end()))
        length += len(value)
        pos = m.end()
    out.append(line[pos:])
    return "".join(out), tuple(cols)


def render(text: str, values: dict[str, str], *, origin: str = "<text>", resolver: Resolver | None = None,
           splice: bool = True, strict_unused: bool = True) -> Source:
    """Fill placeholders and splice pieces; the result keeps a line map. A placeholder without a
    value is an error naming its file and line; with strict_unused, so is a value never used."""
    resolver = resolver or default_resolver()
    used: set[str] = set()
    lines: list[str] = []
    origins: list[Origin] = []
    files: list[Path] = []
    hits: list[Path] = []
    package = mlir_root()

    def expand(src: str, file: str, depth: int, scope: dict[str, str]) -> None:
        if depth > MAX_DEPTH:
            raise SpecializationError(f"{file}: splices nest too deep")
        for lineno, line in enumerate(src.split("\n"), start=1):
            m = SPLICE.match(line) if splice else None
            if m is None:
                filled, cols = _fill_line(line, scope, used, file, lineno)
                if "\n" in filled:  # a multi-line value: every line maps to the placeholder's
                    for part in filled.split("\n"):
                        lines.append(part)
                        origins.append(Origin(file, lineno))
                else:
                    lines.append(filled)
                    origins.append(Origin(file, lineno, cols))
                continue
            rel, _ = _fill_line(m.group(1), scope, used, file, lineno)
            inner = dict(scope)
            for arg in m.group(2).split():
                name, _, value = arg.partition("=")
                inner[name] = _fill_line(value, scope, used, file, lineno)[0]
            try:
                path, piece = resolver.read(rel)
            except SpecializationError as e:
                raise SpecializationError(f"{file}:{lineno}: {e}") from None
            files.append(path)
            if package not in path.parents:
                hits.append(path)
            if piece.endswith("\n"):
                # The splice line's own newline follows the piece: keep that blank line.
                piece = piece[:-1]
                expand(piece, _display(path), depth + 1, inner)
                lines.append("")
                origins.append(Origin(file, lineno))
            else:
                expand(piece, _display(path), depth + 1, inner)

    expand(text, origin, 0, values)
    unused = set(values) - used
    if strict_unused and unused:
        raise SpecializationError(f"{origin}: values given but never used: {sorted(unused)}")
    return Source("\n".join(lines), tuple(origins), frozenset(used), tuple(files), tuple(hits))


def render_file(rel: str, values: dict[str, str], *, resolver: Resolver | None = None,
                strict_unused: bool = False) -> Source:
    """A kernel template (path relative to the kernel folder) rendered with its line map."""
    resolver = resolver or default_resolver()
    path, text = resolver.read(rel)
    src = render(text, values, origin=_display(path), resolver=resolver, strict_unused=strict_unused)
    hits = (path,) if mlir_root() not in path.parents else ()
    return Source(src.text, src.origins, src.used, (path, *src.files), hits + src.include_hits)


def substitute(text: str, values: dict[str, str], *, origin: str = "<text>", splice: bool = True,
               strict_unused: bool = True, resolver: Resolver | None = None) -> str:
    """render() without the line map."""
    return render(text, values, origin=origin, resolver=resolver, splice=splice, strict_unused=strict_unused).text


def _display(path: Path) -> str:
    """A file's name in diagnostics: relative to the working folder when below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
