"""Pieces of a written script: blocks of code, each with the imports it needs.

A :class:`Piece` is a block of top-level code and its import lines; :func:`join` puts the
pieces of one script together, the imports first, grouped and sorted as ruff's isort wants
them (the standard library, then torch), each block once."""

from __future__ import annotations

import inspect
import re
import sys
import textwrap
from dataclasses import dataclass

LINE = 100  # the repository's ruff line length


@dataclass
class Piece:
    code: str
    imports: tuple[str, ...] = ()


def block(text: str, *imports: str) -> Piece:
    """A piece from an indented triple-quoted string."""
    return Piece(textwrap.dedent(text).strip("\n"), imports)


def source_of(*objects) -> str:
    """The source of functions and classes, as they are in labkit (the script's model and
    data are labkit's own code, so the two cannot drift apart)."""
    return "\n\n\n".join(textwrap.dedent(inspect.getsource(obj)).strip("\n")
                         for obj in objects)




def _name_key(name: str) -> tuple[int, str]:
    # ruff's isort (order-by-type): CONSTANTS, then Classes, then the rest
    bare = name.split(" as ")[0]
    kind = 0 if bare.isupper() and len(bare) > 1 else 1 if bare[:1].isupper() else 2
    return kind, bare.lower()


def _from_line(module: str, names: list[str]) -> str:
    names = sorted(set(names), key=_name_key)
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= LINE:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"


def _section(lines: list[str]) -> list[str]:
    straight = sorted({line for line in lines if line.startswith("import ")},
                      key=lambda line: line.split()[1].lower())
    froms: dict[str, list[str]] = {}
    for line in lines:
        match = re.fullmatch(r"from (\S+) import (.+)", line)
        if match:
            froms.setdefault(match[1], []).extend(n.strip() for n in match[2].split(","))
    return straight + [_from_line(m, froms[m]) for m in sorted(froms, key=str.lower)]


def imports_block(lines: list[str]) -> str:
    """Import lines as isort writes them: the standard library, a blank line, the rest."""
    def root(line: str) -> str:
        return line.split()[1].split(".")[0]

    stdlib = [line for line in lines if root(line) in sys.stdlib_module_names]
    other = [line for line in lines if root(line) not in sys.stdlib_module_names]
    return "\n\n".join("\n".join(_section(s)) for s in (stdlib, other) if s)


def join(docstring: str, pieces: list[Piece]) -> str:
    """The script: its docstring, the imports of every piece, then the pieces in order."""
    lines = [line for piece in pieces for line in piece.imports]
    body = "\n\n\n".join(piece.code for piece in pieces if piece.code)
    first = pieces[0].code if pieces else ""
    gap = "\n\n" if first.startswith(("def ", "class ", "@")) else "\n"  # ruff's isort
    return f'"""{docstring}"""\n\n{imports_block(lines)}\n{gap}{body}\n'
