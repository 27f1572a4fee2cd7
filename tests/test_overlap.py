"""DDP's overlap timeline (labkit/data_parallel/overlap.py): the buckets it draws are the ones
DDP made, for two bucket sizes, each AllReduce issued before it completed and within backward.
About 5 s: one 2-rank cluster, a 0.5M-parameter MLP, three DDP steps per bucket size."""

from __future__ import annotations

import pytest

import labkit
from labkit.data_parallel import bucket_timeline
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
