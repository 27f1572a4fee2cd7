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
