"""labkit.lessons.show.same_run: the two runs' losses side by side, as the lessons print them."""

import math

import pytest

from labkit.lessons.show.same_run import compare_losses, global_losses


def test_the_global_loss_is_the_mean_of_the_ranks_that_have_one():
    assert global_losses([[1.0, 2.0], [3.0, 4.0]]) == [2.0, 3.0]
    assert global_losses([[math.nan, math.nan], [3.0, 4.0]]) == [3.0, 4.0]  # a pipeline
    with pytest.raises(ValueError, match="different numbers of steps"):
        global_losses([[1.0], [1.0, 2.0]])


def test_equal_within_the_tolerance_and_different_beyond_it():
    same = compare_losses([2.0, 1.5], [[2.0, 1.5], [2.0, 1.5 + 1e-7]], name="ddp")
    assert same.equal and "losses equal" in same.summary() and "ddp" in str(same)
    assert "<table>" in same._repr_html_() and "plain PyTorch" in same._repr_html_()
    off = compare_losses([2.0, 1.5], [[2.0, 1.6]])
    assert not off.equal and "DIFFERENT" in off.summary()
    assert off.max_difference == pytest.approx(0.1)
    with pytest.raises(ValueError, match="same config"):
        compare_losses([2.0], [[2.0, 1.0]])


def test_a_run_that_calls_an_unwritten_answer_says_so_and_others_raise():
    from labkit.runtime.cluster.errors import RankError

    def unwritten():
        raise RankError(0, "NotImplementedError", exception=NotImplementedError())

    waiting = compare_losses([1.0], unwritten, name="dp x tp", answer="compose")
    assert waiting.equal is None and waiting.plain is None and waiting.max_difference is None
    assert "your `compose` from" in str(waiting) and "write it," in str(waiting)
    assert "<i>" in waiting._repr_html_()

    def broken():
        raise RankError(0, "ValueError: wrong", exception=ValueError("wrong"))

    with pytest.raises(RankError):
        compare_losses([1.0], broken, answer="compose")
    assert compare_losses([1.0], lambda: [[1.0]], answer="compose").equal
    two = compare_losses([1.0], unwritten, answer=("save_checkpoint", "load_checkpoint"))
    assert "your `save_checkpoint` and `load_checkpoint` from" in str(two)
    assert "write them," in str(two)
