"""Self-paced learners: a failed check gives the exercise's hint and says how to see the
reference solution; ``labkit.check.reveal`` shows it, unless the notebook is being graded or
the notebooks were released without solutions."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import torch.distributed as dist

import labkit
from labkit.classroom.release import exercise_cells, release, solution_cells
from labkit.lessons.exercise.hints import HINTS
from labkit.lessons.exercise.result import failed, not_attempted, passed
from labkit.lessons.exercise.solutions import GRADING_ENV, reveal, solutions

REPO = Path(__file__).resolve().parent.parent
COURSE = sorted((REPO / "course").glob("*.ipynb"))


def _course_exercises() -> set[str]:
    return {cell["grade_id"].removesuffix("_answer")
            for path in COURSE for cell in exercise_cells(nbformat.read(path, as_version=4))
            if cell["kind"] == "answer"}


def test_every_exercise_has_a_hint_and_a_released_solution():
    exercises = _course_exercises()
    assert exercises == set(HINTS), "one hint per exercise (labkit/lessons/exercise/hints.py)"
    assert set(solutions()) == exercises


def test_a_failed_check_gives_the_hint_and_the_way_to_the_solution():
    result = failed("ring_all_reduce", "rank 1 holds the wrong sum")
    text, page = str(result), result._repr_html_()
    for shown in (text, page):
        assert HINTS["ring_all_reduce"][:40] in shown
        assert 'labkit.check.reveal("ring_all_reduce")' in shown.replace("&quot;", '"')
    for result in (passed("ring_all_reduce", "right"), not_attempted("ring_all_reduce", "f")):
        assert "Hint" not in str(result) and "reveal" not in str(result)


def test_the_revealed_solution_is_the_course_answer_cell():
    source = nbformat.read(REPO / "course" / "00_your_cluster.ipynb", as_version=4)
    shown = reveal("ring_all_reduce")
    assert shown.code == solution_cells(source)["ring_all_reduce"]
    assert "BEGIN SOLUTION" not in shown.code and "def ring_all_reduce" in shown.code
    assert "def ring_all_reduce" in shown._repr_html_()


def test_the_revealed_solution_passes_its_check(two):
    namespace = {"torch": __import__("torch"), "dist": dist}
    exec(reveal("average_gradients").code, namespace)  # the course's own code
    assert labkit.check.average_gradients(two, namespace["average_gradients"]).passed


def test_reveal_is_off_while_grading(monkeypatch):
    monkeypatch.setenv(GRADING_ENV, "1")
    shown = reveal("ring_all_reduce")
    assert not shown.code and "graded" in str(shown)


def test_an_unknown_exercise_lists_the_real_ones():
    shown = reveal("ring_allreduce")
    assert not shown.code and "ring_all_reduce" in str(shown)


def test_a_release_without_solutions_reveals_nothing(tmp_path, monkeypatch):
    release(REPO / "course", tmp_path)
    written = sorted(p.name for p in (tmp_path / "solutions").glob("*.json"))
    assert written == [p.stem + ".json" for p in COURSE]
    assert json.loads((tmp_path / "solutions" / "00_your_cluster.json").read_text())
    changed, _ = release(REPO / "course", tmp_path, solutions=False)
    assert not list((tmp_path / "solutions").glob("*.json"))
    assert len(changed) == len(COURSE) + 1  # each solutions file, and NONE.txt written
    assert release(REPO / "course", tmp_path, check=True, solutions=False)[0] == []
    assert release(REPO / "course", tmp_path, check=True)[0]  # solutions missing: out of date
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("labkit.lessons.exercise.solutions.solutions_folder",
                        lambda: tmp_path / "none")
    shown = reveal("ring_all_reduce")
    assert not shown.code and "without solutions" in str(shown)
