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


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_course_answers_earn_every_point(name, tmp_path):
    folder = tmp_path / "submissions"
    _handed_in(name, folder / f"alice_{name[:2]}.ipynb")  # matched by its exercises
    [result] = grade([folder], tmp_path / "grades.csv", source_dir=REPO / "course",
                     parameters=dict(SMOKE[name], interactive=False), cell_timeout=120,
                     timeout=400, echo=lambda line: None)
    row = result.row()
    assert result.status == "graded" and result.course == name, row
    assert row["max_points"] > 0 and row["points"] == row["max_points"], row
    assert all(e["status"] == "passed" for e in result.exercises), row
    assert not descendants()
