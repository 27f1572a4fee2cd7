"""Which course notebook a submission is, and its check cells as the course wrote them.

A learner may rename the file (``alice_00.ipynb``), edit a check cell to display a verdict
of its own, add a grade cell worth 100 points, or delete a check. So the grader takes from the
course's source, never from the submission: which cells are graded, their points, and their
code (nbgrader does the same with its locked cells and its database).
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from labkit.classroom.release import release_cell


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
