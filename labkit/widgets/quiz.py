"""Multiple-choice quizzes kept as data (JSON beside the notebook), shown as a widget.

Each question: {"question", "options": [...], "answer": index, "explanations": [one per
option: why it is right, or why it is wrong]}. Choosing an option reveals its explanation;
a wrong choice also shows the right answer's.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Question:
    question: str
    options: tuple[str, ...]
    answer: int
    explanations: tuple[str, ...]

    def __post_init__(self):
        if len(self.options) != len(self.explanations) or not 0 <= self.answer < len(self.options):
            raise ValueError(f"malformed question {self.question!r}: one explanation per "
                             "option and a valid answer index are needed")

    def check(self, choice: int) -> tuple[bool, str]:
        """(is it right, the feedback to show) for option ``choice``."""
        right = choice == self.answer
        feedback = ("Right. " if right else "Not quite. ") + self.explanations[choice]
        if not right:
            feedback += f" The answer is: {self.options[self.answer]}. " \
                        f"{self.explanations[self.answer]}"
        return right, feedback


def load_quiz(path: str | Path) -> list[Question]:
    data = json.loads(Path(path).read_text())
    return [Question(q["question"], tuple(q["options"]), q["answer"], tuple(q["explanations"]))
            for q in data["questions"]]


def quiz_html(questions: list[Question]) -> str:
    """A static rendering: questions and options, explanations folded away."""
    parts = []
    for n, q in enumerate(questions, 1):
        options = "".join(f"<li>{html.escape(o)}</li>" for o in q.options)
        explained = "".join(f"<li><b>{html.escape(o)}</b>: {html.escape(e)}</li>"
                            for o, e in zip(q.options, q.explanations, strict=True))
        parts.append(f"<p><b>{n}. {html.escape(q.question)}</b></p><ol type='A'>{options}</ol>"
                     f"<details><summary>answer</summary>Answer: "
                     f"{html.escape(q.options[q.answer])}<ul>{explained}</ul></details>")
    return "".join(parts)


def quiz_widget(questions: list[Question]):
    """One block per question: radio buttons, a Check button, feedback revealed on answering."""
    import ipywidgets as widgets

    blocks = []
    for n, q in enumerate(questions, 1):
        choice = widgets.RadioButtons(options=[(o, i) for i, o in enumerate(q.options)],
                                      value=None, layout={"width": "auto"})
        feedback = widgets.HTML()

        def on_choice(change, q=q, feedback=feedback):
            if change["new"] is None:
                return
            right, text = q.check(change["new"])
            colour = "green" if right else "firebrick"
            feedback.value = f"<span style='color:{colour}'>{html.escape(text)}</span>"

        choice.observe(on_choice, names="value")
        blocks.append(widgets.VBox([widgets.HTML(f"<b>{n}. {html.escape(q.question)}</b>"),
                                    choice, feedback]))
    return widgets.VBox(blocks)


def show_quiz(path: str | Path, interactive: bool = True):
    """The quiz at ``path`` as a widget, or as static HTML (headless runs, printed pages)."""
    from IPython.display import HTML

    questions = load_quiz(path)
    return quiz_widget(questions) if interactive else HTML(quiz_html(questions))
