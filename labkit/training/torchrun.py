"""The same training experiment under torchrun, on one machine or many:

    torchrun --nproc-per-node 2 -m labkit train --model mlp --strategy ddp --out report.json
    torchrun --nproc-per-node 4 -m labkit train --model gpt --layout fsdp=2,tp=2 --out r.json
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m labkit train ...

Each process is a rank (one GPU each where there are GPUs, else one CPU core each); rank 0
gathers every rank's records and writes the same ``TrainReport`` JSON that ``labkit.train``
returns in a notebook, so a notebook can load it (``labkit.TrainReport.load``) and plot it.
Run without torchrun, it trains on one process.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import rendezvous

from labkit.models import config_for, sized
from labkit.parallel.context.engine import ENGINES as CP_ENGINES
from labkit.runtime.cluster.hardware import physical_cores
from labkit.runtime.cluster.rank import RankContext
from labkit.runtime.memory import MemoryTracker
from labkit.training.checkpoint.lock import lock_checkpoints
from labkit.training.checkpoint.rules import check_checkpointing
from labkit.training.checkpoint.store import CheckpointError
from labkit.training.config import OPTIMIZERS, PRECISIONS, TrainConfig
from labkit.training.engines import CHOICES
from labkit.training.estimate import estimate_memory
from labkit.training.layout import STRATEGIES, Layout
from labkit.training.loop import train_on_rank
from labkit.training.report import TrainReport
from labkit.training.run import Run, resolve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mlp", choices=["mlp", "gpt", "dlrm", "moe_gpt"])
    parser.add_argument("--params", type=float, help="size the model to about this many "
                        "parameters (default: the zoo's default size)")
    parser.add_argument("--strategy", default=["ddp"], choices=STRATEGIES, nargs="+",
                        help="one or more strategies, trained one after another in the same "
                             "processes (with several, each report goes to OUT with the "
                             "strategy's name before its suffix: report.fsdp.json)")
    parser.add_argument("--layout", help="degrees instead of a strategy, e.g. dp=2,tp=2 or "
                        "pp=2,dp=2,schedule=gpipe (their product: the number of processes)")
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS)
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--grad-accumulation", type=int, default=1,
                        help="micro-steps per optimizer step")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="recompute each block's activations in backward")
    parser.add_argument("--checkpoint-dir", help="save sharded checkpoints here, and resume "
                        "from the newest one of this run found here (with several "
                        "strategies: a folder per strategy inside it)")
    parser.add_argument("--checkpoint-every", type=int,
                        help="save every this many steps (default: after the last step)")
    parser.add_argument("--checkpoint-keep", type=int,
                        help="keep the newest this many checkpoints (default: all)")
    parser.add_argument("--checkpoint-async", action="store_true",
                        help="save with dcp.async_save while training goes on")
    parser.add_argument("--kill-rank-at-step", type=int, nargs=2, metavar=("RANK", "STEP"),
                        help="a planted failure, to try restarts: rank RANK kills itself "
                        "(SIGKILL) once STEP steps are done, in the first attempt only "
                        "(torchrun --max-restarts N restarts it; with --checkpoint-dir the "
                        "run resumes from its last checkpoint)")
    parser.add_argument("--cp-engine", default="auto", choices=CP_ENGINES,
                        help="context parallelism's engine: auto (PyTorch's on GPUs, labkit's "
                        "ring on CPU), torch (GPUs only) or ring")
    parser.add_argument("--profile", metavar="DIR", help="record each rank's timed steps "
                        "with torch.profiler: one Chrome trace per rank here "
                        "(rank{r}.pt.trace.json), for Perfetto or TensorBoard")
    parser.add_argument("--cpu", action="store_true", help="use CPU ranks even with GPUs")
    parser.add_argument("--out", default="report.json", help="where rank 0 writes the report")


def parse_layout(text: str) -> tuple[Layout, dict[str, str]]:
    """``"dp=2,tp=2,schedule=gpipe"`` -> ``(Layout(dp=2, tp=2), {"schedule": "gpipe"})``:
    the degrees, and the engine choices given beside them (TrainConfig fields)."""
    fields = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = (part.strip() for part in item.partition("="))
        if name in fields:
            raise ValueError(f"layout {text!r} gives {name} twice: give each dimension once")
        fields[name] = int(value) if value.isdigit() else value
    choices = {name: fields.pop(name) for name in CHOICES if name in fields}
    if "cp_engine" in fields:
        raise ValueError(f"layout {text!r}: the cp engine is its own flag: --cp-engine "
                         f"{fields['cp_engine']}")
    try:
        return Layout(**fields), choices
    except TypeError as exc:
        raise ValueError(f"cannot read layout {text!r}: write e.g. dp=2,tp=2 ({exc})") from exc


def _configs(args) -> list[tuple[TrainConfig, str]]:
    """Each run asked for, with where its report goes."""
    model = sized(args.model, int(args.params)) if args.params else config_for(args.model)
    strategies = [args.strategy] if isinstance(args.strategy, str) else args.strategy
    parallels = [{"strategy": name} for name in strategies]
    if args.layout:
        layout, choices = parse_layout(args.layout)
        parallels = [{"layout": layout, **choices}]
    out = Path(args.out)
    runs = []
    for parallel in parallels:
        config = TrainConfig(model=model, global_batch=args.global_batch, steps=args.steps,
                             lr=args.lr, optimizer=args.optimizer, precision=args.precision,
                             micro_batches=args.micro_batches,
                             grad_accumulation=args.grad_accumulation,
                             activation_checkpointing=args.activation_checkpointing,
                             checkpoint_dir=getattr(args, "checkpoint_dir", None),
                             checkpoint_every=getattr(args, "checkpoint_every", None),
                             checkpoint_async=getattr(args, "checkpoint_async", False),
                             checkpoint_keep=getattr(args, "checkpoint_keep", None),
                             cp_engine=getattr(args, "cp_engine", "auto"),
                             profile=getattr(args, "profile", None), **parallel)
        if len(parallels) > 1 and config.checkpoint_dir is not None:
            # a folder per strategy: the strategy may change on resumption, so in one
            # folder the second run would take the first one's last checkpoint as its own
            config = config.replace(checkpoint_dir=os.path.join(config.checkpoint_dir,
                                                                config.label))
        if len(parallels) > 1 and config.profile is not None:  # one rank{r} file each
            config = config.replace(profile=os.path.join(config.profile, config.label))
        path = (out if len(parallels) == 1
                else out.with_name(f"{out.stem}.{config.label}{out.suffix}"))
        runs.append((config, str(path)))
    return runs


def _device(args) -> torch.device:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if not args.cpu and torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _join(device: torch.device) -> str:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # a virtual GPU: one core
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "WORLD_SIZE" in os.environ:  # started by torchrun: env:// rendezvous
        timeout = timedelta(minutes=10)
        store, rank, world_size = next(rendezvous("env://", timeout=timeout))
        # torchrun keeps one store across restarts (--max-restarts): without a prefix per
        # attempt, a restarted rank reads the dead attempt's addresses and cannot connect.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(backend, store=dist.PrefixStore(f"attempt-{attempt}", store),
                                rank=rank, world_size=world_size, timeout=timeout,
                                device_id=device if device.type == "cuda" else None)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return backend


@dataclass
class _PlantedFailure(RankContext):
    """A rank that SIGKILLs itself once ``kill_at`` steps are done (``--kill-rank-at-step``),
    as a GPU that dies would take its process down: no exception, no goodbye."""

    kill_at: int = 0

    def progress(self, done: int, total: int, desc: str = "") -> None:
        if done == self.kill_at:
            print(f"rank {self.rank}: planted failure, killed after {done} steps",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        super().progress(done, total, desc)


def _context(args):
    """The RankContext class of this process: a planted failure's on the rank it names, in
    torchrun's first attempt (its restarts run clean)."""
    if args.kill_rank_at_step is None:
        return RankContext
    rank, step = args.kill_rank_at_step
    first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) == 0
    if not first_attempt or int(os.environ.get("RANK", 0)) != rank:
        return RankContext
    return functools.partial(_PlantedFailure, kill_at=step)


def _train(run: Run, out: str, ctx: RankContext, estimate) -> None:
    """One run on this process's rank; rank 0 writes its report to ``out``."""
    rank, world_size, config = ctx.rank, ctx.world_size, run.config
    result = train_on_rank(ctx, run.to_dict())
    result["host"] = socket.gethostname()
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object(result, gathered, dst=0, group=dist.group.WORLD)
    if rank == 0:
        hosts = sorted({r["host"] for r in gathered})
        report = TrainReport(run, ctx.oversubscribed, gathered, estimate,
                             where=f"measured under torchrun on {', '.join(hosts)}")
        report.save(out)
        split = report.split()
        print(f"{config.label} x{world_size}: loss {report.losses[0]:.4f} -> "
              f"{report.losses[-1]:.4f}; step {split['step_s'] * 1e3:.1f} ms; "
              f"{report.samples_per_s:.0f} samples/s; report written to {out}", flush=True)


def _lock_on_rank_0(config: TrainConfig):
    """Rank 0 holds ``config.checkpoint_dir`` for the run (its process ending frees it: a
    worker torchrun restarts takes it again); every rank raises when another run holds it."""
    lock = error = None
    if config.checkpoint_dir is not None and dist.get_rank() == 0:
        try:
            lock = lock_checkpoints(config.checkpoint_dir)
        except CheckpointError as exc:
            error = str(exc)
    if config.checkpoint_dir is not None:
        said = [error]
        dist.broadcast_object_list(said, src=0)
        if said[0] is not None:
            raise CheckpointError(said[0])
    return lock


def main(args) -> int:
    try:
        runs = _configs(args)  # bad arguments fail here, before any collective
    except ValueError as error:
        print(f"labkit train: {error}", file=sys.stderr)
        return 2
    device = _device(args)
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if args.kill_rank_at_step is not None:
        rank, step = args.kill_rank_at_step
        if not 0 <= rank < world_size or step < 1:
            raise ValueError(f"--kill-rank-at-step {rank} {step}: the rank must be one of 0.."
                             f"{world_size - 1} and the step at least 1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    debug = os.environ.get("TORCH_DISTRIBUTED_DEBUG")
    runs = [(resolve(config, world_size, device.type, backend, debug), out)
            for config, out in runs]  # every rank resolves its own copy, before any joins
    for run, _ in runs:
        check_checkpointing(run)
    # The estimate traces on a process group of its own: before this process joins one.
    first = int(os.environ.get("RANK", 0)) == 0
    estimates = [estimate_memory(run).to_dict() if first else None for run, _ in runs]
    _join(device)
    try:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        oversubscribed = device.type == "cpu" and local_ranks > physical_cores()
        ctx = _context(args)(dist.get_rank(), world_size, device, backend, dist.group.WORLD,
                             oversubscribed, MemoryTracker(dist.get_rank()))
        for (run, out), estimate in zip(runs, estimates, strict=True):
            lock = _lock_on_rank_0(run.config)
            try:
                _train(run, out, ctx, estimate)
            finally:
                if lock is not None:
                    lock.release()
    finally:
        dist.destroy_process_group()
    return 0
