"""More of what a graded submission's ranks must not reach.

1. A Python prefix reached through a symbolic link (a venv under a linked home or ``/tmp``,
   ``current -> release-3``) is mounted at the link's path: the package's solutions there
   are covered at that path, not only at the resolved one.
2. Another installed copy of labkit under a mounted prefix but not on ``sys.path`` (an older
   ``pip install`` into the base Python, a conda base's environments, a ``--target`` folder)
   is covered too.
3. A process a rank left behind (a session of its own, outliving the launcher that rank
   ended) watches for the next launcher, to take its socket to the checker (``pidfd_getfd``)
   before the launcher is non-dumpable and then answer the checker's spawn requests with a
   pid of its choosing: while a launcher starts nothing else in the sandbox runs, whether
   it was left behind, belongs to another live cluster, or shows as a zombie (its main
   thread ended, another thread running).

The attacks run only inside the sandbox.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from labkit.classroom import sandbox

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sandbox.problem() is not None,
                                reason=f"no sandbox here: {sandbox.problem()}")
SOLUTION = "notebooks/solutions/00_your_cluster.json"


def _wheel_layout(site: Path) -> Path:
    package = site / "labkit"
    shutil.copytree(REPO / "labkit", package, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert (package / SOLUTION).is_file()
    return package


def _read_in_sandbox(path: Path, job: Path) -> subprocess.CompletedProcess:
    argv = sandbox.command([sys.executable, "-c", f"print(open({str(path)!r}).read()[:40])"],
                           job, sandbox.Limits())
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_a_prefix_behind_a_link_never_shows_the_solutions(tmp_path, monkeypatch):
    _wheel_layout(tmp_path / "real" / "prefix" / "site-packages")
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    prefix = tmp_path / "alias" / "prefix"  # what sys.prefix is: a venv's path is not resolved
    site = prefix / "site-packages"
    monkeypatch.setattr(sandbox, "labkit", types.SimpleNamespace(
        __file__=str(site / "labkit" / "__init__.py")))
    prefixes = sandbox._python_paths() + [str(prefix)]
    monkeypatch.setattr(sandbox, "_python_paths", lambda: prefixes)
    monkeypatch.setattr(sys, "path", sys.path + [str(site)])
    (tmp_path / "job").mkdir()
    result = _read_in_sandbox(site / "labkit" / SOLUTION, tmp_path / "job")
    assert "FileNotFoundError" in result.stderr, ("readable", result.stdout)


def test_another_copy_under_a_bound_prefix_never_shows_the_solutions(tmp_path, monkeypatch):
    site = tmp_path / "base" / "lib" / "python3" / "site-packages"  # not on sys.path
    package = _wheel_layout(site)
    # a conda base's environments lie below it; a --target install anywhere
    nested = _wheel_layout(tmp_path / "base" / "envs" / "course" / "lib" / "python3.11" /
                           "site-packages")
    target = _wheel_layout(tmp_path / "base" / "opt" / "deps")
    prefixes = sandbox._python_paths() + [str(tmp_path / "base")]
    monkeypatch.setattr(sandbox, "_python_paths", lambda: prefixes)
    (tmp_path / "job").mkdir()
    for copy in (package, nested, target):
        result = _read_in_sandbox(copy / SOLUTION, tmp_path / "job")
        assert "FileNotFoundError" in result.stderr, ("readable", copy, result.stdout)


TAKES_OVER_LAUNCHER = r"""import os, sys, time, warnings
warnings.simplefilter("ignore")
import labkit
from labkit.runtime.cluster.untrusted import distrust_ranks

distrust_ranks(contained=True)  # as the checker does first, in its sandbox
cluster = labkit.Cluster(2, device="cpu", progress=False, start_timeout=25)
WATCHER = r'''
import ctypes, os, pickle, re, socket, sys, time
old, me = int(sys.argv[1]), os.getpid()
before = {int(p) for p in os.listdir("/proc") if p.isdigit()}  # this generation's ranks
def proof(text):
    open("/tmp/proof", "a").write(text + "\n")
deadline = time.time() + 90
libc = ctypes.CDLL(None, use_errno=True)
while time.time() < deadline:
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in (old, me) or int(p) in before:
            continue
        try:
            args = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if args[1:2] != [b"-I"] or (b"zygote imp" + b"ort serve") not in args[3]:
            continue
        n = int(re.search(rb"serve\((\d+),", args[3]).group(1))
        pidfd = os.pidfd_open(int(p))
        fd = libc.syscall(438, pidfd, n, 0)  # pidfd_getfd
        if fd < 0:
            proof(f"too late: errno {ctypes.get_errno()}"); sys.exit()
        while True:
            try:
                open(f"/proc/{p}/environ", "rb").read(1)
                time.sleep(0.02)
            except PermissionError:
                break
            except FileNotFoundError:
                proof(f"{p} ended before it became non-dumpable"); break
        if not os.path.exists(f'/proc/{p}'):
            continue
        proof(f"launcher {p} is non-dumpable now; I hold its socket to the checker (fd {fd})")
        sock = socket.socket(fileno=fd)
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        message = pickle.loads(data)
        if message[0] == "spawn":
            sock.send(pickle.dumps(("spawned", message[1].rank, 1)))
        proof(f"took the checker's {message[0]!r} of rank {message[1].rank} "
              f"with {len(fds)} fds; told it the rank's pid is 1")
        time.sleep(60); sys.exit()
    time.sleep(0.001)
proof("no new launcher seen")
'''


def plant(ctx):
    import signal, subprocess
    if ctx.rank == 0:
        subprocess.Popen([sys.executable, "-c", WATCHER, str(os.getppid())], start_new_session=True)
        time.sleep(0.5)
        os.kill(os.getppid(), signal.SIGKILL)  # the launcher
    time.sleep(5)


try:
    cluster.run(plant)
except Exception as e:
    print("first run:", type(e).__name__)
try:
    print("second run:", cluster.run(lambda ctx: ctx.rank))
except Exception as e:
    print("second run:", type(e).__name__, str(e)[:200])
print("pids the checker holds:", [h.pid for h in cluster._procs.ranks])
time.sleep(0.5)
print("PROOF:", open("/tmp/proof").read() if os.path.exists("/tmp/proof") else None)
cluster.close()
"""


def test_no_process_a_rank_left_takes_over_the_next_launcher(tmp_path):
    argv = sandbox.command([sys.executable, "-c", TAKES_OVER_LAUNCHER], tmp_path,
                           sandbox.Limits())
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert "I hold its socket" not in result.stdout, result.stdout


_HEAD, _REST = TAKES_OVER_LAUNCHER.split("def plant(ctx):", 1)
# The watcher started by a rank of a second, live cluster: it stays a descendant of the
# checker (below that cluster's zygote) while the first cluster's next launcher starts.
FROM_ANOTHER_CLUSTER = _HEAD.replace(
    'cluster = labkit.Cluster(2, device="cpu", progress=False, start_timeout=25)',
    'cluster = labkit.Cluster(2, device="cpu", progress=False, start_timeout=25)\n'
    'other = labkit.Cluster(1, device="cpu", progress=False, start_timeout=25)') + r"""
def plant_watcher(ctx):
    import subprocess
    subprocess.Popen([sys.executable, "-c", WATCHER, "0"], start_new_session=True)
    time.sleep(1.0)


def kill_launcher(ctx):
    import signal
    if ctx.rank == 0:
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(2)


other.run(plant_watcher)
try:
    cluster.run(kill_launcher)
except Exception as e:
    print("first run:", type(e).__name__)
print("other cluster:", other.run(lambda ctx: ctx.rank))
try:""" + _REST.split("try:", 1)[1]


def test_no_process_of_another_live_cluster_takes_over_the_next_launcher(tmp_path):
    argv = sandbox.command([sys.executable, "-c", FROM_ANOTHER_CLUSTER], tmp_path,
                           sandbox.Limits())
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert "I hold its socket" not in result.stdout, result.stdout
    assert "second run: [0, 1]" in result.stdout, result.stdout  # both clusters still work
    assert "other cluster: [0]" in result.stdout, result.stdout


# The watcher in a second thread, its main thread ended: the process shows as a zombie.
ZOMBIE_LEADER = TAKES_OVER_LAUNCHER.replace(
    '[sys.executable, "-c", WATCHER, str(os.getppid())]',
    '[sys.executable, "-c", "import ctypes, sys, threading, time; W = sys.argv[1]; '
    'sys.argv = sys.argv[1:]; threading.Thread(target=exec, args=(W, {})).start(); '
    'time.sleep(0.1); ctypes.CDLL(None).syscall(60, 0)", WATCHER, str(os.getppid())]')


def test_a_process_that_looks_like_a_zombie_is_held_too(tmp_path):
    assert "syscall(60" in ZOMBIE_LEADER  # SYS_exit: the main thread alone
    argv = sandbox.command([sys.executable, "-c", ZOMBIE_LEADER], tmp_path, sandbox.Limits())
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert "I hold its socket" not in result.stdout, result.stdout
    assert "second run: [0, 1]" in result.stdout, result.stdout


def test_the_hold_runs_only_in_the_sandboxs_own_pid_namespace(tmp_path):
    from labkit.runtime.cluster.launcher import in_sandbox_namespace

    assert not in_sandbox_namespace()  # here kill(-1, SIGSTOP) would stop every process
    code = ("from labkit.runtime.cluster.launcher import in_sandbox_namespace; "
            "print(in_sandbox_namespace())")
    argv = sandbox.command([sys.executable, "-c", code], tmp_path, sandbox.Limits())
    assert subprocess.run(argv, capture_output=True, text=True,
                          timeout=60).stdout.strip() == "True"
