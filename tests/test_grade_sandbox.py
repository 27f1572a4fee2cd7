"""Submissions that attack the grader's machine: a fork bomb, a 10 GB allocation, a filled
disk, a network connection, a daemon. Each is contained, reported in its row, and leaves the
machine as it was."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import psutil
import pytest

from labkit.classroom import sandbox
from labkit.classroom.grade import SandboxError, grade
from tests.conftest import descendants
from tests.grading import REPO, SMOKE, submission

pytestmark = pytest.mark.skipif(sandbox.problem() is not None,
                                reason=f"no sandbox here: {sandbox.problem()}")

FORK_BOMB = """import os, time
def ring_all_reduce(ctx, tensor):
    me = os.getpid()
    while True:
        try:
            if os.fork() == 0:
                continue  # the child forks too
        except OSError:
            break
    if os.getpid() != me:
        time.sleep(600.25)  # hold every process slot
        os._exit(0)
    raise RuntimeError("fork failed: no more processes")
"""
ALLOCATES = """import torch
def ring_all_reduce(ctx, tensor):
    hog = torch.ones(10 * 2**30, dtype=torch.uint8)  # 10 GB, every page touched
    return tensor + hog[:1]
"""
FILLS_DISK = """def ring_all_reduce(ctx, tensor):
    with open("filler", "wb") as f:
        while True:
            f.write(b"x" * 2**20)
"""
CONNECTS = """import socket, subprocess
def ring_all_reduce(ctx, tensor):
    subprocess.Popen(["sleep", "{marker}"], start_new_session=True)  # a daemon, too
    for address in [("127.0.0.1", {port}), ("localhost", {port})]:  # the grader's loopback
        try:
            socket.create_connection(address, timeout=3).sendall(b"leaked")
        except OSError as error:
            last = error
    raise last
"""
MARKER = "610.731"  # the daemon's sleep: how the test finds it if it is left behind


def _cgroups() -> set[str]:
    return {str(p) for p in Path("/sys/fs/cgroup").rglob("labkit-grade-*")}


def test_attacks_are_contained_and_reported(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    folder = tmp_path / "submissions"
    submission(folder / "fork_bomb.ipynb", FORK_BOMB)
    submission(folder / "allocates.ipynb", ALLOCATES)
    submission(folder / "fills_disk.ipynb", FILLS_DISK)
    submission(folder / "connects.ipynb",
               CONNECTS.format(port=port, marker=MARKER))
    before, disk, cgroups = set(psutil.pids()), psutil.disk_usage("/tmp").free, _cgroups()
    limits = sandbox.Limits(memory_bytes=4 * 2**30, processes=128, disk_bytes=64 * 2**20)
    results = grade([folder], tmp_path / "grades.csv", source_dir=REPO / "course",
                    parameters=json.loads(SMOKE), cell_timeout=90, timeout=240, jobs=2,
                    limits=limits, echo=lambda line: None)
    rows = {r.path.stem: r.row() for r in results}
    for row in rows.values():
        assert row["points"] == 0 and row["exercise:ring_all_reduce_check"] == "failed", row
    assert "hit the process limit (128)" in rows["fork_bomb"]["detail"], rows["fork_bomb"]
    assert "allocate" in rows["allocates"]["detail"], rows["allocates"]
    assert ("No space left on device" in rows["fills_disk"]["detail"]
            or "File too large" in rows["fills_disk"]["detail"]), rows["fills_disk"]
    assert "Network is unreachable" in rows["connects"]["detail"] or (
        "Connection refused" in rows["connects"]["detail"]), rows["connects"]
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody reached the grader's machine
    listener.close()
    left = [p for p in set(psutil.pids()) - before if psutil.pid_exists(p)
            and MARKER in _cmdline(p)]
    assert not left, f"processes left behind: {left}"
    assert not descendants()  # the fork bomb's processes, the ranks, the checkers
    assert _cgroups() <= cgroups  # each submission's cgroup is removed
    # the filler wrote until its tmpfs was full: had it reached the host's disk it would have
    # taken far more than this (other programs on a shared machine may write a little meanwhile)
    assert psutil.disk_usage("/tmp").free > disk - 256 * 2**20


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def test_without_a_sandbox_grading_refuses_unless_told(tmp_path, monkeypatch):
    sandbox.problem.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    try:
        with pytest.raises(SandboxError, match="--unsafe-no-sandbox: each submission's code"):
            grade([tmp_path], tmp_path / "grades.csv")
    finally:
        sandbox.problem.cache_clear()
    assert not (tmp_path / "grades.csv").exists()
    assert os.environ["PATH"] == str(tmp_path)


SLEEPS = """import time
def ring_all_reduce(ctx, tensor):
    time.sleep(600)
"""


def test_an_interrupted_grader_stops_every_sandbox_at_once(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "submissions"
    for n in range(3):
        submission(folder / f"sleeps_{n}.ipynb", SLEEPS)
    cgroups = _cgroups()
    grader = subprocess.Popen(
        [sys.executable, "-m", "labkit", "grade", str(folder), "--out", str(tmp_path / "g.csv"),
         "--source", str(REPO / "course"), "--parameters", SMOKE, "--cell-timeout", "300",
         "--timeout", "600", "--jobs", "2"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_checkers(grader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(_checkers(grader.pid)) == 2, "the two sandboxes never started"
        time.sleep(3)  # their ranks sleeping now
        grader.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        _, stderr = grader.communicate(timeout=60)
        took = time.monotonic() - stopped
    finally:
        if grader.poll() is None:
            grader.kill()
            grader.wait()
    assert took < 10, f"the grader went on for {took:.0f} s after Ctrl-C"
    assert grader.returncode == 130 and "interrupted" in stderr, (grader.returncode, stderr)
    assert not (tmp_path / "g.csv").exists()
    assert not descendants() and _cgroups() <= cgroups


def _checkers(pid: int) -> list:
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            checker = ["-m", "labkit.classroom.checker"]
            if child.cmdline()[1:3] == checker and child.parent().cmdline()[1:3] != checker:
                found.append(child)
        except psutil.Error:
            pass
    return found


def test_cgroups_left_by_a_killed_grader_are_removed_and_live_ones_kept():
    from labkit.classroom import cgroup

    if not cgroup.usable():
        pytest.skip("no writable cgroup here")
    import subprocess
    import time

    left, live = cgroup.Cgroup(sandbox.Limits()), cgroup.Cgroup(sandbox.Limits())
    sleeper = subprocess.Popen(live.join_command() + ["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while not live.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cgroup.remove_stale(min_age=0) == len(left.dirs)
        assert not any(d.exists() for d in left.dirs) and all(d.exists() for d in live.dirs)
        assert cgroup.remove_stale() == 0  # none older than a minute
    finally:
        sleeper.kill()
        sleeper.wait()  # reaped, so that the cgroup empties
        live.kill()
        left.kill()


def test_a_python_installed_under_tmp_is_there_inside_the_sandbox(tmp_path, monkeypatch):
    """A checkout (and its venv) under /tmp, as CI's may be: the sandbox's fresh /tmp must not
    cover the Python it runs, and stays writable."""
    import subprocess

    prefix = tmp_path / "venv"
    prefix.mkdir()
    (prefix / "marker").write_text("the python's files\n")
    paths = sandbox._python_paths()
    monkeypatch.setattr(sandbox, "_python_paths", lambda: [*paths, str(prefix)])
    job = tmp_path / "job"
    job.mkdir()
    script = f"cat {prefix}/marker && touch /tmp/written && echo writable"
    argv = sandbox.command(["/bin/sh", "-c", script], job, sandbox.Limits())
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.stdout.split("\n")[:2] == ["the python's files", "writable"], result.stderr
    assert not (Path("/tmp") / "written").exists()
