"""The course's own answers, graded as a learner would hand them in: every lesson's learners'
copy with the reference solutions in its answer cells, graded by ``labkit grade`` in the
sandbox at the tests' smoke sizes, earns every point of every exercise."""

from __future__ import annotations

import nbformat
import pytest

from labkit.classroom import sandbox
from labkit.classroom.grade import grade
from tests.conftest import descendants
from tests.grading import REPO
from tests.lessons import SMOKE

pytestmark = pytest.mark.skipif(sandbox.problem() is not None,
                                reason=f"no sandbox here: {sandbox.problem()}")


def _handed_in(name: str, path) -> None:
    """The learners' copy of ``name``, each answer cell holding the course's solution."""
    course = nbformat.read(REPO / "course" / f"{name}.ipynb", as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in course.cells
               if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    learner = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
    filled = 0
    for cell in learner.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source, filled = answers[grade_id], filled + 1
    assert filled == len(answers) > 0, f"{name}: {filled} of {len(answers)} answer cells"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(learner, path)


def _graded(name: str, folder) -> dict:
    _handed_in(name, folder / "submissions" / f"alice_{name[:2]}.ipynb")  # matched by grade_ids
    [result] = grade([folder / "submissions"], folder / "grades.csv",
                     source_dir=REPO / "course", parameters=dict(SMOKE[name], interactive=False),
                     cell_timeout=120, timeout=400, echo=lambda line: None)
    return {"course": result.course, "status": result.status, "row": result.row(),
            "passed": [e["status"] == "passed" for e in result.exercises]}


def test_the_course_answers_earn_every_point(tmp_path):
    # two lessons graded at once, as `labkit grade --jobs 2` grades a class
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        graded = dict(zip(sorted(SMOKE), pool.map(
            lambda name: _graded(name, tmp_path / name), sorted(SMOKE)), strict=True))
    short = {name: f"{g['status']} {g['row']['points']}/{g['row']['max_points']}: "
                   f"{g['row']['detail'][:300]}" for name, g in graded.items()
             if not (g["status"] == "graded" and g["course"] == name and all(g["passed"])
                     and 0 < g["row"]["points"] == g["row"]["max_points"])}
    assert not short, short
    assert sum(g["row"]["points"] for g in graded.values()) == 38  # docs/instructor.md's table
    assert not descendants()
