"""Private course sources: ``release --source DIR`` and ``grade --source DIR`` with DIR outside
the repository; the source decides what runs and what counts; rows for correct, wrong,
broken, hanging and unmatched submissions; time limits."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from labkit.__main__ import main
from labkit.classroom import sandbox
from labkit.classroom.grade import grade_submission, quiz_scores, submissions
from labkit.classroom.sources import checker_cells
from labkit.lessons.all_reduce.check import CHUNK_ELEMENTS
from labkit.lessons.show.quizzes import RECORD_MIME
from tests.exercises import answer_source

REPO = Path(__file__).resolve().parent.parent
QUIZZES = REPO / "notebooks" / "quizzes"
ANSWER = {"nbgrader": {"grade": False, "grade_id": "ring_answer", "locked": False,
                       "schema_version": 3, "solution": True, "task": False}}
CHECK = {"nbgrader": {"grade": True, "grade_id": "ring_check", "locked": True, "points": 3,
                      "schema_version": 3, "solution": False, "task": False}}
PARAMETERS = "check_timeout = 30"
SETUP = ("import torch\nimport torch.distributed as dist\nimport labkit\n"
         "cluster = labkit.Cluster(2, device='cpu', progress=False)")
HIDDEN = ("ring.assert_passed()\n"  # and one more case, with its own inputs and reference
          "sums = cluster.run(lambda ctx: ring_all_reduce(ctx, torch.ones(6) * (ctx.rank + 1)))\n"
          "assert all(s.tolist() == [3.0] * 6 for s in sums)")
CHECK_CELL = ("ring = labkit.check.ring_all_reduce(cluster, ring_all_reduce, "
              "timeout=check_timeout)\ndisplay(ring)\n"
              f"### BEGIN HIDDEN TESTS\n{HIDDEN}\n### END HIDDEN TESTS")
WRONG = "def ring_all_reduce(ctx, tensor):\n    return tensor"
BROKEN = "1 / 0\n" + WRONG
HANGS = "import time\ndef ring_all_reduce(ctx, tensor):\n    time.sleep(600)"
REFERENCE = answer_source("00_your_cluster", "ring_all_reduce_answer")
CHECK_SIZE_ONLY = REFERENCE.replace(  # right at the visible check's size only
    "    n, rank = ctx.world_size, ctx.rank",
    f"    if tensor.numel() != ctx.world_size * {CHUNK_ELEMENTS}:\n        return tensor\n"
    "    n, rank = ctx.world_size, ctx.rank")


def _notebook(*cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells.append(nbformat.v4.new_markdown_cell("# A ring, by hand"))
    for source, metadata in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata.update(metadata)
        nb.cells.append(cell)
    return nb


def _course(folder: Path) -> Path:
    folder.mkdir(parents=True)
    source = _notebook((PARAMETERS, {"tags": ["parameters"]}), (SETUP, {}), (REFERENCE, ANSWER),
                       (CHECK_CELL, CHECK))
    nbformat.write(source, folder / "ring.ipynb")
    return folder


def _learner(public: Path, path: Path, answer: str) -> None:
    notebook = nbformat.read(public / "ring.ipynb", as_version=4)
    for cell in notebook.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "ring_answer":
            cell.source = answer
    nbformat.write(notebook, path)


NEEDS_SANDBOX = pytest.mark.skipif(sandbox.problem() is not None,
                                   reason=f"no sandbox here: {sandbox.problem()}")


@NEEDS_SANDBOX
def test_private_sources_are_released_and_graded_from_outside_the_repository(tmp_path):
    private, public, folder = _course(tmp_path / "private"), tmp_path / "public", tmp_path / "in"
    assert not private.resolve().is_relative_to(REPO)
    public.mkdir()
    folder.mkdir()
    assert main(["release", "--source", str(private), "--out", str(public)]) == 0
    released = (public / "ring.ipynb").read_text()
    assert "raise NotImplementedError()" in released and "BEGIN SOLUTION" not in released
    assert "isend" not in released and "assert_passed" not in released
    _learner(public, folder / "alice.ipynb", REFERENCE)  # renamed: matched by its exercise
    _learner(public, folder / "bob.ipynb", WRONG)
    _learner(public, folder / "carol.ipynb", BROKEN)
    _learner(public, folder / "dave.ipynb", HANGS)
    _learner(public, folder / "frank.ipynb", CHECK_SIZE_ONLY)
    nbformat.write(_notebook(("1", {})), folder / "eve.ipynb")
    out = tmp_path / "grades.csv"
    assert main(["grade", str(folder), "--source", str(private), "--out", str(out),
                 "--parameters", '{"check_timeout": 3}', "--jobs", "2",
                 "--cell-timeout", "90", "--timeout", "180"]) == 0
    rows = {row["notebook"]: row for row in csv.DictReader(open(out))}
    assert rows["alice"]["points"] == "3" and rows["alice"]["graded_as"] == "ring", rows["alice"]
    assert rows["alice"]["exercise:ring_check"] == "passed"
    for name in ("bob", "carol", "dave"):
        assert rows[name]["status"] == "graded" and rows[name]["points"] == "0", rows[name]
        assert rows[name]["exercise:ring_check"] == "failed", rows[name]
    assert "nothing was added" in rows["bob"]["detail"]
    assert "ZeroDivisionError" in rows["carol"]["detail"]
    assert "did not finish within 3 s" in rows["dave"]["detail"]
    assert rows["frank"]["points"] == "0", rows["frank"]  # the hidden test catches it
    assert "a hidden test of this check failed (AssertionError)" in rows["frank"]["detail"]
    assert rows["eve"]["status"] == "no source" and rows["eve"]["max_points"] == "0"


@NEEDS_SANDBOX
def test_a_run_past_its_time_limits_is_stopped_with_everything_it_started(tmp_path):
    slow = _notebook(("import time\ntime.sleep(600)", {}), ("1", CHECK))
    (tmp_path / "course").mkdir()
    nbformat.write(slow, tmp_path / "course" / "slow.ipynb")  # its own source
    nbformat.write(slow, tmp_path / "slow.ipynb")
    start = time.monotonic()
    result = grade_submission(tmp_path / "slow.ipynb", QUIZZES, tmp_path / "course", timeout=8,
                              cell_timeout=600)
    assert result.status == "timeout" and "stopped after 8 s" in result.detail, result.detail
    assert time.monotonic() - start < 30
    assert result.row()["exercise:ring_check"] == "not run"
    result = grade_submission(tmp_path / "slow.ipynb", QUIZZES, tmp_path / "course",
                              timeout=60, cell_timeout=2)
    assert result.status == "timeout" and "cell 1 raised CellTimeout" in result.detail
    assert not psutil.Process().children(recursive=True)


def test_the_source_decides_which_cells_run_and_count():
    source = _notebook((SETUP, {}), ("def ring_all_reduce(ctx, t):\n    ### BEGIN SOLUTION\n"
                                     "    return t\n    ### END SOLUTION", ANSWER),
                       (CHECK_CELL, CHECK))
    bonus = {"nbgrader": dict(CHECK["nbgrader"], grade_id="bonus", points=100)}
    mine = _notebook(("import os  # a cell of the learner's own", {}), (WRONG, ANSWER),
                     ("print('passed')", CHECK), ("1", bonus))
    cells = checker_cells(source, mine, {"world_size": 2})
    assert [c["kind"] for c in cells] == ["code", "answer", "code"]
    assert cells[1]["source"] == WRONG and cells[1]["names"] == ["ring_all_reduce"]
    assert cells[2]["source"].startswith("ring = labkit.check") and cells[2]["grade_id"]
    assert "assert_passed" not in cells[2]["source"]  # hidden tests stay hidden,
    assert cells[2]["hidden"] == HIDDEN  # handed to the checker apart from the job's files
    mine.cells = mine.cells[:1]  # no answer cell: the learners' stub is checked
    assert "raise NotImplementedError()" in checker_cells(source, mine)[1]["source"]


def test_malformed_quiz_records_score_nothing_and_folders_are_expanded(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("")]
    notebook.cells[0].outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "quiz", RECORD_MIME: {"quiz": "00_your_cluster", "answers": {
            "why-clusters": {"tries": 1}, "sum-of-ranks": "B", "algbw": {"first": 1.0}},
            "expected": {"algbw": 1.0}}})]
    scores, notes = quiz_scores(notebook, QUIZZES, {})
    assert scores == {"00_your_cluster": (0, 4)}
    assert any("2 saved answer(s) do not parse" in n for n in notes)
    assert any("did not reach the quiz" in n for n in notes)
    assert quiz_scores(notebook, QUIZZES, {"00_your_cluster": {"algbw": 1.05}})[0] == {
        "00_your_cluster": (1, 4)}  # within the question's tolerance of the grader's value
    (tmp_path / "a" / ".ipynb_checkpoints").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    for name in ("a/x.ipynb", "a/.ipynb_checkpoints/x-checkpoint.ipynb", "b.ipynb"):
        (tmp_path / name).write_text("{}")
    said = []
    assert submissions([tmp_path / "a", tmp_path / "empty", tmp_path / "b.ipynb"],
                       said.append) == [tmp_path / "a" / "x.ipynb", tmp_path / "b.ipynb"]
    assert said == [f"{tmp_path / 'empty'}: a folder with no notebook in it"]
    assert main(["grade", str(tmp_path / "empty"), "--out", str(tmp_path / "g.csv")]) == 1


def _quiz_record(answers: dict):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("")]
    notebook.cells[0].outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "quiz", RECORD_MIME: {"quiz": "00_your_cluster", "answers": answers}})]
    return notebook


def test_quiz_answers_the_widget_could_not_have_saved_score_nothing():
    answers = {"why-clusters": {"first": True},  # JSON true: Python's 1, the right option
               "sum-of-ranks": {"first": [1]}, "everyone-must-join": {"first": 7},
               "algbw": {"first": float("nan")}}
    past_float = dict(answers, algbw={"first": 10**400})
    measured = {"00_your_cluster": {"algbw": 1.0}}
    scores, notes = quiz_scores(_quiz_record(answers), QUIZZES, measured)
    assert scores == {"00_your_cluster": (0, 4)}, scores
    assert "quiz 00_your_cluster: 4 saved answer(s) do not parse: scored 0" in notes, notes
    assert quiz_scores(_quiz_record(past_float), QUIZZES, measured)[0] == scores
    answers.update({"why-clusters": {"first": 1}, "algbw": {"first": 1}})
    assert quiz_scores(_quiz_record(answers), QUIZZES, measured)[0] == {
        "00_your_cluster": (2, 4)}


def test_a_source_behind_a_linked_folder_or_an_oversized_file_is_not_read(tmp_path,
                                                                         monkeypatch):
    from labkit.classroom import grade as grading

    private = tmp_path / "private-course"
    private.mkdir()
    source = private / "00_your_cluster.ipynb"
    source.write_bytes((REPO / "course" / "00_your_cluster.ipynb").read_bytes())
    (tmp_path / "subs").mkdir()
    # a learner's archive, unpacked, holds a link to the sources; a shell glob follows it
    (tmp_path / "subs" / "mallory").symlink_to(private)
    (tmp_path / "subs" / "eve").symlink_to(REPO / "course")
    for learner, sources in (("mallory", private), ("eve", None)):
        result = grade_submission(tmp_path / "subs" / learner / "00_your_cluster.ipynb",
                                  QUIZZES, sources)
        assert result.status == "unreadable" and "the course's sources" in result.detail, result
        assert result.row()["points"] == 0
    monkeypatch.setattr(grading, "MAX_NOTEBOOK_BYTES", 1000)
    big = tmp_path / "big.ipynb"
    big.write_bytes(source.read_bytes())
    result = grade_submission(big, QUIZZES, private)
    assert result.status == "unreadable" and "larger than" in result.detail, result


def test_job_folders_of_graders_no_longer_running_are_removed(tmp_path):
    from labkit.classroom.grade import JOB_PREFIX, remove_stale_jobs

    dead = psutil.Popen(["true"])
    dead.wait()
    for owner in (dead.pid, os.getpid()):
        (tmp_path / f"{JOB_PREFIX}{owner}-abc" / "quizzes").mkdir(parents=True)
    (tmp_path / f"{JOB_PREFIX}{dead.pid}-link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    assert remove_stale_jobs(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{JOB_PREFIX}{os.getpid()}-abc", f"{JOB_PREFIX}{dead.pid}-link", "elsewhere"])


def test_a_link_or_a_non_notebook_is_a_row_that_quotes_nothing_of_the_file(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$SECRETHASH:19000:0:99999:7:::\n")
    (tmp_path / "linked.ipynb").symlink_to(secret)  # a learner's repository may hold links
    (tmp_path / "garbage.ipynb").write_text("SECRETHASH, not json")
    for name in ("linked", "garbage"):
        result = grade_submission(tmp_path / f"{name}.ipynb", QUIZZES, REPO / "course")
        assert result.status == "unreadable", result
        assert "SECRETHASH" not in result.detail, result.detail
    assert "symbolic link" in grade_submission(tmp_path / "linked.ipynb", QUIZZES, None).detail


def test_a_file_name_like_a_formula_reaches_the_grades_file_as_text(tmp_path):
    from labkit.classroom.grade import grade

    (tmp_path / '=HYPERLINK("evil", "ok").ipynb').write_text("not json")
    grade([tmp_path], tmp_path / "grades.csv", source_dir=REPO / "course", echo=lambda _: None)
    row = next(csv.DictReader(open(tmp_path / "grades.csv")))
    assert row["notebook"] == "'=HYPERLINK(\"evil\", \"ok\")", row
