"""Clocks that time work where it runs: on the host for CPU ranks, on the stream for GPUs.

A CPU rank's host does the work itself, so the host clock is exact. A GPU's host only queues
work (kernels, NCCL collectives, point-to-point transfers) and moves on: a host timestamp
taken after a launch marks the launch, not the end of the work. :class:`DeviceClock` records
events in the device's stream instead (CUDA events): an event fires when the work queued
before it is done, so a region between two marks is device time. Marks are resolved to
seconds after :meth:`synchronize`, on the same axis as :meth:`now` (``time.perf_counter``),
which itself waits for the device, so phase boundaries and device marks line up.

Every measurement of the step uses one clock: the collectives' intervals
(``runtime/comm/intercept.py``), the phases of a step (``training/step/spmd.py``), a pipeline's
timeline, the embedding lookups and the per-layer timing of tensor parallelism.
"""

from __future__ import annotations

import time

import torch


class HostClock:
    """Host time: exact where the host does the work (CPU ranks)."""

    def start(self) -> None:
        """Begin a window (a step): nothing to anchor on the host."""

    def now(self) -> float:
        return time.perf_counter()

    def mark(self) -> float:
        return time.perf_counter()

    def synchronize(self) -> None:
        """Wait for the device: the host is the device here."""

    def seconds(self, mark: float) -> float:
        return mark


class DeviceClock:
    """Time as the device's stream sees it, from events recorded in stream order.

    ``event`` makes an event with ``record()`` and ``elapsed_time(other)`` (milliseconds),
    ``synchronize`` waits until the device is idle: ``torch.cuda.Event(enable_timing=True)``
    and ``torch.cuda.synchronize`` on a GPU; a stand-in stream in the tests.
    """

    def __init__(self, event=None, synchronize=None):
        self._event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self._synchronize = synchronize or torch.cuda.synchronize
        self._anchor = None
        self._anchor_s = 0.0

    def start(self) -> None:
        """Anchor the device's time to the host's: an event recorded on an idle device."""
        self._synchronize()
        self._anchor_s = time.perf_counter()
        self._anchor = self._event()
        self._anchor.record()

    def now(self) -> float:
        """A boundary: the host waits for the device, then reads its clock."""
        self._synchronize()
        return time.perf_counter()

    def mark(self):
        if self._anchor is None:
            self.start()
        event = self._event()
        event.record()
        return event

    def synchronize(self) -> None:
        self._synchronize()

    def seconds(self, mark) -> float:
        """When the work queued before ``mark`` finished (call after :meth:`synchronize`)."""
        return self._anchor_s + self._anchor.elapsed_time(mark) / 1e3


def clock_for(device: torch.device) -> HostClock | DeviceClock:
    return DeviceClock() if device.type == "cuda" else HostClock()
