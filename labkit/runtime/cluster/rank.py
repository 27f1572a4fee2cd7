"""The life of one rank: join the process group, then run jobs sent by the notebook.

A rank is a process forked from the zygote (see ``zygote.py``). It talks to the notebook
over one socket: jobs come in; results, errors and progress go out. A reader thread takes
every message in, so that the notebook can ask a busy rank where it is (a run that timed
out names the rank that held it up). File descriptors 1 and 2 are pipes to the notebook:
whatever the rank prints, from Python or from C, is shown there.
"""

from __future__ import annotations

import ctypes
import gc
import io
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from labkit.runtime.cluster.messages import dumps_result, error_message, where
from labkit.runtime.memory import MemoryTracker
from labkit.runtime.memory.capacity import apply_capacity, as_device_oom
from labkit.runtime.memory.coverage import countable_rnn_kernels, follow_threads, track_kept

PROGRESS_INTERVAL_S = 0.1  # at most ten progress messages a second per rank
_PR_SET_DUMPABLE = 4  # linux/prctl.h


@dataclass(frozen=True)
class RankSpec:
    """What the notebook tells a new rank: who it is and how to find its peers."""

    rank: int
    world_size: int
    device_type: str  # "cpu" or "cuda"
    backend: str  # "gloo" or "nccl"
    store_port: int
    generation: int  # bumped on every restart, so old rendezvous keys never clash
    oversubscribed: bool
    gpu_index: int | None = None  # which GPU (ranks may share one), None on CPU
    pg_timeout_s: float = 300.0  # a collective that waits longer than this fails
    threads: int = 1  # host threads for torch's CPU work
    ranks_on_gpu: int = 1  # ranks sharing this rank's GPU (each gets a share without a cap)
    forked: bool = False  # forked from the notebook's process (see launcher.py)


class _Channel:
    """The rank's end of its socket; sends are serialised because user threads may report."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple) -> None:
        with self._lock:
            self.conn.send(message)


@dataclass
class RankContext:
    """What a function run on the cluster receives as its first argument, ``ctx``.

    ``state`` is a dict that lives on the rank across runs (keep a model there between cells).
    ``memory`` tracks this rank's device memory by category; with a capacity set
    (``Cluster(memory_per_device=...)``) every job runs inside it and an allocation past the
    capacity raises ``labkit.DeviceOOM``.
    """

    rank: int
    world_size: int
    device: torch.device
    backend: str
    group: Any
    oversubscribed: bool
    memory: MemoryTracker
    state: dict = field(default_factory=dict)
    _channel: Any = field(default=None, repr=False)
    _job_id: int = field(default=0, repr=False)
    _last_progress: float = field(default=0.0, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def progress(self, done: int, total: int, desc: str = "") -> None:
        """Report ``done`` of ``total`` units of work; the notebook shows a live bar (under
        torchrun, rank 0 prints one line per report instead)."""
        now = time.monotonic()
        if done < total and now - self._last_progress < PROGRESS_INTERVAL_S:
            return
        self._last_progress = now
        if self._channel is not None:
            self._channel.send(("progress", self._job_id, int(done), int(total), desc))
        elif self.rank == 0:
            print(f"{desc}: {done}/{total}", file=sys.stderr, flush=True)

    def barrier(self) -> None:
        dist.barrier(group=self.group)


def _die_with_parent() -> None:
    """Never outlive the zygote: Linux kills us when it dies; elsewhere a thread polls."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="labkit-parent-watch", daemon=True).start()


def _readable_from_outside() -> None:
    """Let the notebook's process read this rank's ``/proc`` entries (its sockets: a check
    counts the bytes that crossed them, ``labkit/runtime/comm/sockets.py``), also when that
    process made itself non-dumpable (the grader's checker, ``labkit/classroom/checker.py``),
    a flag a forked rank inherits."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _own_streams() -> None:
    """Python's streams on fds 1 and 2 (the pipes to the notebook), line by line, so that
    ``sys.stdout.fileno()`` works (``faulthandler.enable()`` needs it)."""
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # C's stdio buffers (a pipe is not line-buffered)
    except (OSError, AttributeError):
        pass


def _refuse_threads_after_fork() -> None:
    """A rank forked from the notebook cannot use OpenMP threads (it would hang for good)."""
    original = torch.set_num_threads

    def set_num_threads(n: int) -> None:
        if n > 1:
            raise RuntimeError(
                f"torch.set_num_threads({n}) on a rank forked from the notebook's process: "
                "OpenMP cannot start threads there (it would hang). Create the cluster with "
                "labkit.Cluster(..., launcher='fresh') for more than one thread per rank")
        original(n)

    torch.set_num_threads = set_num_threads


def _init_device(spec: RankSpec) -> torch.device:
    if spec.forked:
        _refuse_threads_after_fork()
    torch.set_num_threads(spec.threads)  # a virtual GPU: one core; a GPU's host: a share
    if spec.device_type == "cuda":
        torch.cuda.set_device(spec.gpu_index)
        return torch.device("cuda", spec.gpu_index)
    return torch.device("cpu")


def _join_group(spec: RankSpec, device: torch.device) -> None:
    store = dist.TCPStore("127.0.0.1", spec.store_port, is_master=False,
                          timeout=timedelta(seconds=60))
    store = dist.PrefixStore(f"generation-{spec.generation}", store)
    dist.init_process_group(
        spec.backend, store=store, rank=spec.rank, world_size=spec.world_size,
        timeout=timedelta(seconds=spec.pg_timeout_s),
        device_id=device if spec.backend == "nccl" else None,
    )


def _call(ctx: RankContext, fn, args, kwargs):
    """Run the learner's function; under the memory tracker when the device has a capacity,
    with what the tracker alone would miss made visible (``labkit/runtime/memory/coverage.py``)."""
    if getattr(ctx.memory, "device_capacity", None) is None:
        return fn(ctx, *args, **kwargs)
    gc.collect()  # what earlier runs left in reference cycles is not this run's memory
    track_kept(ctx.memory, ctx.state)  # tensors kept from runs without a cap count too
    with ctx.memory, follow_threads(ctx.memory), countable_rnn_kernels():
        return fn(ctx, *args, **kwargs)


def settle(ctx: RankContext) -> None:
    """End of a run: wait for the device's queued work and meet the other ranks, so that a
    run's errors (a collective one rank never joined) belong to that run, not the next."""
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    if ctx.backend == "nccl":
        dist.barrier(group=ctx.group, device_ids=[ctx.device.index])
        torch.cuda.synchronize(ctx.device)


def _run_job(ctx: RankContext, channel: _Channel, job_id: int, payload: bytes,
             options: dict) -> None:
    ctx._job_id, ctx._last_progress = job_id, 0.0
    try:
        apply_capacity(ctx.memory, ctx.device, options.get("capacity_bytes"),
                       options.get("ranks_on_gpu", 1))
        fn, args, kwargs = _loads(payload)
        result = _call(ctx, fn, args, kwargs)
        settle(ctx)
        result_bytes = _dump(fn, result)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the notebook
        if isinstance(exc, torch.OutOfMemoryError):
            exc = as_device_oom(exc, ctx.memory, ctx.device).with_traceback(exc.__traceback__)
        _flush_all()
        channel.send(error_message(job_id, exc, skip_frames=2))
        return
    _flush_all()
    channel.send(("result", job_id, result_bytes))


def _loads(payload: bytes):
    import cloudpickle

    return cloudpickle.loads(payload)


def _dump(fn, result) -> bytes:
    try:
        return dumps_result(result)
    except Exception as exc:  # noqa: BLE001 - reported to the notebook as a TypeError
        raise TypeError(f"the result of {getattr(fn, '__name__', fn)!r} cannot be sent back "
                        f"to the notebook ({exc}); return plain Python values or tensors"
                        ) from None


def _read_messages(channel: _Channel, jobs: queue.SimpleQueue, main_thread: int) -> None:
    """The reader thread: jobs go to the main thread; 'where' is answered at once."""
    while True:
        try:
            message = channel.conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the notebook went away
        if message[0] == "where":
            channel.send(("where", message[1], where(main_thread)))
        else:
            jobs.put(message)


def main(fd: int, spec: RankSpec) -> None:
    """Entry point of a freshly forked rank; runs jobs until the notebook closes the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook stops ranks, not Ctrl-C
    _die_with_parent()
    _readable_from_outside()
    _own_streams()
    channel = _Channel(Connection(fd))
    try:
        device = _init_device(spec)
        _join_group(spec, device)
    except BaseException as exc:  # noqa: BLE001
        _flush_all()
        channel.send(error_message(None, exc))
        os._exit(1)
    ctx = RankContext(spec.rank, spec.world_size, device, spec.backend, dist.group.WORLD,
                      spec.oversubscribed, MemoryTracker(spec.rank), _channel=channel)
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_messages, args=(channel, jobs, threading.get_ident()),
                     name="labkit-rank-reader", daemon=True).start()
    channel.send(("ready", {"rank": spec.rank, "pid": os.getpid(), "device": str(device),
                            "backend": spec.backend, "threads": torch.get_num_threads(),
                            "ranks_on_gpu": spec.ranks_on_gpu if device.type == "cuda" else 0}))
    while True:
        message = jobs.get()
        if message[0] == "run":
            _run_job(ctx, channel, *message[1:])
