"""The processes behind a Cluster: one zygote and its ranks, and how they are stopped.

Kept apart from ``Cluster`` so that a finalizer can kill them without holding the Cluster
alive: closing it, garbage collection and interpreter exit all end here.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from labkit.cluster.errors import ClusterError

# Imported once by the zygote so that every forked rank has them for free.
ZYGOTE_PRELOAD = ("torch", "torch.distributed", "cloudpickle", "labkit.cluster.rank",
                  "labkit.memory", "labkit.models")
EXIT_WAIT_S = 5.0


@dataclass
class RankHandle:
    rank: int
    conn: Connection
    pid: int | None = None
    info: dict | None = None


class Processes:
    """One zygote and the ranks it forked for the current generation."""

    def __init__(self):
        self.zygote: subprocess.Popen | None = None
        self.zygote_sock: socket.socket | None = None
        self.ranks: list[RankHandle] = []
        self.exitcodes: dict[int, int] = {}  # pid -> exit code, as reported by the zygote

    def zygote_alive(self) -> bool:
        return self.zygote is not None and self.zygote.poll() is None

    def start_zygote(self, deadline: float) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = (f"import sys; sys.path[:0] = {sys.path!r}; "
                f"from labkit.cluster.zygote import serve; "
                f"serve({theirs.fileno()}, {list(ZYGOTE_PRELOAD)!r})")
        # A session of its own: Jupyter's interrupt signals the kernel's whole process group,
        # and the ranks must be stopped by us, in order, not by a stray SIGINT.
        self.zygote = subprocess.Popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()],
                                       start_new_session=True)
        theirs.close()
        self.zygote_sock = ours
        while not wait([ours], timeout=0.1):
            if self.zygote.poll() is not None:
                raise ClusterError(f"the rank launcher exited with code {self.zygote.returncode} "
                                   "while importing torch: run `python -m labkit doctor`")
            if time.monotonic() > deadline:
                self.shutdown()
                raise ClusterError("the rank launcher did not start in time")
        self.read_zygote()

    def spawn(self, spec) -> RankHandle:
        ours, theirs = socket.socketpair()
        socket.send_fds(self.zygote_sock, [pickle.dumps(("spawn", spec))], [theirs.fileno()])
        theirs.close()
        handle = RankHandle(spec.rank, Connection(ours.detach()))
        self.ranks.append(handle)
        return handle

    def read_zygote(self) -> None:
        """Take in every message the zygote has sent so far, without blocking."""
        while True:
            try:
                data = self.zygote_sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not data:
                return
            message = pickle.loads(data)
            if message[0] == "spawned":
                _, rank, pid = message
                for handle in self.ranks:
                    if handle.rank == rank and handle.pid is None:
                        handle.pid = pid
            elif message[0] == "exited":
                self.exitcodes[message[1]] = message[3]

    def exitcode(self, pid: int | None, wait_s: float = 1.0) -> int | None:
        """How rank process ``pid`` ended, waiting briefly for the zygote to reap it."""
        self._await_exits([pid] if pid is not None else [], wait_s)
        return self.exitcodes.get(pid)

    def _await_exits(self, pids: list[int], wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while (self.zygote_alive() and time.monotonic() < deadline
               and not all(pid in self.exitcodes for pid in pids)):
            if wait([self.zygote_sock], timeout=0.05):
                self.read_zygote()

    def kill_ranks(self) -> None:
        """Stop every rank at once (they may be stuck in a collective) and wait until reaped."""
        pids = [h.pid for h in self.ranks if h.pid is not None]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for handle in self.ranks:
            handle.conn.close()
        self.ranks = []
        self._await_exits(pids, EXIT_WAIT_S)

    def shutdown(self) -> None:
        """Stop the ranks and the zygote. Safe to call more than once."""
        self.kill_ranks()
        if self.zygote_sock is not None:
            self.zygote_sock.close()  # the zygote exits when it reads end-of-file
            self.zygote_sock = None
        if self.zygote is not None:
            try:
                self.zygote.wait(timeout=EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                self.zygote.kill()
                self.zygote.wait()
            self.zygote = None
