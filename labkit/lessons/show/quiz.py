"""Quizzes shown as a widget: scored, retry allowed, the explanation after each answer.

The questions are data (``labkit/lessons/show/quizzes.py`` reads and scores them). Choosing an
option, or checking a number, reveals the explanation (and, where the suite has one, a link to
the run that confirms or refutes that option); the score line counts first answers. Each answer
also updates a small record displayed under the quiz (``RECORD_MIME``): JupyterLab saves it in
the notebook, which is how ``python -m labkit grade`` reads a learner's quiz score.

A notebook names its quiz as ``quizzes/<notebook>.json`` beside it; a notebook opened on its
own (Colab, a single downloaded file) reads the package's copy of that quiz instead.
"""

from __future__ import annotations

import html
from pathlib import Path

from labkit.lessons.materials import QUIZZES, quiz_file
from labkit.lessons.show.quizzes import RECORD_MIME, Question, QuizRecord, load_quiz


def _evidence_html(question: Question, choice: int) -> str:
    """Links to the runs that confirm or refute option ``choice`` (JupyterLab opens a
    notebook at a heading from ``name.ipynb#Heading-text``)."""
    links = [f"<a href='{r['notebook']}.ipynb#{html.escape(r['section'].replace(' ', '-'))}'>"
             f"{html.escape(r['notebook'])} · {html.escape(r['section'])}</a>"
             for r in question.references(choice)]
    return f"<br><i>Seen in a run: {', '.join(links)}</i>" if links else ""


def _record_bundle(record: QuizRecord, questions: list[Question]) -> dict:
    return {"text/plain": record.summary(questions), RECORD_MIME: record.to_dict(questions)}


def quiz_html(questions: list[Question], values: dict | None = None) -> str:
    """A static rendering: questions and options, answers and explanations folded away."""
    parts = []
    for n, q in enumerate(questions, 1):
        if q.kind == "number":
            expected = q.expected(values or {})
            answer = f"{expected:.3g} {html.escape(q.unit)} (measured here). " \
                     f"{html.escape(q.explanation)}"
            body = ""
        else:
            answer = html.escape(q.options[q.answer]) + "<ul>" + "".join(
                f"<li><b>{html.escape(o)}</b>: {html.escape(e)}{_evidence_html(q, i)}</li>"
                for i, (o, e) in enumerate(zip(q.options, q.explanations, strict=True))) + "</ul>"
            body = "<ol type='A'>" + "".join(f"<li>{html.escape(o)}</li>" for o in q.options) \
                + "</ol>"
        parts.append(f"<p><b>{n}. {html.escape(q.question)}</b></p>{body}"
                     f"<details><summary>answer</summary>Answer: {answer}</details>")
    return "".join(parts)


def _choice_block(q: Question, on_answer):
    import ipywidgets as widgets

    choice = widgets.RadioButtons(options=[(o, i) for i, o in enumerate(q.options)],
                                  value=None, layout={"width": "auto"})
    choice.observe(lambda change: change["new"] is not None and on_answer(change["new"]),
                   names="value")
    return choice


def _number_block(q: Question, on_answer):
    import ipywidgets as widgets

    number = widgets.FloatText(value=0.0, description=q.unit or "answer",
                               layout={"width": "220px"})
    button = widgets.Button(description="Check")
    button.on_click(lambda _: on_answer(number.value))
    return widgets.HBox([number, button])


def quiz_widget(questions: list[Question], values: dict | None = None, name: str = "quiz",
                on_change=None):
    """One block per question and a score line; ``on_change(record)`` after every answer."""
    import ipywidgets as widgets

    record = QuizRecord(name)
    blocks = []
    for n, q in enumerate(questions, 1):
        expected = q.expected(values or {})
        feedback = widgets.HTML()

        def on_answer(answer, q=q, feedback=feedback, expected=expected):
            right, text = q.feedback(answer, expected)
            colour = "green" if right else "firebrick"
            extra = _evidence_html(q, answer) if q.kind == "choice" else ""
            feedback.value = (f"<span style='color:{colour}'>{html.escape(text)}</span>"
                              f"{extra}")
            record.answer(q, answer, expected)
            if on_change is not None:
                on_change(record)

        make = _number_block if q.kind == "number" else _choice_block
        blocks.append(widgets.VBox([widgets.HTML(f"<b>{n}. {html.escape(q.question)}</b>"),
                                    make(q, on_answer), feedback]))
    box = widgets.VBox(blocks)
    box.record = record
    return box


def quiz_source(path: str | Path):
    """``path``; or, where it is ``quizzes/<name>.json`` and no such file is here, the
    package's copy of quiz ``name``."""
    given = Path(path)
    if given.exists() or given.is_absolute() or given.parent.name != QUIZZES:
        return given
    return quiz_file(given.stem)


def show_quiz(path: str | Path, interactive: bool = True, values: dict | None = None):
    """Display the quiz at ``path`` as a widget with its score line under it (saved in the
    notebook, for grading), or return it as static HTML (headless runs, printed pages).
    ``values``: the measured numbers that questions read from a plot ("value" in the file)."""
    from IPython.display import HTML, display

    questions = load_quiz(quiz_source(path))
    if not interactive:
        return HTML(quiz_html(questions, values))
    name, handle = Path(path).stem, None

    def save(record: QuizRecord) -> None:  # the score line under the quiz, saved with it
        handle.update(_record_bundle(record, questions), raw=True)

    box = quiz_widget(questions, values, name, on_change=save)
    display(box)
    handle = display(_record_bundle(box.record, questions), raw=True, display_id=True)
    return None
