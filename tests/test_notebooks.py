"""Every lesson, executed at its classroom defaults (tests/lessons.py), as a learner meets it.

What holds for every notebook: it runs to the end and records its values; every exercise's
reference solution passes its check (read back as ``python -m labkit grade`` reads it); every
number in the prose was printed by a cell; every cell that makes a figure shows one; no
warning reaches the learner; the parameters cell holds the lesson's settings only. What each
notebook claims is asserted in ``tests/test_claims_<NN>.py``. The learners' versions in
``notebooks/`` are run in a real browser by ``test_browser.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labkit.classroom.grade import exercise_results
from tests.lessons import SMOKE, STEMS, lesson
from tests.prose_numbers import unprinted_numbers

# A call that draws: a labkit plot (one figure each), a labkit widget (an image or a widget
# each), pyplot. show_source prints code, not a figure.
_PLOT = re.compile(r"labkit\.plots\.\w+\(|\bplt\.subplots\(")
_WIDGET = re.compile(r"labkit\.widgets\.(?!show_source\b)\w+\(")
_PROGRESS = re.compile(r"\d+%\|")  # a tqdm bar's text: a progress bar, not a figure
_PLUMBING = ("results_path", "papermill", "tests", "smoke")


def _figures(cell) -> int:
    """Images and (non-progress-bar) widgets among a cell's outputs."""
    count = 0
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if "image/png" in data or "image/svg+xml" in data:
            count += 1
        elif "application/vnd.jupyter.widget-view+json" in data:
            text = "".join(data.get("text/plain", ""))
            count += not _PROGRESS.search(text)
    return count


def test_every_notebook_is_covered():
    assert STEMS, "no notebooks found"
    assert sorted(SMOKE) == STEMS, "add the browser test's parameters to tests/lessons.py"
    missing = [stem for stem in STEMS
               if not (Path(__file__).parent / f"test_claims_{stem[:2]}.py").exists()]
    assert not missing, f"each lesson's claims need tests/test_claims_<NN>.py: {missing}"


@pytest.mark.parametrize("stem", STEMS)
def test_lesson_runs_and_every_exercise_passes(stem):
    nb = lesson(stem)
    exercises = exercise_results(nb.notebook)
    assert exercises, f"{stem} has no exercise"
    assert all(e["status"] == "passed" for e in exercises), exercises


@pytest.mark.parametrize("stem", STEMS)
def test_every_number_in_the_prose_was_printed(stem):
    nb = lesson(stem)
    unprinted = unprinted_numbers(json.loads(nb.path.read_text()), stem)
    assert not unprinted, ("numbers in the prose that no cell printed (print them from a cell, "
                           "or say them without a number):\n" + "\n".join(unprinted))


@pytest.mark.parametrize("stem", STEMS)
def test_every_figure_is_shown(stem):
    """A cell that draws leaves an image (or a live widget) for each thing it draws: a Figure
    that is not the cell's last expression, or a tuple of figures, shows nothing."""
    nb = lesson(stem)
    missing = []
    for index, cell in enumerate(nb.notebook.cells):
        if cell.cell_type != "code":
            continue
        drawn = len(_PLOT.findall(cell.source)) + len(_WIDGET.findall(cell.source))
        if _figures(cell) < drawn:
            missing.append(f"cell {index}: draws {drawn}, shows {_figures(cell)}:\n"
                           f"{cell.source[:300]}")
    assert not missing, f"{stem}: figures that never appear:\n" + "\n\n".join(missing)


@pytest.mark.parametrize("stem", STEMS)
def test_no_warning_reaches_the_learner(stem):
    nb = lesson(stem)
    warned = [f"cell {i}: {''.join(o.get('text', ''))[:400]}"
              for i, cell in enumerate(nb.notebook.cells) if cell.cell_type == "code"
              for o in cell.get("outputs", [])
              if o.get("name") == "stderr" and "Warning" in "".join(o.get("text", ""))]
    assert not warned, f"{stem}: warnings in the learner's view:\n" + "\n".join(warned)


@pytest.mark.parametrize("stem", STEMS)
def test_the_parameters_cell_holds_the_lesson_only(stem):
    """Test-only settings live outside the learner's view: the results record is a collapsed
    cell at the end, and its path comes from the test's environment."""
    nb = lesson(stem)
    cells = [c for c in nb.notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{stem}: one cell tagged 'parameters'"
    found = [word for word in _PLUMBING if word in cells[0].source]
    assert not found, f"{stem}: the parameters cell mentions {found}"
    records = [c for c in nb.notebook.cells if "labkit.record_results(" in c.source]
    assert len(records) == 1, f"{stem}: one record_results cell"
    assert records[0].metadata.get("jupyter", {}).get("source_hidden"), \
        f"{stem}: the record_results cell is collapsed (metadata jupyter.source_hidden)"
