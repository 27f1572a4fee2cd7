"""What to train and how: one typed config whose fields check their own type and range
(``labkit/training/run.py`` resolves and checks it as a whole)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from labkit.models import MLPConfig, ModelConfig, config_for, fields
from labkit.parallel.context.engine import ENGINES as CP_ENGINES
from labkit.training.engines import CHOICE_FIELDS, check_choice, describe
from labkit.training.layout.layout import Layout
from labkit.training.layout.presets import STRATEGIES

OPTIMIZERS = ("adam", "adamw", "sgd")
PRECISIONS = ("fp32", "bf16", "mixed")


@dataclass(frozen=True)
class TrainConfig:
    """A training run.

    Attributes:
        model: a zoo config (``labkit.models.MLPConfig()``...) or a zoo name ("mlp").
        strategy: a preset layout over all the ranks, by name (``labkit.STRATEGIES``):
            "single" (one device), data parallel "naive_dp", "ddp"; sharded "zero1", "fsdp";
            pipelines "naive_pipeline", "gpipe", "1f1b", "interleaved_1f1b"; tensor
            parallel "tp"; embedding tables "table_wise", "row_wise" (and
            "row_wise_dtensor").
        layout: a ``labkit.Layout`` instead of a strategy name (parallelisms composed:
            ``Layout(fsdp=2, tp=2)``); its degrees must multiply to the rank count.
        schedule, dp_kind, tables, tp_kind: the engine choices beside the layout's degrees
            (the pipeline schedule, the data-parallel engine, the DLRM's tables placed over
            fsdp, what splits the matrices over tp: DTensor or labkit's hand-written layers:
            ``labkit/training/engines.py``); None for the default (a strategy name sets its
            own).
        global_batch: samples per step over all ranks; data-parallel ranks get an equal slice.
        steps: optimizer steps; the first also builds lazy state and is left out of timings.
        precision: "fp32"; "bf16" (weights, gradients, optimizer state and compute in
            bfloat16); "mixed" (fp32 master weights, gradients and optimizer state, bfloat16
            compute: autocast, or FSDP2's ``MixedPrecisionPolicy`` where FSDP shards).
            Pipelines run in fp32 only.
        micro_batches: process each rank's batch in this many chunks, one after another,
            adding up their gradients (gradient accumulation); in a pipeline, the chunks
            its schedule sends through the stages.
        grad_accumulation: micro-steps per optimizer step: each rank's batch is cut into
            this many micro-batches, run forward and backward one after another, their
            gradients added up before one optimizer step. Same global batch, same update
            (up to float rounding); activations of one micro-batch at a time. Not with a
            pipeline (raise its micro_batches instead).
        activation_checkpointing: keep only each block's input in forward and recompute
            the block during backward (``torch.utils.checkpoint``, non-reentrant; the
            model's plan says what a block is: the GPT's transformer blocks).
        bucket_cap_mb: DDP's gradient bucket size.
        return_weights: also return every rank's final weights (for parity checks).
        checkpoint_dir: save sharded checkpoints (``torch.distributed.checkpoint``) here,
            and resume from the newest good one of this run found here
            (``labkit/training/checkpoint``).
        checkpoint_every: save after every this many steps (and after the last step); None
            saves after the last step only. Needs ``checkpoint_dir``.
        checkpoint_async: save with ``dcp.async_save``: training goes on while a
            background thread writes the checkpoint (it is committed before the next save).
        checkpoint_keep: keep this run's newest this many checkpoints, deleting older ones
            after each save (None keeps all). Saves killed half-way are deleted either way.
        cp_engine: what runs context parallelism (``labkit/parallel/context/engine.py``):
            "auto" (PyTorch's ``context_parallel`` on CUDA ranks, labkit's ring on CPU,
            where torch 2.13's refuses), "torch" (CUDA only) or "ring" (labkit's ring
            everywhere). The report's ``extra["cp_engine"]`` says which ran.
        profile: a folder: each rank records its timed steps with ``torch.profiler`` and
            writes a Chrome trace there (``rank{r}.pt.trace.json``, listed by the report's
            ``traces``), for Perfetto or TensorBoard (``labkit/training/profile.py``).
    """

    model: ModelConfig = field(default_factory=MLPConfig)
    strategy: str = "single"
    layout: Layout | None = None
    schedule: str | None = None
    dp_kind: str | None = None
    tables: str | None = None
    tp_kind: str | None = None
    global_batch: int = 64
    steps: int = 5
    lr: float = 1e-3
    optimizer: str = "adam"
    precision: str = "fp32"
    seed: int = 0
    micro_batches: int = 1
    bucket_cap_mb: float = 25.0
    return_weights: bool = False
    grad_accumulation: int = 1
    activation_checkpointing: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    checkpoint_async: bool = False
    checkpoint_keep: int | None = None
    cp_engine: str = "auto"
    profile: str | None = None

    def __post_init__(self):
        if isinstance(self.model, str):
            object.__setattr__(self, "model", config_for(self.model))
        _check_fields(self)
        if self.layout is not None and not isinstance(self.layout, Layout):
            raise ValueError(f"layout is a labkit.Layout, not {self.layout!r}")

    @property
    def label(self) -> str:
        """The strategy's name, or the layout's with its engine choices (for titles and
        progress bars): ``"pp2 x dp2 (gpipe)"``."""
        if self.layout is None:
            return self.strategy
        return describe(self.layout, self.schedule, self.dp_kind, self.tables, self.tp_kind)

    def replace(self, **changes) -> TrainConfig:
        """A copy with ``changes``; a new strategy replaces the layout and its engine
        choices, and a new layout the strategy and the engine choices not given with it
        (``replace(strategy="ddp")`` on a config with a layout trains DDP;
        ``replace(layout=Layout(dp=2))`` on a gpipe pipeline's config trains DDP, not a
        one-stage pipeline)."""
        if "strategy" in changes and "layout" not in changes:
            changes["layout"] = None
            for name in CHOICE_FIELDS:
                changes.setdefault(name, None)
        if "layout" in changes:  # the new degrees run with their own (default) engines
            changes.setdefault("strategy", "single")
            for name in CHOICE_FIELDS:
                changes.setdefault(name, None)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["model"] = {"name": self.model.name, **dataclasses.asdict(self.model)}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        data = dict(data)
        model = dict(data.pop("model"))
        layout = dict(data.pop("layout", None) or {}) or None
        for name in CHOICE_FIELDS:  # saved inside the layout before
            choice = (layout or {}).pop(name, None)
            if choice is not None and data.get(name) is None:
                data[name] = choice
        return cls(model=config_for(model.pop("name"), **model),
                   layout=Layout(**layout) if layout is not None else None, **data)


def _check_fields(config: TrainConfig) -> None:
    """Every field's type and range, before anything is sent to a rank."""
    if not isinstance(config.model, ModelConfig):
        raise TypeError(f"TrainConfig.model must be a zoo config or name, got {config.model!r}")
    fields.one_of(config, "strategy", STRATEGIES)
    for name in CHOICE_FIELDS:
        check_choice("TrainConfig", name, getattr(config, name))
    fields.whole(config, "global_batch", "steps", "micro_batches")
    fields.whole(config, "seed", minimum=0)
    fields.positive(config, "lr", allow_zero=True)  # as torch's optimizers: lr=0 is allowed
    fields.positive(config, "bucket_cap_mb")
    fields.one_of(config, "optimizer", OPTIMIZERS)
    fields.one_of(config, "precision", PRECISIONS)
    fields.flag(config, "return_weights")
    fields.whole(config, "grad_accumulation")
    fields.flag(config, "activation_checkpointing")
    _check_checkpoint_fields(config)
    fields.one_of(config, "cp_engine", CP_ENGINES)
    if config.profile is not None:
        if not isinstance(config.profile, (str, os.PathLike)):
            raise TypeError(f"TrainConfig.profile must be a folder's path, got "
                            f"{config.profile!r}")
        object.__setattr__(config, "profile", os.fspath(config.profile))


def _check_checkpoint_fields(config: TrainConfig) -> None:
    if config.checkpoint_dir is not None:
        if not isinstance(config.checkpoint_dir, (str, os.PathLike)):
            raise TypeError(f"TrainConfig.checkpoint_dir must be a path, got "
                            f"{config.checkpoint_dir!r}")
        object.__setattr__(config, "checkpoint_dir", os.fspath(config.checkpoint_dir))
    if config.checkpoint_every is not None:
        fields.whole(config, "checkpoint_every")
    if config.checkpoint_keep is not None:
        fields.whole(config, "checkpoint_keep")
    fields.flag(config, "checkpoint_async")
