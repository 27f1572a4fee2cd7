"""A lesson's web page: the executed course notebook, shown as the learner's copy shows it.

The course notebook runs with its reference solutions in (that is how the suite executes
every lesson); the page shows what a learner meets instead:

* every cell as ``python -m labkit release`` gives it to a learner (``release_cell``): an
  exercise's answer cell is nbgrader's stub, a check cell has no hidden tests;
* an answer cell's outputs and its check's outputs are replaced by a short note, since they
  came from the solution the page does not show;
* every other cell keeps the outputs it printed and drew; a widget becomes a still picture of
  its last state (``widget_snapshots``), its plot a PNG;
* the cells tagged ``remove-cell`` (the collapsed cell that records results for the tests)
  are left out, and an "Open in Colab" badge follows the title.
"""

from __future__ import annotations

import nbformat

from labkit.classroom.release import release_cell
from labkit.classroom.widget_snapshots import is_widget, snapshot, widget_state

COLAB = ("https://colab.research.google.com/github/labkit-course/labkit/blob/main/"
         "notebooks/{stem}.ipynb")
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
REMOVE_TAG = "remove-cell"
ANSWER_NOTE = ("Your turn: this is the cell you complete, as it is in your copy of the "
               "notebook. This page does not show the reference solution, nor what it "
               "printed.")
CHECK_NOTE = ("The check's verdict on your answer appears here when you run the notebook. "
              "The page was executed with the reference solution, so it shows no verdict.")
ABOUT = ("This page is the lesson as it ran at its classroom defaults on the machine that "
         "built the site, shown as your copy of the notebook shows it: each exercise is the "
         "cell you complete, with a note in place of its output and of its check's. Sliders "
         "and quizzes show their state at the end of the run; they respond in the notebook.")


class PageError(ValueError):
    """An executed notebook that cannot make a lesson's page (the message says why)."""


def colab_url(stem: str) -> str:
    return COLAB.format(stem=stem)


def check_executed(executed, source, stem: str) -> None:
    """Raise ``PageError`` unless ``executed`` is ``source`` run at its classroom defaults."""
    injected = [c for c in executed.cells
                if "injected-parameters" in c.metadata.get("tags", [])]
    if injected:
        raise PageError(f"{stem}.ipynb was executed with injected parameters; a lesson's page "
                        "shows it at its classroom defaults: execute it without parameters")
    ran = [(c.cell_type, c.source) for c in executed.cells]
    if ran != [(c.cell_type, c.source) for c in source.cells]:
        raise PageError(f"{stem}.ipynb was executed from another version of "
                        f"course/{stem}.ipynb: execute the current one")
    code = [c for c in executed.cells if c.cell_type == "code" and c.source.strip()]
    if not code or any(c.execution_count is None for c in code):
        raise PageError(f"{stem}.ipynb has code cells that never ran: pass executed "
                        "notebooks (papermill's output, or LABKIT_LESSONS_DIR's)")
    failed = [i for i, c in enumerate(executed.cells) if c.cell_type == "code"
              and (c.metadata.get("papermill", {}).get("exception")
                   or any(o.get("output_type") == "error" for o in c.get("outputs", [])))]
    if failed:
        raise PageError(f"{stem}.ipynb failed in cell {failed[0]}: a lesson's page shows a "
                        "run that finished; execute it again and read the error there")


def lesson_page(executed, source, stem: str) -> nbformat.NotebookNode:
    """The page's notebook for lesson ``stem`` from its executed course notebook."""
    check_executed(executed, source, stem)
    state, ids, cells = widget_state(executed), set(), []
    for index, cell in enumerate(executed.cells):
        if REMOVE_TAG in cell.metadata.get("tags", []):
            continue
        page = release_cell(cell, f"{stem}.ipynb, cell {index}", ids)
        grading = cell.metadata.get("nbgrader", {})
        if page.cell_type == "code":
            if grading.get("solution") or grading.get("grade"):
                page.outputs = [_note(ANSWER_NOTE if grading.get("solution") else CHECK_NOTE)]
            else:
                page.outputs = _still(cell.outputs, state)
                page.execution_count = cell.execution_count
        page.metadata = {k: v for k, v in cell.metadata.items() if k == "tags"}
        cells.append(page)
    _badge(cells, stem)
    metadata = {k: executed.metadata[k] for k in ("kernelspec", "language_info")
                if k in executed.metadata}
    return nbformat.v4.new_notebook(cells=cells, metadata=metadata)


def _badge(cells: list, stem: str) -> None:
    """The Colab badge and what the page shows, under the title (the first line of the first
    cell when that is a heading; else in a cell of their own, first)."""
    about = f"[![Open In Colab]({COLAB_BADGE})]({colab_url(stem)})\n\n*{ABOUT}*"
    first = cells[0] if cells else None
    if first is not None and first.cell_type == "markdown" and first.source.startswith("# "):
        title, _, rest = first.source.partition("\n")
        first.source = f"{title}\n\n{about}\n\n{rest.lstrip()}".rstrip()
    else:
        cells.insert(0, nbformat.v4.new_markdown_cell(about))


def _note(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output(
        "display_data", data={"text/html": f"<p class='labkit-page-note'><i>{text}</i></p>",
                              "text/plain": text})


def _still(outputs: list, state: dict) -> list:
    """``outputs`` with every widget replaced by its snapshot."""
    shown = []
    for output in outputs:
        if is_widget(output):
            shown.extend(nbformat.from_dict(o) for o in snapshot(output, state))
        else:
            shown.append(output)
    return shown
