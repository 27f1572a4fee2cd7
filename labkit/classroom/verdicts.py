"""Run the grader's checker (``checker.py``) for one submission and collect what it found.

The checker runs in the submission's sandbox (``sandbox.py``), or, with
``--unsafe-no-sandbox``, as a plain child process under ``reaper.py``. Its findings come back
as JSON lines on a pipe this process opened (the checker's ``VERDICT_FD``); anything else it or
its ranks print is kept (its last 64 KiB) only for the row's detail. When the checker ends,
or the submission's time is up, everything it started is killed (the sandbox's cgroup and pid
namespace; the reaper otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from labkit.classroom import cgroup as cgroups
from labkit.classroom.sandbox import Limits, command

REAPER = Path(__file__).resolve().with_name("reaper.py")
_LIVE: set = set()  # the checkers running now (their Popen), for stop_all
_LOCK = threading.Lock()
_STOPPING = threading.Event()


class Stopped(Exception):
    """The grading was interrupted (``stop_all``): no checker is started any more."""


def stop_all() -> None:
    """Kill every checker running now and start no other (the grader was interrupted):
    each ``run_checker`` then cleans up its sandbox, cgroup included, and returns."""
    _STOPPING.set()
    with _LOCK:
        live = list(_LIVE)
    for process in live:
        _kill_tree(process.pid)


def resume() -> None:
    """Allow checkers again (a new ``grade`` call, after an interrupted one)."""
    _STOPPING.clear()


@dataclass
class Findings:
    """What the checker reported: verdicts by grade_id, measured quiz values by quiz, how the
    run ended ("done", "error", "timeout", "died") and why, and the limits it ran into."""

    verdicts: dict = field(default_factory=dict)
    expected: dict = field(default_factory=dict)
    ending: str = "died"
    detail: str = ""
    limits: list = field(default_factory=list)

    def take(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "verdict":
            self.verdicts[str(event.get("grade_id"))] = event.get("verdict")
        elif kind == "quiz":
            self.expected[str(event.get("quiz"))] = event.get("expected") or {}
        elif kind == "done":
            self.ending = "done"
        elif kind == "error":
            self.ending = "timeout" if event.get("timeout") else "error"
            self.detail = f"cell {event.get('cell')} raised {event.get('error')}"


def _read(fd: int, findings: Findings) -> None:
    with os.fdopen(fd, "rb") as pipe:
        for line in pipe:
            try:
                findings.take(json.loads(line))
            except (ValueError, AttributeError):
                continue


class _Tail:
    """The last ``limit`` bytes a process printed (a submission may print without end)."""

    def __init__(self, limit: int = 64 * 1024):
        self.limit, self.data = limit, bytearray()

    def follow(self, stream) -> None:
        def read():
            for chunk in iter(lambda: stream.read1(1 << 16), b""):
                self.data += chunk
                del self.data[:-self.limit]
        threading.Thread(target=read, daemon=True).start()

    def text(self) -> str:
        return self.data.decode(errors="replace")


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        parent = psutil.Process(pid)
        family = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for process in family:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)


def _command(job: Path, spec_path: str, fds: tuple[int, int], sandboxed: bool,
             limits: Limits, cgroup) -> list[str]:
    checker = [sys.executable, "-m", "labkit.classroom.checker", spec_path, *map(str, fds)]
    if sandboxed:
        return command(checker, job, limits, cgroup)
    return [sys.executable, str(REAPER), *checker]


def _send_hidden(fd: int, hidden: list[str]) -> None:
    try:
        with os.fdopen(fd, "wb") as pipe:
            for source in hidden:
                pipe.write((json.dumps(source) + "\n").encode())
    except OSError:  # the checker ended before reading them all
        pass


def run_checker(job: Path, hidden: list[str], timeout: float, sandboxed: bool = True,
                limits: Limits = Limits()) -> Findings:
    """Run the checker on ``job/spec.json`` (``job`` also holds ``quizzes/``), ``hidden``: the
    hidden tests of its check cells in order, sent down a pipe of their own; never raises for
    what the submission does."""
    findings = Findings()
    cgroup = cgroups.Cgroup(limits) if sandboxed and cgroups.usable() else None
    spec_path = "/job/spec.json" if sandboxed else str(job / "spec.json")
    work = job / "work"
    work.mkdir(exist_ok=True)
    read_end, write_end = os.pipe()
    hidden_read, hidden_write = os.pipe()
    reader = threading.Thread(target=_read, args=(read_end, findings), daemon=True)
    sender = threading.Thread(target=_send_hidden, args=(hidden_write, hidden), daemon=True)
    log = _Tail()
    process = None
    try:
        with _LOCK:
            if _STOPPING.is_set():
                raise Stopped("the grading was interrupted")
            process = subprocess.Popen(
                _command(job, spec_path, (write_end, hidden_read), sandboxed, limits, cgroup),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                pass_fds=[write_end, hidden_read], cwd=work, start_new_session=True)
            _LIVE.add(process)
        log.follow(process.stdout)
        reader.start()
        sender.start()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            findings.ending, findings.detail = "timeout", (
                f"stopped after {timeout:g} s (a cell or the notebook hung)")
    finally:
        os.close(write_end)
        os.close(hidden_read)
        if not sender.is_alive() and not sender.ident:
            os.close(hidden_write)
        if cgroup is not None:
            findings.limits = cgroup.events()
            cgroup.kill()
        if process is not None:
            _kill_tree(process.pid)
            process.wait()
            with _LOCK:
                _LIVE.discard(process)
        if reader.ident:
            reader.join(timeout=10)
        else:  # never started (interrupted, or the sandbox could not start)
            os.close(read_end)
    if findings.ending == "died":
        errors = [line for line in log.text().splitlines() if "Error" in line][-1:]
        findings.detail = ("the grader's run stopped before it finished (its checker was "
                           f"killed or crashed, exit status {process.returncode})"
                           + "".join(f": {line.strip()[:300]}" for line in errors))
    return findings


def prepare_job(job: Path, spec: dict, quiz_dir: Path, sandboxed: bool) -> None:
    """``job/spec.json`` and ``job/quizzes/`` for ``run_checker``, readable by the sandbox's
    own user (nothing in them is secret: the learners' cells and the public quiz files)."""
    shutil.copytree(quiz_dir, job / "quizzes")
    spec = dict(spec, quiz_dir="/job/quizzes" if sandboxed else str(job / "quizzes"))
    (job / "spec.json").write_text(json.dumps(spec))
    for path in [job, *job.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
