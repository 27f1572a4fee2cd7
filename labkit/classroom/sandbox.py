"""A sandbox per submission: bubblewrap (``bwrap``), a user of its own, resource limits.

What a graded submission's checker and ranks get (``command``):

* a filesystem of their own: read-only, the system (``/usr``, ``/lib``, ``/bin``, ``/sys``, a
  few files of ``/etc``), this Python's installation (its prefixes), labkit's package alone at
  ``/opt/labkit/labkit`` (never the repository around it; every installed labkit's
  ``notebooks/`` the sandbox shows, which holds the reference solutions where labkit is
  installed from a wheel, covered by an empty folder: ``_hidden_materials``) and
  the job's folder (the spec and the quiz files) at ``/job``; writable, only a size-limited
  tmpfs at ``/tmp`` (the working folder), and ``/dev/shm`` alike. Nothing else: not the
  grader's home, not the course sources, not the other submissions, not the grades file;
* new pid, network, IPC and UTS namespaces: no network but a loopback of their own (the
  ranks' gloo runs on it); when the checker ends, every process left in its pid namespace is
  killed with it;
* a user of their own, without capabilities. Run as root (CI, containers), bwrap sets up the
  namespaces and ``setpriv`` then drops to a fresh uid per submission (``sandbox_uid``), so
  the submission owns nothing outside its tmpfs, reads only what is world-readable and cannot
  write ``/proc/sys``; as another user, bwrap maps that user into a new user namespace
  (``--unshare-user --disable-userns``);
* limits (``prlimit``): address space per process, open files, file size, no core dumps; with
  a writable cgroup (``cgroup.py``), the processes and memory of the whole submission, and
  without one, processes by ``RLIMIT_NPROC`` (per fresh uid as root; as another user it
  counts all that user's processes).

``problem()`` says why no sandbox can be made here (then ``labkit grade`` refuses, unless
``--unsafe-no-sandbox``).
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import labkit

# Only what Python, torch and matplotlib read (no shadow file, no host keys).
ETC = tuple(f"/etc/{name}" for name in (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "hosts", "passwd", "group",
    "localtime", "fonts", "alternatives", "ssl", "mime.types", "os-release", "gai.conf"))
SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/sys", *ETC)
LABKIT_MOUNT = "/opt/labkit"  # labkit's package is mounted at /opt/labkit/labkit
FIRST_UID = 200_000  # the fresh uids, as root: above any real account
_UIDS = itertools.count()


@dataclass(frozen=True)
class Limits:
    """What one submission may use (its checker and all its ranks together, except where
    said)."""

    memory_bytes: int = 6 * 2**30  # the whole submission (cgroup), and each process (AS)
    processes: int = 512  # tasks: threads count (8 gloo ranks and the checker: ~320)
    open_files: int = 1024  # per process
    disk_bytes: int = 512 * 2**20  # the tmpfs at /tmp, and /dev/shm alike


class SandboxError(RuntimeError):
    """No sandbox can be made on this machine; the message says why and what to do."""


def sandbox_uid() -> int:
    """A uid no other submission graded now has (as root)."""
    return FIRST_UID + (os.getpid() % 1000) * 1000 + next(_UIDS) % 1000


def _python_paths() -> list[str]:
    """This Python's installation (never the current folder, a repository or ``PYTHONPATH``:
    they may hold the sources; never ``/``, a Python at ``/bin/python3`` being in the system
    folders mounted anyway)."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix,
                str(Path(os.path.realpath(sys.executable)).parent.parent)}
    return sorted(p for p in prefixes if Path(p).exists() and Path(p).resolve() != Path("/"))


@functools.lru_cache(maxsize=1)
def _bwrap_options() -> tuple[str, ...]:
    """The options this bwrap has beyond 0.4's (``--disable-userns`` came with 0.8)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return ()
    help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True).stdout
    return ("--disable-userns",) if "--disable-userns" in help_text else ()


def _mounts(job: Path) -> list[tuple[str, str, str]]:
    """(option, source, destination) of each read-only mount."""
    mounts = [("--ro-bind-try", p, p) for p in SYSTEM]
    mounts += [("--ro-bind", p, p) for p in _python_paths()]
    return mounts + [("--ro-bind", str(Path(labkit.__file__).parent), f"{LABKIT_MOUNT}/labkit"),
                     ("--ro-bind", str(job), "/job")]


@functools.lru_cache(maxsize=64)
def _materials_below(real_root: str) -> tuple[str, ...]:
    """Every ``labkit/notebooks`` folder (not a link) below ``real_root``: a walk of the tree,
    links not followed (about 3 s for /usr and a venv here, once a process)."""
    found = []
    for folder, subfolders, _ in os.walk(real_root):
        if os.path.basename(folder) == "labkit" and "notebooks" in subfolders:
            path = os.path.join(folder, "notebooks")
            if not os.path.islink(path):
                found.append(path)
    return tuple(found)


def _hidden_materials() -> list[str]:
    """Every installed labkit's ``notebooks/`` the sandbox would show, as the sandbox names it.
    Installed from a wheel (not a checkout, where it is a link that leads nowhere inside) it is
    a folder holding the reference solutions: under labkit's mount, and anywhere below a
    mounted prefix or system folder (a conda base holds its envs, a venv may sit in
    /usr/local), named by the mounted, unresolved path (a prefix reached through a link is
    mounted at the link's path). The checker reads none of it (the quizzes come from the
    job's copy)."""
    found = set()
    package = Path(labkit.__file__).parent / "notebooks"
    if package.is_dir() and not package.is_symlink():
        found.add(f"{LABKIT_MOUNT}/labkit/notebooks")
    roots = [p for p in [*_python_paths(), "/usr", "/lib", "/lib64", "/lib32"]
             if os.path.isdir(p)]
    for root in roots:
        real = os.path.realpath(root)
        for path in _materials_below(real):
            found.add(os.path.join(root, os.path.relpath(path, real)))
    return sorted(found)


def bwrap_arguments(job: Path, limits: Limits, uid: int | None) -> list[str]:
    """The ``bwrap`` command line up to the command; ``uid``: the one ``setpriv`` drops to
    (as root), None to map this user in a user namespace instead."""
    args = ["bwrap", *(["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if uid else
                       ["--unshare-user", *_bwrap_options()]),
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent",
            "--new-session", "--clearenv"]
    # the fresh file systems first: a later mount covers what lies below it, so a Python
    # installed under /tmp (a checkout there, its venv) is bound on top of the new /tmp
    scratch = ("/proc", "/dev", "/tmp", "/dev/shm")
    args += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(limits.disk_bytes), "--tmpfs", "/tmp",
             "--perms", "1777", "--size", str(limits.disk_bytes), "--tmpfs", "/dev/shm"]
    mounts = _mounts(job)
    parents = {str(a) for _, _, dest in mounts for a in Path(dest).parents if str(a) != "/"}
    for parent in sorted(parents - {dest for _, _, dest in mounts} - set(scratch), key=len):
        args += ["--perms", "0755", "--dir", parent]  # bwrap would make them 0700
    for option, source, dest in mounts:
        args += [option, source, dest]
    for folder in _hidden_materials():  # an empty, read-only folder over the solutions
        args += ["--perms", "0555", "--size", "4096", "--tmpfs", folder]
    args += ["--chdir", "/tmp"]
    environment = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/tmp",
                   "LANG": "C.UTF-8", "LABKIT_GRADING": "1", "MPLBACKEND": "Agg",
                   "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": LABKIT_MOUNT}
    for name, value in environment.items():
        args += ["--setenv", name, value]
    return args + ["--"]


def prlimit_arguments(limits: Limits, uid: int | None, cgroup: bool = False) -> list[str]:
    """With a cgroup, its limit is the process limit (it counts what it refused, for the
    row); without, RLIMIT_NPROC, which counts the processes of the forking process's real
    uid: the fresh uid's own as root; as another user, all of that user's."""
    args = ["prlimit", f"--as={limits.memory_bytes}", f"--nofile={limits.open_files}",
            f"--fsize={limits.disk_bytes}", "--core=0"]
    if not cgroup:
        args.append(f"--nproc={limits.processes + (0 if uid else _own_processes())}")
    return args + ["--"]


def _own_processes() -> int:
    import psutil

    uid = os.getuid()
    return sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"].real == uid)


def _drop_to(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--"]


def command(argv: list[str], job: Path, limits: Limits, cgroup=None) -> list[str]:
    """``argv`` run inside the sandbox, ``job`` at ``/job``; ``cgroup``: a ``cgroup.Cgroup``
    to start it in, or None."""
    uid = sandbox_uid() if os.getuid() == 0 else None
    prefix = cgroup.join_command() if cgroup is not None else []
    return (prefix + prlimit_arguments(limits, uid, cgroup is not None)
            + bwrap_arguments(job, limits, uid)
            + (_drop_to(uid) if uid else []) + argv)


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """Why no sandbox can be made here (None: one can)."""
    if not sys.platform.startswith("linux"):
        return "the sandbox needs Linux (bubblewrap, namespaces)"
    needed = ["bwrap", "prlimit"] + (["setpriv"] if os.getuid() == 0 else [])
    missing = [tool for tool in needed if shutil.which(tool) is None]
    if missing:
        return (f"{' and '.join(missing)} not found (Debian/Ubuntu: apt-get install -y "
                "bubblewrap; prlimit and setpriv come with util-linux)")
    trial = command(["true"], Path("/tmp"), Limits())
    result = subprocess.run(trial, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        return (f"bubblewrap does not work here: {result.stderr.strip()[:300]} (as a user "
                "other than root it needs user namespaces: sysctl "
                "kernel.unprivileged_userns_clone=1, or user.max_user_namespaces > 0)")
    return None
