"""The zygote: one process that imports torch once, then forks every rank.

Forking from an interpreter that has already imported torch (and never touched CUDA) makes
starting 8 ranks cost little more than starting 1. The zygote also reaps its children and
tells the notebook how each one ended, and takes them all down if the notebook goes away.

Protocol (SOCK_SEQPACKET, one pickled tuple per packet):
    notebook -> zygote: ("spawn", RankSpec) with the rank's socket attached as a file descriptor
    zygote -> notebook: ("ready", pid), ("spawned", rank, pid), ("exited", pid, rank, exitcode)
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import sys

REAP_INTERVAL_S = 0.05


def _exitcode(status: int) -> int:
    """Like Popen.returncode: negative for a signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _fork_rank(sock: socket.socket, spec, rank_fd: int) -> int:
    pid = os.fork()
    if pid == 0:  # the new rank
        code = 1
        try:
            sock.close()
            from labkit.cluster import rank

            rank.main(rank_fd, spec)
            code = 0
        finally:
            os._exit(code)
    os.close(rank_fd)
    return pid


def _reap(sock: socket.socket, children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        rank = children.pop(pid, -1)
        sock.send(pickle.dumps(("exited", pid, rank, _exitcode(status))))


def _kill_all(children: dict[int, int]) -> None:
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in list(children):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def serve(fd: int, preload: list[str]) -> None:
    """Serve spawn requests on socket ``fd`` until the notebook closes it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in preload:
        __import__(name)
    sock = socket.socket(fileno=fd)
    sock.send(pickle.dumps(("ready", os.getpid())))
    children: dict[int, int] = {}
    try:
        while True:
            readable, _, _ = select.select([sock], [], [], REAP_INTERVAL_S)
            if readable:
                data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
                if not data:
                    break  # the notebook is gone
                message = pickle.loads(data)
                if message[0] == "spawn":
                    spec = message[1]
                    pid = _fork_rank(sock, spec, fds[0])
                    children[pid] = spec.rank
                    sock.send(pickle.dumps(("spawned", spec.rank, pid)))
            _reap(sock, children)
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        _kill_all(children)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2].split(",") if len(sys.argv) > 2 else [])
