"""What a check found: passed, failed (and precisely why), or not attempted yet.

A ``CheckResult`` shows itself in a notebook as a coloured box, and carries a machine-readable
copy (``MIME_TYPE``) in the same output, which the test suite reads back from the notebooks it
executes (``python -m labkit grade`` never trusts it: its checker computes every verdict
itself, ``labkit/classroom/checker.py``). It never raises by itself, so a learner's "Run
All" reaches the end of the notebook; the instructor's version of a check cell calls
``assert_passed()`` in a hidden-test region (nbgrader's convention), which is stripped from
the learners' notebooks.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from labkit.lessons.exercise.hints import hint
from labkit.lessons.exercise.solutions import available

MIME_TYPE = "application/vnd.labkit.check+json"
PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"
_COLOURS = {PASSED: "#1b7f3b", FAILED: "#b22222", NOT_ATTEMPTED: "#8a6d00"}


class ExerciseFailed(AssertionError):
    """Raised by ``CheckResult.assert_passed`` (hidden tests, grading)."""


@dataclass
class CheckResult:
    """The verdict on one exercise.

    Attributes:
        exercise: the checker's name ("ring_all_reduce", ...).
        status: "passed", "failed" or "not attempted".
        summary: one sentence: what is wrong and what to change (or what was confirmed).
        details: further findings, one sentence each (per rank, per pass, ...).
        measured: the figures the verdict rests on (bytes, errors, memory...), plain values.
    """

    exercise: str
    status: str
    summary: str
    details: list[str] = field(default_factory=list)
    measured: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def assert_passed(self) -> None:
        """Raise ``ExerciseFailed`` with the verdict unless the exercise passed."""
        if not self.passed:
            raise ExerciseFailed(f"{self.exercise}: {self.status}: {self.summary}")

    def to_dict(self) -> dict:
        return {"exercise": self.exercise, "status": self.status, "summary": self.summary,
                "details": list(self.details), "measured": self.measured}

    @property
    def help(self) -> list[str]:
        """Under a failed check: the exercise's hint, and how to see the reference solution (when
        ``reveal`` has one to show)."""
        if self.status != FAILED:
            return []
        lines = [f"Hint: {hint(self.exercise)}"] if hint(self.exercise) else []
        if not available(self.exercise):  # graded, or released without solutions
            return lines
        return lines + [f'Still stuck? labkit.check.reveal("{self.exercise}") shows the '
                        "reference solution."]

    def __str__(self) -> str:
        lines = [f"{self.exercise}: {self.status.upper()}: {self.summary}"]
        return "\n".join(lines + [f"  - {d}" for d in self.details] + self.help)

    def _repr_html_(self) -> str:
        colour = _COLOURS[self.status]
        items = "".join(f"<li>{html.escape(d)}</li>" for d in self.details)
        help_ = "".join(f"<br><i>{html.escape(line)}</i>" for line in self.help)
        return (f"<div style='border-left:4px solid {colour};padding:4px 10px'>"
                f"<b style='color:{colour}'>{html.escape(self.exercise)}: "
                f"{html.escape(self.status)}</b><br>{html.escape(self.summary)}"
                f"{f'<ul>{items}</ul>' if items else ''}{help_}</div>")

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return {"text/plain": str(self), "text/html": self._repr_html_(),
                MIME_TYPE: self.to_dict()}


def passed(exercise: str, summary: str, details=(), **measured) -> CheckResult:
    return CheckResult(exercise, PASSED, summary, list(details), measured)


def failed(exercise: str, summary: str, details=(), **measured) -> CheckResult:
    return CheckResult(exercise, FAILED, summary, list(details), measured)


def not_attempted(exercise: str, where: str) -> CheckResult:
    return CheckResult(exercise, NOT_ATTEMPTED,
                       f"not attempted yet: {where} still raises NotImplementedError. Write "
                       "your code in place of `raise NotImplementedError()`, run that cell, "
                       "then run this one again.")
