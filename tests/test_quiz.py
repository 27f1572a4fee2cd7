"""Quizzes: well-formed, scored on first answers with retries allowed, explanations after an
answer, a question read from a plot in every notebook, and the origin questions' every option
backed by a run in the suite that the notebooks' tests check."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labkit.lessons.show.quiz import quiz_html, quiz_widget
from labkit.lessons.show.quizzes import QuizError, QuizRecord, load_quiz

REPO = Path(__file__).resolve().parent.parent
QUIZZES = sorted((REPO / "notebooks" / "quizzes").glob("*.json"))
ORIGIN = {"00_your_cluster": "why-clusters", "06_recommender_at_scale": "team-scenario"}


def _values(questions) -> dict:
    return {q.value: 2.0 for q in questions if q.kind == "number"}


def test_every_notebook_has_a_quiz():
    notebooks = {p.stem for p in (REPO / "course").glob("*.ipynb")}
    assert notebooks == {p.stem for p in QUIZZES}


@pytest.mark.parametrize("path", QUIZZES, ids=lambda p: p.stem)
def test_quiz_is_well_formed_and_asks_for_a_number_from_a_plot(path):
    questions = load_quiz(path)
    assert any(q.kind == "number" for q in questions), f"{path.stem}: read a plot"
    for q in questions:
        expected = 2.0 if q.kind == "number" else None
        right = q.answer if q.kind == "choice" else expected
        ok, text = q.feedback(right, expected)
        assert ok and text.startswith("Right.")
        wrong = (q.answer + 1) % len(q.options) if q.kind == "choice" else 100.0
        ok, text = q.feedback(wrong, expected)
        assert not ok and text.startswith("Not quite.")
    assert "<details>" in quiz_html(questions, _values(questions))


def test_score_counts_first_answers_and_retries_show_explanations():
    questions = load_quiz(REPO / "notebooks" / "quizzes" / "00_your_cluster.json")
    saved = []
    box = quiz_widget(questions, {"largest_algbw": 1.5}, "00_your_cluster",
                      on_change=lambda record: saved.append(record.to_dict(questions)))
    first = box.children[0]
    radio, feedback = first.children[1], first.children[2]
    assert feedback.value == ""
    radio.value = (questions[0].answer + 1) % len(questions[0].options)  # wrong first
    assert "Not quite." in feedback.value and "Seen in a run" in feedback.value
    radio.value = questions[0].answer  # retry: right now, the score keeps the first answer
    assert "Right." in feedback.value
    assert saved[-1]["score"] == 0 and saved[-1]["answers"]["why-clusters"]["tries"] == 2
    number = box.children[3].children[1]  # the bandwidth question: a number and a button
    number.children[0].value = 1.6
    number.children[1].click()
    assert saved[-1]["score"] == 1 and saved[-1]["expected"]["algbw"] == 1.5


def test_record_rescoring_does_not_trust_the_saved_score():
    questions = load_quiz(REPO / "notebooks" / "quizzes" / "00_your_cluster.json")
    record = QuizRecord("00_your_cluster")
    record.answer(questions[1], questions[1].answer)
    record.answers[questions[2].id] = {"first": 3, "tries": 1, "first_right": True}  # edited
    assert record.score(questions) == 1


def test_malformed_questions_are_refused(tmp_path):
    bad = {"questions": [{"question": "?", "options": ["a", "b"], "answer": 2,
                          "explanations": ["x", "y"]}]}
    (tmp_path / "q.json").write_text(json.dumps(bad))
    with pytest.raises(QuizError, match="malformed"):
        load_quiz(tmp_path / "q.json")
    number = {"questions": [{"question": "?", "kind": "number", "value": "v"}]}
    (tmp_path / "n.json").write_text(json.dumps(number))
    with pytest.raises(QuizError, match="measured value 'v'"):
        load_quiz(tmp_path / "n.json")[0].expected({})


def _tagged_cell_and_heading(notebook: str, cell: str) -> tuple[int, str]:
    nb = nbformat.read(REPO / "course" / f"{notebook}.ipynb", as_version=4)
    heading = ""
    for index, c in enumerate(nb.cells):
        if c.cell_type == "markdown":
            lines = [line for line in c.source.splitlines() if line.startswith("## ")]
            heading = lines[-1][3:].strip() if lines else heading
        if f"evidence:{cell}" in c.get("metadata", {}).get("tags", []):
            return index, heading
    pytest.fail(f"{notebook} has no cell tagged evidence:{cell}")


@pytest.mark.parametrize("path", QUIZZES, ids=lambda p: p.stem)
def test_evidence_points_to_a_tagged_cell_under_its_heading(path):
    for q in load_quiz(path):
        for choice in range(len(q.options)):
            for ref in q.references(choice):
                _, heading = _tagged_cell_and_heading(ref["notebook"], ref["cell"])
                assert heading == ref["section"], (q.id, ref)


@pytest.mark.parametrize("notebook", sorted(ORIGIN))
def test_every_option_of_the_origin_questions_is_backed_by_a_run(notebook):
    questions = {q.id: q for q in load_quiz(REPO / "notebooks" / "quizzes" / f"{notebook}.json")}
    q = questions[ORIGIN[notebook]]
    assert all(q.references(choice) for choice in range(len(q.options))), q.id
