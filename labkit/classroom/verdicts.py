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


class _CheckerRun:
    """One checker process, its two pipes (findings in, hidden tests out) and its output."""

    def __init__(self, hidden: list[str], findings: Findings):
        self.read_end, self.write_end = os.pipe()
        self.hidden_read, self.hidden_write = os.pipe()
        self.reader = threading.Thread(target=_read, args=(self.read_end, findings), daemon=True)
        self.sender = threading.Thread(target=_send_hidden, args=(self.hidden_write, hidden),
                                       daemon=True)
        self.log, self.process = _Tail(), None

    @property
    def fds(self) -> tuple[int, int]:
        """The checker's ends: where it writes its findings, where it reads hidden tests."""
        return self.write_end, self.hidden_read

    def start(self, argv: list[str], cwd: Path) -> None:
        with _LOCK:
            if _STOPPING.is_set():
                raise Stopped("the grading was interrupted")
            self.process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                pass_fds=list(self.fds), cwd=cwd, start_new_session=True)
            _LIVE.add(self.process)
        self.log.follow(self.process.stdout)
        self.reader.start()
        self.sender.start()

    def close(self, cgroup, findings: Findings) -> None:
        """Kill whatever the checker left (its cgroup, its process tree) and close the pipes."""
        os.close(self.write_end)
        os.close(self.hidden_read)
        if not self.sender.is_alive() and not self.sender.ident:
            os.close(self.hidden_write)
        if cgroup is not None:
            findings.limits = cgroup.events()
            cgroup.kill()
        if self.process is not None:
            _kill_tree(self.process.pid)
            self.process.wait()
            with _LOCK:
                _LIVE.discard(self.process)
        if self.reader.ident:
            self.reader.join(timeout=10)
        else:  # never started (interrupted, or the sandbox could not start)
            os.close(self.read_end)

    def died(self) -> str:
        """Why a checker that reported no ending stopped, from its last error line."""
        errors = [line for line in self.log.text().splitlines() if "Error" in line][-1:]
        code = self.process.returncode if self.process is not None else None
        return ("the grader's run stopped before it finished (its checker was killed or "
                f"crashed, exit status {code})"
                + "".join(f": {line.strip()[:300]}" for line in errors))


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
    run = _CheckerRun(hidden, findings)
    try:
        run.start(_command(job, spec_path, run.fds, sandboxed, limits, cgroup), work)
        try:
            run.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            findings.ending, findings.detail = "timeout", (
                f"stopped after {timeout:g} s (a cell or the notebook hung)")
    finally:
        run.close(cgroup, findings)
    if findings.ending == "died":
        findings.detail = run.died()
    return findings


def prepare_job(job: Path, spec: dict, quiz_dir: Path, sandboxed: bool) -> None:
    """``job/spec.json`` and ``job/quizzes/`` for ``run_checker``, readable by the sandbox's
    own user (nothing in them is secret: the learners' cells and the public quiz files)."""
    shutil.copytree(quiz_dir, job / "quizzes")
    spec = dict(spec, quiz_dir="/job/quizzes" if sandboxed else str(job / "quizzes"),
                sandboxed=sandboxed)
    (job / "spec.json").write_text(json.dumps(spec))
    for path in [job, *job.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
