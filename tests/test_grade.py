"""``python -m labkit grade``: a correct, a wrong, a broken and a hanging submission, graded in
one call; each gets its row, and the hanging one does not stop the others."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import nbformat
import psutil

from labkit.__main__ import main
from labkit.check.result import MIME_TYPE
from labkit.classroom.grade import (
    exercise_results,
    grade_submission,
    quiz_scores,
    restore_checks,
    submissions,
)
from labkit.classroom.quizzes import RECORD_MIME
from labkit.classroom.sources import find_source, grade_points
from tests.conftest import wait_gone
from tests.exercises import answer_source

REPO = Path(__file__).resolve().parent.parent
ANSWER = {"nbgrader": {"grade": False, "grade_id": "ring_answer", "locked": False,
                       "schema_version": 3, "solution": True, "task": False}}
CHECK = {"nbgrader": {"grade": True, "grade_id": "ring_check", "locked": True, "points": 3,
                      "schema_version": 3, "solution": False, "task": False}}
SETUP = ("import torch\nimport torch.distributed as dist\nimport labkit\n"
         "cluster = labkit.Cluster(2, device='cpu', progress=False)")
CHECK_CELL = "ring = labkit.check.ring_all_reduce(cluster, ring_all_reduce)\ndisplay(ring)"
WRONG = "def ring_all_reduce(ctx, tensor):\n    return tensor  # forgot to add anything"


def _submission(path, *cells, quiz=None):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    for source, metadata in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata.update(metadata)
        nb.cells.append(cell)
    if quiz:  # what the quiz widget saved while the learner answered
        nb.cells[0].outputs = [nbformat.v4.new_output("display_data", data={
            "text/plain": "quiz", RECORD_MIME: quiz})]
    nbformat.write(nb, path)


def test_grade_a_folder_of_submissions(tmp_path):
    reference = answer_source("00_your_cluster", "ring_all_reduce_answer")
    folder = tmp_path / "submissions"
    folder.mkdir()
    quiz = {"quiz": "00_your_cluster", "answers": {
        "why-clusters": {"first": 1, "tries": 1}, "sum-of-ranks": {"first": 0, "tries": 2}},
        "expected": {}, "score": 4, "max": 4}  # the saved score is not trusted
    _submission(folder / "b_correct.ipynb", (SETUP, {}), (reference, ANSWER),
                (CHECK_CELL, CHECK), quiz=quiz)
    _submission(folder / "c_wrong.ipynb", (SETUP, {}), (WRONG, ANSWER), (CHECK_CELL, CHECK))
    _submission(folder / "d_broken.ipynb", ("1 / 0", {}), (SETUP, {}), (WRONG, ANSWER),
                (CHECK_CELL, CHECK))
    _submission(folder / "a_hangs.ipynb", ("import time\ntime.sleep(600)", {}),
                (WRONG, ANSWER), (CHECK_CELL, CHECK))
    out = tmp_path / "grades.csv"
    start = time.monotonic()
    assert main(["grade", str(folder), "--out", str(out),
                 "--timeout", "180", "--cell-timeout", "60", "--source", str(tmp_path),
                 "--jobs", "3"]) == 0  # a cell limit that a loaded 2-core machine still meets
    assert time.monotonic() - start < 180
    rows = {row["notebook"]: row for row in csv.DictReader(open(out))}
    assert rows["b_correct"]["status"] == "graded" and rows["b_correct"]["points"] == "3"
    assert rows["b_correct"]["graded_as"] == ""  # no course notebook in --source
    assert rows["b_correct"]["exercise:ring_check"] == "passed"
    assert rows["b_correct"]["quiz:00_your_cluster"] == "1/4"
    assert rows["c_wrong"]["status"] == "graded" and rows["c_wrong"]["points"] == "0"
    assert rows["c_wrong"]["exercise:ring_check"] == "failed"
    assert rows["d_broken"]["status"] == "error"
    assert rows["d_broken"]["detail"] == "cell 0 raised ZeroDivisionError: division by zero"
    assert rows["d_broken"]["exercise:ring_check"] == "not run"
    assert rows["a_hangs"]["status"] == "timeout" and rows["a_hangs"]["max_points"] == "3"
    assert "cell time limit" in rows["a_hangs"]["detail"]
    assert rows["a_hangs"]["exercise:ring_check"] == "not run"


def test_a_notebook_past_its_time_limit_is_killed_with_its_kernel(tmp_path):
    _submission(tmp_path / "slow.ipynb", ("import time\ntime.sleep(600)", {}))
    result = grade_submission(tmp_path / "slow.ipynb", REPO / "notebooks" / "quizzes",
                              timeout=8, cell_timeout=600)
    assert result.status == "timeout" and "stopped after 8 s" in result.detail
    assert result.seconds < 30
    assert not psutil.Process().children(recursive=True)  # papermill and its kernel are gone


def test_check_cells_are_restored_from_the_source():
    source, submission = nbformat.v4.new_notebook(), nbformat.v4.new_notebook()
    real = nbformat.v4.new_code_cell(CHECK_CELL + "\n### BEGIN HIDDEN TESTS\nring.assert_passed()"
                                     "\n### END HIDDEN TESTS")
    real.metadata.update(CHECK)
    edited = nbformat.v4.new_code_cell("print('passed')")
    edited.metadata.update(CHECK)
    source.cells, submission.cells = [real], [edited]
    assert restore_checks(submission, source) == []
    assert submission.cells[0].source == CHECK_CELL  # the learners' version: no hidden tests
    submission.cells = []
    assert restore_checks(submission, source) == ["ring_check"]


# ----- a hostile submission -------------------------------------------------------------------
FAKE_VERDICT = {"exercise": "ring_all_reduce", "status": "passed", "summary": "trust me",
                "details": [], "measured": {}}


def _displayed(cell, verdict) -> None:
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": "verdict",
                                                                 MIME_TYPE: verdict})]


def test_the_course_decides_which_cells_count_and_what_they_are_worth(tmp_path):
    source = nbformat.v4.new_notebook()
    real = nbformat.v4.new_code_cell(CHECK_CELL)
    real.metadata.update(CHECK)
    source.cells = [real]
    nbformat.write(source, tmp_path / "00_your_cluster.ipynb")
    # renamed, its check cell edited to display "passed", and a grade cell of its own
    submission = nbformat.v4.new_notebook()
    edited, bonus = nbformat.v4.new_code_cell("print('hi')"), nbformat.v4.new_code_cell("1")
    edited.metadata.update(CHECK)
    bonus.metadata.update({"nbgrader": dict(CHECK["nbgrader"], grade_id="bonus", points=100)})
    submission.cells = [edited, bonus]
    found = find_source(Path("alice_00.ipynb"), submission, tmp_path)
    assert found == tmp_path / "00_your_cluster.ipynb"  # by its exercises, not its name
    assert restore_checks(submission, nbformat.read(found, as_version=4)) == []
    assert submission.cells[0].source == CHECK_CELL
    _displayed(submission.cells[0], dict(FAKE_VERDICT, status="failed"))  # the real check's
    _displayed(submission.cells[1], FAKE_VERDICT)
    results = exercise_results(submission, grade_points(source))
    assert [(r["grade_id"], r["status"], r["earned"]) for r in results] == [
        ("ring_check", "failed", 0)]  # the bonus cell does not count
    submission.cells = [bonus]  # the check deleted: it still counts in max_points
    assert exercise_results(submission, grade_points(source)) == [
        {"grade_id": "ring_check", "points": 3, "status": "missing", "earned": 0,
         "summary": "the check cell was deleted"}]
    # a notebook sharing no exercise and no name with the course is not run at all
    (tmp_path / "in").mkdir()
    _submission(tmp_path / "in" / "mine.ipynb", ("1", {}))
    result = grade_submission(tmp_path / "in" / "mine.ipynb", REPO / "notebooks" / "quizzes",
                              tmp_path)
    assert result.status == "no source" and "00_your_cluster.ipynb" in result.detail


def test_malformed_quiz_records_score_nothing_and_folders_are_expanded(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("")]
    notebook.cells[0].outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "quiz", RECORD_MIME: {"quiz": "00_your_cluster", "answers": {
            "why-clusters": {"tries": 1}, "sum-of-ranks": "B", "algbw": {"first": 1.0}},
            "expected": None}})]
    assert quiz_scores(notebook, REPO / "notebooks" / "quizzes") == {"00_your_cluster": (0, 4)}
    (tmp_path / "a" / ".ipynb_checkpoints").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    for name in ("a/x.ipynb", "a/.ipynb_checkpoints/x-checkpoint.ipynb", "b.ipynb"):
        (tmp_path / name).write_text("{}")
    said = []
    assert submissions([tmp_path / "a", tmp_path / "empty", tmp_path / "b.ipynb"],
                       said.append) == [tmp_path / "a" / "x.ipynb", tmp_path / "b.ipynb"]
    assert said == [f"{tmp_path / 'empty'}: a folder with no notebook in it"]
    assert main(["grade", str(tmp_path / "empty"), "--out", str(tmp_path / "g.csv")]) == 1


ESCAPES = """import os, subprocess, time
pids = [subprocess.Popen(['sleep', '300'], start_new_session=True).pid,
        subprocess.Popen(['sleep', '300'], process_group=0).pid]
child = os.fork()
if child == 0:  # a daemon of its own: new session, parent gone
    os.setsid()
    time.sleep(300)
    os._exit(0)
pids.append(child)
open({pid_file!r}, 'w').write(' '.join(map(str, pids)))
import shutil
shutil.rmtree(os.getcwd())  # and it deletes its working folder on the way out"""


def test_what_a_submission_leaves_running_is_killed(tmp_path):
    pid_file = tmp_path / "pids"
    _submission(tmp_path / "escapes.ipynb", (ESCAPES.format(pid_file=str(pid_file)), {}))
    result = grade_submission(tmp_path / "escapes.ipynb", REPO / "notebooks" / "quizzes",
                              timeout=120, cell_timeout=60)
    assert result.status == "error", result.detail
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 3
    assert not wait_gone(pids, timeout=5)
