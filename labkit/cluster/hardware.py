"""What this machine offers: physical cores and GPUs. Read in the notebook's process."""

from __future__ import annotations

import os

import psutil


def physical_cores() -> int:
    """Cores this process may use, counting hyper-threads once."""
    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity API
        allowed = physical
    return max(1, min(physical, allowed))


def gpu_count() -> int:
    """Number of CUDA devices visible here (0 on a CPU-only machine)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


DEVICES = ("auto", "cpu", "cuda")


def resolve_device(world_size: int, device: str, capacity_bytes: int | None) -> tuple[str, bool]:
    """(device type, whether ranks share GPUs), or a clear error before any process starts."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be a whole number, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    gpus = gpu_count()
    if device == "cuda" and world_size > gpus:
        if gpus and capacity_bytes is not None:
            return "cuda", True  # ranks share GPUs, each capped to its share
        raise ValueError(f"asked for {world_size} GPU ranks but this machine has {gpus} GPU(s): "
                         f"use fewer ranks, device='cpu' for {world_size} virtual GPUs"
                         + (", or memory_per_device=... to share the GPUs" if gpus else ""))
    if device == "auto":
        return ("cuda" if 0 < world_size <= gpus else "cpu"), False
    return device, False
