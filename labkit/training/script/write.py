"""The text of a written script, from a resolved run: the pieces in the order the script
reads (the run's values, the model, the data, each parallelism, the step, ``main``)."""

from __future__ import annotations

import textwrap

from labkit.models import build_model, plan_for
from labkit.parallel.pipeline.stages import split_stages
from labkit.parallel.sharded.fsdp import shard_dims
from labkit.training.build.build import plain_ddp
from labkit.training.layout.layout import MESH_ORDER
from labkit.training.script.model import (
    DATA_FUNCTION,
    MODEL_CLASS,
    config_piece,
    data_piece,
    model_pieces,
    tp_pieces,
)
from labkit.training.script.parallel import (
    data_parallel_pieces,
    pipeline_pieces,
    profile_piece,
    setup_piece,
    write_piece,
)
from labkit.training.script.refuse import check_scriptable
from labkit.training.script.source import Piece, join
from labkit.training.script.step import main_piece, step_piece

OPTIMIZER_CLASS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


def mesh_dims(run) -> list[tuple[str, int]]:
    """The mesh's dimensions: those split more than one way, or whose engine runs on one
    rank (a preset's DDP on one rank), in labkit's order (pp outermost, tp innermost)."""
    layout, engines = run.layout, run.engines
    engine = engines.data_engine
    runs = {"pp": engines.pipelined, "dp": engine in ("ddp", "naive", "zero1"),
            "fsdp": engine == "fsdp", "cp": False, "tp": False}
    return [(dim, getattr(layout, dim)) for dim in MESH_ORDER
            if getattr(layout, dim) > 1 or runs[dim]]


def data_engine(run) -> str | None:
    """What averages gradients: "ddp", "zero1" (DDP and ZeroRedundancyOptimizer), "naive",
    "fsdp", "replicate" (FSDP2's DDP, for replicas split by tp or pp), or None."""
    engine = run.engines.data_engine
    if engine in ("ddp", "zero1") and not plain_ddp(run):
        return "replicate"
    return engine


def _constants(run, stages) -> Piece:
    config, layout = run.config, run.layout
    lines = [f"SEED = {config.seed}", f"GLOBAL_BATCH = {config.global_batch}  # samples per "
             "step, over every rank", f"STEPS = {config.steps}", f"LR = {config.lr!r}",
             f"WORLD_SIZE = {run.world_size}  # ranks: torchrun's --nproc-per-node x --nnodes",
             f"DATA_SIZE = {layout.data_size}  # slices of the batch: dp x fsdp"]
    if run.engines.pipelined:
        lines += [f"MICRO_BATCHES = {config.micro_batches}  # per step, through the pipeline",
                  f"PP = {layout.pp}",
                  "# layers [a, b) of each stage: labkit's split, equal numbers of layers with "
                  "weights", f"STAGE_LAYERS = {stages}"]
    else:
        micro = config.micro_batches * config.grad_accumulation
        lines.append(f"MICRO_STEPS = {micro}  # forward-backward passes per optimizer step")
    return Piece("\n".join(lines))


def _wrapped(command: str, width: int = 92) -> str:
    """A long command over several lines (an option with its value on one), each but the
    last ending in a backslash."""
    words = []
    for word in command.split(" "):
        if words and not word.startswith("-") and words[-1].startswith("--"):
            words[-1] += " " + word
        else:
            words.append(word)
    lines, line = [], "    "
    for word in words:
        if line.strip() and len(line) + len(word) > width:
            lines.append(line + "\\")
            line = "        "
        line += word + " "
    return "\n".join(lines + [line.rstrip()])


def _fill(text: str) -> str:
    return textwrap.fill(text, 92)


def _docstring(run, command: str | None, name: str) -> str:
    label, n = run.label, run.world_size
    model = MODEL_CLASS[run.config.model.name]
    head = f"Train the zoo's {model} with {label} on {n} rank{'s' * (n > 1)}, in plain PyTorch."
    launch = f"    torchrun --nproc-per-node {n} {name} --out losses.json"
    what = ("the same weights, data and steps as labkit's ranks: the losses it writes (rank 0: "
            "{\"losses\": [...]}, one per step) are labkit's. A GPU per rank (NCCL), or without "
            "GPUs a CPU core per rank (gloo); torch and the standard library only.")
    if command:
        origin = [_fill("Written by ``python -m labkit script`` from the run it resolves for"),
                  _wrapped(command), _fill(f"with {what}")]
    else:
        origin = [_fill(f"Written by ``labkit.script`` from a resolved run, with {what}")]
    return "\n\n".join([head, launch, *origin]) + "\n"


def script_text(run, command: str | None = None, cpu: bool = False,
                out: str = "losses.json", name: str = "train.py",
                profile: str | None = None) -> str:
    """The standalone training script of ``run`` (a resolved ``Run``); ScriptRefused for a
    run labkit trains but writes no script for (``refuse.py``). ``cpu``: CPU ranks even
    where there are GPUs; ``out``: the default of the script's ``--out``; ``profile``: a
    folder, for a script that records its steps with ``torch.profiler`` there (its
    ``--profile DIR``; None: a script without the profiler); ``name``: its file name, for its
    docstring."""
    check_scriptable(run)
    config = run.config
    plan = plan_for(config.model)
    meta = build_model(config.model, "meta", config.seed)
    stages = None
    if run.engines.pipelined:
        layers = plan.layers(meta)
        cut = split_stages(layers, run.stages)
        starts = [layers.index(pieces[0]) for pieces in cut]
        stages = [(a, b) for a, b in zip(starts, starts[1:] + [len(layers)], strict=True)]
    engine = data_engine(run)
    dims = mesh_dims(run)
    pieces = [_constants(run, stages), *model_pieces(config.model, run.engines.pipelined),
              data_piece(config.model), setup_piece(cpu)]
    if run.layout.tp > 1:
        pieces += tp_pieces(config.model, meta, plan, run.layout.tp)
    if run.engines.pipelined:
        pieces += pipeline_pieces(config.model.name, run.engines.schedule)
    pieces += data_parallel_pieces(run, engine, shard_dims(run.layout))
    pieces += [step_piece(run, engine), write_piece(run.engines.pipelined),
               *([profile_piece()] if profile else []),
               main_piece(run, engine, dims, OPTIMIZER_CLASS[config.optimizer],
                          DATA_FUNCTION[config.model.name], out, profile)]
    code = "\n".join(piece.code for piece in pieces[2:])  # only the fields the script reads
    pieces[1] = config_piece(config.model, code)
    return join(_docstring(run, command, name), pieces)
