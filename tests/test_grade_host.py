"""The grader's checker and its limits, against what a submission's ranks can do and need."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psutil

import labkit
from labkit.classroom.sandbox import Limits
from tests.exercises import solution
from tests.grading import REPO


def test_the_checker_never_imports_from_the_folder_the_ranks_write(tmp_path):
    """The checker runs in /tmp, which its ranks write: a module planted there (one the
    checker imports later, such as ipywidgets) must not be the one it imports."""
    (tmp_path / "planted_by_a_rank.py").write_text("print('ran in the checker')\n")
    code = ("import labkit.classroom.checker as checker; checker._harden(); "
            "import planted_by_a_rank")
    found = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert "ran in the checker" not in found.stdout
    assert "No module named 'planted_by_a_rank'" in found.stderr, found.stderr[-500:]


def test_an_honest_check_on_8_ranks_stays_under_the_task_limit():
    """The sandbox's process limit counts threads: notebook 07's check (4 ranks, then 8) with
    the course's answer, its peak of tasks measured here, must leave room under it."""
    me, peak, done = psutil.Process(), [0], threading.Event()

    def watch():
        while not done.is_set():
            try:
                tasks = sum(p.num_threads() for p in me.children(recursive=True) + [me])
                peak[0] = max(peak[0], tasks)
            except psutil.Error:
                pass
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    answer = solution("07_putting_it_together", "mesh_groups_answer", "mesh_groups")
    with labkit.Cluster(4, device="cpu", progress=False) as cluster:
        verdict = labkit.check.mesh_groups(cluster, answer)
    done.set()
    watcher.join()
    assert verdict.status == "passed", str(verdict)
    assert peak[0] * 1.25 < Limits().processes, (peak[0], Limits().processes)


def test_quizzes_are_read_from_the_jobs_copy_not_the_link_the_ranks_can_replace():
    from labkit.classroom.checker import quiz_file

    assert quiz_file("quizzes/07_putting_it_together.json", "/job/quizzes") == \
        "/job/quizzes/07_putting_it_together.json"
    assert quiz_file("../../tmp/forged/07.json", "/job/quizzes") == "/job/quizzes/07.json"
