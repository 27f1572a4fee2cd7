"""Grade submitted notebooks: execute each one afresh, read what its checks and quizzes found.

    python -m labkit grade submissions/*.ipynb --out grades.csv

Each submission runs in a process of its own (papermill, a new kernel, so a new cluster), in a
temporary folder of its own, with a time limit per cell and per notebook; when the limit
passes, the whole process group (kernel and ranks) is killed. A notebook that raises or hangs
gets a row saying where, with the exercises it reached graded; the others are not affected.

* Exercises: every nbgrader grade cell (``nbgrader.grade = true``) of the executed notebook is
  read for the verdict its check displayed (``labkit.check.MIME_TYPE``): passed earns the
  cell's points; failed, not attempted, or not run (the notebook stopped before it) earn none.
  With the course's sources at hand (``--source``), the check cells are first restored from
  them (as nbgrader restores locked cells), so an edited check cannot pass itself.
* Quizzes: read from the submission as the learner saved it (the widget's record), and scored
  again from the quiz file: first answers only.
"""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from labkit.check.result import MIME_TYPE
from labkit.classroom.quizzes import RECORD_MIME, load_quiz
from labkit.classroom.release import release_cell

REPO = Path(__file__).resolve().parent.parent.parent
NOT_RUN = "not run"


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _bundles(cell, mime: str) -> list:
    return [o["data"][mime] for o in cell.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result")
            and mime in o.get("data", {})]


def _error(cell) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"{output['ename']}: {output['evalue']}"
    return None


def exercise_results(notebook) -> list[dict]:
    """Per nbgrader grade cell of an executed notebook: grade_id, points, status, summary."""
    results = []
    for cell in notebook.cells:
        meta = _meta(cell)
        if not meta.get("grade"):
            continue
        found = _bundles(cell, MIME_TYPE)
        verdict = found[-1] if found else None
        status = verdict["status"] if verdict else NOT_RUN
        summary = verdict["summary"] if verdict else (_error(cell) or
                                                     "the notebook stopped before this cell")
        points = meta.get("points", 0)
        results.append({"grade_id": meta["grade_id"], "points": points, "status": status,
                        "earned": points if status == "passed" else 0, "summary": summary})
    return results


def quiz_scores(notebook, quiz_dir: Path) -> dict[str, tuple[int, int]]:
    """Quiz name -> (score, max), from the records saved in a notebook, re-scored."""
    scores = {}
    for cell in notebook.cells:
        for record in _bundles(cell, RECORD_MIME):
            path = Path(quiz_dir) / f"{record.get('quiz')}.json"
            if not path.exists():
                continue  # a quiz this course does not have: nothing to score it against
            questions = load_quiz(path)
            expected = record.get("expected", {})
            score = sum(q.is_right(record["answers"][q.id]["first"], expected.get(q.id))
                        for q in questions if q.id in record.get("answers", {}))
            scores[record["quiz"]] = (score, len(questions))
    return scores


def restore_checks(notebook, source) -> list[str]:
    """Replace each check cell of ``notebook`` by the learners' version of the source's cell
    with the same grade_id; return the grade_ids the submission no longer has."""
    released = {_meta(c)["grade_id"]: release_cell(c, "source", set())
                for c in source.cells if _meta(c).get("grade")}
    seen = set()
    for i, cell in enumerate(notebook.cells):
        grade_id = _meta(cell).get("grade_id")
        if grade_id in released:
            notebook.cells[i] = released[grade_id]
            seen.add(grade_id)
    return sorted(set(released) - seen)


@dataclass
class Submission:
    path: Path
    status: str = "graded"
    detail: str = ""
    exercises: list = field(default_factory=list)
    quizzes: dict = field(default_factory=dict)
    seconds: float = 0.0

    def row(self) -> dict:
        row = {"submission": str(self.path), "notebook": self.path.stem, "status": self.status,
               "detail": self.detail, "seconds": f"{self.seconds:.1f}",
               "points": sum(e["earned"] for e in self.exercises),
               "max_points": sum(e["points"] for e in self.exercises)}
        row.update({f"exercise:{e['grade_id']}": e["status"] for e in self.exercises})
        row.update({f"quiz:{name}": f"{score}/{top}" for name, (score, top)
                    in self.quizzes.items()})
        return row


def _kill_tree(pid: int) -> None:
    """Kill a process and everything below it (papermill, its kernel, the kernel's ranks)."""
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


def _execute(src: Path, dst: Path, work: Path, parameters: dict, cell_timeout: float,
             timeout: float) -> tuple[str, str]:
    """Run papermill in a process of its own; (status, detail)."""
    command = [sys.executable, "-m", "papermill", str(src), str(dst), "--cwd", str(work),
               "--kernel", "python3", "--execution-timeout", str(int(cell_timeout)),
               "--no-progress-bar", "--no-log-output"]
    if parameters:
        command += ["-y", json.dumps(parameters)]
    log = open(work / "papermill.log", "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(process.pid)
        return "timeout", f"stopped after {timeout:g} s (a cell or the notebook hung)"
    finally:
        log.close()
    if code == 0:
        return "graded", ""
    log_text = (work / "papermill.log").read_text(errors="replace")
    if "CellTimeoutError" in log_text or "Cell execution timed out" in log_text:
        return "timeout", f"a cell ran past the cell time limit ({cell_timeout:g} s)"
    tail = log_text.strip().splitlines()[-3:]
    return "error", " | ".join(tail)[-400:]


PAPERMILL_TAGS = {"papermill-error-cell-tag", "injected-parameters"}


def _where_it_stopped(notebook) -> str:
    """"cell N raised ...", N counting the submission's own cells (not papermill's)."""
    own = [c for c in notebook.cells
           if not PAPERMILL_TAGS & set(c.get("metadata", {}).get("tags", []))]
    for index, cell in enumerate(own):
        error = _error(cell)
        if error:
            return f"cell {index} raised {error}"
    return ""


def grade_submission(path: Path, quiz_dir: Path, source_dir: Path | None = None,
                     parameters: dict | None = None, cell_timeout: float = 300,
                     timeout: float = 1800) -> Submission:
    """Execute one submission in a fresh folder and process; never raises for the notebook's
    own faults (they become the row's status)."""
    result, start = Submission(Path(path)), time.monotonic()
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a row, not a crash
        result.status, result.detail = "unreadable", f"{type(exc).__name__}: {exc}"
        return result
    result.quizzes = quiz_scores(notebook, quiz_dir)
    source = Path(source_dir) / Path(path).name if source_dir else None
    missing = restore_checks(notebook, nbformat.read(source, as_version=4)) \
        if source is not None and source.exists() else []
    with tempfile.TemporaryDirectory(prefix="labkit-grade-") as tmp:
        work = Path(tmp)
        shutil.copytree(quiz_dir, work / "quizzes")
        src, dst = work / "submission.ipynb", work / "executed.ipynb"
        nbformat.write(notebook, src)
        result.status, result.detail = _execute(src, dst, work, parameters or {},
                                                cell_timeout, timeout)
        executed = nbformat.read(dst, as_version=4) if dst.exists() else notebook
    result.exercises = exercise_results(executed)
    result.exercises += [{"grade_id": g, "points": 0, "status": "missing", "earned": 0,
                          "summary": "the check cell was deleted"} for g in missing]
    if result.status == "error":
        result.detail = _where_it_stopped(executed) or result.detail
    result.seconds = time.monotonic() - start
    return result


def grade(paths, out: Path, quiz_dir: Path | None = None, source_dir: Path | None = None,
          parameters: dict | None = None, cell_timeout: float = 300,
          timeout: float = 1800, jobs: int = 1, echo=print) -> list[Submission]:
    """Grade every submission in ``paths`` and write ``out`` (CSV, in the order given).
    ``jobs`` submissions run at once, each in its own process and folder."""
    from concurrent.futures import ThreadPoolExecutor

    quiz_dir = Path(quiz_dir or REPO / "notebooks" / "quizzes")
    source_dir = source_dir if source_dir is not None else (
        REPO / "course" if (REPO / "course").is_dir() else None)

    def one(path) -> Submission:
        try:
            result = grade_submission(Path(path), quiz_dir, source_dir, parameters,
                                      cell_timeout, timeout)
        except Exception as exc:  # noqa: BLE001 - one submission never stops the others
            result = Submission(Path(path), "error", f"grading failed: {type(exc).__name__}: "
                                f"{exc}"[:400])
        row = result.row()
        echo(f"{path}: {result.status}, {row['points']}/{row['max_points']} points"
             + (f" ({result.detail})" if result.detail else ""))
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, paths))
    rows = [r.row() for r in results]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return results
