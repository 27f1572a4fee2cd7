"""``labkit.Cluster``: N real ranks that live across notebook cells.

    with labkit.Cluster(4) as cluster:          # 4 virtual GPUs on CPU (or 4 GPUs)
        cluster.run(lambda ctx: ctx.rank)       # -> [0, 1, 2, 3]

Data flows one way: the notebook sends a function (shipped by value with cloudpickle, so it
may be defined in a cell), every rank runs it, results come back in rank order.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import warnings
import weakref
from datetime import timedelta
from multiprocessing.connection import wait

import cloudpickle

from labkit.cluster.errors import ClusterError, RankError, RunTimeout
from labkit.cluster.hardware import gpu_count, physical_cores, resolve_device
from labkit.cluster.processes import Processes, RankHandle
from labkit.cluster.progress import RunProgress
from labkit.cluster.rank import RankSpec
from labkit.memory import DeviceOOM, parse_bytes

FAILURE_GRACE_S = 0.3  # after a first failure, wait this long for the others' reports
POLL_S = 0.1


class OversubscriptionWarning(UserWarning):
    """More CPU ranks than physical cores: ranks share cores, so timings are not per-device."""


warnings.filterwarnings("once", category=OversubscriptionWarning)


class RunResults(list):
    """Per-rank return values in rank order, plus how they were obtained."""

    def __init__(self, values, *, world_size: int, device: str, backend: str,
                 oversubscribed: bool, seconds: float, shared_gpus: bool = False):
        super().__init__(values)
        self.world_size, self.device, self.backend = world_size, device, backend
        self.oversubscribed, self.seconds, self.shared_gpus = oversubscribed, seconds, shared_gpus


class Cluster:
    """A persistent group of ``world_size`` ranks running ``torch.distributed``.

    Args:
        world_size: number of ranks (processes), one device each.
        device: "cuda" (one GPU per rank, NCCL), "cpu" (virtual GPUs: one core each, gloo),
            or "auto" (GPUs when there are enough, else CPU). With more "cuda" ranks than
            GPUs and a ``memory_per_device``, ranks share GPUs (round robin, gloo), each
            capped to its share; ``shared_gpus`` and results say so.
        memory_per_device: each device's capacity ("2GB", "512MiB", bytes, or None for the
            whole device). On a virtual GPU labkit enforces it; on a GPU CUDA's allocator is
            limited to it. Past it, ``labkit.DeviceOOM``. Can be changed between runs.
        progress: show a live progress bar when ranks call ``ctx.progress``.
        start_timeout: seconds allowed for the ranks to start and join the process group.
    """

    def __init__(self, world_size: int, device: str = "auto", *,
                 memory_per_device: int | str | None = None, progress: bool = True,
                 start_timeout: float = 120.0):
        self.memory_per_device = memory_per_device  # validated before any process starts
        self.device, self.shared_gpus = resolve_device(world_size, device, self._capacity_bytes)
        # NCCL refuses two ranks on one GPU: shared GPUs talk over gloo.
        self.backend = "nccl" if self.device == "cuda" and not self.shared_gpus else "gloo"
        self.progress = progress
        self.start_timeout = start_timeout
        self._procs = Processes()
        self._finalizer = weakref.finalize(self, self._procs.shutdown)
        self._store = None
        self._generation = 0
        self._job_id = 0
        self._busy = threading.Lock()  # one run at a time (cells and widget threads share it)
        self._set_world_size(world_size)
        self._start()

    # ----- life cycle -------------------------------------------------------------------
    def _set_world_size(self, world_size: int) -> None:
        self.world_size = world_size
        self.oversubscribed = self.device == "cpu" and world_size > physical_cores()
        if self.oversubscribed:
            warnings.warn(
                f"{world_size} CPU ranks on {physical_cores()} physical cores: ranks share "
                "cores, so times are not those of separate devices (results say so)",
                OversubscriptionWarning, stacklevel=3)

    def _start(self) -> None:
        import torch.distributed as dist

        deadline = time.monotonic() + self.start_timeout
        if not self._procs.zygote_alive():
            self._procs.start_zygote(deadline)
        if self._store is None:  # the rendezvous lives in this process: no port to guess
            self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                        timeout=timedelta(seconds=60))
        self._generation += 1
        for rank in range(self.world_size):
            gpu = rank % max(1, gpu_count()) if self.device == "cuda" else None
            self._procs.spawn(RankSpec(rank, self.world_size, self.device, self.backend,
                                       self._store.port, self._generation, self.oversubscribed,
                                       gpu_index=gpu))
        pending = {h.rank for h in self._procs.ranks}
        while pending:
            for handle, message in self._poll(pending):
                if message[0] == "ready":
                    handle.info = message[1]
                    pending.discard(handle.rank)
                elif message[0] in ("error", "died"):
                    self._procs.kill_ranks()
                    raise ClusterError(f"rank {handle.rank} could not start: "
                                       f"{self._describe(handle, message)[1]}")
            if time.monotonic() > deadline:
                self._procs.kill_ranks()
                raise ClusterError(f"ranks {sorted(pending)} did not start within "
                                   f"{self.start_timeout:.0f} s")

    def resize(self, world_size: int) -> None:
        """Restart with a different number of ranks (the zygote, and torch, stay loaded)."""
        _, shared_gpus = resolve_device(world_size, self.device, self._capacity_bytes)
        with self._busy:
            self.shared_gpus = shared_gpus
            self.backend = "nccl" if self.device == "cuda" and not shared_gpus else "gloo"
            self._procs.kill_ranks()
            self._set_world_size(world_size)
            self._start()

    @contextlib.contextmanager
    def resized(self, world_size: int):
        """``with cluster.resized(n):`` runs at ``n`` ranks, and the old count comes back
        after, whatever happened inside (resizing inside the block is allowed)."""
        original = self.world_size
        if world_size != original:
            self.resize(world_size)
        try:
            yield self
        finally:
            if self.world_size != original and not self.closed:
                self.resize(original)

    def close(self) -> None:
        """Stop every rank and the launcher. The cluster cannot be used afterwards."""
        self._finalizer()
        if self._store is not None:
            self._store = None

    @property
    def memory_per_device(self) -> int | None:
        """Each device's capacity in bytes (None: the whole device)."""
        return self._capacity_bytes

    @memory_per_device.setter
    def memory_per_device(self, value: int | str | None) -> None:
        self._capacity_bytes = parse_bytes(value)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- running ----------------------------------------------------------------------
    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> RunResults:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; return the results in rank order.

        Raises ``DeviceOOM`` if a rank runs out of device memory, ``RankError`` if any rank
        raises otherwise or dies, ``RunTimeout`` after ``timeout`` seconds. In every case,
        and on KeyboardInterrupt, the ranks are stopped and restart on the next run.
        """
        if self.closed:
            raise ClusterError("this cluster is closed: create a new labkit.Cluster")
        if not callable(fn):
            raise TypeError(f"run() needs a function fn(ctx, ...), got {fn!r}")
        try:
            payload = cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:
            raise TypeError(f"cannot send {getattr(fn, '__name__', fn)!r} and its arguments "
                            f"to the ranks: {exc}") from exc
        with self._busy:
            return self._run_locked(payload, timeout)

    def _run_locked(self, payload: bytes, timeout: float | None) -> RunResults:
        if not self._procs.ranks:
            self._start()  # after a failure: fresh ranks, a fresh process group
        self._job_id += 1
        started = time.monotonic()
        options = {"capacity_bytes": self._capacity_bytes}
        for handle in self._procs.ranks:
            handle.conn.send(("run", self._job_id, payload, options))
        progress = RunProgress(self.world_size, enabled=self.progress)
        try:
            values = self._collect(self._job_id, started, timeout, progress)
        except BaseException:
            self._procs.kill_ranks()
            raise
        finally:
            progress.close()
        return RunResults(values, world_size=self.world_size, device=self.device,
                          backend=self.backend, oversubscribed=self.oversubscribed,
                          seconds=time.monotonic() - started, shared_gpus=self.shared_gpus)

    def _collect(self, job_id: int, started: float, timeout, progress: RunProgress) -> list:
        results: dict[int, object] = {}
        failures: list[tuple[RankHandle, tuple]] = []
        first_failure = None
        pending = set(range(self.world_size))
        while pending:
            for handle, message in self._poll(pending):
                kind = message[0]
                if kind == "progress" and message[1] == job_id:
                    progress.update(handle.rank, *message[2:])
                elif kind == "result" and message[1] == job_id:
                    results[handle.rank] = cloudpickle.loads(message[2])
                    pending.discard(handle.rank)
                elif kind in ("error", "died"):
                    failures.append((handle, message))
                    pending.discard(handle.rank)
                    first_failure = first_failure or time.monotonic()
            now = time.monotonic()
            if first_failure and (not pending or now - first_failure > FAILURE_GRACE_S):
                raise self._rank_error(failures)
            if timeout is not None and now - started > timeout:
                raise RunTimeout(f"run did not finish within {timeout} s: ranks "
                                 f"{sorted(pending)} were still running and were stopped")
        return [results[rank] for rank in range(self.world_size)]

    def _poll(self, ranks: set[int]):
        """Yield (handle, message) for ranks in ``ranks`` that sent something; POLL_S at most."""
        handles = {h.conn: h for h in self._procs.ranks if h.rank in ranks}
        ready = wait([*handles, self._procs.zygote_sock], timeout=POLL_S)
        for conn in ready:
            if conn is self._procs.zygote_sock:
                self._procs.read_zygote()
                continue
            handle = handles[conn]
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = ("died",)
            if message[0] == "stream":
                stream = sys.stdout if message[1] == "stdout" else sys.stderr
                prefix = f"[rank {handle.rank}] "
                stream.write("".join(prefix + line for line in message[2].splitlines(True)))
                continue
            yield handle, message

    def _describe(self, handle: RankHandle, message: tuple) -> tuple[str, str, str]:
        """(short, long message, remote traceback) for an 'error' or 'died' message."""
        if message[0] == "died":
            code = self._procs.exitcode(handle.pid)
            if code is not None and code < 0:
                how = f"killed by signal {signal.Signals(-code).name}"
            else:
                how = f"exit code {code}" if code is not None else "exit code unknown"
            text = f"process {handle.pid} died ({how})"
            return f"died ({how})", text, ""
        _, _, type_name, text, tb, _ = message
        return f"raised {type_name}", f"{type_name}: {text}", tb

    def _rank_error(self, failures: list) -> RankError | DeviceOOM:
        # The root cause first: an OOM anywhere, then a rank that died (its peers' collectives
        # fail *because* it died, and their reports can arrive first), then the first error.
        def cause(failure) -> int:
            message = failure[1]
            if message[0] == "error" and message[2] == "DeviceOOM":
                return 0
            return 1 if message[0] == "died" else 2

        failures = sorted(failures, key=cause)
        handle, message = failures[0]
        _, text, tb = self._describe(handle, message)
        exitcode = self._procs.exitcode(handle.pid) if message[0] == "died" else None
        exception = None
        if message[0] == "error" and message[5] is not None:
            exception = cloudpickle.loads(message[5])
        if isinstance(exception, DeviceOOM):
            exception.remote_traceback = tb
            return exception
        others = tuple(f"rank {h.rank}: {self._describe(h, m)[0]}" for h, m in failures[1:])
        return RankError(handle.rank, text, tb, exitcode, exception, others)

    # ----- showing ----------------------------------------------------------------------
    @property
    def ranks(self) -> list[dict]:
        """One dict per rank: rank, pid, device, backend, threads."""
        return [dict(h.info or {"rank": h.rank}) for h in self._procs.ranks]

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._procs.ranks)} ranks up"
        note = ", oversubscribed" if self.oversubscribed else ""
        note += ", GPUs shared" if self.shared_gpus else ""
        return (f"Cluster(world_size={self.world_size}, device={self.device!r}, "
                f"backend={self.backend!r}{note}; {state})")

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{r.get('rank')}</td><td>{r.get('pid', '')}</td><td>{r.get('device', '')}"
            f"</td><td>{r.get('backend', '')}</td><td>{r.get('threads', '')}</td></tr>"
            for r in self.ranks)
        return (f"<b>{self!r}</b><table><tr><th>rank</th><th>pid</th><th>device</th>"
                f"<th>backend</th><th>threads</th></tr>{rows}</table>")
