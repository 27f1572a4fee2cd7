"""The zygote: one process with torch imported that forks every rank.

Forking from an interpreter that has already imported torch (and never touched CUDA) makes
starting 8 ranks cost little more than starting 1. ``launcher.py`` starts the zygote, either
forked from the notebook's own process or as a fresh Python. The zygote also

* makes each rank the leader of a process group of its own, so that whatever user code
  starts on a rank (``subprocess.Popen``, a multiprocessing child) dies with the rank;
* is a *child subreaper* (Linux): a process that left its rank's group (``setsid``, a double
  fork) is re-parented to the zygote when its parent dies, and is killed once no rank is
  left alive;
* reaps ranks and tells the notebook how each one ended;
* takes everything down when the notebook goes away (its socket closes, or the zygote's
  parent changes because the notebook was killed);
* started ``guarded`` (for a grader's checker, whose ranks run untrusted code), is
  non-dumpable from its first statement (``launcher.GUARD``, before any import), so that no
  rank can read its memory or take it over through ``ptrace`` and
  report other pids as ranks; each rank is made dumpable again, so that the checker can
  still read its sockets in ``/proc``.

Protocol (SOCK_SEQPACKET, one pickled tuple per packet):
    notebook -> zygote: ("spawn", RankSpec) with the rank's socket, stdout and stderr pipes
        attached as file descriptors; ("exit",)
    zygote -> notebook: ("ready", pid), ("spawned", rank, pid), ("exited", pid, rank, exitcode)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import select
import signal
import socket
import sys
import time

REAP_INTERVAL_S = 0.05
KILL_ALL_S = 10.0  # the most the zygote spends taking everything down
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE = 4


def _exitcode(status: int) -> int:
    """Like Popen.returncode: negative for a signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def kill_group(pid: int) -> None:
    """SIGKILL rank ``pid`` and everything in its process group (what it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)  # not yet a group leader (killed right after fork)


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _set_dumpable(value: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, value, 0, 0, 0)


def _fork_rank(sock: socket.socket, spec, fds: list[int], guarded: bool = False) -> int:
    """Fork rank ``spec.rank``: ``fds`` are its socket, its stdout pipe and its stderr pipe."""
    rank_fd, out_fd, err_fd = fds
    pid = os.fork()
    if pid == 0:  # the new rank
        code = 1
        try:
            if guarded:
                _set_dumpable(1)  # a fork keeps the zygote's flag; the checker reads /proc
            os.setpgid(0, 0)
            sock.close()
            os.dup2(out_fd, 1)  # C and C++ output (NCCL's warnings) reach the notebook too
            os.dup2(err_fd, 2)
            os.close(out_fd)
            os.close(err_fd)
            from labkit.runtime.cluster import rank

            rank.main(rank_fd, spec)
            code = 0
        finally:
            os._exit(code)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also here, so the group exists before the notebook hears of it
    for fd in fds:
        os.close(fd)
    return pid


def _adopted(ranks: dict[int, int]) -> list[int]:
    """Children of the zygote that are not ranks: orphans it adopted as a subreaper."""
    import psutil

    try:
        return [p.pid for p in psutil.Process().children() if p.pid not in ranks]
    except psutil.Error:
        return []


def _reap(sock: socket.socket | None, ranks: dict[int, int]) -> None:
    reaped_rank = False
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid in ranks:
            rank = ranks.pop(pid)
            kill_group(pid)  # what the rank started dies with it
            reaped_rank = True
            if sock is not None:
                sock.send(pickle.dumps(("exited", pid, rank, _exitcode(status))))
    if reaped_rank and not ranks:
        for pid in _adopted(ranks):  # a generation is over: nothing of it may stay
            kill_group(pid)


def _kill_all(ranks: dict[int, int]) -> None:
    """Kill every rank, then every orphan it leaves (they are adopted only once their
    parent has died), until the zygote has no child left."""
    for pid in list(ranks):
        kill_group(pid)
    deadline = time.monotonic() + KILL_ALL_S
    while time.monotonic() < deadline:
        for pid in _adopted({}):
            kill_group(pid)
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(REAP_INTERVAL_S / 5)
        except ChildProcessError:
            return


def _serve_requests(sock: socket.socket, ranks: dict[int, int], guarded: bool) -> None:
    parent = os.getppid()
    while os.getppid() == parent:  # the notebook (our parent) was killed: stop
        readable, _, _ = select.select([sock], [], [], REAP_INTERVAL_S)
        if readable:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
            if not data:
                return  # the notebook closed its end
            message = pickle.loads(data)
            if message[0] == "exit":
                return
            if message[0] == "spawn" and len(fds) == 3:
                spec = message[1]
                pid = _fork_rank(sock, spec, fds, guarded)
                ranks[pid] = spec.rank
                sock.send(pickle.dumps(("spawned", spec.rank, pid)))
            else:
                for fd in fds:
                    os.close(fd)
        _reap(sock, ranks)


def serve(fd: int, preload: list[str], guarded: bool = False) -> None:
    """Serve spawn requests on socket ``fd`` until the notebook closes it or goes away;
    ``guarded``: the ranks' code is untrusted (see the module's docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)  # whatever handlers the notebook process had
    _become_subreaper()
    for name in preload:
        __import__(name)
    sock = socket.socket(fileno=fd)
    sock.send(pickle.dumps(("ready", os.getpid())))
    ranks: dict[int, int] = {}  # pid -> rank
    try:
        _serve_requests(sock, ranks, guarded)
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        _kill_all(ranks)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2].split(",") if len(sys.argv) > 2 else [])
