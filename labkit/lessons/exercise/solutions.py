"""The reference solution of an exercise, on request, for learners working on their own.

    labkit.check.reveal("ring_all_reduce")

``python -m labkit release`` writes the course's solutions beside the learners' notebooks
(``solutions/<notebook>.json``); an instructor who grades the exercises releases without them
(``--no-solutions``, which leaves ``solutions/NONE.txt`` where reveal stops looking). Reveal
looks in ``solutions/`` beside the notebook first, then in the package's own (the learners'
materials, ``labkit.lessons.materials``), so a notebook opened alone (Colab) finds them. While
a notebook is graded (``LABKIT_GRADING`` set, not "0"; ``python -m labkit grade`` sets it)
``reveal`` shows nothing. Your own function stays what the checks run: revealing grades nothing.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from pathlib import Path

from labkit.lessons.materials import solutions_folder

GRADING_ENV = "LABKIT_GRADING"
SOLUTIONS = "solutions"
# Written by ``release --no-solutions`` in place of the solutions: a folder holding it has
# none to show, and the search stops there (it does not go on to the package's own).
NO_SOLUTIONS = "NONE.txt"
_OFF = ("", "0", "false", "no", "off")


@dataclass(frozen=True, repr=False)
class Reveal:
    """What ``reveal`` found: the solution's code, or why there is none to show."""

    exercise: str
    code: str = ""
    reason: str = ""

    def __str__(self) -> str:
        if not self.code:
            return f"{self.exercise}: {self.reason}"
        return f"{self.exercise}, the reference solution:\n\n{self.code}"

    __repr__ = __str__  # a console (or a notebook's text/plain) shows the code, not escapes

    def _repr_html_(self) -> str:
        if not self.code:
            return f"<i>{html.escape(self.exercise)}: {html.escape(self.reason)}</i>"
        return (f"<b>{html.escape(self.exercise)}: the reference solution</b> (try it in your "
                "own cell; the check still runs your function)"
                f"<pre>{html.escape(self.code)}</pre>")


def _folders() -> list:
    """Where reveal looks, in order: ``solutions/`` here, then the package's (Traversables)."""
    return [Path.cwd() / SOLUTIONS, solutions_folder()]


def grading() -> bool:
    """Whether ``LABKIT_GRADING`` is on (set, and not "", "0", "false", "no" or "off")."""
    return os.environ.get(GRADING_ENV, "").strip().lower() not in _OFF


def _read(path) -> tuple[dict[str, str], str]:
    """({exercise: code} of one solutions file, "" or why it could not be read)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return {}, f"{path} is not a solutions file ({type(error).__name__}: {error})"
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        return {}, f"{path} is not a solutions file ({{exercise: code}} expected)"
    return data, ""


def _search() -> tuple[dict[str, str], list[str], bool]:
    """(the solutions of the first folder that has any, the files there that could not be
    read, whether a folder on the way says it was released without solutions)."""
    for folder in _folders():
        if not folder.is_dir():
            continue
        if (folder / NO_SOLUTIONS).is_file():
            return {}, [], True
        files = sorted((f for f in folder.iterdir() if f.name.endswith(".json")),
                       key=lambda f: f.name)
        if files:
            found, problems = {}, []
            for path in files:
                data, problem = _read(path)
                found.update(data)
                problems += [problem] if problem else []
            if found or problems:
                return found, problems, False
    return {}, [], False


def solutions() -> dict[str, str]:
    """Every released solution: {exercise: code}, from the first folder that has any ({}
    while grading, or where the notebooks were released without solutions)."""
    return {} if grading() else _search()[0]


def available(exercise) -> bool:
    """Whether ``reveal(exercise)`` would show a solution."""
    return isinstance(exercise, str) and exercise in solutions()


def reveal(exercise: str) -> Reveal:
    """The reference solution of ``exercise`` (its check's name, e.g. "ring_all_reduce"; your
    own function, named as the exercise, works too)."""
    if not isinstance(exercise, str) and callable(exercise):
        exercise = getattr(exercise, "__name__", exercise)
    if not isinstance(exercise, str):
        return Reveal(repr(exercise)[:60], reason='give the exercise\'s name, as in '
                                                  'labkit.check.reveal("ring_all_reduce").')
    if grading():
        return Reveal(exercise, reason="reveal is off while this notebook is graded.")
    found, problems, withheld = _search()
    if withheld:
        return Reveal(exercise, reason="these notebooks were released without solutions "
                                       "(your course grades the exercises).")
    if not found:
        looked = " or ".join(str(f) for f in _folders())
        return Reveal(exercise, reason=f"no reference solutions found (looked in {looked})"
                      + (f": {'; '.join(problems)}" if problems else "."))
    if exercise not in found:
        return Reveal(exercise, reason=f"no such exercise; the exercises are: "
                                       f"{', '.join(sorted(found))}."
                      + (f" ({'; '.join(problems)})" if problems else ""))
    return Reveal(exercise, code=found[exercise])
