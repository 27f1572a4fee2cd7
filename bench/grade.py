"""Benchmark: how long ``python -m labkit grade`` takes for a class, and that it leaves nothing.

    python bench/grade.py           # 20 submissions of notebook 00, --jobs 2
    python bench/grade.py --quick   # 6 of them (about a minute)

The submissions are the learners' notebook 00 with its answer cell filled in, alternately the
reference solution and a wrong answer, graded at the tests' smoke sizes in the sandbox (or
with ``--unsafe-no-sandbox``, where none can be made). Afterwards no process below this one and
no grading cgroup may be left. The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    from labkit.classroom import sandbox
    from labkit.classroom.grade import grade
    from tests.grading import SMOKE, WRONG, reference, submission

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 submissions, not 20")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    count, unsafe = (6 if args.quick else 20), sandbox.problem() is not None
    with tempfile.TemporaryDirectory(prefix="labkit-bench-grade-") as tmp:
        folder = Path(tmp) / "submissions"
        for n in range(count):
            submission(folder / f"learner_{n:02d}.ipynb", reference() if n % 2 == 0 else WRONG)
        start = time.monotonic()
        results = grade([folder], Path(tmp) / "grades.csv", source_dir=REPO / "course",
                        parameters=json.loads(SMOKE), cell_timeout=120, timeout=300,
                        jobs=args.jobs, sandboxed=not unsafe)
        seconds = time.monotonic() - start
    time.sleep(0.5)
    left = [p.pid for p in psutil.Process().children(recursive=True)]
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").rglob("labkit-grade-*")]
    right = [r.row()["points"] == (3 if int(r.path.stem[-2:]) % 2 == 0 else 0) for r in results]
    figures = {"submissions": count, "jobs": args.jobs, "sandboxed": not unsafe,
               "seconds": round(seconds, 1), "per_submission_s": round(seconds / count, 2),
               "graded_right": sum(right), "processes_left": len(left),
               "cgroups_left": len(cgroups)}
    print(json.dumps(figures))
    return 0 if all(right) and not left and not cgroups else 1


if __name__ == "__main__":
    sys.exit(main())
