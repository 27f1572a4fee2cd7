"""Execute every notebook at smoke size under papermill and check the values it recorded.

The notebooks run are the course's sources (``course/``), with the reference solutions of the
exercises filled in: every exercise's check must pass (the hidden tests assert it, and the
verdicts are read back here as ``python -m labkit grade`` reads them). The learners'
versions in ``notebooks/`` are run in a real browser by ``test_browser.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from labkit.classroom.grade import exercise_results
from tests.notebook_checks import NOTEBOOKS
from tests.prose_numbers import unprinted_numbers

REPO = Path(__file__).resolve().parent.parent
ALL = sorted((REPO / "course").glob("*.ipynb"))
CELL_TIMEOUT_S = 240


def _failure_report(notebook: Path, executed: Path, error) -> str:
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    tail = "\n".join(ansi.sub("", line) for line in error.traceback[-12:])
    return (f"{notebook.name} failed in cell {error.exec_count}: {error.ename}: {error.evalue}\n"
            f"--- cell source ---\n{error.source}\n--- traceback (end) ---\n{tail}\n"
            f"executed notebook kept at {executed}")


def test_every_notebook_is_covered():
    assert ALL, "no notebooks found"
    missing = [nb.stem for nb in ALL if nb.stem not in NOTEBOOKS]
    assert not missing, f"add smoke parameters and checks to tests/notebook_checks.py: {missing}"


@pytest.mark.parametrize("notebook", ALL, ids=lambda p: p.stem)
def test_notebook_runs_and_records_results(notebook: Path, tmp_path: Path):
    import papermill

    if notebook.stem not in NOTEBOOKS:
        pytest.fail(f"{notebook.name} has no entry in tests/notebook_checks.py")
    parameters, check = NOTEBOOKS[notebook.stem]
    results_path = tmp_path / "results.json"
    executed = tmp_path / notebook.name
    failure = None
    try:
        papermill.execute_notebook(
            str(notebook), str(executed), kernel_name="python3", cwd=str(notebook.parent),
            parameters={**parameters, "results_path": str(results_path)},
            execution_timeout=CELL_TIMEOUT_S, progress_bar=False)
    except papermill.PapermillExecutionError as error:
        failure = _failure_report(notebook, executed, error)
    if failure:
        pytest.fail(failure)
    assert results_path.exists(), f"{notebook.name} recorded no results"
    check(json.loads(results_path.read_text()))
    exercises = exercise_results(nbformat.read(executed, as_version=4))
    assert exercises, f"{notebook.name} has no exercise"
    assert all(e["status"] == "passed" for e in exercises), exercises
    unprinted = unprinted_numbers(json.loads(executed.read_text()), notebook.stem)
    assert not unprinted, ("numbers in the prose that no cell printed (print them from a cell, "
                           "or say them without a number):\n" + "\n".join(unprinted))
