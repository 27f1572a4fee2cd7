"""``labkit.Cluster``: N real ranks that live across notebook cells.

    with labkit.Cluster(4) as cluster:          # 4 virtual GPUs on CPU (or 4 GPUs)
        cluster.run(lambda ctx: ctx.rank)       # -> [0, 1, 2, 3]

Data flows one way: the notebook sends a function (shipped by value with cloudpickle, so it
may be defined in a cell), every rank runs it, results come back in rank order. Whatever
happens (a rank killed from outside between runs, Ctrl-C in the middle of sending, ``close``
from another thread), the next run finds working ranks.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
import weakref
from datetime import timedelta

import labkit.runtime.cluster.hardware as hardware
from labkit.runtime.cluster.collect import collect, describe, load_results
from labkit.runtime.cluster.errors import ClusterError, RanksRestartedWarning, RunTimeout
from labkit.runtime.cluster.launcher import choose_launcher
from labkit.runtime.cluster.per_rank import jobs, payloads
from labkit.runtime.cluster.placement import (
    cluster_line,
    job_options,
    oversubscribed,
    rank_spec,
    warn_oversubscribed,
)
from labkit.runtime.cluster.processes import Processes
from labkit.runtime.cluster.progress import Listeners, RunProgress
from labkit.runtime.cluster.runs import RunResults, ranks_html, seconds
from labkit.runtime.memory import DeviceOOM, parse_bytes

CLOSE_WAIT_S = 10.0  # close() waits this long for a run in another thread to let go


class Cluster:
    """A persistent group of ``world_size`` ranks running ``torch.distributed``.

    Args:
        world_size: number of ranks (processes), one device each. More than the machine
            can hold (memory, cores, open files) is refused before any process starts.
        device: "cuda" (one GPU per rank, NCCL), "cpu" (virtual GPUs: one core each, gloo),
            or "auto" (GPUs when there are enough, else CPU). With more "cuda" ranks than
            GPUs, ranks share GPUs (round robin, gloo), each capped at ``memory_per_device``
            or, without it, at an even share; ``shared_gpus`` and results say so.
        memory_per_device: each device's capacity ("2GB", "512MiB", bytes, or None for the
            whole device). On a virtual GPU labkit enforces it; on a GPU CUDA's allocator is
            limited to it. Past it, ``labkit.DeviceOOM``. Can be changed between runs.
        progress: show a live progress bar when ranks call ``ctx.progress``.
        start_timeout: seconds allowed for the ranks to start and join the process group.
        collective_timeout: seconds a collective may wait for its peers before it fails
            (the process group's timeout).
        launcher: "auto" (fork this process when that is safe: instant start), "fork", or
            "fresh" (a new Python that imports torch: a few seconds, always safe).
        max_world_size: start more ranks than the machine's limit, on purpose.
    """

    def __init__(self, world_size: int, device: str = "auto", *,
                 memory_per_device: int | str | None = None, progress: bool = True,
                 start_timeout: float = 120.0, collective_timeout: float = 300.0,
                 launcher: str = "auto", max_world_size: int | None = None):
        self._closing = threading.Event()
        capacity = parse_bytes(memory_per_device)
        self.device, self.shared_gpus = hardware.resolve_device(world_size, device, capacity)
        hardware.check_world_size(world_size, self.device, max_world_size)
        hardware.check_capacity(world_size, self.device, self.shared_gpus, capacity)
        self._capacity_bytes = capacity
        self.start_timeout = seconds(start_timeout, "start_timeout", allow_none=False)
        self.collective_timeout = seconds(collective_timeout, "collective_timeout", False)
        self.launcher = choose_launcher(launcher, self.device)
        self.max_world_size = max_world_size
        self.progress = progress
        self._procs = Processes()
        self._finalizer = weakref.finalize(self, self._procs.shutdown)
        self._store = None
        self._generation = 0
        self._job_id = 0
        self._warned_oversubscribed = False
        self._busy = threading.Lock()  # one run at a time (cells and widget threads share it)
        self._listeners = Listeners()  # per thread: see listening()
        self._set_world_size(world_size)
        self._start(time.monotonic() + self.start_timeout)

    # ----- life cycle -------------------------------------------------------------------
    @property
    def backend(self) -> str:
        # NCCL refuses two ranks on one GPU: shared GPUs talk over gloo.
        return "nccl" if self.device == "cuda" and not self.shared_gpus else "gloo"

    def _set_world_size(self, world_size: int) -> None:
        self.world_size = world_size
        self.oversubscribed = oversubscribed(self.device, world_size)
        if self.oversubscribed and not self._warned_oversubscribed:
            self._warned_oversubscribed = True  # once per cluster, however often it resizes
            warn_oversubscribed(world_size)

    def _start(self, deadline: float) -> None:
        """Start every rank and wait until each has joined the process group. Interrupted
        or failed at any point, it leaves no rank behind."""
        import torch.distributed as dist

        try:
            if not self._procs.zygote_alive():
                self._procs.start_zygote(self.launcher, deadline)
            if self._store is None:  # the rendezvous lives in this process: no port to guess
                self._store = dist.TCPStore("127.0.0.1", 0, is_master=True,
                                            wait_for_workers=False, timeout=timedelta(seconds=60))
            self._generation += 1
            for rank in range(self.world_size):
                self._procs.spawn(rank_spec(self, rank, self._store.port, self._generation,
                                            self._procs.kind == "fork"))
            self._await_ready(deadline)
        except BaseException:
            self._procs.kill_ranks()
            raise

    def _await_ready(self, deadline: float) -> None:
        pending = {h.rank for h in self._procs.ranks}
        while pending:
            for handle, message in self._procs.poll(pending, 0.1):
                if message[0] == "ready":
                    handle.info = message[1]
                    pending.discard(handle.rank)
                elif message[0] in ("error", "died"):
                    raise ClusterError(f"rank {handle.rank} could not start: "
                                       f"{describe(self._procs, handle, message)[1]}")
            if pending and time.monotonic() > deadline:
                raise ClusterError(f"ranks {sorted(pending)} did not start within "
                                   f"{self.start_timeout:.0f} s")

    def _revive(self) -> None:
        """Before a run: start ranks if there are none, and restart them (saying so) if one
        died since the last run or the launcher is gone."""
        if not self._procs.zygote_alive() and self._procs.zygote is not None:
            code = self._procs.zygote.poll()
            self._procs.kill_ranks()
            self._procs.drop_zygote()
            warnings.warn(f"the rank launcher ended between runs (exit code {code}); it and "
                          "every rank were started again: ctx.state is empty",
                          RanksRestartedWarning, stacklevel=5)
        dead = self._procs.dead_ranks() if self._procs.ranks else []
        if dead:
            how = "; ".join(f"rank {h.rank} {describe(self._procs, h, ('died',))[1]}"
                            for h in dead)
            self._procs.kill_ranks()
            warnings.warn(f"{how} between runs: every rank was started again, so ctx.state "
                          "is empty", RanksRestartedWarning, stacklevel=5)
        if not self._procs.ranks:
            self._start(time.monotonic() + self.start_timeout)

    def resize(self, world_size: int) -> None:
        """Restart with a different number of ranks (the launcher, and torch, stay loaded)."""
        self._check_open()
        device, shared_gpus = hardware.resolve_device(world_size, self.device,
                                                      self._capacity_bytes)
        hardware.check_world_size(world_size, self.device, self.max_world_size)
        hardware.check_capacity(world_size, device, shared_gpus, self._capacity_bytes)
        with self._busy:
            self._check_open()
            self._procs.kill_ranks()
            self.shared_gpus = shared_gpus
            self._set_world_size(world_size)
            self._start(time.monotonic() + self.start_timeout)

    @contextlib.contextmanager
    def resized(self, world_size: int):
        """``with cluster.resized(n):`` work on ``n`` ranks, then return to the rank count
        the cluster had (the explorers measure each setting this way)."""
        original = self.world_size
        try:  # the stop button may be pressed while the ranks start, too
            if world_size != original:
                self.resize(world_size)
            yield self
        finally:
            if not self.closed and self.world_size != original:
                self.resize(original)

    @contextlib.contextmanager
    def listening(self, listener):
        """``with cluster.listening(f):`` each progress report of a run this thread starts
        calls ``f(rank, done, total, desc)`` (a widget's live view). Per thread: a widget's
        background run never hears, nor acts on, a run another cell starts meanwhile."""
        with self._listeners.listening(listener):
            yield self

    def close(self) -> None:
        """Stop every rank and the launcher. The cluster cannot be used afterwards. From
        another thread, a run in progress ends with ClusterError."""
        self._closing.set()
        self._procs.signal_ranks()  # a run blocked in another thread returns now
        locked = self._busy.acquire(timeout=CLOSE_WAIT_S)
        try:
            self._finalizer()
            self._store = None
        finally:
            if locked:
                self._busy.release()

    def _check_open(self) -> None:
        if self.closed:
            raise ClusterError("this cluster is closed: create a new labkit.Cluster")

    @property
    def memory_per_device(self) -> int | None:
        """Each device's capacity in bytes (None: the whole device, or an even share of a
        GPU that ranks share)."""
        return self._capacity_bytes

    @memory_per_device.setter
    def memory_per_device(self, value: int | str | None) -> None:
        capacity = parse_bytes(value)
        hardware.check_capacity(self.world_size, self.device, self.shared_gpus, capacity)
        self._capacity_bytes = capacity

    @property
    def closed(self) -> bool:
        return self._closing.is_set() or not self._finalizer.alive

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- running ----------------------------------------------------------------------
    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> RunResults:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; return the results in rank order.

        Raises ``DeviceOOM`` if a rank runs out of device memory, ``RankError`` if any rank
        raises otherwise or dies, ``RunTimeout`` after ``timeout`` seconds (counted from
        this call, waiting for another run included). In every case, and on
        KeyboardInterrupt, the ranks are stopped and restart on the next run.
        """
        timeout = seconds(timeout, "timeout")
        deadline = None if timeout is None else time.monotonic() + timeout
        self._check_open()
        if not callable(fn):
            raise TypeError(f"run() needs a function fn(ctx, ...), got {fn!r}")
        pickled = payloads(fn, args, kwargs, self.world_size)  # a PerRank: one per rank
        if not self._busy.acquire(timeout=-1 if deadline is None else timeout):
            raise RunTimeout(f"run did not start within {timeout} s: another run (another "
                             "thread or a widget) held the cluster all that time; nothing ran")
        try:
            self._check_open()
            return self._run_locked(pickled, deadline, timeout)
        finally:
            self._busy.release()

    def _run_locked(self, pickled: list[bytes], deadline: float | None,
                    timeout) -> RunResults:
        started = time.monotonic()
        try:
            self._revive()  # (starting ranks has its own timeout, not the run's)
            if deadline is not None:
                deadline += time.monotonic() - started
            self._job_id += 1
            options = job_options(self, self._capacity_bytes)
            self._procs.send_all(jobs(self._job_id, pickled, options))
            progress = RunProgress(self.world_size, enabled=self.progress,
                                   listener=self._listeners.current())
            try:
                blobs = collect(self._procs, self._job_id, self.world_size, deadline, timeout,
                                progress)
            except DeviceOOM:
                progress.out_of_memory()
                raise
            finally:
                progress.close()
        except BaseException as exc:
            self._procs.kill_ranks()
            if self._closing.is_set():
                raise ClusterError("the cluster was closed while this run was running: its "
                                   "ranks were stopped") from exc
            raise
        return RunResults(load_results(blobs), world_size=self.world_size, device=self.device,
                          backend=self.backend, oversubscribed=self.oversubscribed,
                          seconds=time.monotonic() - started, shared_gpus=self.shared_gpus)

    # ----- showing ----------------------------------------------------------------------
    @property
    def ranks(self) -> list[dict]:
        """One dict per rank: rank, pid, device, backend, threads."""
        return [dict(h.info or {"rank": h.rank}) for h in self._procs.ranks]

    def __repr__(self) -> str:
        return cluster_line(self, len(self._procs.ranks))

    def _repr_html_(self) -> str:
        return ranks_html(repr(self), self.ranks)
