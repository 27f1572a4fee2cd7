"""Virtual GPU memory: the capacity is exact, the breakdown adds up, DeviceOOM says why."""

from __future__ import annotations

import pickle

import pytest
import torch

import labkit
from labkit.runtime.memory import DeviceOOM, MemoryTracker, format_bytes, parse_bytes

CAP = 1_000_000  # bytes


@pytest.fixture(scope="module")
def capped():
    with labkit.Cluster(1, device="cpu", memory_per_device=CAP, progress=False) as cluster:
        yield cluster


def _allocate(ctx, *sizes):
    kept = [torch.empty(n, dtype=torch.uint8) for n in sizes]
    return sum(t.numel() for t in kept)


def test_capacity_is_reached_exactly_and_not_passed(capped):
    assert capped.run(_allocate, CAP) == [CAP]  # exactly the capacity: fits
    assert capped.run(_allocate, CAP - 100, 100) == [CAP]
    with pytest.raises(DeviceOOM) as info:
        capped.run(_allocate, CAP - 100, 100, 1)  # one byte more: out of memory
    oom = info.value
    assert (oom.rank, oom.requested_bytes, oom.in_use_bytes, oom.capacity_bytes) == (0, 1, CAP,
                                                                                      CAP)
    assert oom.breakdown["total"] == CAP
    assert "add devices" in str(oom) or "batch size" in str(oom)
    assert capped.run(_allocate, CAP) == [CAP]  # the next run works


def test_tensors_kept_between_runs_still_count(capped):
    def keep_half(ctx):
        ctx.state["half"] = torch.empty(CAP // 2, dtype=torch.uint8)

    capped.run(keep_half)
    with pytest.raises(DeviceOOM):  # a fresh rank after this: ctx.state is gone
        capped.run(_allocate, CAP // 2 + 1)
    capped.run(keep_half)
    assert capped.run(_allocate, CAP // 2) == [CAP // 2]


def test_device_oom_is_torchs_out_of_memory_error_and_travels():
    oom = DeviceOOM(3, "cpu", 10, 100, 95, {"activations": 95, "total": 95})
    assert isinstance(oom, torch.OutOfMemoryError)
    copy = pickle.loads(pickle.dumps(oom))
    assert (copy.rank, copy.requested_bytes, copy.breakdown) == (3, 10, oom.breakdown)
    assert "rank 3" in str(copy) and "activations dominate" in str(copy)


def test_tracker_counts_resize_and_frees():
    tracker = MemoryTracker()
    with tracker:
        t = torch.empty(1000)
        assert tracker.live()["total"] == 4000
        t.untyped_storage().resize_(0)  # how FSDP2 frees gathered parameters
        assert tracker.live()["total"] == 0
        t.untyped_storage().resize_(400)
        assert tracker.live()["total"] == 400
        del t
        assert tracker.live()["total"] == 0


def test_sizes_are_read_and_written_like_people_do():
    assert parse_bytes("2GB") == 2 * 10**9
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes(1024) == 1024 and parse_bytes(None) is None
    assert format_bytes(1536) == "1.5 KiB"
    for bad in ("two GB", "-1GB", "3 parsecs", 0):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_bad_capacity_fails_before_any_process_starts():
    from tests.conftest import descendants

    before = descendants()
    with pytest.raises(ValueError, match="size"):
        labkit.Cluster(1, device="cpu", memory_per_device="lots")
    assert descendants() == before
