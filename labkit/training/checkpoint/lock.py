"""One run at a time in a checkpoint folder: ``checkpoint_dir/LOCK``.

Two runs saving into one folder would pass each other's checkpoints off as their own (the
fingerprint is the same when the configs are) and race on the same ``step-N`` names. The
run takes an exclusive ``flock`` on ``LOCK`` for as long as it trains, and writes its pid,
host and start time into it, so the second run is told who holds the folder.

The kernel lets go of a ``flock`` when its holder's process ends, however it ends (SIGKILL
included): a ``LOCK`` left behind by a dead run holds no lock, and the next run takes it
over (its pid and host are overwritten). No pid is ever guessed alive or dead, so two runs
that find one stale ``LOCK`` at once cannot both take it. A ``flock`` is per open file,
so two runs in one process (two threads of a notebook) are kept apart too.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from labkit.training.checkpoint.store import CheckpointError

LOCK = "LOCK"


class CheckpointLock:
    """The lock on ``root`` (taken by ``take``; ``release`` or the process's end frees it)."""

    def __init__(self, root):
        self.path = Path(root) / LOCK
        self.file = None

    def take(self) -> CheckpointLock:
        """Hold the folder, or raise ``CheckpointError`` saying who does."""
        try:  # the rules' check cannot see every refusal (root, read-only or special mounts)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            file = open(self.path, "a+")  # noqa: SIM115 - held open for the whole run
        except OSError as exc:
            raise CheckpointError(f"checkpoint_dir {str(self.path.parent)!r} cannot be made or "
                                  f"written to ({exc.strerror}): give a folder you may write "
                                  f"in") from exc
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = _describe(file.read())
            file.close()
            raise CheckpointError(
                f"checkpoint_dir {str(self.path.parent)!r} is in use by another run "
                f"({holder}): wait until it ends, or give this run another checkpoint_dir"
            ) from None
        file.seek(0)
        file.truncate()
        json.dump({"pid": os.getpid(), "host": socket.gethostname(),
                   "since": time.strftime("%Y-%m-%d %H:%M:%S")}, file)
        file.flush()
        self.file = file
        return self

    def release(self) -> None:
        if self.file is not None:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_UN)
            self.file.close()
            self.file = None

    def __enter__(self) -> CheckpointLock:
        return self.take()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_checkpoints(root) -> CheckpointLock | None:
    """The lock on ``root``, taken; None when the run saves no checkpoints."""
    return None if root is None else CheckpointLock(root).take()


def _describe(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"pid {holder['pid']} on {holder['host']}, since {holder['since']}"
    except (ValueError, KeyError, TypeError):
        return "it is starting"
