"""While memory is tracked on a CPU rank, a collective is over, buffers included, before the
step moves on.

Why: FSDP2 all-gathers a unit's parameters into one flat buffer (the unit's whole weights,
1.0 MiB for the 512-wide layer of the sharded-memory test) and, after the unit's backward,
drops that buffer together with the collective's ``Work``. gloo's ``Work`` holds views of the
buffer, and gloo's worker thread holds the ``Work`` for a moment after the collective
completes. When FSDP let go first, the buffer was freed later, on gloo's thread, after the
next unit's parameters were gathered: FSDP's measured peak on 2 ranks was then ~0.86 MiB
above the estimate (about 1 run in 8), depending only on how the OS scheduled gloo's thread.
Here each symmetric collective is waited for as it is issued, and then gloo's threads are
given the CPU until none is running (Linux: their state in /proc; at most a few ms), so its
buffers die when the program drops them, as the estimator (whose fake collectives complete
at once) assumes: the same peak on every run. Point-to-point sends and receives are left
alone (waiting for a send before the peer's receive is posted could deadlock), and so are
GPU collectives, which do not block the host.
"""

from __future__ import annotations

import functools
import os
import threading
import time

import torch

# The longest a collective waits for gloo's threads to go idle: it returns as soon as they
# are (microseconds, normally). 5 ms was too short once in CI (a virtual machine whose host
# took the core away: 9 and 13 of 200 all-gathers freed late on the two ranks).
SETTLE_LIMIT_S = 0.02

_SYMMETRIC = ("allreduce_", "allreduce_coalesced_", "allgather_", "_allgather_base_",
              "allgather_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_",
              "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "broadcast_",
              "reduce_", "alltoall_", "alltoall_base_", "gather_", "scatter_", "barrier")


@functools.cache
def collective_ops() -> frozenset:
    """The c10d ops (as the dispatcher names them) of collectives every rank joins."""
    import torch.distributed  # noqa: F401 - registers the c10d ops

    ops = (getattr(torch.ops.c10d, name, None) for name in _SYMMETRIC)
    return frozenset(op.default for op in ops if op is not None)


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def settle_collective(func, args, result) -> None:
    """Wait for ``func``'s work if it is a collective over CPU tensors (see above)."""
    if func not in collective_ops():
        return
    tensor = _first_tensor(args)
    if tensor is not None and tensor.device.type != "cpu":
        return
    waited = False
    for item in result if isinstance(result, (tuple, list)) else (result,):
        if isinstance(item, torch.ScriptObject) and hasattr(item, "wait"):
            item.wait()
            waited = True
    if waited:
        _let_other_threads_finish(time.monotonic() + SETTLE_LIMIT_S)


def _let_other_threads_finish(deadline: float) -> None:
    """Yield the CPU until no other thread of this process is running (gloo's worker has
    put its finished Work down), or until ``deadline``."""
    me = threading.get_native_id()
    try:
        tasks = [int(t) for t in os.listdir("/proc/self/task") if int(t) != me]
    except OSError:  # not Linux: give the worker one chance to run
        os.sched_yield() if hasattr(os, "sched_yield") else time.sleep(0)
        return
    while time.monotonic() < deadline:
        if not any(_running(task) for task in tasks):
            return
        os.sched_yield()


def _running(task: int) -> bool:
    try:
        with open(f"/proc/self/task/{task}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"R"
    except (OSError, IndexError):
        return False
