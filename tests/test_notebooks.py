"""Every lesson, executed at its classroom defaults (tests/lessons.py), as a learner meets it.

What holds for every notebook: it runs to the end and records its values; every exercise's
reference solution passes its check (read back as ``python -m labkit grade`` reads it); every
number in the prose was printed by a cell; every cell that makes a figure shows one; no
warning reaches the learner; the parameters cell holds the lesson's settings only. What each
notebook claims is asserted in ``tests/test_claims_<NN>.py``. The learners' versions in
``notebooks/`` are run in a real browser by ``test_browser.py``.
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

import pytest

from labkit.classroom.grade import exercise_results
from tests.lessons import SMOKE, STEMS, lesson
from tests.prose_numbers import unprinted_numbers

# A call that draws: a labkit plot (labkit.plots...plot_*, one figure each), a labkit widget (an
# image or a widget each), pyplot's figure makers; called through the package or by a name
# imported from it (``from labkit.lessons.layouts.plots import plot_rank_grid``), in code (comments
# and strings are not calls). show_source prints code, the quiz helpers return data.
_PACKAGES = {"plots": re.compile(r"plot_\w+"),
             "widgets": re.compile(r"(?!(?:show_source|load_quiz|quiz_html|divisors|"
                                   r"layout_from)\b)\w+")}
_DOTTED = re.compile(r"\blabkit\.(?:lessons\.\w+\.)?(plots|widgets)\.(?:[a-z_]\w*\.)*?(\w+)\(")
_PYPLOT = re.compile(r"\bplt\.(?:subplots|figure|subplot_mosaic)\(")
# a lesson's modules: labkit.lessons.<topic>.plots / widgets / *_plots / *_widget / kill
_FROM = re.compile(r"^[ \t]*from[ \t]+labkit\.(?:lessons\.(?:\w+\.)?)?(plots|widgets|\w+_plots|"
                   r"\w+_widget|kill)[ \t]+import[ \t]+"
                   r"(?:\(([\w\s,]+)\)|([\w \t,]+))", re.M)
_PROGRESS = re.compile(r"\d+%\|")  # a tqdm bar's text: a progress bar, not a figure
_PLUMBING = ("results_path", "papermill", "tests", "smoke")
_WARNING = re.compile(r"warning", re.I)  # UserWarning, "Warning:", logging's "WARNING:"


def _code(source: str) -> str:
    """``source`` with its comments and string literals blanked out."""
    rows = [list(line) for line in source.splitlines(keepends=True)]
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return source
    for token in tokens:
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            (start_row, start_col), (end_row, end_col) = token.start, token.end
            for row in range(start_row, end_row + 1):
                line = rows[row - 1]
                for col in range(start_col if row == start_row else 0,
                                 end_col if row == end_row else len(line)):
                    line[col] = line[col] if line[col] == "\n" else " "
    return "".join("".join(row) for row in rows)


def drawing_names(notebook) -> dict[str, str]:
    """{name: "plots" | "widgets"}: the drawing functions a notebook imports by name."""
    names = {}
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for module, bracketed, plain in _FROM.findall(_code(cell.source)):
            package = "plots" if module.endswith("plots") else "widgets"
            for item in (bracketed or plain).split(","):
                words = item.split()  # name, or name as alias
                if len(words) in (1, 3) and _PACKAGES[package].fullmatch(words[0]):
                    names[words[-1]] = package
    return names


def drawn(source: str, names: dict[str, str]) -> int:
    """How many figures (or widgets) a cell's code draws."""
    code = _code(source)
    count = sum(bool(_PACKAGES[package].fullmatch(name))
                for package, name in _DOTTED.findall(code))
    count += len(_PYPLOT.findall(code))
    for name in names:
        count += len(re.findall(rf"(?<![\w.]){re.escape(name)}\(", code))
    return count


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


def unshown_figures(notebook) -> list[str]:
    """The code cells of an executed notebook that draw more than they show."""
    names, missing = drawing_names(notebook), []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        count = drawn(cell.source, names)
        if _figures(cell) < count:
            missing.append(f"cell {index}: draws {count}, shows {_figures(cell)}:\n"
                           f"{cell.source[:300]}")
    return missing


def warnings_shown(notebook) -> list[str]:
    """The warnings a notebook's cells printed to stderr."""
    return [f"cell {i}: {''.join(o.get('text', ''))[:400]}"
            for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
            for o in cell.get("outputs", [])
            if o.get("name") == "stderr" and _WARNING.search("".join(o.get("text", "")))]


@pytest.mark.parametrize("stem", STEMS)
def test_every_figure_is_shown(stem):
    """A cell that draws leaves an image (or a live widget) for each thing it draws: a Figure
    that is not the cell's last expression, or a tuple of figures, shows nothing. (A loop's
    figures count once: the source does not say how many times it runs.)"""
    missing = unshown_figures(lesson(stem).notebook)
    assert not missing, f"{stem}: figures that never appear:\n" + "\n\n".join(missing)


@pytest.mark.parametrize("stem", STEMS)
def test_no_warning_reaches_the_learner(stem):
    warned = warnings_shown(lesson(stem).notebook)
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
