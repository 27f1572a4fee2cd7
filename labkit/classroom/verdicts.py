"""Run the grader's checker (``checker.py``) for one submission and collect what it found.

The checker runs in the submission's sandbox (``sandbox.py``), or, with
``--unsafe-no-sandbox``, as a plain child process under ``reaper.py``. Its findings come back
as JSON lines on a pipe this process opened (the checker's ``VERDICT_FD``); anything else it or
its ranks print goes to a log that is only read for the row's detail. When the checker ends,
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


def _command(job: Path, spec_path: str, fd: int, sandboxed: bool, limits: Limits,
             cgroup) -> list[str]:
    checker = [sys.executable, "-m", "labkit.classroom.checker", spec_path, str(fd)]
    if sandboxed:
        return command(checker, job, limits, cgroup)
    return [sys.executable, str(REAPER), *checker]


def run_checker(job: Path, timeout: float, sandboxed: bool = True,
                limits: Limits = Limits()) -> Findings:
    """Run the checker on ``job/spec.json`` (``job`` also holds ``quizzes/``); never raises
    for what the submission does."""
    findings = Findings()
    cgroup = cgroups.Cgroup(limits) if sandboxed and cgroups.usable() else None
    spec_path = "/job/spec.json" if sandboxed else str(job / "spec.json")
    work = job / "work"
    work.mkdir(exist_ok=True)
    read_end, write_end = os.pipe()
    reader = threading.Thread(target=_read, args=(read_end, findings), daemon=True)
    log_path = job / "checker.log"
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                _command(job, spec_path, write_end, sandboxed, limits, cgroup),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                pass_fds=[write_end], cwd=work, start_new_session=True)
        os.close(write_end)
        reader.start()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            findings.ending, findings.detail = "timeout", (
                f"stopped after {timeout:g} s (a cell or the notebook hung)")
    finally:
        if cgroup is not None:
            findings.limits = cgroup.events()
            cgroup.kill()
        if "process" in locals():
            _kill_tree(process.pid)
            process.wait()
        reader.join(timeout=10)
    if findings.ending == "died":
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        findings.detail = ("the grader's run ended before it finished: "
                           + " | ".join(tail)[-300:])
    return findings


def prepare_job(job: Path, spec: dict, quiz_dir: Path, sandboxed: bool) -> None:
    """``job/spec.json`` and ``job/quizzes/`` for ``run_checker``, readable by the sandbox's
    own user (nothing in them is secret: the learners' cells and the public quiz files)."""
    shutil.copytree(quiz_dir, job / "quizzes")
    spec = dict(spec, quiz_dir="/job/quizzes" if sandboxed else str(job / "quizzes"))
    (job / "spec.json").write_text(json.dumps(spec))
    for path in [job, *job.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
