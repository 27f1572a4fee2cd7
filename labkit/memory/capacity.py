"""Give a rank's device a capacity: enforced by labkit on a virtual GPU, by CUDA on a GPU."""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import _disable_current_modes

from labkit.memory.oom import DeviceOOM
from labkit.memory.tracker import MemoryTracker


def apply_capacity(tracker: MemoryTracker, device: torch.device,
                   capacity_bytes: int | None) -> None:
    """Set the capacity for the next job. On CUDA the allocator itself is limited."""
    tracker.capacity_bytes = capacity_bytes if device.type == "cpu" else None
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        fraction = 1.0 if capacity_bytes is None else min(1.0, capacity_bytes / total)
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    tracker.device_capacity = capacity_bytes


@contextlib.contextmanager
def on_host():
    """Work that a GPU job would do on the host (making a batch): not counted on the device."""
    with _disable_current_modes():
        yield


def as_device_oom(exc: torch.OutOfMemoryError, tracker: MemoryTracker,
                  device: torch.device) -> DeviceOOM:
    """CUDA's own OOM, re-raised as the suite's DeviceOOM with the rank's breakdown."""
    if isinstance(exc, DeviceOOM):
        return exc
    live = tracker.live()
    capacity = getattr(tracker, "device_capacity", None) or 0
    if device.type == "cuda":
        capacity = capacity or torch.cuda.get_device_properties(device).total_memory
        live["total"] = torch.cuda.memory_allocated(device)
    oom = DeviceOOM(tracker.rank, str(device), 0, capacity, live["total"], live)
    oom.args = (f"{oom.args[0]}\nCUDA said: {exc}",)
    return oom
