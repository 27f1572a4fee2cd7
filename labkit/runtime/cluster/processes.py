"""The processes behind a Cluster: one zygote and its ranks, their output, how they are stopped.

Kept apart from ``Cluster`` so that a finalizer can kill them without holding the Cluster
alive: closing it, garbage collection and interpreter exit all end here. Only the process
that started them may stop them: a child that the notebook forks (``os.fork()``, a
multiprocessing worker) closes its copies of their sockets and leaves them alone.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from labkit.runtime.cluster.errors import ClusterError
from labkit.runtime.cluster.launcher import others_held, start_zygote
from labkit.runtime.cluster.output import RankStream, drain
from labkit.runtime.cluster.untrusted import loads
from labkit.runtime.cluster.zygote import kill_group

EXIT_WAIT_S = 5.0
SPAWN_REPORT_S = 2.0  # how long the zygote may take to say which pid a new rank got
FORK_READY_S = 10.0  # a forked zygote answers at once; if not, a fresh one is started


@dataclass
class RankHandle:
    rank: int
    conn: Connection
    streams: tuple[RankStream, RankStream]  # its stdout and stderr
    pid: int | None = None
    info: dict | None = None


class Processes:
    """One zygote and the ranks it forked for the current generation."""

    def __init__(self):
        self.owner = os.getpid()
        self.zygote = None  # subprocess.Popen or launcher.ForkedZygote
        self.zygote_sock: socket.socket | None = None
        self.kind: str | None = None  # "fork" or "fresh"
        self.ranks: list[RankHandle] = []
        self.exitcodes: dict[int, int] = {}  # pid -> exit code, as reported by the zygote
        _LIVE.add(self)

    def zygote_alive(self) -> bool:
        return self.zygote is not None and self.zygote.poll() is None

    def start_zygote(self, kind: str, deadline: float) -> None:
        """Start the zygote and wait for its hello; a forked one that stays silent is
        replaced by a fresh one (a lock held by a thread of this process at fork time)."""
        self.drop_zygote()
        with others_held():  # a grader's sandbox: nothing else runs until the hello
            self.zygote, self.zygote_sock = start_zygote(kind)
            self.kind = kind
            ready = self._hello(kind, deadline)
        if not ready:
            return self.start_zygote("fresh", deadline)
        self.read_zygote()

    def _hello(self, kind: str, deadline: float) -> bool:
        """Wait for the new zygote's hello; False: a forked one stayed silent (try fresh)."""
        limit = min(deadline, time.monotonic() + FORK_READY_S) if kind == "fork" else deadline
        while not wait([self.zygote_sock], timeout=0.05):
            if self.zygote.poll() is not None:
                raise ClusterError(f"the rank launcher exited with code {self.zygote.returncode}"
                                   " while importing torch: run `python -m labkit doctor`")
            if time.monotonic() > limit:
                self.drop_zygote()
                if kind == "fork" and time.monotonic() < deadline:
                    return False
                raise ClusterError("the rank launcher did not start in time")
        return True

    def drop_zygote(self) -> None:
        """Forget a zygote (stopping it if it still runs)."""
        if self.zygote_sock is not None:
            try:
                self.zygote_sock.send(pickle.dumps(("exit",)))
            except OSError:
                pass
            self.zygote_sock.close()
            self.zygote_sock = None
        if self.zygote is not None:
            try:
                self.zygote.wait(timeout=EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                self.zygote.kill()
                self.zygote.wait()
            self.zygote = None

    def spawn(self, spec) -> RankHandle:
        ours, theirs = socket.socketpair()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        streams = (RankStream(out_read, spec.rank, "stdout"),
                   RankStream(err_read, spec.rank, "stderr"))
        handle = RankHandle(spec.rank, Connection(ours.detach()), streams)
        self.ranks.append(handle)  # known before it is asked for: an interrupt cannot orphan it
        try:
            socket.send_fds(self.zygote_sock, [pickle.dumps(("spawn", spec))],
                            [theirs.fileno(), out_write, err_write])
        finally:
            theirs.close()
            os.close(out_write)
            os.close(err_write)
        return handle

    def send_all(self, messages: list[bytes]) -> None:
        """A job to every rank, ``messages[rank]`` to each. A rank that cannot take it has
        died: the collection that follows reports it as the cause."""
        for handle in self.ranks:
            try:
                handle.conn.send_bytes(messages[handle.rank])
            except OSError:
                pass

    def read_zygote(self) -> None:
        """Take in every message the zygote has sent so far, without blocking."""
        while self.zygote_sock is not None:
            try:
                data = self.zygote_sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError, OSError):
                return
            if not data:
                return
            message = loads(data)
            if message[0] == "spawned":
                _, rank, pid = message
                for handle in self.ranks:
                    if handle.rank == rank and handle.pid is None:
                        handle.pid = pid
            elif message[0] == "exited":
                self.exitcodes[message[1]] = message[3]

    def poll(self, ranks: set[int], timeout: float):
        """Yield (handle, message) for ranks in ``ranks`` that sent something or ended, and
        show what ranks printed; waits ``timeout`` seconds at most."""
        handles = {h.conn: h for h in self.ranks if h.rank in ranks}
        streams = [s for h in self.ranks for s in h.streams if s.fd >= 0]
        sources = [*handles, *streams] + ([self.zygote_sock] if self.zygote_sock else [])
        ready = wait(sources, timeout=timeout)
        for source in ready:
            if isinstance(source, RankStream):
                source.read()
        if self.zygote_sock in ready:
            self.read_zygote()
        for conn, handle in handles.items():
            if conn not in ready and handle.pid not in self.exitcodes:
                continue
            try:  # an ended rank's socket may live on in a child of it: do not wait for it
                readable = conn in ready or conn.poll(0)
                message = loads(conn.recv_bytes()) if readable else ("died",)
            except (EOFError, OSError, pickle.UnpicklingError):
                message = ("died",)
            yield handle, message

    def streams(self) -> list[RankStream]:
        return [s for h in self.ranks for s in h.streams]

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

    def _learn_pids(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while (self.zygote_alive() and time.monotonic() < deadline
               and any(h.pid is None for h in self.ranks)):
            if wait([self.zygote_sock], timeout=0.05):
                self.read_zygote()

    def dead_ranks(self) -> list[RankHandle]:
        """Ranks whose process ended since the last run (killed from outside, a timer...)."""
        self.read_zygote()
        dead = []
        for handle in self.ranks:
            try:
                while handle.conn.poll(0):  # end of file, or stray messages to discard
                    handle.conn.recv_bytes()
            except (EOFError, OSError):
                dead.append(handle)
                continue
            if handle.pid is None or handle.pid in self.exitcodes or _ended(handle.pid):
                dead.append(handle)
        return dead

    def signal_ranks(self) -> None:
        """SIGKILL every rank's process group now; safe from any thread (nothing changes)."""
        if os.getpid() != self.owner:
            return
        for handle in list(self.ranks):
            if handle.pid is not None:
                kill_group(handle.pid)

    def kill_ranks(self) -> None:
        """Stop every rank at once (they may be stuck in a collective) and wait until reaped."""
        if os.getpid() != self.owner:
            return
        self.read_zygote()
        self._learn_pids(SPAWN_REPORT_S)
        pids = [h.pid for h in self.ranks if h.pid is not None]
        for pid in pids:
            kill_group(pid)
        self._await_exits(pids, EXIT_WAIT_S)
        drain(self.streams())  # what they printed before they died
        for handle in self.ranks:
            handle.conn.close()
            for stream in handle.streams:
                stream.close()
        self.ranks = []

    def shutdown(self) -> None:
        """Stop the ranks and the zygote. Safe to call more than once."""
        if os.getpid() != self.owner:
            return
        self.kill_ranks()
        self.drop_zygote()
        _LIVE.discard(self)

    def _forget(self) -> None:
        """In a child forked from the notebook: these processes are the parent's."""
        for handle in self.ranks:
            handle.conn.close()
            for stream in handle.streams:
                stream.close()
        if self.zygote_sock is not None:
            self.zygote_sock.close()
        self.ranks, self.zygote, self.zygote_sock = [], None, None


def _ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie: its main thread is gone, though its other
    threads, and so its sockets, may not be yet)."""
    if not os.path.isdir("/proc/self"):
        return False  # no /proc (macOS): the socket's end of file and the zygote tell
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False


_LIVE: weakref.WeakSet[Processes] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for processes in list(_LIVE):
        processes._forget()
    _LIVE.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
