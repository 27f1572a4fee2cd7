"""Errors name the rank and say what happened, whatever the learner's code raises or returns:
classes that exist only on the ranks, constructors that need two arguments, an exception
whose __str__ raises; impossible settings are refused before any process starts."""

from __future__ import annotations

import os

import pytest

import labkit
from tests.conftest import descendants

MODULE = """
class OnlyHere(Exception):
    pass

class Point:
    def __init__(self, x):
        self.x = x
"""


def _import_rank_only_module(ctx, folder):
    import importlib
    import sys

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "rank_only_module.py"), "w") as f:
        f.write(MODULE)
    sys.path.insert(0, folder)
    importlib.invalidate_caches()
    return importlib.import_module("rank_only_module")


def test_exception_class_that_exists_only_on_the_ranks(two, tmp_path):
    def raise_it(ctx, folder):
        module = _import_rank_only_module(ctx, folder)
        if ctx.rank == 1:
            raise module.OnlyHere("a class the notebook cannot import")

    with pytest.raises(labkit.RankError) as info:
        two.run(raise_it, str(tmp_path / "mods"))
    error = info.value
    assert error.rank == 1 and error.exception is None
    assert "OnlyHere: a class the notebook cannot import" in str(error)
    assert "could not be rebuilt here" in str(error) and "raise_it" in error.remote_traceback


def test_result_whose_class_exists_only_on_the_ranks(two, tmp_path):
    pids = two.run(lambda ctx: os.getpid())

    def make_point(ctx, folder):
        return _import_rank_only_module(ctx, folder).Point(ctx.rank)

    with pytest.raises(labkit.RankError, match="rank 0: its result could not be rebuilt") as info:
        two.run(make_point, str(tmp_path / "mods"))
    assert not info.value.restarted and "still up" in str(info.value)
    assert two.run(lambda ctx: os.getpid()) == pids  # nothing was lost


class NeedsTwo(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


def test_exception_whose_constructor_needs_two_arguments(two):
    def raise_it(ctx):
        raise NeedsTwo("left", "right")

    with pytest.raises(labkit.RankError, match="NeedsTwo: left and right") as info:
        two.run(raise_it)
    assert info.value.rank in (0, 1) and "raise_it" in info.value.remote_traceback


def test_result_whose_constructor_needs_two_arguments(two):
    with pytest.raises(labkit.RankError, match="rank 0: its result could not be rebuilt.*"
                                               "TypeError"):
        two.run(lambda ctx: NeedsTwo("a", "b"))
    assert two.run(lambda ctx: ctx.rank) == [0, 1]


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("no text for you")


def test_exception_whose_str_raises_keeps_its_traceback(two):
    def raise_it(ctx):
        raise BadStr()

    with pytest.raises(labkit.RankError) as info:
        two.run(raise_it)
    error = info.value
    assert "BadStr" in str(error) and "died" not in error.message
    assert "raise_it" in error.remote_traceback
    assert two.run(lambda ctx: ctx.rank) == [0, 1]


@pytest.mark.parametrize("capacity", [1e30, float("inf"), "1000000TB"])
def test_capacity_larger_than_the_machine_is_refused(capacity):
    before = descendants()
    with pytest.raises(ValueError, match="memory|size"):
        labkit.Cluster(1, device="cpu", memory_per_device=capacity)
    assert descendants() == before


def test_capacity_set_later_is_checked_too(one):
    with pytest.raises(ValueError, match="more than this machine"):
        one.memory_per_device = "1000000TB"
    assert one.memory_per_device is None


def test_too_many_ranks_are_refused_before_any_process_starts():
    before = descendants()
    with pytest.raises(ValueError, match=r"at most \d+ .*max_world_size=10000"):
        labkit.Cluster(10000, device="cpu")
    assert descendants() == before


def test_the_rank_limit_can_be_lifted_on_purpose(monkeypatch):
    from labkit.runtime.cluster import hardware

    monkeypatch.setattr(hardware, "rank_limit", lambda device: (2, "a test's limit"))
    with pytest.raises(ValueError, match="at most 2 .a test's limit"):
        labkit.Cluster(3, device="cpu", progress=False)
    with labkit.Cluster(3, device="cpu", progress=False, max_world_size=3) as cluster:
        assert cluster.run(lambda ctx: ctx.world_size) == [3, 3, 3]
