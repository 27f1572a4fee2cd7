"""Benchmark: machine time of every lesson at classroom defaults, and learner time estimated.

    python bench/classroom.py           # each course notebook at its classroom defaults
    python bench/classroom.py --quick   # at the tests' smoke sizes (about two minutes)

Machine time is measured: each notebook of ``course/`` (reference solutions filled in) runs
top to bottom under papermill with its own parameters cell, one after another, and the wall
time is printed. Learner time is an estimate, not a measurement (nobody was timed): the
prose read at 120 words a minute (technical text), 15 minutes per exercise, one minute per
quiz question, and the machine time itself. docs/instructor.md quotes the figures of one run.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
WORDS_PER_MINUTE, EXERCISE_MIN, QUESTION_MIN = 120, 15, 1


def learner_minutes(notebook, quiz_path: Path) -> dict:
    from labkit.classroom.release import exercise_cells
    from labkit.lessons.show.quizzes import load_quiz

    words = sum(len(re.findall(r"\w+", c.source)) for c in notebook.cells
                if c.cell_type == "markdown")
    exercises = sum(1 for c in exercise_cells(notebook) if c["kind"] == "answer")
    questions = len(load_quiz(quiz_path)) if quiz_path.exists() else 0
    reading = words / WORDS_PER_MINUTE
    return {"words": words, "exercises": exercises, "questions": questions,
            "estimate_min": reading + EXERCISE_MIN * exercises + QUESTION_MIN * questions}


def main() -> None:
    import nbformat
    import papermill

    from tests.lessons import SMOKE

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke sizes (the tests')")
    parser.add_argument("--only", nargs="*", default=None, help="notebook stems to run")
    args = parser.parse_args()
    figures = {"cores": os.cpu_count(), "quick": args.quick, "notebooks": {}}
    for path in sorted((REPO / "course").glob("*.ipynb")):
        if args.only and path.stem not in args.only:
            continue
        parameters = {**SMOKE[path.stem], "interactive": False} if args.quick else {}
        error = None
        with tempfile.TemporaryDirectory() as tmp:
            start = time.monotonic()
            try:
                papermill.execute_notebook(str(path), str(Path(tmp) / path.name),
                                           parameters={**parameters, "interactive": False},
                                           kernel_name="python3", cwd=str(path.parent),
                                           progress_bar=False, execution_timeout=1800)
            except papermill.PapermillExecutionError as failure:
                error = f"cell {failure.exec_count}: {failure.ename}: {failure.evalue}"[:300]
            seconds = time.monotonic() - start
        learner = learner_minutes(nbformat.read(path, as_version=4),
                                  REPO / "notebooks" / "quizzes" / f"{path.stem}.json")
        learner["estimate_min"] += seconds / 60
        figures["notebooks"][path.stem] = {"machine_s": round(seconds, 1), "error": error,
                                           **{k: round(v, 1) if isinstance(v, float) else v
                                              for k, v in learner.items()}}
        print(f"{path.stem}: machine {seconds:.0f} s; learner about "
              f"{learner['estimate_min']:.0f} min (estimated: {learner['words']} words, "
              f"{learner['exercises']} exercise(s), {learner['questions']} questions)"
              + (f"; FAILED at {error}" if error else ""), flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
