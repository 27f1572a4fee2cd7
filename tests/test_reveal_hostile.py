"""``reveal`` and the hints under hostile use: a hint followed to the letter passes its check;
a handout released without solutions reveals nothing, whatever labkit's install holds; the
grader's kernels do not reveal; odd inputs and broken files give a sentence, not a traceback."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.distributed as dist

import labkit
from labkit.classroom.release import release
from labkit.lessons.exercise.hints import HINTS
from labkit.lessons.exercise.result import failed
from labkit.lessons.exercise.solutions import GRADING_ENV, grading, reveal, solutions

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


def test_a_handout_released_without_solutions_reveals_nothing(tmp_path, monkeypatch):
    """The documented graded release: labkit installed from the repository (editable), whose
    notebooks/solutions hold every answer, must not be where reveal finds them."""
    handout = tmp_path / "handout"
    release(REPO / "course", handout, solutions=False)
    monkeypatch.chdir(handout)
    shown = reveal("ring_all_reduce")
    assert not shown.code and "without solutions" in str(shown)
    assert solutions() == {}
    assert release(REPO / "course", handout, check=True, solutions=False) == ([], [])
    release(REPO / "course", handout)  # with solutions again: the marker goes
    assert reveal("ring_all_reduce").code
    assert release(REPO / "course", handout, check=True) == ([], [])


def test_a_solutions_file_without_a_notebook_is_stale(tmp_path):
    release(REPO / "course", tmp_path)
    orphan = tmp_path / "solutions" / "99_deleted_lesson.json"
    orphan.write_text('{"old_exercise": "def old_exercise(): pass\\n"}\n')
    changed, stale = release(REPO / "course", tmp_path, check=True)
    assert changed == [] and stale == [orphan]
    assert orphan in release(REPO / "course", tmp_path, solutions=False)[1]


def test_labkit_grading_off_values(monkeypatch):
    for value, on in (("1", True), ("yes", True), ("0", False), ("", False),
                      ("false", False), (" Off ", False)):
        monkeypatch.setenv(GRADING_ENV, value)
        assert grading() is on, value
        assert bool(reveal("average_gradients").code) is not on, value


def test_odd_arguments_give_a_sentence(monkeypatch):
    monkeypatch.delenv(GRADING_ENV, raising=False)
    for odd in (["ring_all_reduce"], {"a": 1}, None, 3):
        shown = reveal(odd)
        assert not shown.code and str(shown)

    def ring_all_reduce(ctx, tensor):  # the learner's own function, passed as it is
        return tensor

    assert "def ring_all_reduce" in reveal(ring_all_reduce).code


def test_broken_solution_files_are_named_not_raised(tmp_path, monkeypatch):
    monkeypatch.delenv(GRADING_ENV, raising=False)
    folder = tmp_path / "solutions"
    folder.mkdir()
    (folder / "broken.json").write_text("{not json")
    (folder / "list.json").write_text("[1, 2]")
    monkeypatch.chdir(tmp_path)
    shown = reveal("ring_all_reduce")
    assert not shown.code and "broken.json" in str(shown) and "list.json" in str(shown)
    (folder / "good.json").write_text('{"ring_all_reduce": "def ring_all_reduce(): ...\\n"}')
    assert reveal("ring_all_reduce").code == "def ring_all_reduce(): ...\n"


def test_a_failed_check_offers_reveal_only_when_it_shows_something(tmp_path, monkeypatch):
    monkeypatch.delenv(GRADING_ENV, raising=False)
    assert "labkit.check.reveal" in str(failed("zero1", "wrong"))
    monkeypatch.setenv(GRADING_ENV, "1")
    text = str(failed("zero1", "wrong"))
    assert "Hint:" in text and "reveal" not in text
    monkeypatch.delenv(GRADING_ENV)
    release(REPO / "course", tmp_path, solutions=False)
    monkeypatch.chdir(tmp_path)
    assert "reveal" not in str(failed("zero1", "wrong"))


def test_a_console_shows_the_code_not_its_escapes(monkeypatch):
    monkeypatch.delenv(GRADING_ENV, raising=False)
    shown = reveal("average_gradients")
    assert repr(shown) == str(shown) and "\n    for param in model.parameters():" in repr(shown)
