"""Which course notebook a submission is, and its check cells as the course wrote them.

A learner may rename the file (``alice_00.ipynb``), edit a check cell to display a verdict
of its own, add a grade cell worth 100 points, or delete a check. So the grader takes from the
course's source, never from the submission: which cells are graded, their points, and their
code (nbgrader does the same with its locked cells and its database).
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from labkit.classroom.release import BEGIN_HIDDEN, END_HIDDEN, _regions, release_cell


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def grade_points(notebook) -> dict[str, float]:
    """{grade_id: points} of a notebook's nbgrader grade cells, in order."""
    return {_meta(c)["grade_id"]: _meta(c).get("points", 0)
            for c in notebook.cells if _meta(c).get("grade") and _meta(c).get("grade_id")}


def _ids(notebook) -> set[str]:
    return {_meta(c)["grade_id"] for c in notebook.cells if _meta(c).get("grade_id")}


def find_source(path: Path, notebook, source_dir: Path) -> Path | None:
    """The course notebook a submission comes from: the same file name, else the one whose
    exercises (nbgrader grade_ids) it shares most; None if no source shares one."""
    same_name = Path(source_dir) / Path(path).name
    if same_name.is_file():
        return same_name
    mine, best, shared = _ids(notebook), None, 0
    for candidate in sorted(Path(source_dir).glob("*.ipynb")):
        try:
            common = len(mine & _ids(nbformat.read(candidate, as_version=4)))
        except Exception:  # noqa: BLE001 - an unreadable file in the folder is not a source
            continue
        if common > shared:
            best, shared = candidate, common
    return best


def restore_checks(notebook, source) -> list[str]:
    """Replace each check cell of ``notebook`` by the learners' version of the source's cell
    with the same grade_id; return the grade_ids the submission no longer has."""
    released = {_meta(c)["grade_id"]: release_cell(c, "source", set())
                for c in source.cells if _meta(c).get("grade")}
    seen = set()
    for i, cell in enumerate(notebook.cells):
        grade_id = _meta(cell).get("grade_id")
        if grade_id in released:
            notebook.cells[i] = released[grade_id]
            seen.add(grade_id)
    return sorted(set(released) - seen)


def hidden_tests(cell) -> str:
    """The code between a check cell's hidden-test markers ("" if it has none)."""
    lines = cell.source.split("\n")
    return "\n".join(line for start, stop in _regions(lines, BEGIN_HIDDEN, END_HIDDEN, "cell")
                     for line in lines[start + 1:stop])


def _parameters_cell(parameters: dict) -> str:
    return "# parameters injected by the grader\n" + "\n".join(
        f"{name} = {value!r}" for name, value in parameters.items())


def checker_cells(source, submission, parameters: dict | None = None) -> list[dict]:
    """The cells the grader's checker runs (``checker.py``): the source's code cells as the
    learners received them (solutions and hidden tests removed), with ``parameters`` after the
    cell tagged ``parameters``, and for each answer cell the submission's cell of the same
    grade_id (the learners' stub if it has none), to be run on the ranks only.

    Each: {kind: "code" | "answer", source, grade_id and hidden (check cells: its hidden
    tests, which the grader hands the checker apart, never in the job's files), names (answer
    cells: what the source's cell defines, the only names bound in the checker), position
    (its index in the source)}."""
    from labkit.classroom.answers import defined_names

    mine = {_meta(c)["grade_id"]: c.source for c in submission.cells
            if c.cell_type == "code" and _meta(c).get("grade_id")}
    cells = []
    for position, cell in enumerate(source.cells):
        if cell.cell_type != "code":
            continue
        meta, released = _meta(cell), release_cell(cell, f"cell {position}", set())
        if meta.get("solution"):
            answer = mine.get(meta.get("grade_id"), released.source)
            cells.append({"kind": "answer", "source": answer, "position": position,
                          "names": defined_names(cell.source)})
            continue
        graded = bool(meta.get("grade"))
        cells.append({"kind": "code", "source": released.source, "position": position,
                      "grade_id": meta.get("grade_id") if graded else None,
                      **({"hidden": hidden_tests(cell)} if graded else {})})
        if parameters and "parameters" in cell.get("metadata", {}).get("tags", []):
            cells.append({"kind": "code", "source": _parameters_cell(parameters),
                          "position": position, "grade_id": None})
    return cells
