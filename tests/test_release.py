"""The learners' notebooks are built from the course's sources, are up to date, and carry no
solution; the sources follow nbgrader's conventions."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labkit.__main__ import main
from labkit.classroom.release import (
    BEGIN_SOLUTION,
    END_SOLUTION,
    MARKERS,
    ReleaseError,
    exercise_cells,
    release,
    release_notebook,
)

REPO = Path(__file__).resolve().parent.parent
COURSE = sorted((REPO / "course").glob("*.ipynb"))


def test_learners_notebooks_are_up_to_date(tmp_path):
    changed, stale = release(REPO / "course", REPO / "notebooks", check=True)
    assert not stale, f"notebooks without a source in course/: {stale}"
    assert not changed, f"out of date, run `python -m labkit release`: {changed}"
    assert main(["release", "--course", str(REPO / "course"), "--out",
                 str(REPO / "notebooks"), "--check"]) == 0


def _solution_lines(cell) -> list[str]:
    lines, inside = [], False
    for line in cell.source.split("\n"):
        if BEGIN_SOLUTION in line:
            inside = True
        elif END_SOLUTION in line:
            inside = False
        elif inside and len(line.strip()) > 12:  # shorter lines ("return None") are generic
            lines.append(line.strip())
    return lines


@pytest.mark.parametrize("source", COURSE, ids=lambda p: p.stem)
def test_no_solution_reaches_the_learners(source):
    course = nbformat.read(source, as_version=4)
    student_text = (REPO / "notebooks" / source.name).read_text()
    for marker in MARKERS:
        assert marker not in student_text, f"{source.name}: {marker!r} in the learners' copy"
    answers = [c for c in course.cells if c.get("metadata", {}).get("nbgrader", {})
               .get("solution")]
    assert answers, f"{source.name} has no exercise"
    student = nbformat.read(REPO / "notebooks" / source.name, as_version=4)
    student_code = "\n".join(c.source for c in student.cells if c.cell_type == "code")
    for cell in answers:
        for line in _solution_lines(cell):
            assert line not in student_code, f"{source.name}: solution line kept: {line}"
    stubs = [c for c in student.cells if "raise NotImplementedError()" in c.source]
    assert len(stubs) == len(answers)


@pytest.mark.parametrize("source", COURSE, ids=lambda p: p.stem)
def test_sources_follow_nbgrader_conventions(source):
    course = nbformat.read(source, as_version=4)
    cells = exercise_cells(course)
    checks = [c for c in cells if c["kind"] == "check"]
    assert checks and all(c["points"] > 0 for c in checks)
    for cell in checks:  # each check's cell asserts the verdict in a hidden-test region
        text = course.cells[cell["index"]].source
        assert "### BEGIN HIDDEN TESTS" in text and ".assert_passed()" in text
    for cell in course.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta:
            assert meta["schema_version"] == 3 and "grade_id" in meta
            assert meta.get("locked") == bool(meta.get("grade"))


def _notebook(*sources, metadata=None):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    for cell in nb.cells:
        cell.metadata.update(metadata or {})
    return nb


def test_release_replaces_solutions_with_nbgrader_stub_keeping_indentation():
    answer = {"nbgrader": {"solution": True, "grade": False, "grade_id": "a", "locked": False,
                           "schema_version": 3}}
    nb = _notebook("def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
                   metadata=answer)
    out = release_notebook(nb)
    assert out.cells[0].source == ("def f(x):\n    # YOUR CODE HERE\n"
                                   "    raise NotImplementedError()")
    assert "return 2 * x" in nb.cells[0].source  # the source is untouched


def test_release_refuses_what_nbgrader_would():
    with pytest.raises(ReleaseError, match="not marked as an nbgrader answer cell"):
        release_notebook(_notebook("### BEGIN SOLUTION\nx = 1\n### END SOLUTION"))
    with pytest.raises(ReleaseError, match="without"):
        release_notebook(_notebook("### BEGIN SOLUTION\nx = 1"))
    grade = {"nbgrader": {"grade": True, "grade_id": "g", "locked": True, "solution": False}}
    with pytest.raises(ReleaseError, match="needs points"):
        release_notebook(_notebook("assert True", metadata=grade))
    with pytest.raises(ReleaseError, match="used twice"):
        release_notebook(_notebook("x = 1", "y = 2", metadata={
            "nbgrader": {**grade["nbgrader"], "points": 1}}))


def test_release_reports_a_notebook_without_a_source(tmp_path):
    course, out = tmp_path / "course", tmp_path / "out"
    course.mkdir()
    out.mkdir()
    nbformat.write(_notebook("x = 1"), course / "a.ipynb")
    (out / "b.ipynb").write_text(json.dumps({}))
    changed, stale = release(course, out)
    assert changed == [out / "a.ipynb"] and stale == [out / "b.ipynb"]
    assert release(course, out, check=True) == ([], [out / "b.ipynb"])
