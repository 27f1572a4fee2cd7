"""Execute a course notebook at its classroom defaults, once per test session, and read it back.

Every lesson is run as a learner meets it: ``course/<stem>.ipynb`` (the reference solutions in)
under papermill with **no parameter injected**, its kernel started with ``LABKIT_RESULTS``
naming the file that the notebook's last, collapsed cell writes (``labkit.record_results``).
Tests then assert the lesson's claims on those values:

    @pytest.fixture(scope="module")
    def nb():
        return lesson("02_data_parallel")          # executed once, shared by every test file

    def test_two_devices_cut_the_step_time(nb):
        assert nb.results["ddp_speedup"] >= 1.5

The executed notebooks go to a temporary folder, removed at exit unless a lesson failed;
``LABKIT_LESSONS_DIR=DIR pytest ...`` writes them to DIR and keeps them, to read afterwards.

``SMOKE`` holds the small parameters of the real-browser test (tests/test_browser.py), which
drives the learners' copies in JupyterLab and needs them quick.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from labkit.lessons.show.results import RESULTS_ENV

REPO = Path(__file__).resolve().parent.parent
COURSE = REPO / "course"
STEMS = sorted(p.stem for p in COURSE.glob("*.ipynb"))
CELL_TIMEOUT_S = 300
_WORK: Path | None = None  # made when a lesson first runs; removed at exit unless one failed
_OWNER: int | None = None  # the process that made it: a forked rank inherits the atexit hook
_FAILED: set[str] = set()
_RUNS: dict[str, Lesson | str] = {}  # stem -> the executed lesson, or why it failed


KEEP_ENV = "LABKIT_LESSONS_DIR"  # set: the executed lessons are written there and kept


def _work() -> Path:
    """The session's folder of executed lessons (made on first use)."""
    global _WORK, _OWNER
    if _WORK is None:
        _OWNER = os.getpid()
        if os.environ.get(KEEP_ENV):
            _WORK = Path(os.environ[KEEP_ENV])
            _WORK.mkdir(parents=True, exist_ok=True)
        else:
            _WORK = Path(tempfile.mkdtemp(prefix="labkit-lessons-"))
            atexit.register(_clean)
    return _WORK


def _clean() -> None:
    """At exit: the executed lessons go, unless one failed (its report names the folder)."""
    if _WORK is not None and not _FAILED and os.getpid() == _OWNER:
        shutil.rmtree(_WORK, ignore_errors=True)


@dataclass
class Lesson:
    """One executed lesson: its notebook (outputs in), its recorded values, its run time."""

    stem: str
    path: Path  # the executed notebook, kept for reading
    notebook: nbformat.NotebookNode
    results: dict
    seconds: float

    def cell(self, index: int):
        return self.notebook.cells[index]

    def cells_with(self, text: str) -> list[int]:
        """Indices of the code cells whose source contains ``text``."""
        return [i for i, c in enumerate(self.notebook.cells)
                if c.cell_type == "code" and text in c.source]


def _failure_report(stem: str, executed: Path, error) -> str:
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    tail = "\n".join(ansi.sub("", line) for line in error.traceback[-12:])
    return (f"{stem} failed in cell {error.cell_index} (In [{error.exec_count}]): "
            f"{error.ename}: {error.evalue}\n"
            f"--- cell source ---\n{error.source}\n--- traceback (end) ---\n{tail}\n"
            f"executed notebook kept at {executed}")


def _execute(stem: str) -> Lesson | str:
    """The lesson run once per session (every later call answers from ``_RUNS``)."""
    if stem not in _RUNS:
        _RUNS[stem] = _run(stem)
    return _RUNS[stem]


def _run(stem: str) -> Lesson | str:
    import papermill

    source = COURSE / f"{stem}.ipynb"
    if not source.exists():
        return f"no notebook course/{stem}.ipynb"
    executed, results = _work() / f"{stem}.ipynb", _work() / f"{stem}.json"
    results.unlink(missing_ok=True)
    before = os.environ.get(RESULTS_ENV)
    os.environ[RESULTS_ENV] = str(results)  # the kernel papermill starts inherits it
    start = time.perf_counter()
    try:
        papermill.execute_notebook(str(source), str(executed), kernel_name="python3",
                                   cwd=str(COURSE), execution_timeout=CELL_TIMEOUT_S,
                                   progress_bar=False)
    except papermill.PapermillExecutionError as error:
        _FAILED.add(stem)
        return _failure_report(stem, executed, error)
    except Exception as error:  # noqa: BLE001 - a cell past its time, a dead kernel: reported
        _FAILED.add(stem)  # once, and cached, not run again by every test that asks
        return (f"{stem} did not finish: {type(error).__name__}: {str(error)[:2000]}\n"
                f"executed notebook (as far as it ran) kept at {executed}")
    finally:
        if before is None:
            os.environ.pop(RESULTS_ENV, None)
        else:
            os.environ[RESULTS_ENV] = before
    seconds = time.perf_counter() - start
    if not results.exists():
        _FAILED.add(stem)
        return f"{stem} ran but recorded no results (its labkit.record_results cell)"
    return Lesson(stem, executed, nbformat.read(executed, as_version=4),
                  json.loads(results.read_text()), seconds)


def lesson_fixture(stem: str):
    """A module-scoped fixture of ``lesson(stem)``: ``nb = lesson_fixture("02_data_parallel")``
    at the top of a claims file gives each test there the executed lesson as ``nb``."""

    @pytest.fixture(scope="module")
    def nb() -> Lesson:
        return lesson(stem)

    return nb


def assert_out_of_one_device_by_half_again(results: dict) -> None:
    """A lesson's one-device run ran out of memory, and with the cap lifted it peaked at
    1.5x the cap or more (what it records as ``single_oom``, ``one_device_peak``)."""
    assert results["single_oom"], "the model was meant not to fit one device"
    assert results["one_device_peak"] >= 1.5 * results["capacity"]


def assert_each_cheaper_lever_fits_one_device(results: dict) -> None:
    """SGD alone, or bf16 alone, would have fitted the model on one device (estimated)."""
    assert set(results["levers"]) == {"SGD", "bf16"}
    assert all(peak <= results["capacity"] for peak in results["levers"].values())


def lesson(stem: str) -> Lesson:
    """``course/<stem>.ipynb`` executed at its classroom defaults (once per session); a test
    that asks for a lesson that failed fails with the lesson's error."""
    outcome = _execute(stem)
    if isinstance(outcome, str):
        pytest.fail(outcome, pytrace=False)
    return outcome


# The real-browser test's parameters: small, so that "Run All" in JupyterLab is quick.
SMOKE = {
    "00_your_cluster": {"world_size": 2, "device": "cpu", "all_reduce_mib": [0.25, 1]},
    "01_the_memory_wall": {"sizes": [2e5, 5e5, 2e6], "size": 2e5, "big_models": ["7B"],
                           "boundary_world_sizes": [1, 2], "boundary_levers": ["bf16"]},
    "02_data_parallel": {"world_size": 2, "params": 5e5, "global_batch": 64, "steps": 3,
                         "sizes": [5e5], "world_sizes": [1, 2], "bucket_caps": [0.25, 25],
                         "comm_sizes_kib": [16, 256, 4096], "compute_batch": 512,
                         "walk_batches": [128, 32], "weak_batch": 128, "timing_steps": 3,
                         "batches": [64]},
    "03_pipeline_parallel": {"d_hidden": 512, "n_layers": 4, "global_batch": 256,
                             "memory_per_device": "8MiB", "micro_batches": 4,
                             "stage_options": [2], "micro_options": [1, 4], "steps": 2},
    "04_tensor_parallel": {"d_hidden": 512, "n_layers": 4, "global_batch": 64,
                           "memory_per_device": "8MiB", "world_size": 2, "steps": 3,
                           "degree_options": [1, 2], "batches": [32, 256, 1024]},
    "05_sharded_data_parallel": {"d_hidden": 512, "n_layers": 6, "global_batch": 32,
                                 "steps": 3, "world_sizes": [1, 2],
                                 "boundary_sizes": [2e5, 6e5, 1.5e6]},
    "06_recommender_at_scale": {"world_size": 2, "rows_per_table": 4000,
                                "memory_per_device": "6MiB", "global_batch": 256, "steps": 20,
                                "epoch_samples": 100_000, "rows_options": [2000, 4000, 6000],
                                "gpu_options": [1, 2]},
    "07_putting_it_together": {"world_size": 4, "d_hidden": 512, "n_layers": 4,
                               "global_batch": 64, "memory_per_device": "8MiB", "steps": 3},
    "08_long_sequences_and_experts": {"seq_options": [256, 512], "memory_per_device": "4MiB",
                                      "capacity_factors": [0.5, 2.0], "moe_steps": 3},
    "09_plan_a_real_run": {"world_size": 2, "steps": 3, "calibration_runs": 3,
                           "decoders": ["7B"]},
    "10_when_a_gpu_dies": {"world_size": 2, "d_hidden": 64, "n_layers": 3, "global_batch": 16,
                           "steps": 8, "checkpoint_every": 3, "kill_at_step": 5},
}
