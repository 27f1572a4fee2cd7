"""What this machine offers, and what it can hold: cores, memory, GPUs, file descriptors.
Read in the notebook's process, before any rank starts."""

from __future__ import annotations

import math
import os
import resource

import psutil

from labkit.runtime.memory.units import format_bytes

DEVICES = ("auto", "cpu", "cuda")
# Private memory (USS) of one CPU rank forked from the launcher, measured on Linux with torch
# 2.13: ~7 MiB idle in a gloo group, 24-46 MiB after training a default zoo model with DDP.
# Each rank is budgeted twice that, so that the ranks a machine takes can also train.
RANK_MEMORY_BYTES = 96 * 2**20
# Ranks per physical core for CPU ranks: on 2 cores, 64 ranks joined their group in ~6 s and
# 128 in ~14 s, and every collective step then waits for all of them in turn.
RANKS_PER_CORE = 32
# GPU memory a rank sharing a GPU is given at least: its CUDA context alone takes hundreds of
# MiB of the GPU before any tensor (gpu-check.sh prints what it is on the GPU it runs on).
CUDA_RANK_BYTES = 2**30
NOTEBOOK_FDS_PER_RANK = 3  # a socket and two output pipes in the notebook's process
SPARE_FDS = 64


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


def gpu_memory_bytes() -> int:
    """Memory of the smallest visible GPU (0 without GPUs)."""
    import torch

    return min((torch.cuda.get_device_properties(i).total_memory
                for i in range(gpu_count())), default=0)


def host_memory_bytes() -> int:
    return psutil.virtual_memory().total


def ranks_per_gpu(world_size: int, gpus: int) -> int:
    """Ranks on the busiest GPU when ranks are dealt round robin."""
    return math.ceil(world_size / gpus) if gpus else 0


def host_threads(device: str, world_size: int) -> int:
    """torch's CPU threads per rank: one for a virtual GPU (one core's worth); a GPU rank's
    host work shares the cores evenly with the other ranks, instead of each taking all."""
    return 1 if device == "cpu" else max(1, physical_cores() // world_size)


def resolve_device(world_size: int, device: str, capacity_bytes: int | None) -> tuple[str, bool]:
    """(device type, whether ranks share GPUs), or a clear error before any process starts.

    With more "cuda" ranks than GPUs, ranks share GPUs (round robin, over gloo): each is
    capped at ``capacity_bytes``, or, without one, at an even share of its GPU."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be a whole number, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    gpus = gpu_count()
    if device == "cuda" and world_size > gpus:
        if gpus:
            return "cuda", True
        raise ValueError(f"asked for {world_size} GPU ranks but this machine has no GPU: use "
                         f"device='cpu' for {world_size} virtual GPUs")
    if device == "auto":
        return ("cuda" if 0 < world_size <= gpus else "cpu"), False
    return device, False


def check_capacity(world_size: int, device: str, shared_gpus: bool,
                   capacity_bytes: int | None) -> None:
    """Refuse a capacity the hardware cannot back: more than the machine's memory for a
    virtual GPU, more than a GPU holds, or caps of ranks sharing a GPU that add up past it."""
    if capacity_bytes is None:
        return
    if device == "cpu":
        total = host_memory_bytes()
        if capacity_bytes > total:
            raise ValueError(f"memory_per_device={format_bytes(capacity_bytes)} is more than "
                             f"this machine's {format_bytes(total)} of memory: a virtual GPU "
                             "cannot hold more than the machine; choose a smaller capacity")
        return
    gpus, total = gpu_count(), gpu_memory_bytes()
    sharing = ranks_per_gpu(world_size, gpus) if shared_gpus else 1
    if capacity_bytes * sharing > total:
        most = format_bytes(total // sharing)
        shared = (f"{sharing} ranks share one GPU of {format_bytes(total)}: {sharing} x "
                  f"{format_bytes(capacity_bytes)} does not fit" if sharing > 1 else
                  f"a GPU here holds {format_bytes(total)}")
        raise ValueError(f"memory_per_device={format_bytes(capacity_bytes)} cannot be given: "
                         f"{shared}. Choose at most {most} per rank"
                         + (", or fewer ranks" if sharing > 1 else ""))


def rank_limit(device: str) -> tuple[int, str]:
    """The most ranks this machine can hold, and why: memory, cores, file descriptors."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limits = [(max(1, (nofile - SPARE_FDS) // NOTEBOOK_FDS_PER_RANK),
               f"{nofile} open files allowed to this process (`ulimit -n`), "
               f"{NOTEBOOK_FDS_PER_RANK} per rank"),
              (max(1, int(psutil.virtual_memory().available // RANK_MEMORY_BYTES)),
               f"{format_bytes(psutil.virtual_memory().available)} of memory available, "
               f"about {format_bytes(RANK_MEMORY_BYTES)} per rank")]
    if device == "cpu":
        cores = physical_cores()
        limits.append((RANKS_PER_CORE * cores, f"{cores} physical core(s), at most "
                       f"{RANKS_PER_CORE} ranks per core"))
    elif gpu_count():
        per_gpu = max(1, gpu_memory_bytes() // CUDA_RANK_BYTES)
        limits.append((gpu_count() * per_gpu, f"{gpu_count()} GPU(s) of "
                       f"{format_bytes(gpu_memory_bytes())}, at least "
                       f"{format_bytes(CUDA_RANK_BYTES)} per rank"))
    return min(limits)


def check_world_size(world_size: int, device: str, max_world_size: int | None) -> None:
    """Refuse, before any process starts, more ranks than the machine can hold."""
    limit, reason = rank_limit(device)
    if max_world_size is not None:
        if isinstance(max_world_size, bool) or not isinstance(max_world_size, int):
            raise TypeError(f"max_world_size must be a whole number, got {max_world_size!r}")
        limit, reason = max_world_size, "max_world_size"
    if world_size > limit:
        raise ValueError(f"{world_size} ranks is more than this machine can hold: at most "
                         f"{limit} ({reason}). To start more on purpose, pass "
                         f"max_world_size={world_size}")
