"""Run a command, then kill every process it left behind: how ``labkit grade`` runs papermill.

    python labkit/classroom/reaper.py COMMAND [ARGS...]    # exit status: the command's

A graded notebook runs arbitrary code. When papermill ends, the kernel is shut down, but a
process the notebook started in a session or process group of its own
(``subprocess.Popen(..., start_new_session=True)``, a double fork with ``os.setsid()``)
outlives it, reparented to init. On Linux this process makes itself the *child subreaper* of
everything below it (``prctl(PR_SET_CHILD_SUBREAPER)``), so such orphans become its children
instead, and it kills them all once the command has exited. Elsewhere it kills what is still
below it (orphans that left the tree are out of reach there).

Run as a script (not ``-m labkit...``) so that it starts in milliseconds, without torch.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import psutil

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Adopt the orphans of this process's descendants (Linux only); True if it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def kill_descendants(timeout: float = 10.0) -> int:
    """SIGKILL every process below this one, wait for them; return how many there were."""
    left = psutil.Process().children(recursive=True)
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=timeout)
    return len(left)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    become_subreaper()
    try:
        code = subprocess.call(argv, close_fds=False)  # the grader's verdict pipe too
    finally:
        kill_descendants()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
