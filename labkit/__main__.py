"""Command line.

    python -m labkit doctor                               # is this machine ready?
    torchrun --nproc-per-node 2 -m labkit train --strategy ddp --out report.json
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="check torch, devices and a 2-rank all_reduce")
    from labkit.train import torchrun

    torchrun.add_arguments(commands.add_parser(
        "train", help="train a zoo model (under torchrun: on every rank), write a JSON report"))
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from labkit.doctor import main as doctor

        return doctor()
    return torchrun.main(args)


if __name__ == "__main__":
    sys.exit(main())
