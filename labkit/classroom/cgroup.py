"""A cgroup for one graded submission: its processes and memory limited together, and every
process in it killed when it ends (daemons, a fork bomb's children, ranks).

Made below the grader's own cgroup, in the v1 ``pids`` and ``memory`` hierarchies, or in v2;
it needs a writable ``/sys/fs/cgroup`` (root, or a delegated subtree). ``sandbox.py`` uses one
where it can and says so when not.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


class Cgroup:
    """A cgroup for one submission (v1 ``pids`` + ``memory`` hierarchies, or v2), below this
    process's own; ``kill()`` ends everything in it and removes it."""

    def __init__(self, limits):
        self.name = f"labkit-grade-{uuid.uuid4().hex[:12]}"
        self.dirs: list[Path] = []
        self.limits = limits
        try:
            self._make_all(limits)
        except OSError:
            self.kill()
            raise

    def _make_all(self, limits) -> None:
        if (CGROUP_ROOT / "cgroup.controllers").exists():
            self._make(CGROUP_ROOT, "", {"pids.max": limits.processes,
                                         "memory.max": limits.memory_bytes,
                                         "memory.swap.max": 0})
        else:
            self._make(CGROUP_ROOT / "pids", "pids", {"pids.max": limits.processes})
            self._make(CGROUP_ROOT / "memory", "memory",
                       {"memory.limit_in_bytes": limits.memory_bytes})

    def _make(self, root: Path, controller: str, values: dict) -> None:
        path = _own(root, controller) / self.name
        path.mkdir()
        self.dirs.append(path)
        for key, value in values.items():
            if (path / key).exists():
                (path / key).write_text(str(value))

    def join_command(self) -> list[str]:
        """A prefix that moves the command into the cgroup before it starts."""
        moves = "; ".join(f'echo $$ > "{d / "cgroup.procs"}"' for d in self.dirs)
        return ["/bin/sh", "-c", f'{moves}; exec "$@"', "sh"]

    def pids(self) -> set[int]:
        found = set()
        for d in self.dirs:
            try:
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    def events(self) -> list[str]:
        """The limits the submission ran into, one phrase each."""
        said = []
        for d in self.dirs:
            said += _count(d / "pids.events", "max",
                           f"hit the process limit ({self.limits.processes})")
            said += _count(d / "memory.events", "oom_kill", "was killed for memory")
            said += _count(d / "memory.oom_control", "oom_kill", "was killed for memory")
            if _read_int(d / "memory.failcnt"):
                said.append(f"reached the memory limit ({self.limits.memory_bytes >> 20} MiB)")
        return list(dict.fromkeys(said))

    def kill(self, timeout: float = 10.0) -> int:
        """SIGKILL every process in the cgroup until none is left; remove it. How many
        were killed."""
        killed, deadline = set(), time.monotonic() + timeout
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for d in reversed(self.dirs):
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:  # removed already (remove_stale)
                    break
                except OSError:
                    time.sleep(0.05)
        return len(killed)


def _own(root: Path, controller: str) -> Path:
    """This process's cgroup in the hierarchy at ``root`` (``controller``: "" for v2)."""
    own = next((line.split(":", 2)[2] for line in
                Path("/proc/self/cgroup").read_text().splitlines()
                if line.split(":", 2)[1] == controller), "/")
    return root / own.lstrip("/")


def remove_stale(min_age: float = 60.0) -> int:
    """Remove the empty submission cgroups a grader killed with SIGKILL left below this
    process's cgroup (older than ``min_age`` seconds: one being set up now is younger, and
    one in use has processes, which ``rmdir`` refuses to remove). How many were removed."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        places = [_own(CGROUP_ROOT, "")]
    else:
        places = [_own(CGROUP_ROOT / c, c) for c in ("pids", "memory")]
    removed = 0
    for place in places:
        for path in place.glob("labkit-grade-*"):
            try:
                if time.time() - path.stat().st_mtime >= min_age:
                    path.rmdir()
                    removed += 1
            except OSError:
                pass
    return removed


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _count(path: Path, key: str, phrase: str) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    counts = [int(v) for k, v in (line.split() for line in lines if line.count(" ") == 1)
              if k == key and v.isdigit()]
    return [phrase] if counts and counts[0] > 0 else []


@functools.lru_cache(maxsize=1)
def usable() -> bool:
    """Whether a cgroup can be made here."""
    try:
        from labkit.classroom.sandbox import Limits

        Cgroup(Limits()).kill()
        return True
    except OSError:
        return False
