"""The life of one rank: join the process group, then run jobs sent by the notebook.

A rank is a process forked from the zygote (see ``zygote.py``). It talks to the notebook
over one socket: jobs come in, results, errors, progress and printed text go out.
"""

from __future__ import annotations

import ctypes
import io
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from labkit.memory import MemoryTracker
from labkit.memory.capacity import apply_capacity, as_device_oom

PROGRESS_INTERVAL_S = 0.1  # at most ten progress messages a second per rank


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
    pg_timeout_s: float = 300.0


class _Channel:
    """The rank's end of its socket; sends are serialised because user threads may print."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple) -> None:
        with self._lock:
            self.conn.send(message)


class _ForwardedStream(io.TextIOBase):
    """Replaces sys.stdout/sys.stderr on a rank: whole lines travel to the notebook."""

    def __init__(self, channel: _Channel, name: str):
        self._channel, self._name, self._buffer = channel, name, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._buffer += text
        if "\n" in self._buffer:
            lines, self._buffer = self._buffer.rsplit("\n", 1)
            self._channel.send(("stream", self._name, lines + "\n"))
        return len(text)

    def flush(self) -> None:
        if self._buffer:
            text, self._buffer = self._buffer, ""
            self._channel.send(("stream", self._name, text + "\n"))


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
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="labkit-parent-watch", daemon=True).start()


def _init_device(spec: RankSpec) -> torch.device:
    if spec.device_type == "cuda":
        torch.cuda.set_device(spec.gpu_index)
        return torch.device("cuda", spec.gpu_index)
    # A virtual GPU: one core's worth of compute.
    torch.set_num_threads(1)
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


def _error_message(job_id: int | None, exc: BaseException, skip_frames: int = 0) -> tuple:
    """An 'error' message; ``skip_frames`` drops labkit's own frames from the traceback."""
    tb = exc.__traceback__
    for _ in range(skip_frames):
        tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        exc_bytes = cloudpickle.dumps(exc)
        cloudpickle.loads(exc_bytes)
    except Exception:  # noqa: BLE001 - any exception may refuse pickling; send text only
        exc_bytes = None
    return ("error", job_id, type(exc).__name__, str(exc), text, exc_bytes)


def _call(ctx: RankContext, fn, args, kwargs):
    """Run the learner's function; under the memory tracker when the device has a capacity."""
    if ctx.memory.capacity_bytes is None:
        return fn(ctx, *args, **kwargs)
    with ctx.memory:
        return fn(ctx, *args, **kwargs)


def _run_job(ctx: RankContext, channel: _Channel, job_id: int, payload: bytes,
             options: dict) -> None:
    ctx._job_id, ctx._last_progress = job_id, 0.0
    try:
        apply_capacity(ctx.memory, ctx.device, options.get("capacity_bytes"))
        fn, args, kwargs = cloudpickle.loads(payload)
        result = _call(ctx, fn, args, kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the notebook
        if isinstance(exc, torch.OutOfMemoryError):
            exc = as_device_oom(exc, ctx.memory, ctx.device).with_traceback(exc.__traceback__)
        sys.stdout.flush()
        sys.stderr.flush()
        channel.send(_error_message(job_id, exc, skip_frames=2))
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        result_bytes = cloudpickle.dumps(result)
    except Exception as exc:  # noqa: BLE001 - reported to the notebook as a TypeError
        wrapped = TypeError(f"the result of {getattr(fn, '__name__', fn)!r} cannot be sent back "
                            f"to the notebook ({exc}); return plain Python values or tensors")
        channel.send(_error_message(job_id, wrapped))
        return
    channel.send(("result", job_id, result_bytes))


def main(fd: int, spec: RankSpec) -> None:
    """Entry point of a freshly forked rank; runs jobs until the notebook closes the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook stops ranks, not Ctrl-C
    _die_with_parent()
    channel = _Channel(Connection(fd))
    sys.stdout = _ForwardedStream(channel, "stdout")
    sys.stderr = _ForwardedStream(channel, "stderr")
    try:
        device = _init_device(spec)
        _join_group(spec, device)
    except BaseException as exc:  # noqa: BLE001
        channel.send(_error_message(None, exc))
        os._exit(1)
    ctx = RankContext(spec.rank, spec.world_size, device, spec.backend, dist.group.WORLD,
                      spec.oversubscribed, MemoryTracker(spec.rank), _channel=channel)
    channel.send(("ready", {"rank": spec.rank, "pid": os.getpid(), "device": str(device),
                            "backend": spec.backend, "threads": torch.get_num_threads()}))
    while True:
        try:
            message = channel.conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the notebook went away
        _run_job(ctx, channel, *message[1:])
