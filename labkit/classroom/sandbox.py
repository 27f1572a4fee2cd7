"""A sandbox per submission: bubblewrap (``bwrap``), resource limits, and a cgroup to end it.

What a graded submission's checker and ranks get (``command``):

* a filesystem of their own: the system (``/usr``, ``/lib``, ``/bin``, ``/etc``, ``/sys``)
  and this Python (its prefixes and the ``sys.path`` entries inside them) read-only, labkit's
  package alone at ``/opt/labkit/labkit`` (never the repository around it), the job's
  folder (the spec and the quiz files) read-only at ``/job``, and one writable place, a
  size-limited tmpfs at ``/tmp`` (the working folder), with ``/dev/shm`` alike. Nothing else
  is mounted: not the grader's home, not the course sources, not the other submissions nor the
  grades file;
* new user, pid, network, IPC and UTS namespaces (``--unshare-user --unshare-pid
  --unshare-net ...``): no network but a loopback of their own, on which the ranks' gloo
  runs; no capabilities, no nested user namespaces (``--disable-userns``); when the checker
  ends, every process left in its pid namespace is killed with it;
* limits (``prlimit``): address space per process, open files, file size, no core dumps; and
  in a cgroup of its own (v1 ``pids`` and ``memory``, or v2), the number of processes and the
  memory of the whole submission. As root (CI, containers) the process limit needs the cgroup
  (``RLIMIT_NPROC`` does not apply to root); elsewhere ``RLIMIT_NPROC`` stands in for it.

``problem()`` says why no sandbox can be made here (then ``labkit grade`` refuses, unless
``--unsafe-no-sandbox``).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import labkit

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Limits:
    """What one submission may use (its checker and all its ranks together, except where
    said)."""

    memory_bytes: int = 6 * 2**30  # the whole submission (cgroup), and each process (AS)
    processes: int = 256
    open_files: int = 1024  # per process
    disk_bytes: int = 512 * 2**20  # the tmpfs at /tmp, and /dev/shm alike


class SandboxError(RuntimeError):
    """No sandbox can be made on this machine; the message says why and what to do."""


LABKIT_MOUNT = "/opt/labkit"  # labkit's package is mounted at /opt/labkit/labkit


def _python_paths() -> list[str]:
    """This Python's installation: its prefixes and the ``sys.path`` entries inside them
    (never the current folder, a repository or ``PYTHONPATH``: they may hold the sources)."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix,
                str(Path(os.path.realpath(sys.executable)).parent.parent)}
    paths = {p for p in prefixes if Path(p).exists()}
    for entry in sys.path:
        if entry and Path(entry).exists() and any(
                Path(entry).resolve().is_relative_to(Path(p).resolve()) for p in prefixes):
            paths.add(entry)
    return sorted(paths)


@functools.lru_cache(maxsize=1)
def _bwrap_options() -> tuple[str, ...]:
    """The options this bwrap has beyond 0.4's (``--disable-userns`` came with 0.8)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return ()
    help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True).stdout
    return ("--disable-userns",) if "--disable-userns" in help_text else ()


def bwrap_arguments(job: Path, limits: Limits) -> list[str]:
    """The ``bwrap`` command line up to the command itself."""
    args = ["bwrap", "--unshare-user", "--uid", "1000", "--gid", "1000", *_bwrap_options(),
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent",
            "--new-session", "--clearenv"]
    for path in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys"):
        args += ["--ro-bind-try", path, path]
    for path in _python_paths():
        args += ["--ro-bind", path, path]
    args += ["--ro-bind", str(Path(labkit.__file__).parent), f"{LABKIT_MOUNT}/labkit"]
    args += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(limits.disk_bytes), "--tmpfs", "/tmp",
             "--size", str(limits.disk_bytes), "--tmpfs", "/dev/shm",
             "--ro-bind", str(job), "/job", "--chdir", "/tmp"]
    environment = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/tmp",
                   "LANG": "C.UTF-8", "LABKIT_GRADING": "1", "MPLBACKEND": "Agg",
                   "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": LABKIT_MOUNT}
    for name, value in environment.items():
        args += ["--setenv", name, value]
    return args


def prlimit_arguments(limits: Limits, with_nproc: bool) -> list[str]:
    args = ["prlimit", f"--as={limits.memory_bytes}", f"--nofile={limits.open_files}",
            f"--fsize={limits.disk_bytes}", "--core=0"]
    if with_nproc:  # counts every process of this user: the grader's own too
        args.append(f"--nproc={limits.processes + _own_processes()}")
    return args + ["--"]


def _own_processes() -> int:
    import psutil

    uid = os.getuid()
    return sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"].real == uid)


class Cgroup:
    """A cgroup for one submission (v1 ``pids`` + ``memory`` hierarchies, or v2), below this
    process's own; ``kill()`` ends everything in it and removes it."""

    def __init__(self, limits: Limits):
        self.name = f"labkit-grade-{uuid.uuid4().hex[:12]}"
        self.dirs: list[Path] = []
        self.limits = limits
        if (CGROUP_ROOT / "cgroup.controllers").exists():
            self._make(CGROUP_ROOT, "", {"pids.max": limits.processes,
                                         "memory.max": limits.memory_bytes,
                                         "memory.swap.max": 0})
        else:
            self._make(CGROUP_ROOT / "pids", "pids", {"pids.max": limits.processes})
            self._make(CGROUP_ROOT / "memory", "memory",
                       {"memory.limit_in_bytes": limits.memory_bytes})

    def _make(self, root: Path, controller: str, values: dict) -> None:
        own = next((line.split(":", 2)[2] for line in
                    Path("/proc/self/cgroup").read_text().splitlines()
                    if line.split(":", 2)[1] == controller), "/")
        path = root / own.lstrip("/") / self.name
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
                except OSError:
                    time.sleep(0.05)
        return len(killed)


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


def cgroups_usable() -> bool:
    try:
        Cgroup(Limits()).kill()
        return True
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """Why no sandbox can be made here (None: one can)."""
    if not sys.platform.startswith("linux"):
        return "the sandbox needs Linux (bubblewrap, namespaces)"
    if shutil.which("bwrap") is None or shutil.which("prlimit") is None:
        return ("bubblewrap is not installed (Debian/Ubuntu: apt-get install -y bubblewrap; "
                "prlimit comes with util-linux)")
    if os.getuid() == 0 and not cgroups_usable():
        return ("running as root, the process and memory limits need a writable cgroup "
                "(/sys/fs/cgroup), and none could be made here")
    with_nproc = os.getuid() != 0
    job = Path("/tmp")
    trial = prlimit_arguments(Limits(), with_nproc) + bwrap_arguments(job, Limits()) + ["true"]
    result = subprocess.run(trial, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        return (f"bubblewrap does not work here: {result.stderr.strip()[:300]} (it needs "
                "user namespaces: sysctl kernel.unprivileged_userns_clone=1, or "
                "user.max_user_namespaces > 0)")
    return None


def command(argv: list[str], job: Path, limits: Limits, cgroup: Cgroup | None) -> list[str]:
    """``argv`` run inside the sandbox, ``job`` at ``/job``."""
    prefix = cgroup.join_command() if cgroup is not None else []
    return (prefix + prlimit_arguments(limits, with_nproc=cgroup is None)
            + bwrap_arguments(job, limits) + argv)
