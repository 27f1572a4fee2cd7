"""``python -m labkit script``: the arguments of ``python -m labkit train``, and where the
script goes.

    python -m labkit script --model gpt --layout fsdp=2,tp=2 --out-script train.py
    python -m labkit script --strategy ddp fsdp --world-size 2   # train.ddp.py, train.fsdp.py
"""

from __future__ import annotations

import argparse
import shlex
import sys

from labkit.training import torchrun
from labkit.training.script import ScriptRefused, script, world_size_of

_OWN = {"--out-script": 1, "--world-size": 1}  # this command's options, with their values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    torchrun.add_arguments(parser)
    for action in parser._actions:  # --out here: the default of the script's own --out
        if action.dest == "out":
            action.default = "losses.json"
            action.help = "the default of the script's --out (default: losses.json)"
    parser.add_argument("--out-script", default="train.py",
                        help="where the script goes (default: train.py; with several "
                             "strategies, each with the strategy's name before the suffix: "
                             "train.ddp.py)")
    parser.add_argument("--world-size", type=int,
                        help="the ranks it runs on, as torchrun's --nproc-per-node x --nnodes "
                             "(default: the layout's product; a strategy needs it)")


def _train_command(argv: list[str], world_size: int, strategy: str | None) -> str:
    """The ``torchrun ... -m labkit train`` command of the same run (of ``strategy`` alone,
    where several were given)."""
    kept, skip, strategies = [], 0, False
    for arg in argv:
        if strategies and not arg.startswith("-"):
            continue  # the strategies given: this run's alone is kept
        strategies = False
        if skip:
            skip -= 1
        elif arg.split("=")[0] in _OWN:
            skip = _OWN[arg] if "=" not in arg else 0
        elif arg == "--strategy" and strategy is not None:
            kept += [arg, strategy]
            strategies = True
        elif arg != "script":
            kept.append(arg)
    return f"torchrun --nproc-per-node {world_size} -m labkit train {shlex.join(kept)}"


def main(args, argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if args.kill_rank_at_step is not None:
        print("--kill-rank-at-step plants a failure for torchrun's restarts and labkit's "
              "checkpoints to recover from; a script saves no checkpoint: leave it out",
              file=sys.stderr)
        return 2
    # --profile: the default of the script's own --profile (no folder is made here)
    try:
        runs = torchrun._configs(argparse.Namespace(**{**vars(args), "out": args.out_script,
                                                       "profile": None}))
    except ValueError as error:
        print(f"labkit script: {error}", file=sys.stderr)
        return 2
    for config, path in runs:
        try:
            n = world_size_of(config, args.world_size)
            text = script(config, world_size=n, path=path, cpu=args.cpu, out=args.out,
                          profile=args.profile,
                          command=_train_command(argv, n, config.strategy if config.layout is None
                                                   else None))
        except (ScriptRefused, ValueError) as error:
            print(error, file=sys.stderr)
            return 2
        print(f"wrote {path} ({len(text.splitlines())} lines): {text.command}")
    return 0
