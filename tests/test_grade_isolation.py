"""What a graded submission's ranks can reach of the grader's: never a copy of the checker's
memory, never the package's reference solutions.

1. A rank may end the rank launcher (the zygote; same uid). The checker then starts another at
   its next run, from inside the next check, after that check drew the data meant for other
   ranks: a zygote forked from the checker would hand that data to every rank. Notebook 03: an
   answer to ``pipeline_step`` ends the zygote, and ``pipeline_schedule``'s rank 0 looks in its
   own memory for the check's private runs (stage 1's weights and the targets, rank 1's alone).
2. Where labkit is installed from a wheel (not a checkout), ``labkit/notebooks`` is a folder
   holding the reference solutions, seen in the sandbox under labkit's mount and under the
   Python prefix it is installed in.
3. A rank may ``ptrace`` any dumpable process of its uid: the launcher is not one, so no rank
   reads its memory or makes it report other processes as ranks, while the checker can still
   read each rank's sockets in ``/proc``.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest

from labkit.__main__ import main
from labkit.classroom import sandbox

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sandbox.problem() is not None,
                                reason=f"no sandbox here: {sandbox.problem()}")
SMOKE_03 = ('{"d_hidden": 64, "n_layers": 2, "global_batch": 16, "micro_batches": 2, '
            '"micro_options": [1, 2], "stage_options": [2], "steps": 1, "interactive": false}')
ENDS_ZYGOTE = '''import os, signal

def pipeline_step(ctx, stage, inputs, targets, micro_batches, activation_shape):
    if ctx.rank == 0:
        os.kill(os.getppid(), signal.SIGKILL)  # the rank launcher: re-forked by the checker
    raise RuntimeError("this exercise is given up")
'''
FINDS_DATA = '''from torch.distributed.pipelining import PipelineStage

def pipeline_schedule(ctx, part, micro_batches, loss_fn, schedule_class):
    import gc
    gc.unfreeze()
    runs = [o for o in gc.get_objects() if type(o).__name__ == "_Run"]
    raise RuntimeError(f"rank {ctx.rank} holds {len(runs)} of the check's private runs")
'''


def _cell(notebook, grade_id: str):
    return next(c for c in notebook.cells
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id)


def test_a_rank_never_holds_a_later_checks_private_data(tmp_path):
    notebook = nbformat.read(REPO / "notebooks" / "03_pipeline_parallel.ipynb", as_version=4)
    _cell(notebook, "pipeline_step_answer").source = ENDS_ZYGOTE
    _cell(notebook, "pipeline_schedule_answer").source = FINDS_DATA
    folder = tmp_path / "submissions"
    folder.mkdir()
    nbformat.write(notebook, folder / "03_pipeline_parallel.ipynb")
    out = tmp_path / "grades.csv"
    assert main(["grade", str(folder), "--out", str(out), "--source", str(REPO / "course"),
                 "--parameters", SMOKE_03, "--cell-timeout", "120", "--timeout", "400"]) == 0
    row = next(csv.DictReader(open(out)))
    assert row["exercise:pipeline_schedule_check"] == "failed", row
    assert re.search(r"rank \d holds 0 of the check's private runs", row["detail"]), row
    assert not re.search(r"holds [1-9]\d* of the check's private runs", row["detail"]), row


def test_the_sandbox_never_shows_the_packages_solutions(tmp_path, monkeypatch):
    # labkit laid out as a wheel installs it into a prefix: notebooks/ a folder, not a link
    site = tmp_path / "prefix" / "site-packages"
    package = site / "labkit"
    shutil.copytree(REPO / "labkit", package, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert (package / "notebooks" / "solutions" / "00_your_cluster.json").is_file()
    monkeypatch.setattr(sandbox, "labkit", types.SimpleNamespace(
        __file__=str(package / "__init__.py")))
    prefixes = sandbox._python_paths() + [str(tmp_path / "prefix")]
    monkeypatch.setattr(sandbox, "_python_paths", lambda: prefixes)
    monkeypatch.setattr(sys, "path", sys.path + [str(site)])
    job = tmp_path / "job"
    job.mkdir()
    for root in ("/opt/labkit/labkit", str(package)):
        solution = f"{root}/notebooks/solutions/00_your_cluster.json"
        code = (f"import os; print(open({root + '/__init__.py'!r}).read()[:1]); "
                f"print(os.listdir({root + '/notebooks'!r})); print(open({solution!r}).read())")
        argv = sandbox.command([sys.executable, "-c", code], job, sandbox.Limits())
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert result.stdout.splitlines()[1:2] == ["[]"], (root, result.stdout, result.stderr)
        assert result.returncode != 0 and "FileNotFoundError" in result.stderr, result.stdout


PROBES_LAUNCHER = '''import os
import labkit
from labkit.runtime.cluster.untrusted import distrust_ranks

distrust_ranks(contained=True)  # as the checker does first, in its sandbox
cluster = labkit.Cluster(2, device="cpu", progress=False)


def probe(ctx):
    found = {}
    for place in ("environ", "mem", "fd"):
        try:
            with open(f"/proc/{os.getppid()}/{place}", "rb") as f:  # the launcher's
                f.read(1)
            found[place] = "read"
        except OSError as error:
            found[place] = type(error).__name__
    found["own fd"] = bool(os.listdir(f"/proc/{os.getpid()}/fd"))  # what the checker reads
    return found


print(cluster.launcher, cluster.run(probe))
cluster.close()
'''


def test_no_rank_can_read_or_take_over_the_launcher(tmp_path):
    argv = sandbox.command([sys.executable, "-c", PROBES_LAUNCHER], tmp_path, sandbox.Limits())
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    refused = {"environ": "PermissionError", "mem": "PermissionError", "fd": "PermissionError",
               "own fd": True}
    assert result.stdout.strip() == f"fresh {[refused, refused]}", result.stdout
