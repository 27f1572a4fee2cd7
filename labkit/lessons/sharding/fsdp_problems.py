"""What is wrong with a learner's FSDP2 wrapping of a GPT, in the learner's terms: read from
what the ranks reported (their units, bytes, parameter peaks, collectives and trained weights)
beside one device's run (``fsdp_check.py``), and from the bytes the kernel counted on each
rank's sockets."""

from __future__ import annotations

import torch

from labkit.lessons.sharding.fsdp_check import (
    BLOCKS,
    GRAD_TOLERANCE,
    STEPS,
    TOLERANCE,
    ddp_bytes,
    fsdp_bytes,
)
from labkit.runtime.memory import format_bytes

WRAP = ("call fully_shard(block, mesh=mesh) on each block of model.blocks, then "
        "fully_shard(model, mesh=mesh)")


def _names(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _share(ref: dict) -> str:
    return f"{ref['outside_bytes'] / ref['whole_bytes']:.0%}"


def _gathers(rank: dict) -> list[int]:
    """[calls, bytes] of the all-gathers in the last step's forward."""
    return (rank.get("passes") or [[{}]])[-1][0].get("all_gather", [0, 0])


def unit_problems(rank: dict, ref: dict) -> list[str]:
    """Which modules are (not) FSDP units, and what follows from it."""
    units, whole = rank["units"], ref["whole_bytes"]
    if "error" in rank:
        if "" in units and any(b not in units for b in BLOCKS):
            return [f"fully_shard(model) ran before the blocks' (then fully_shard on a block "
                    f"raised {rank['error']}): wrap every block first and the root last; the "
                    "root takes the parameters that no unit inside it has taken"]
        return [f"shard_model raised {rank['error']}"]
    if not units:
        return [f"shard_model sharded nothing: no module is an FSDP unit, so every rank holds "
                f"the whole model ({format_bytes(whole)}), as with DDP; {WRAP}"]
    problems = []
    missing = [b for b in BLOCKS if b not in units]
    if missing and units == [""]:
        problems.append(
            f"only the root is wrapped: the whole model is one unit, so forward gathers all its "
            f"parameters in one all-gather ({format_bytes(_gathers(rank)[1])}, the whole model) "
            f"and each rank's parameters peak at {format_bytes(rank.get('parameter_peak', 0))}"
            f", more than the {format_bytes(whole)} DDP holds; fully_shard each block first, "
            "so that one block at a time is whole")
    elif missing:
        one = len(missing) == 1
        what = "is not an FSDP unit of its" if one else "are not FSDP units of their"
        problems.append(f"{_names(missing)} {what} own (forward ran {_gathers(rank)[0]} "
                        "all-gathers): fully_shard each block of model.blocks, so that a "
                        "block's parameters are gathered whole, in one all-gather, only while "
                        "it runs")
    if "" not in units:
        problems.append(f"the root is not wrapped: the parameters outside the blocks (the "
                        f"embeddings, the final norm and the head: {_share(ref)} of the model) "
                        "stay whole on every rank and nobody averages their gradients, so each "
                        "rank trains them on its own slice of the batch; call "
                        "fully_shard(model, mesh=mesh) last")
    return problems


def value_problems(r: int, rank: dict, ref: dict) -> tuple[list[str], float]:
    """How far rank ``r``'s weights are from one device's after the steps."""
    if "train_error" in rank:
        return [f"training the wrapped model raised on rank {r}: {rank['train_error']}"], 0.0
    gaps = {name: (rank["weights"][name] - w).abs().max().item() if name in rank["weights"]
            and rank["weights"][name].shape == w.shape else float("inf")
            for name, w in ref["weights"].items()}
    worst = max(gaps, key=gaps.get)
    if gaps[worst] > TOLERANCE:
        return [f"after {STEPS} Adam steps, rank {r}'s {worst} differs from one device's "
                f"(by {gaps[worst]:.2g})"], gaps[worst]
    return grad_problems(r, rank, ref), gaps[worst]


def grad_problems(r: int, rank: dict, ref: dict) -> list[str]:
    """Whether rank ``r``'s gradients of the first step are one device's (Adam's steps hide a
    gradient's scale, so the weights alone do not show it)."""
    for name, want in ref["grads"].items():
        got = rank["grads"].get(name)
        if got is None or got.shape != want.shape:
            return [f"rank {r} has no gradient of {name} of one device's shape after the first "
                    "backward"]
        if (got - want).abs().max().item() > GRAD_TOLERANCE * want.abs().max().item():
            ratio = (torch.linalg.vector_norm(got) / torch.linalg.vector_norm(want)).item()
            return [f"after the first backward, rank {r}'s gradient of {name} differs from one "
                    f"device's (its norm is {ratio:.3g} times one device's): the weights still "
                    "matched because Adam's steps do not depend on a gradient's scale; every "
                    "gradient should be the mean over the ranks, as FSDP's reduce-scatter "
                    "leaves it"]
    return []


def memory_problems(r: int, rank: dict, ref: dict, n: int) -> list[str]:
    """Whether rank ``r`` held about 1/N at rest, and less than the whole model at its peak."""
    whole, held, problems = ref["whole_bytes"], rank["held_bytes"], []
    if held > whole / n + 0.05 * whole:
        wrapped = "" in rank["units"] and all(b in rank["units"] for b in BLOCKS)
        why = ("every block and the root are units, but they keep more than 1/N: give "
               "fully_shard the mesh shard_model receives (one dimension, all N ranks), so "
               "that each unit is sharded over every rank" if wrapped else
               "every parameter should be in some unit")
        problems.append(f"rank {r} holds {format_bytes(held)} of parameters at rest, "
                        f"{held / whole:.0%} of the model's {format_bytes(whole)} (1/N = "
                        f"{1 / n:.0%}): {why}")
    peak = rank.get("parameter_peak")
    if peak is not None and peak >= whole and rank["units"] != [""]:  # [""]: said already
        problems.append(f"rank {r}'s parameters peaked at {format_bytes(peak)}, at least the "
                        f"whole model's {format_bytes(whole)}: no saving over DDP at the peak")
    return problems


def problems(ranks: list[dict], ref: dict, n: int) -> tuple[list[str], float]:
    """Every problem found (one message each), and the largest weight gap of the ranks."""
    found, values, memory, worst = unit_problems(ranks[0], ref), [], [], 0.0
    for r, rank in enumerate(ranks):
        if "error" in rank:
            continue
        mine, gap = value_problems(r, rank, ref)
        worst = max(worst, gap)
        values, memory = values or mine, memory or memory_problems(r, rank, ref, n)
    return list(dict.fromkeys(found + values + memory)), worst



def wire_problems(wire, on_wire: list[int] | None, ref: dict, n: int) -> list[str]:
    """Whether each rank's sockets carried what FSDP's ``STEPS`` steps send (the kernel's
    count, ``on_wire``, read outside the ranks): an all-reduce of the gradients (DDP) or
    training alone sends less, whatever the ranks report of their units and collectives."""
    if on_wire is None:
        return [wire.unmeasured()] if wire.required else []
    fsdp, ddp = STEPS * fsdp_bytes(ref, n), STEPS * ddp_bytes(ref, n)
    for r, sent in enumerate(on_wire):
        if sent < fsdp:
            return [f"{format_bytes(sent)} crossed rank {r}'s sockets during the check (the "
                    f"kernel's count, read outside the ranks), less than FSDP sends in {STEPS} "
                    f"steps ({format_bytes(fsdp)}: every unit's parameters all-gathered for "
                    "forward, the blocks' again for backward, every gradient reduce-scattered;"
                    f" an all-reduce of the gradients, as DDP's, sends {format_bytes(ddp)}): "
                    "whatever the ranks reported, the model was not trained as FSDP units; "
                    f"{WRAP}, and let FSDP do the communication"]
    return []
