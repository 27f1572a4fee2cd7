"""Timing that measures work, not its launch (issue 18), proven on CPU with a stand-in device
stream: launching returns at once and the work finishes later, in order, as on a GPU. The
same code paths time collectives, the phases of a step and a pipeline's timeline; and a
step's communication is all recorded, in its own step, when the step ends."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from labkit.parallel.pipeline.timeline import StageTimeline
from labkit.runtime.comm.clock import DeviceClock, HostClock
from labkit.runtime.comm.intercept import CollectiveMeter, _complete_collective, _wrap
from labkit.runtime.comm.meter import CommMeter
from labkit.training.step.spmd import run_step

WORK_S = 0.2


class SlowStream:
    """A stand-in device queue: ``launch`` returns at once, its work ends later, in order."""

    def __init__(self):
        self.done_at = time.perf_counter()

    def launch(self, seconds: float) -> None:
        self.done_at = max(self.done_at, time.perf_counter()) + seconds

    def event(self):
        return _Event(self)

    def synchronize(self) -> None:
        time.sleep(max(0.0, self.done_at - time.perf_counter()))


class _Event:
    """Fires when the work queued before it is done (``torch.cuda.Event``'s contract)."""

    def __init__(self, stream: SlowStream):
        self.stream, self.at = stream, None

    def record(self) -> None:
        self.at = max(self.stream.done_at, time.perf_counter())

    def elapsed_time(self, end: _Event) -> float:
        return (end.at - self.at) * 1e3  # milliseconds


def _device_clock(stream: SlowStream) -> DeviceClock:
    clock = DeviceClock(stream.event, stream.synchronize)
    clock.start()
    return clock


def test_a_device_clock_times_the_work_a_host_clock_only_its_launch():
    stream = SlowStream()
    clock, host = _device_clock(stream), HostClock()
    a, host_a = clock.mark(), host.mark()
    stream.launch(WORK_S)
    b, host_b = clock.mark(), host.mark()
    assert host.seconds(host_b) - host.seconds(host_a) < WORK_S / 4  # the launch
    clock.synchronize()
    assert clock.seconds(b) - clock.seconds(a) == pytest.approx(WORK_S, abs=0.05)  # the work
    start = clock.now()
    stream.launch(WORK_S)
    assert clock.now() - start >= WORK_S * 0.9  # a boundary waits for the device


class _Launching(nn.Module):
    """A layer whose forward only queues work on the stand-in stream."""

    def __init__(self, stream: SlowStream):
        super().__init__()
        self.stream, self.weight = stream, nn.Parameter(torch.ones(2))

    def forward(self, x):
        self.stream.launch(WORK_S)
        return x * self.weight


def test_a_step_s_phases_are_device_time():
    stream = SlowStream()
    model = _Launching(stream)
    batch = (torch.ones(4, 2), torch.zeros(4, 2))
    loss = nn.functional.mse_loss
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    on_device = run_step(model, batch, loss, optimizer, "fp32", clock=_device_clock(stream))
    on_host = run_step(model, batch, loss, optimizer, "fp32", clock=HostClock())
    assert on_device["forward_s"] >= WORK_S * 0.9
    assert on_host["forward_s"] < WORK_S / 4  # what a host clock saw on CUDA before


class _CompletedWork:
    """An NCCL-like work: its future completes when the collective is queued."""

    def __init__(self):
        self.future = torch.futures.Future()
        self.future.set_result(None)

    def get_future(self):
        return self.future


def _collective_seconds(clock, stream: SlowStream) -> float:
    def all_reduce(tensor, group=None, async_op=False):
        stream.launch(WORK_S)  # queued; the device runs it later
        return _CompletedWork()

    collective = _wrap(all_reduce, "all_reduce", _complete_collective("tensor"))
    meter = CommMeter(clock)
    with CollectiveMeter(meter):
        collective(torch.ones(8), async_op=True)
    (stat,) = meter.stats
    assert (stat.kind, stat.calls, stat.bytes) == ("all_reduce", 1, 32)
    return stat.seconds


def test_a_collective_is_timed_to_its_end_on_the_device():
    stream = SlowStream()
    assert _collective_seconds(_device_clock(stream), stream) == pytest.approx(WORK_S, abs=0.05)
    stream.synchronize()
    assert _collective_seconds(HostClock(), stream) < WORK_S / 4


def test_a_pipeline_timeline_is_device_time():
    stream = SlowStream()
    timeline = StageTimeline(_device_clock(stream))
    start = timeline.clock.mark()
    stream.launch(WORK_S)
    timeline.record("F", 0, start, timeline.clock.mark(), stage=0)
    timeline.clock.synchronize()
    (event,) = timeline.take()
    assert event["end"] - event["start"] == pytest.approx(WORK_S, abs=0.05)
    assert abs(event["end"] - time.time()) < 5  # wall-clock seconds, shared by all ranks


class _LateWork:
    """A work whose completion callback runs on another thread, later (as gloo's do): the
    caller that waited for the work may go on before the callback has run."""

    def __init__(self):
        self.future = torch.futures.Future()
        threading.Timer(WORK_S, lambda: self.future.set_result(None)).start()

    def get_future(self):
        return self.future


def test_a_step_s_communication_is_complete_when_the_step_ends():
    """The race seen in CI (a DDP step recorded with no communication): a step's collectives
    are recorded before its meter is read, every time, and not in the next step's."""
    def all_reduce(tensor, group=None, async_op=False):
        return _LateWork()

    collective = _wrap(all_reduce, "all_reduce", _complete_collective("tensor"))
    this_step, next_step = CommMeter(), CommMeter()
    with CollectiveMeter(this_step):
        collective(torch.ones(4), async_op=True)
    assert this_step.calls == 1 and this_step.busy_s >= WORK_S * 0.9
    with CollectiveMeter(next_step):
        pass
    assert next_step.calls == 0
