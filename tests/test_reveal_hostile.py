"""``reveal`` and the hints under hostile use: a hint followed to the letter passes its check;
a handout released without solutions reveals nothing, whatever labkit's install holds; the
grader's kernels do not reveal; odd inputs and broken files give a sentence, not a traceback."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import torch
import torch.distributed as dist

import labkit
from labkit.check.hints import HINTS
from labkit.check.solutions import GRADING_ENV
from labkit.classroom.grade import grade_submission

REPO = Path(__file__).resolve().parent.parent


def _formula(text: str):
    """``(r + 1 - s)`` -> a function of (r, s, n)."""
    expression = text.replace(" ", "")
    assert re.fullmatch(r"[rs0-9+\-]+", expression), text
    return lambda r, s, n: eval(expression, {}, {"r": r, "s": s}) % n  # noqa: S307


def test_the_ring_hint_followed_to_the_letter_passes(two):
    hint = HINTS["ring_all_reduce"]
    sends = [_formula(f) for f in re.findall(r"sends chunk \(([^)]*)\) mod N", hint)]
    into = [_formula(f) for f in re.findall(r"into chunk \(([^)]*)\) mod N", hint)]
    assert len(sends) == len(into) == 2, "the hint gives both phases' chunk indices"

    def ring(ctx, tensor):
        n, r = ctx.world_size, ctx.rank
        chunks, incoming = list(tensor.chunk(n)), torch.empty(tensor.numel() // n)
        for phase in range(2):
            for s in range(n - 1):
                sending = dist.isend(chunks[sends[phase](r, s, n)], (r + 1) % n)
                dist.recv(incoming, (r - 1) % n)
                sending.wait()
                target = chunks[into[phase](r, s, n)]
                target.add_(incoming) if phase == 0 else target.copy_(incoming)
        return tensor

    result = labkit.check.ring_all_reduce(two, ring)
    assert result.passed, str(result)


def test_the_grader_does_not_reveal(tmp_path, monkeypatch):
    """An answer cell that runs the revealed reference solution earns nothing when graded."""
    monkeypatch.delenv(GRADING_ENV, raising=False)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells.append(nbformat.v4.new_code_cell(
        "import labkit\nshown = labkit.check.reveal('average_gradients')\n"
        "assert not shown.code, 'the grader revealed the solution'"))
    nbformat.write(nb, tmp_path / "cheat.ipynb")
    result = grade_submission(tmp_path / "cheat.ipynb", REPO / "notebooks" / "quizzes",
                              timeout=120, cell_timeout=60)
    assert result.status == "graded", result.detail
