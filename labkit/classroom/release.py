"""Learners' notebooks from the course's sources: solutions out, hidden tests out.

The sources in ``course/`` hold the reference solutions and follow nbgrader's conventions, so
an instructor can also hand them to nbgrader as they are:

* an answer cell has cell metadata ``nbgrader: {solution: true, grade_id, ...}``; in it, the
  lines between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` become
  ``# YOUR CODE HERE`` / ``raise NotImplementedError()`` (nbgrader's stub, indented alike),
  which raises only when the learner's function is called: by a check, on the ranks, where
  the check reports "not attempted yet" and "Run All" goes on;
* a check cell has ``nbgrader: {grade: true, locked: true, points, grade_id}``; the lines
  between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS`` are removed.

    python -m labkit release                 # course/*.ipynb -> notebooks/*.ipynb
    python -m labkit release --check         # exit 1 if notebooks/ is out of date
    python -m labkit release --no-solutions  # for a graded course: no reference solutions

Beside the notebooks, ``solutions/<name>.json`` holds each exercise's reference solution (the
answer cell without its markers), which ``labkit.check.reveal`` shows a learner on request;
``--no-solutions`` leaves it out (and removes one written before), and writes
``solutions/NONE.txt`` instead, so that ``reveal`` run beside these notebooks does not fall back
on the repository's own ``notebooks/solutions``.

nbgrader itself is not needed: this is the part of its ``generate_assignment`` that the suite
uses, written for these notebooks (one command, no database, no course directory layout).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
CODE_STUB = ["# YOUR CODE HERE", "raise NotImplementedError()"]
TEXT_STUB = ["YOUR ANSWER HERE"]
HEADER = "nbgrader"
MARKERS = (BEGIN_SOLUTION, END_SOLUTION, BEGIN_HIDDEN, END_HIDDEN)


class ReleaseError(ValueError):
    """A source notebook breaks the conventions above (the message names the cell)."""


def _regions(lines: list[str], begin: str, end: str, where: str):
    """Yield (start, stop) line indices of each begin/end region (markers included)."""
    start = None
    for i, line in enumerate(lines):
        if begin in line:
            if start is not None:
                raise ReleaseError(f"{where}: nested '{begin}'")
            start = i
        elif end in line:
            if start is None:
                raise ReleaseError(f"{where}: '{end}' without '{begin}'")
            yield start, i
            start = None
    if start is not None:
        raise ReleaseError(f"{where}: '{begin}' without '{end}'")


def _replace(lines: list[str], begin: str, end: str, stub: list[str], where: str):
    regions = list(_regions(lines, begin, end, where))
    for start, stop in reversed(regions):
        indent = re.match(r"\s*", lines[start]).group(0)
        lines[start:stop + 1] = [indent + s for s in stub]
    return lines, len(regions)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get(HEADER, {})


def _check_metadata(cell, where: str, ids: set) -> None:
    meta = _meta(cell)
    if not meta:
        return
    if meta.get("grade") or meta.get("solution") or meta.get("locked"):
        grade_id = meta.get("grade_id")
        if not grade_id:
            raise ReleaseError(f"{where}: nbgrader metadata without a grade_id")
        if grade_id in ids:
            raise ReleaseError(f"{where}: grade_id {grade_id!r} is used twice")
        ids.add(grade_id)
    if meta.get("grade") and "points" not in meta:
        raise ReleaseError(f"{where}: a grade cell needs points")


def release_cell(cell, where: str, ids: set):
    """The learner's version of one cell (a new cell; the source is not changed)."""
    cell = nbformat.from_dict(dict(cell))
    _check_metadata(cell, where, ids)
    lines = cell.source.split("\n")
    stub = CODE_STUB if cell.cell_type == "code" else TEXT_STUB
    lines, solutions = _replace(lines, BEGIN_SOLUTION, END_SOLUTION, stub, where)
    lines, hidden = _replace(lines, BEGIN_HIDDEN, END_HIDDEN, [], where)
    if solutions and not _meta(cell).get("solution"):
        raise ReleaseError(f"{where}: a solution region in a cell not marked as an nbgrader "
                           "answer cell (metadata nbgrader.solution = true)")
    if hidden and not _meta(cell).get("grade"):
        raise ReleaseError(f"{where}: hidden tests in a cell not marked as an nbgrader grade "
                           "cell (metadata nbgrader.grade = true)")
    while lines and not lines[-1].strip():
        lines.pop()
    cell.source = "\n".join(lines)
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    return cell


def release_notebook(source: nbformat.NotebookNode, name: str = "notebook"):
    """The learner's version of a source notebook."""
    ids: set[str] = set()
    student = nbformat.from_dict(dict(source))
    student.cells = [release_cell(cell, f"{name}, cell {i}", ids)
                     for i, cell in enumerate(source.cells)]
    return student


def exercise_cells(notebook: nbformat.NotebookNode) -> list[dict]:
    """The nbgrader cells of a notebook: [{grade_id, kind ("answer"|"check"), points, index}]."""
    found = []
    for index, cell in enumerate(notebook.cells):
        meta = _meta(cell)
        if meta.get("solution") or meta.get("grade"):
            found.append({"grade_id": meta["grade_id"], "index": index,
                          "kind": "check" if meta.get("grade") else "answer",
                          "points": meta.get("points", 0)})
    return found


def solution_cells(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """{exercise: the answer cell's code, solution markers removed} of a source notebook."""
    found = {}
    for cell in notebook.cells:
        meta = _meta(cell)
        if meta.get("solution") and cell.cell_type == "code":
            exercise = meta["grade_id"].removesuffix("_answer")
            lines = [line for line in cell.source.split("\n")
                     if line.strip() not in (BEGIN_SOLUTION, END_SOLUTION)]
            found[exercise] = "\n".join(lines).strip() + "\n"
    return found


def _sync(target: Path, data: bytes | None, check: bool) -> bool:
    """Make ``target`` hold ``data`` (None: not exist); True if it did not already."""
    current = target.read_bytes() if target.exists() else None
    if current == data:
        return False
    if not check:
        if data is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return True


def notebook_bytes(notebook) -> bytes:
    """A notebook as the suite commits it (nbformat's layout, one trailing newline)."""
    return (nbformat.writes(notebook) + "\n").encode()


def release(course: Path, out: Path, check: bool = False,
            solutions: bool = True) -> tuple[list[Path], list[Path]]:
    """Write (or with ``check``, only compare) ``out/<name>.ipynb`` for each
    ``course/<name>.ipynb``, and ``out/solutions/<name>.json`` unless not ``solutions`` (then
    ``out/solutions/NONE.txt`` says so, and ``reveal`` looks no further). Returns (the files
    written or out of date, the notebooks and solutions in ``out`` without a source in
    ``course``: never deleted here, the caller says so)."""
    from labkit.lessons.exercise.solutions import NO_SOLUTIONS

    sources = sorted(Path(course).glob("*.ipynb"))
    if not sources:
        raise ReleaseError(f"no notebooks in {course}")
    changed = []
    for path in sources:
        source = nbformat.read(path, as_version=4)
        data = notebook_bytes(release_notebook(source, path.name))
        target = Path(out) / path.name
        if _sync(target, data, check):
            changed.append(target)
        answers = solution_cells(source) if solutions else {}
        answers_data = (json.dumps(answers, indent=1) + "\n").encode() if answers else None
        answers_path = Path(out) / "solutions" / f"{path.stem}.json"
        if _sync(answers_path, answers_data, check):
            changed.append(answers_path)
    marker = Path(out) / "solutions" / NO_SOLUTIONS
    if _sync(marker, None if solutions else WITHHELD.encode(), check):
        changed.append(marker)
    expected = {p.stem for p in sources}
    stale = [p for p in sorted(Path(out).glob("*.ipynb")) if p.stem not in expected]
    stale += [p for p in sorted((Path(out) / "solutions").glob("*.json"))
              if p.stem not in expected]
    return changed, stale


WITHHELD = ("These notebooks were released without their reference solutions\n"
            "(python -m labkit release --no-solutions): labkit.check.reveal shows none.\n")
