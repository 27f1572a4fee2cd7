"""Command line: ``python -m labkit doctor``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="check torch, devices and a 2-rank all_reduce")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from labkit.doctor import main as doctor

        return doctor()
    return 2


if __name__ == "__main__":
    sys.exit(main())
