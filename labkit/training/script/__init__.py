"""A run as a standalone PyTorch training script, for a learner to take to their own GPUs.

    python -m labkit script --model gpt --layout fsdp=2,tp=2 --out-script train.py
    torchrun --nproc-per-node 4 train.py --out losses.json

    labkit.script(model="gpt", layout=labkit.Layout(fsdp=2, tp=2), path="train.py")  # a cell

The script is written from the same resolved ``Run`` that labkit's ranks train
(``labkit/training/run.py``): the zoo model's own source (``labkit/models``), its synthetic
data, the same seed, the layout's mesh, and each parallelism applied in torchtitan's order
(tensor parallelism with ``parallelize_module`` and a plan dict, activation checkpointing,
the pipeline split into ``PipelineStage``s, ``fully_shard`` per block and the root, or
DDP), with a comment on each call. It imports torch and the standard library only and runs
under torchrun on CUDA with NCCL (each rank's GPU from ``LOCAL_RANK``) or on CPU with gloo;
``--out r.json`` writes ``{"losses": [...]}``, equal to what ``torchrun -m labkit train``
reports for the same arguments.

A run labkit trains but writes no script for (its hand-written engines: the DLRM's tables,
the MoE's experts, ring attention, the naive pipeline, the naive tensor-parallel layers;
checkpointing) raises :class:`ScriptRefused` with the reason, before anything is written
(``refuse.py``).
``docs/guide/script.md`` lists what is written and what is refused.
"""

from __future__ import annotations

import os

from labkit.training.config import TrainConfig
from labkit.training.run import Run, resolve
from labkit.training.script.refuse import ScriptRefused, refusal
from labkit.training.script.write import script_text

__all__ = ["Script", "ScriptRefused", "refusal", "script", "script_text"]


class Script(str):
    """The text of a written script (a ``str``); in a notebook it shows as highlighted code
    with the command that runs it. ``path``: where it was written, or None."""

    path: str | None = None
    world_size: int = 1

    @property
    def command(self) -> str:
        name = os.path.basename(self.path) if self.path else "train.py"
        return f"torchrun --nproc-per-node {self.world_size} {name}"

    def _repr_markdown_(self) -> str:
        where = f"written to `{self.path}`; " if self.path else ""
        return f"{where}run it with `{self.command}`\n\n```python\n{self}```\n"


def world_size_of(config: TrainConfig, world_size: int | None) -> int:
    if world_size is not None:
        return world_size
    if config.layout is not None:
        return config.layout.size
    if config.strategy == "single":
        return 1
    raise ValueError(f"strategy {config.strategy!r} spreads over every rank: say how many "
                     f"(labkit.script(..., world_size=4), or --world-size 4)")


def script(config: TrainConfig | Run | None = None, *, world_size: int | None = None,
           path: str | os.PathLike | None = None, cpu: bool = False,
           command: str | None = None, out: str = "losses.json", profile: str | None = None,
           **fields) -> Script:
    """The standalone training script of a run, written to ``path`` when given.

        labkit.script(model="mlp", strategy="ddp", world_size=2, path="train.py")
        labkit.script(labkit.TrainConfig(model="gpt", layout=labkit.Layout(fsdp=2, tp=2)))

    ``config``: a ``TrainConfig`` (with ``fields`` replaced, as ``labkit.train`` takes them)
    or a resolved ``Run``. ``world_size``: the ranks (default: the layout's product; a
    strategy needs it). ``cpu``: CPU ranks even where there are GPUs. ``command``: the
    ``labkit train`` command line the run came from, for the script's docstring. ``out``:
    the default of the script's ``--out``; ``profile`` (default: the run's own): a folder,
    for a script that records its steps with ``torch.profiler``, a Chrome trace per rank
    there (its ``--profile DIR`` changes it). Raises
    ``ScriptRefused`` for a run labkit trains but writes no script for, ``ValueError`` for
    one that does not run at all.
    """
    if isinstance(config, Run):
        if fields or world_size is not None:
            raise TypeError("a resolved Run is written as it was resolved: give a TrainConfig "
                            "to change it")
        run = config if config.checked else resolve(config.config, config.world_size)
    else:
        config = (config or TrainConfig()).replace(**fields) if fields else (
            config or TrainConfig())
        run = resolve(config, world_size_of(config, world_size))
    name = os.path.basename(path) if path is not None else "train.py"
    profile = run.config.profile if profile is None else os.fspath(profile)
    text = Script(script_text(run, command, cpu, out, name, profile))
    text.world_size = run.world_size
    if path is not None:
        text.path = os.fspath(path)
        with open(text.path, "w") as file:
            file.write(text)
    return text
