"""Does the model state fit at all? Worked out before any rank starts.

Every training step holds, at its optimizer step, the weights, their gradients and the
optimizer's state (Adam's two moments per weight, created at the first step): that much is
the least a device needs, whatever the batch. When even that is more than the capacity, the
run cannot fit. ``labkit.train`` still runs it, so that the out-of-memory error a learner
sees (and the notebooks plot) is measured, and adds to that ``DeviceOOM`` what was worked out
here: how much the model state needs, and what would fit instead.
"""

from __future__ import annotations

import math

from labkit.models import count_parameters
from labkit.runtime.memory.oom import MODEL_STATE
from labkit.runtime.memory.units import format_bytes

OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 0}  # tensors kept per weight


def _split(run) -> tuple[tuple[str, ...], int] | None:
    """Which model-state parts a run's layout splits evenly over its ranks, and over how
    many; None where the split is uneven (tensor parallelism keeps norms and embeddings
    whole, pipelines split by stage, tables by a planner: the tracker speaks for those)."""
    layout, engine = run.layout, run.engines.data_engine
    if layout.tp > 1 or run.engines.pipelined or engine == "tables":
        return None
    if engine == "fsdp":
        return MODEL_STATE, layout.fsdp
    if engine == "zero1":
        return ("optimizer",), layout.dp
    return (), 1


def model_state_floor(run) -> dict[str, int] | None:
    """Least bytes of each model-state part one rank of ``run`` (a resolved Run) holds at
    the optimizer step (None for layouts whose split this does not know)."""
    split = _split(run)
    return None if split is None else _floor(run.config, *split)


def _floor(config, split: tuple[str, ...], ways: int) -> dict[str, int]:
    n = count_parameters(config.model)
    width = 2 if config.precision == "bf16" else 4  # bytes per value; "mixed" keeps fp32
    per_weight = {"parameters": width, "gradients": width,
                  "optimizer": width * OPTIMIZER_STATES[config.optimizer]}
    return {part: math.ceil(n * size / (ways if part in split else 1))
            for part, size in per_weight.items()}


def _what_fits(run, capacity: int, floor: dict[str, int]) -> str:
    config, world_size = run.config, run.world_size
    n = count_parameters(config.model)
    per_weight = sum(floor.values()) / n
    ways = []
    whole = sum(_floor(config, (), 1).values())  # one device holds all of it
    if run.engines.data_engine != "fsdp":
        ranks = math.ceil(whole / capacity)
        ways.append(f"'fsdp' splits all of it: {format_bytes(whole / world_size)} per device "
                    f"on {world_size} rank(s)" if ranks <= world_size else
                    f"'fsdp' splits all of it, and needs at least {ranks} ranks for it")
    elif world_size * capacity < whole:
        ways.append(f"'fsdp' needs at least {math.ceil(whole / capacity)} ranks")
    if config.optimizer != "sgd":
        ways.append("optimizer='sgd' keeps no optimizer state")
    ways.append(f"a smaller model: with '{config.label}' on {world_size} rank(s) the model "
                f"state alone fills the capacity at ~{capacity / per_weight / 1e6:.3g}M "
                "parameters, and the batch's activations come on top, so the largest model "
                "that trains is smaller than that")
    return "What fits: " + "; ".join(ways) + "."


# What replaces the OOM's advice when the model state alone cannot fit: the breakdown at the
# failure may show activations as the largest part (the forward pass runs before gradients
# and optimizer state exist), and lowering the batch would not help.
ADVICE = ("the model state must shrink or be split, not the batch: it needs more than the "
          "capacity whatever the batch size (worked out before the run, below)")


def model_state_note(run, capacity_bytes: int | None) -> str | None:
    """What to tell a learner whose model state alone passes ``capacity_bytes`` (None when
    it fits, or for strategies this does not know). Goes with ``ADVICE``."""
    if capacity_bytes is None:
        return None
    config, world_size = run.config, run.world_size
    floor = model_state_floor(run)
    if floor is None or sum(floor.values()) <= capacity_bytes:
        return None
    parts = ", ".join(f"{part} {format_bytes(floor[part])}" for part in MODEL_STATE)
    return (f"Worked out before the run: the model state alone needs at least "
            f"{format_bytes(sum(floor.values()))} per device with '{config.label}' on "
            f"{world_size} rank(s) ({parts}), more than the "
            f"{format_bytes(capacity_bytes)} capacity, whatever the batch size. "
            + _what_fits(run, capacity_bytes, floor))
