"""Submissions of notebook 00 for the grader's tests: the learners' copy with its answer cell
replaced, graded at smoke size against the course's sources."""

from __future__ import annotations

import csv
from pathlib import Path

import nbformat

from labkit.__main__ import main
from labkit.lessons.show.quizzes import RECORD_MIME
from tests.exercises import answer_source

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = "00_your_cluster"
ANSWER_ID, CHECK_ID = "ring_all_reduce_answer", "ring_all_reduce_check"
SMOKE = '{"world_size": 2, "device": "cpu", "all_reduce_mib": [0.25], "interactive": false}'
WRONG = "def ring_all_reduce(ctx, tensor):\n    return tensor  # forgot to add anything\n"


def reference() -> str:
    return answer_source(NOTEBOOK, ANSWER_ID)


def _cell(notebook, grade_id: str):
    return next(c for c in notebook.cells
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id)


def submission(path: Path, answer: str, quiz: dict | None = None, outputs=None) -> Path:
    """The learners' notebook 00 at ``path``, its answer cell ``answer``; ``quiz``: the record
    the quiz widget would have saved; ``outputs``: saved outputs of the check cell."""
    notebook = nbformat.read(REPO / "notebooks" / f"{NOTEBOOK}.ipynb", as_version=4)
    _cell(notebook, ANSWER_ID).source = answer
    if outputs:
        _cell(notebook, CHECK_ID).outputs = outputs
    if quiz is not None:
        quiz_cell = next(c for c in notebook.cells if "show_quiz" in c.source)
        quiz_cell.outputs = [nbformat.v4.new_output(
            "display_data", data={"text/plain": "quiz", RECORD_MIME: quiz})]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


def grade_folder(folder: Path, out: Path, *options: str) -> dict[str, dict]:
    """``python -m labkit grade folder`` against the course's sources; rows by notebook."""
    assert main(["grade", str(folder), "--out", str(out), "--source", str(REPO / "course"),
                 "--parameters", SMOKE, "--cell-timeout", "90", "--timeout", "240",
                 "--jobs", "2", *options]) == 0
    return {row["notebook"]: row for row in csv.DictReader(open(out))}
