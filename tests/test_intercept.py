"""The collective meter: what it counts, that it counts each collective once, from any
thread, and that torch.distributed is left as it was found, whatever happens inside."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from labkit.runtime.comm.intercept import CollectiveMeter
from labkit.runtime.comm.meter import CommMeter


def _restored_after_an_error(ctx):
    original = dist.all_reduce
    meter = CommMeter()
    try:
        with CollectiveMeter(meter):
            dist.all_reduce(torch.ones(4))
            raise RuntimeError("inside the step")
    except RuntimeError:
        pass
    return dist.all_reduce is original, meter.calls


def _nested(ctx):
    original = dist.all_reduce
    outer, inner = CommMeter(), CommMeter()
    with CollectiveMeter(outer):
        dist.all_reduce(torch.ones(1))
        with CollectiveMeter(inner):
            dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(3))
    dist.all_reduce(torch.ones(4))  # after the last exit: nobody counts it
    return outer.bytes, inner.bytes, dist.all_reduce is original


def _many_async(ctx, count):
    meter = CommMeter()
    tensors = [torch.ones(1000) for _ in range(count)]
    with CollectiveMeter(meter):
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for work in works:
            work.wait()
        shard = torch.empty(500)
        dist.reduce_scatter_single(shard, torch.ones(1000))  # gloo: a work without future
        gathered = torch.empty(2000)
        dist.all_gather_into_tensor(gathered, torch.ones(1000))  # calls all_gather_single
    return meter.calls, meter.by_kind, meter.wire_bytes


def _functional(ctx):
    import torch.distributed._functional_collectives as funcol

    meter = CommMeter()
    with CollectiveMeter(meter):
        out = funcol.all_reduce(torch.ones(8), "sum", dist.group.WORLD)
        value = out.sum().item()
    return value, meter.by_kind, len(meter.intervals)


def test_functions_are_restored_even_when_the_step_fails(two):
    assert two.run(_restored_after_an_error) == [(True, 1), (True, 1)]


def test_nested_meters_record_into_the_innermost(two):
    assert two.run(_nested) == [(16, 8, True)] * 2  # outer: 4 + 12 bytes; inner: 8


def test_async_works_are_counted_once_from_any_thread(two):
    for calls, kinds, wire in two.run(_many_async, 50):
        assert calls == 52
        assert kinds["all_reduce"] == [50, 50 * 4000, pytest.approx(50 * 4000.0)]  # 2(N-1)/N=1
        assert kinds["reduce_scatter"] == [1, 4000, pytest.approx(2000.0)]  # (N-1)/N
        assert kinds["all_gather"] == [1, 8000, pytest.approx(4000.0)]
        assert wire == pytest.approx(50 * 4000 + 2000 + 4000)


def test_functional_collectives_are_waited_for_and_counted(two):
    for value, kinds, intervals in two.run(_functional):
        assert value == 16.0 and kinds == {"all_reduce": [1, 32, pytest.approx(32.0)]}
        assert intervals == 1
