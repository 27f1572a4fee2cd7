"""The reference solution of an exercise, on request, for learners working on their own.

    labkit.check.reveal("ring_all_reduce")

``python -m labkit release`` writes the course's solutions beside the learners' notebooks
(``solutions/<notebook>.json``); an instructor who grades the exercises releases without them
(``--no-solutions``), and while a notebook is graded (``LABKIT_GRADING`` set) ``reveal`` shows
nothing. Your own function stays what the checks run: revealing grades nothing.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from pathlib import Path

GRADING_ENV = "LABKIT_GRADING"
SOLUTIONS = "solutions"
_REPO_SOLUTIONS = Path(__file__).resolve().parents[2] / "notebooks" / SOLUTIONS


@dataclass(frozen=True)
class Reveal:
    """What ``reveal`` found: the solution's code, or why there is none to show."""

    exercise: str
    code: str = ""
    reason: str = ""

    def __str__(self) -> str:
        if not self.code:
            return f"{self.exercise}: {self.reason}"
        return f"{self.exercise}, the reference solution:\n\n{self.code}"

    def _repr_html_(self) -> str:
        if not self.code:
            return f"<i>{html.escape(self.exercise)}: {html.escape(self.reason)}</i>"
        return (f"<b>{html.escape(self.exercise)}: the reference solution</b> (try it in your "
                "own cell; the check still runs your function)"
                f"<pre>{html.escape(self.code)}</pre>")


def _folders() -> list[Path]:
    return [Path.cwd() / SOLUTIONS, _REPO_SOLUTIONS]


def solutions() -> dict[str, str]:
    """Every released solution: {exercise: code}, from the first folder that has any."""
    for folder in _folders():
        files = sorted(folder.glob("*.json")) if folder.is_dir() else []
        if files:
            found = {}
            for path in files:
                found.update(json.loads(path.read_text()))
            return found
    return {}


def reveal(exercise: str) -> Reveal:
    """The reference solution of ``exercise`` (its check's name, e.g. "ring_all_reduce")."""
    if os.environ.get(GRADING_ENV):
        return Reveal(exercise, reason="reveal is off while this notebook is graded.")
    found = solutions()
    if not found:
        return Reveal(exercise, reason="these notebooks were released without solutions "
                                       "(your course grades the exercises).")
    if exercise not in found:
        return Reveal(exercise, reason=f"no such exercise; the exercises are: "
                                       f"{', '.join(sorted(found))}.")
    return Reveal(exercise, code=found[exercise])
