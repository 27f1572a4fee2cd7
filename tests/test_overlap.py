"""DDP's overlap timeline (labkit/lessons/data_parallel/overlap.py): the buckets it draws are the
ones DDP made, for two bucket sizes, each AllReduce issued before it completed and within backward.
About 5 s: one 2-rank cluster, a 0.5M-parameter MLP, three DDP steps per bucket size."""

from __future__ import annotations

import pytest

import labkit
from labkit.lessons.data_parallel.overlap import bucket_timeline
from labkit.models import sized


@pytest.fixture(scope="module")
def cluster():
    with labkit.Cluster(2) as c:
        yield c


def test_the_buckets_recorded_are_ddps_for_two_bucket_sizes(cluster):
    model = sized("mlp", 5e5)  # ~2 MB of gradients
    small, large = (bucket_timeline(cluster, model, 32, cap) for cap in (0.25, 25))
    for timeline in (small, large):
        assert len(timeline.buckets) == timeline.ddp_buckets
        for rank in timeline.ranks:  # every rank reduced the same buckets
            assert len(rank["buckets"]) == timeline.ddp_buckets
        assert all(0 <= b["issued"] <= b["done"] <= timeline.backward_s
                   for b in timeline.buckets)
    assert large.ddp_buckets == 1 < small.ddp_buckets
    assert sum(b["bytes"] for b in small.buckets) == sum(b["bytes"] for b in large.buckets)
    # with several buckets, the first AllReduce starts before backward's computation ends
    assert small.buckets[0]["issued"] < small.compute_end_s


def test_a_bad_bucket_size_is_refused_before_any_rank_runs(cluster):
    with pytest.raises(ValueError, match="bucket_cap_mb must be positive"):
        bucket_timeline(cluster, "mlp", 32, 0)


@pytest.mark.parametrize("cap, error", [
    ("25", TypeError), (True, TypeError), (-1, ValueError), (float("nan"), ValueError),
    (float("inf"), ValueError), (1e30, ValueError)])
def test_a_cap_that_is_not_a_positive_finite_number_is_refused_before_any_rank_runs(cap, error):
    class NoCluster:  # any rank started would be a bug: the check comes first
        world_size = 2

        def run(self, *args):
            raise AssertionError("ranks ran with a bad bucket_cap_mb")

    with pytest.raises(error, match="bucket_cap_mb"):
        bucket_timeline(NoCluster(), "mlp", 32, cap)


class _StandInEvent:
    """A CUDA event's interface: recorded in stream order, read after synchronize."""

    made: list = []

    def __init__(self):
        _StandInEvent.made.append(self)

    def record(self):
        import time
        self.at = time.perf_counter()

    def elapsed_time(self, other):
        return (other.at - self.at) * 1e3


def _marks_on_rank(ctx):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from labkit.lessons.data_parallel.overlap import _timed_hook
    from labkit.runtime.comm.clock import DeviceClock

    clock, marks = DeviceClock(_StandInEvent, lambda: None), []
    ddp = DistributedDataParallel(torch.nn.Linear(8, 8))
    ddp.register_comm_hook(None, _timed_hook(marks, clock))
    ddp(torch.ones(2, 8)).sum().backward()
    return [type(m[k]).__name__ for m in marks for k in ("issued", "done")]


def test_the_hook_marks_issue_and_completion_on_the_ranks_clock(cluster):
    # on a GPU the host only queues work: a host timestamp in the callback marks a launch,
    # so both marks must be the clock's (CUDA events there, resolved after backward)
    for kinds in cluster.run(_marks_on_rank):
        assert kinds and set(kinds) == {"_StandInEvent"}


@pytest.mark.parametrize("batch", [0, -2, "32", 32.0])
def test_a_bad_global_batch_is_refused_before_any_rank_runs(cluster, batch):
    with pytest.raises(ValueError, match="global_batch"):
        bucket_timeline(cluster, "mlp", batch, 25)


def test_the_explorer_refuses_a_timeline_of_another_model_or_batch(cluster):
    from labkit.lessons.widgets import bucket_explorer

    model = sized("mlp", 5e5)
    measured = bucket_timeline(cluster, model, 32, 25)
    figure = bucket_explorer(cluster, model, 32, caps=(25,), interactive=False,
                             measured=[measured])  # the same setup: drawn from the cache
    assert figure is not None
    for other_model, other_batch in ((sized("mlp", 2e5), 32), (model, 16)):
        with pytest.raises(ValueError, match="another model, batch or cluster"):
            bucket_explorer(cluster, other_model, other_batch, caps=(25,), interactive=False,
                            measured=[measured])
