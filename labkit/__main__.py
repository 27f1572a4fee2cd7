"""Command line.

    python -m labkit doctor                               # is this machine ready?
    python -m labkit notebooks ~/labkit-lessons           # the learners' notebooks, to open
    torchrun --nproc-per-node 2 -m labkit train --strategy ddp --out report.json
    python -m labkit script --strategy ddp --world-size 2 --out-script train.py  # plain torch
    python -m labkit release                              # course/ -> notebooks/ (learners')
    python -m labkit grade submissions/ --source course --out grades.csv
    python -m labkit docs --out site/                     # the web site, lessons executed
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _release_arguments(parser) -> None:
    parser.add_argument("--source", "--course", dest="course", type=Path,
                        default=Path("course"),
                        help="the course sources, with solutions; may be a private folder "
                             "outside the repository (default: course)")
    parser.add_argument("--out", type=Path, default=Path("notebooks"),
                        help="where the learners' notebooks go (default: notebooks)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the learners' notebooks are out of date")
    parser.add_argument("--no-solutions", action="store_true",
                        help="leave out solutions/ (the reference solutions that "
                             "labkit.check.reveal shows): for a course that grades exercises")


def _grade_arguments(parser) -> None:
    parser.add_argument("submissions", nargs="+", type=Path,
                        help="submitted notebooks, or folders of them")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="the CSV to write")
    parser.add_argument("--parameters", default="{}",
                        help='JSON injected into each notebook\'s parameters cell, e.g. '
                             '\'{"world_size": 2}\'')
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds allowed per submission (default 1800)")
    parser.add_argument("--cell-timeout", type=float, default=300,
                        help="seconds allowed per cell (default 300)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="submissions graded at once (each in its own process; default 1)")
    parser.add_argument("--quizzes", type=Path, default=None,
                        help="the quiz files (default: the suite's notebooks/quizzes)")
    parser.add_argument("--source", type=Path, default=None,
                        help="the course sources the grader runs (default: the suite's "
                             "course/ when present); may be a private folder")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="grade without bubblewrap: each submission's code runs as you, "
                             "with your files and network; only for work you trust")


def _release(args) -> int:
    from labkit.classroom.release import release

    changed, stale = release(args.course, args.out, check=args.check,
                             solutions=not args.no_solutions)
    for path in stale:
        print(f"{path} has no source in {args.course}/: add it there, or delete it")
    if args.check:
        for path in changed:
            print(f"{path} is out of date: run `python -m labkit release`")
        return 1 if changed or stale else 0
    print(f"wrote {len(changed)} file(s) to {args.out}/" if changed else "up to date")
    return 1 if stale else 0


def _grade(args) -> int:
    from labkit.classroom.grade import SandboxError, grade

    try:
        grade(args.submissions, args.out, args.quizzes, args.source, json.loads(args.parameters),
              args.cell_timeout, args.timeout, args.jobs,
              sandboxed=not args.unsafe_no_sandbox)
    except FileNotFoundError as error:
        print(error, file=sys.stderr)
        return 1
    except SandboxError as error:
        print(error, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the running submissions were stopped; {args.out} was not "
              "written", file=sys.stderr)
        return 130
    print(f"wrote {args.out}")
    return 0


def _notebooks(args) -> int:
    from labkit.classroom.fetch import FetchError, fetch, report

    try:
        result = fetch(args.folder, force=args.force)
    except FetchError as error:
        print(error, file=sys.stderr)
        return 2
    print("\n".join(report(result)))
    return 0


def _docs_arguments(parser) -> None:
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="the folder the site goes to (new, empty, or a site built here)")
    parser.add_argument("--executed", type=Path, default=None, metavar="DIR",
                        help="a folder of course notebooks executed at their classroom "
                             "defaults (as LABKIT_LESSONS_DIR keeps them); without it, the "
                             "lessons are executed first (slow)")


def _docs(args) -> int:
    from labkit.classroom.site import SiteError, build_site

    try:
        build_site(args.out, args.executed, say=lambda line: print(line, flush=True))
    except SiteError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="check torch, devices and a 2-rank all_reduce")
    notebooks = commands.add_parser(
        "notebooks", help="copy the learners' notebooks and quizzes into a folder of yours")
    notebooks.add_argument("folder", type=Path, help="where they go (made if missing)")
    notebooks.add_argument("--force", action="store_true",
                           help="overwrite the files there you edited too (without it they "
                                "are kept; files you did not edit are updated either way)")
    from labkit.training import torchrun

    torchrun.add_arguments(commands.add_parser(
        "train", help="train a zoo model (under torchrun: on every rank), write a JSON report"))
    from labkit.training.script import cli as script_cli

    script_cli.add_arguments(commands.add_parser(
        "script", help="write the standalone PyTorch training script of the run that "
                       "`train` would train with the same arguments"))
    _release_arguments(commands.add_parser(
        "release", help="write the learners' notebooks from the course sources (solutions "
                        "and hidden tests removed)"))
    _grade_arguments(commands.add_parser(
        "grade", help="run the checks of submitted notebooks, each in a sandbox, and write "
                      "their results and quiz scores to a CSV"))
    _docs_arguments(commands.add_parser(
        "docs", help="build the web site (user guide, lessons with their outputs, API "
                     "reference) with mkdocs --strict"))
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from labkit.runtime.cluster.doctor import main as doctor

        return doctor()
    if args.command == "release":
        return _release(args)
    if args.command == "notebooks":
        return _notebooks(args)
    if args.command == "grade":
        return _grade(args)
    if args.command == "docs":
        return _docs(args)
    if args.command == "script":
        return script_cli.main(args, sys.argv[1:] if argv is None else argv)
    return torchrun.main(args)


if __name__ == "__main__":
    code = main()
    if sys.argv[1:2] == ["train"]:  # its report written, its process group destroyed:
        sys.stdout.flush()  # skip Python's teardown, where torch's threads can abort it
        sys.stderr.flush()  # ("terminate called without an active exception"), as the
        os._exit(code)  # scripts labkit writes do
    sys.exit(code)
