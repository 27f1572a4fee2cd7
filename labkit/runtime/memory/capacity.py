"""Give a rank's device a capacity: enforced by labkit on a virtual GPU, by CUDA on a GPU."""

from __future__ import annotations

import contextlib
import re

import torch
from torch.utils._python_dispatch import _disable_current_modes

from labkit.runtime.memory.oom import DeviceOOM
from labkit.runtime.memory.tracker import MemoryTracker

_CUDA_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def apply_capacity(tracker: MemoryTracker, device: torch.device,
                   capacity_bytes: int | None, ranks_on_gpu: int = 1) -> None:
    """Set the capacity for the next job. On CUDA the allocator itself is limited: ranks that
    share a GPU without a capacity get an even share, and a lowered capacity empties
    PyTorch's cache (blocks it keeps would otherwise be handed out past the new limit)."""
    if device.type != "cuda":
        tracker.capacity_bytes = capacity_bytes
        tracker.device_capacity = capacity_bytes
        return
    total = torch.cuda.get_device_properties(device).total_memory
    if capacity_bytes is None and ranks_on_gpu > 1:
        capacity_bytes = total // ranks_on_gpu
    fraction = 1.0 if capacity_bytes is None else min(1.0, capacity_bytes / total)
    if fraction < getattr(tracker, "cuda_fraction", 1.0):
        torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    tracker.cuda_fraction = fraction
    tracker.capacity_bytes = None  # CUDA enforces it; the tracker gives the breakdown
    tracker.device_capacity = capacity_bytes


@contextlib.contextmanager
def on_host():
    """Work that a GPU job would do on the host (making a batch): not counted on the device."""
    with _disable_current_modes():
        yield


def cuda_requested_bytes(message: str) -> int:
    """The size in CUDA's "Tried to allocate 512.00 MiB" (0 if the message has none)."""
    match = re.search(r"Tried to allocate ([0-9.]+) ?(bytes|B|KiB|MiB|GiB|TiB)", message)
    return int(float(match.group(1)) * _CUDA_UNITS[match.group(2)]) if match else 0


def as_device_oom(exc: torch.OutOfMemoryError, tracker: MemoryTracker,
                  device: torch.device) -> DeviceOOM:
    """CUDA's own OOM, re-raised as the suite's DeviceOOM with the rank's tracked breakdown
    (jobs under a capacity run under the tracker) and CUDA's words kept whole."""
    if isinstance(exc, DeviceOOM):
        return exc
    live = tracker.live()
    capacity = getattr(tracker, "device_capacity", None) or 0
    if device.type == "cuda":
        capacity = capacity or torch.cuda.get_device_properties(device).total_memory
        live["total"] = torch.cuda.memory_allocated(device)
    text = str(exc)
    return DeviceOOM(tracker.rank, str(device), cuda_requested_bytes(text), capacity,
                     live["total"], live, detail=f"CUDA said: {text}")
