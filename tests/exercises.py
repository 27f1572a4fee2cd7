"""The reference solutions, taken from the course's notebooks (the one place they are
written), so that the checks' tests run exactly what the notebooks' tests run."""

from __future__ import annotations

from pathlib import Path

import nbformat

COURSE = Path(__file__).resolve().parent.parent / "course"
PRELUDE = "import torch\nimport torch.distributed as dist\nfrom torch import nn\n"


def answer_source(notebook: str, grade_id: str) -> str:
    """The source of the answer cell ``grade_id`` of ``course/<notebook>``, solution in it."""
    nb = nbformat.read(COURSE / f"{notebook}.ipynb", as_version=4)
    cells = [c for c in nb.cells
             if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id]
    assert len(cells) == 1, f"{notebook} has no answer cell {grade_id}"
    return cells[0].source


def solution(notebook: str, grade_id: str, name: str):
    """Object ``name`` defined by the answer cell ``grade_id`` of ``course/<notebook>``.

    The cell runs in a fresh namespace whose module is not importable, so that cloudpickle
    ships its functions to the ranks by value, as it does from a notebook."""
    namespace = {"__name__": f"course_answer_{grade_id}"}
    code = PRELUDE + answer_source(notebook, grade_id)
    exec(compile(code, f"<{notebook}:{grade_id}>", "exec"), namespace)
    return namespace[name]
