"""Quizzes as data (a JSON file beside the notebooks), scored the same way in the notebook's
widget and by ``python -m labkit grade``.

A quiz file: ``{"questions": [...]}``, each question one of

* a choice: ``{"id", "question", "options": [...], "answer": index, "explanations": [one per
  option], "evidence": {option index: {"notebook", "cell", "section"}}}`` (evidence is
  optional: the runs in the suite that confirm or refute that option, one or a list of
  cells tagged ``evidence:<cell>`` under the heading ``section`` of that notebook);
* a number read from a plot the learner just made: ``{"id", "kind": "number", "question",
  "value": name, "tolerance": relative, "unit", "explanation"}``; the notebook passes the
  measured value (``values={name: ...}``), so the right answer is this machine's own.

The score counts each question's first answer (retries are allowed, to learn from the
explanations, and do not change the score).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

RECORD_MIME = "application/vnd.labkit.quiz+json"


class QuizError(ValueError):
    """A malformed quiz file, or a number question without its measured value."""


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    options: tuple[str, ...] = ()
    answer: int | None = None
    explanations: tuple[str, ...] = ()
    evidence: dict = field(default_factory=dict)
    kind: str = "choice"
    value: str = ""
    tolerance: float = 0.1
    unit: str = ""
    explanation: str = ""

    def __post_init__(self):
        if self.kind == "choice":
            if (len(self.options) != len(self.explanations) or self.answer is None
                    or not 0 <= self.answer < len(self.options)):
                raise QuizError(f"malformed question {self.question!r}: one explanation per "
                                "option and a valid answer index are needed")
        elif self.kind == "number":
            if not self.value or self.tolerance <= 0:
                raise QuizError(f"malformed question {self.question!r}: a number question "
                                "needs the name of its measured value and a tolerance > 0")
        else:
            raise QuizError(f"question {self.question!r}: unknown kind {self.kind!r}")

    def references(self, choice: int) -> list[dict]:
        """The runs that confirm or refute option ``choice``: [{notebook, cell, section}]."""
        refs = self.evidence.get(choice, [])
        return [refs] if isinstance(refs, dict) else list(refs)

    def expected(self, values: dict) -> float | None:
        if self.kind != "number":
            return None
        if self.value not in values:
            raise QuizError(f"question {self.id!r} needs the measured value {self.value!r}: "
                            f"pass values={{{self.value!r}: ...}} to show_quiz")
        return float(values[self.value])

    def is_right(self, answer, expected: float | None = None) -> bool:
        if self.kind == "choice":
            return answer == self.answer
        try:
            return abs(float(answer) - expected) <= self.tolerance * abs(expected)
        except (TypeError, ValueError):
            return False

    def feedback(self, answer, expected: float | None = None) -> tuple[bool, str]:
        """(is it right, the explanation to show) for ``answer``."""
        right = self.is_right(answer, expected)
        lead = "Right. " if right else "Not quite. "
        if self.kind == "number":
            value = f"{expected:.3g}{' ' + self.unit if self.unit else ''}"
            return right, (f"{lead}Measured here: {value} (answers within "
                           f"{self.tolerance:.0%} count). " + self.explanation)
        text = lead + self.explanations[answer]
        if not right:
            text += f" The answer is: {self.options[self.answer]}. {self.explanations[self.answer]}"
        return right, text


def load_quiz(path) -> list[Question]:
    """The questions of the quiz file ``path`` (a path, or a package resource)."""
    data = json.loads((path if hasattr(path, "read_text") else Path(path)).read_text())
    questions = []
    for n, q in enumerate(data["questions"]):
        q = dict(q)
        q.setdefault("id", f"q{n + 1}")
        for key in ("options", "explanations"):
            q[key] = tuple(q.get(key, ()))
        q["evidence"] = {int(k): v for k, v in q.get("evidence", {}).items()}
        questions.append(Question(**q))
    if len({q.id for q in questions}) != len(questions):
        raise QuizError(f"{path}: question ids must be unique")
    return questions


@dataclass
class QuizRecord:
    """What a learner answered: per question id, the first answer, whether it was right,
    the last answer and the number of tries. Saved in the notebook (``RECORD_MIME``)."""

    quiz: str
    answers: dict = field(default_factory=dict)
    expected: dict = field(default_factory=dict)  # number questions: this run's values

    def answer(self, question: Question, choice, expected: float | None = None) -> None:
        entry = self.answers.setdefault(question.id, {"first": choice, "tries": 0})
        if entry["tries"] == 0:
            entry["first_right"] = question.is_right(choice, expected)
        entry["tries"] += 1
        entry["last"] = choice
        if expected is not None:
            self.expected[question.id] = expected

    def score(self, questions: list[Question]) -> int:
        """Questions answered right at the first try (recomputed, not trusted)."""
        total = 0
        for q in questions:
            entry = self.answers.get(q.id)
            if entry is not None:
                total += q.is_right(entry["first"], self.expected.get(q.id))
        return total

    def to_dict(self, questions: list[Question]) -> dict:
        return {"quiz": self.quiz, "answers": self.answers, "expected": self.expected,
                "score": self.score(questions), "max": len(questions)}

    def summary(self, questions: list[Question]) -> str:
        return (f"Quiz {self.quiz}: {self.score(questions)}/{len(questions)} right at the first "
                f"try; {len(self.answers)}/{len(questions)} answered.")
