"""What is wrong with a learner's tensor-parallel plan of a GPT block, in the learner's terms.

``describe_plan`` runs on a rank: what each entry of the plan names (a module of the block? of
which kind?) and maps it to. ``plan_problems`` reads that description here and says which
module is split the wrong way and why; ``measured_problems`` says what the ranks' run found
different from one device (values, shards, bytes, collectives); ``wire_problems`` what the
kernel counted on the ranks' sockets beside what the split needs. ``plan_check.py`` puts them
together into the verdict.
"""

from __future__ import annotations

from fnmatch import fnmatch

import torch

from labkit.runtime.memory import format_bytes

COLWISE, ROWWISE = "ColwiseParallel", "RowwiseParallel"
# Megatron's plan of the block (labkit.models.gpt_split.block_styles), module -> style.
LINEARS = {"attn.qkv": COLWISE, "attn.proj": ROWWISE, "mlp.0": COLWISE, "mlp.2": ROWWISE}
SHOULD = {
    "attn.qkv": "split it by columns (ColwiseParallel()): each rank then computes the q, k and v "
                "of its own heads, and attention runs on those heads with no communication",
    "attn.proj": "split it by rows (RowwiseParallel()): its input arrives split by heads, the "
                 "slice of its input features a row split takes, and one all-reduce sums the "
                 "heads' shares",
    "mlp.0": "split it by columns (ColwiseParallel()): each rank computes its own hidden units, "
             "and GELU works on each unit alone",
    "mlp.2": "split it by rows (RowwiseParallel()): its input arrives split by hidden units, "
             "and one all-reduce sums their shares",
}
WRONG_WAY = {
    "attn.qkv": "attn.qkv is row-split: a row split takes its input split by features, but the "
                "block's input is whole on every rank, and each head's q, k and v would be "
                "left a partial sum; ",
    "attn.proj": "attn.proj is column-split: a column split wants its input whole, and its "
                 "output would need a gather before the residual add; ",
    "mlp.0": "mlp.0 is row-split: its input is whole on every rank, not split by features as a "
             "row split wants; ",
    "mlp.2": "mlp.2 is column-split: a column split wants its input whole, and its output "
             "would need a gather before the residual add; ",
}
NAMES = ", ".join(LINEARS)


def _matches(module, path: list[str]) -> list[str]:
    """The names of the modules inside ``module`` that ``path`` (a key split at its dots) names,
    each part matched as ``parallelize_module`` matches it (``fnmatch``: ``*`` is a wildcard)."""
    if not path:
        return [""]
    names = []
    for name, child in module.named_children():
        if fnmatch(name, path[0]):
            names += [f"{name}.{rest}" if rest else name for rest in _matches(child, path[1:])]
    return names


def resolve_plan(block, plan: dict) -> dict:
    """The plan with each key replaced by the names of the modules it names
    (``{"*.qkv": style}`` -> ``{"attn.qkv": style}``); a key that names none stays as it is."""
    resolved = {}
    for key, style in plan.items():
        names = _matches(block, key.split(".")) if isinstance(key, str) and key else []
        for name in names or [key]:
            resolved[name] = style
    return resolved


def describe_plan(block, plan) -> dict:
    """(On a rank.) {"entries": {key: {module, style, instance, class}}}, or {"type": ...} when
    the plan is not a dict."""
    from torch.distributed.tensor.parallel import ParallelStyle

    if not isinstance(plan, dict):
        return {"type": type(plan).__name__}
    entries = {}
    for key, style in plan.items():
        try:
            module = type(block.get_submodule(key)).__name__ if isinstance(key, str) else None
        except AttributeError:
            module = None
        entries[key if isinstance(key, str) else repr(key)[:60]] = {
            "module": module, "instance": isinstance(style, ParallelStyle),
            "class": isinstance(style, type),
            "style": style.__name__ if isinstance(style, type) else type(style).__name__}
    return {"entries": entries}


def _entry_problem(key: str, entry: dict) -> str | None:
    if entry["module"] is None:
        return (f"{key!r} names no module of the block: the plan's names are paths inside the "
                f"block it is given ({NAMES}; print(block) lists them)")
    if entry["module"] != "Linear":
        inside = [k for k in LINEARS if k.startswith(f"{key}.")] if key else list(LINEARS)
        return (f"{key or 'the block itself'} is a {entry['module']}, not a linear layer: "
                "ColwiseParallel and RowwiseParallel split the weight of an nn.Linear; name "
                f"the linear layers ({', '.join(inside or LINEARS)})")
    if not entry["instance"]:
        what = f"the class {entry['style']}" if entry["class"] else f"a {entry['style']}"
        return (f"{key} maps to {what}, not a parallel style: give an instance, "
                "ColwiseParallel() or RowwiseParallel()")
    if key in LINEARS and entry["style"] in (COLWISE, ROWWISE) and entry["style"] != LINEARS[key]:
        return WRONG_WAY[key] + SHOULD[key]
    return None


def plan_problems(description: dict) -> list[str]:
    """The plan's mistakes, read from its description (module by module)."""
    if "entries" not in description:
        return [f"block_plan returned a {description['type']}, not a dict: return "
                "{name of a module in the block: ColwiseParallel() or RowwiseParallel()}"]
    entries = description["entries"]
    problems = [p for key, entry in entries.items() if (p := _entry_problem(key, entry))]
    missing = [k for k in LINEARS if entries.get(k, {}).get("module") != "Linear"]
    if len(missing) == len(LINEARS):
        problems.append(f"the plan splits none of the block's linear layers ({NAMES}): every "
                        "rank would hold the whole block; split attention's and the MLP's "
                        "pair each by columns, then by rows")
    else:
        problems += [f"{k} is not in the plan: its weight stays whole on every rank; {SHOULD[k]}"
                     for k in missing]
    return problems


def _close(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and a.shape == b.shape
            and torch.allclose(a, b, rtol=1e-4, atol=1e-5))


def _counts(collectives: dict) -> dict:
    return {kind: c[0] for kind, c in collectives.items()}


def _kinds(collectives: dict) -> str:
    return ", ".join(f"{c[0]} {k}" for k, c in collectives.items()) or "no collective"


def _values(r: int, found: dict, ref: dict) -> dict[str, str]:
    problems = {}
    y = found["y"]
    if tuple(y.shape) != tuple(ref["y"].shape):
        problems["y"] = (f"the block's output on rank {r} is of shape {tuple(y.shape)}, one "
                         f"device's {tuple(ref['y'].shape)}: the last layer of each pair must "
                         "give every rank the whole output (a row split's all-reduce)")
    elif not _close(y, ref["y"]):
        gap = (y - ref["y"]).abs().max().item()
        problems["y"] = f"the block's output on rank {r} differs from one device's (by {gap:.2g})"
    elif not _close(found["x_grad"], ref["x_grad"]):
        problems["x_grad"] = (f"the gradient of the block's input on rank {r} differs from one "
                              "device's")
    return problems


def _own_copies(values: list[dict], ref: dict) -> bool:
    """Whether a rank holds a whole copy of a weight Megatron splits: the plan left its layer
    out, so the layer keeps that rank's own weights (only rank 0's are the block's, and
    parallelize_module hands out rank 0's for the layers the plan names), and the values the
    ranks computed say nothing of the plan (its shape says what is wrong)."""
    return any(tuple(mine["shape"]) == ref["shapes"][name] != tuple(grads[0].shape)
               for rank in values for name, grads in ref["grads"].items()
               if (mine := rank.get("params", {}).get(name)) is not None)


def _shards(r: int, params: dict, ref: dict, compare: bool = True) -> dict[str, str]:
    problems = {}
    for name, grads in ref["grads"].items():
        mine, expected = params.get(name), grads[r]
        if mine is None:
            problems[name] = f"rank {r} holds no parameter {name}"
        elif tuple(mine["shape"]) != tuple(expected.shape):
            if name.endswith(".bias") and name.replace(".bias", ".weight") in problems:
                continue  # its weight says it
            whole = " (the whole tensor)" if tuple(mine["shape"]) == ref["shapes"][name] else ""
            problems[name] = (f"{name} is of shape {tuple(mine['shape'])} on each rank"
                              f"{whole}; its 1/N shard is {tuple(expected.shape)}")
        elif compare and not _close(mine["grad"], expected):
            problems[name] = (f"the gradient of {name} on rank {r} is not its slice of one "
                              "device's")
    held = sum(p["bytes"] for p in params.values())
    if held != ref["held_bytes"]:
        whole = ref["whole_bytes"]
        problems["bytes"] = (f"each rank holds {format_bytes(held)} of the block's "
                             f"{format_bytes(whole)} of parameters ({held / whole:.0%}); split "
                             f"as Megatron does, {format_bytes(ref['held_bytes'])} "
                             f"({ref['held_bytes'] / whole:.0%})")
    return problems


def _passes(found: dict, n: int) -> dict[str, str]:
    want = {"all_reduce": 2} if n > 1 else {}
    problems = {}
    if _counts(found["forward"]) != want:
        problems["forward"] = (f"forward ran {_kinds(found['forward'])}: Megatron's block needs "
                               "exactly 2 all-reduces forward (of attn.proj's and mlp.2's "
                               "outputs) and no gather")
    if _counts(found["backward"]) != want:
        problems["backward"] = (f"backward ran {_kinds(found['backward'])}: Megatron's block "
                                "needs exactly 2 all-reduces backward (of the gradients of "
                                "attn.qkv's and mlp.0's inputs)")
    return problems


def measured_problems(values: list[dict], ref: dict, n: int) -> list[str]:
    """What the ranks' run found different from one device (one message per kind, from the
    first rank that shows it)."""
    found: dict[str, str] = {}
    compare = not _own_copies(values, ref)
    for r, rank in enumerate(values):
        if "error" in rank:
            found.setdefault("error", f"on rank {r}, parallelize_module or the block's forward "
                                      f"and backward raised {rank['error']}")
            continue
        for kind, message in {**(_values(r, rank, ref) if compare else {}),
                              **_shards(r, rank["params"], ref, compare),
                              **_passes(rank, n)}.items():
            found.setdefault(kind, message)
    return list(found.values())


def wire_problems(wire, received: list[int] | None, ref: dict, n: int) -> list[str]:
    """The bytes that reached each rank's sockets (``received``: the kernel's count, read
    outside the ranks) beside what tensor parallelism sends it. Rank 0 holds the block's
    weights; any other rank receives from it its shards of the split weights and the whole
    biases (``scatter_bytes``), then the all-reduced activations. Computing the whole block on
    a rank takes a whole copy of rank 0's weights instead: Megatron's split stays well below
    that on 2 and 4 ranks (about 3/4 and 2/3 of it, activations and gloo's framing included),
    the copy cannot."""
    if n == 1:
        return []
    if received is None:
        return [wire.unmeasured()] if wire.required else []
    copy = ref["whole_bytes"] - ref["norm_bytes"]  # the norms are the same on every rank
    for rank, got in enumerate(received[1:], start=1):
        if got >= copy:
            return [f"{format_bytes(got)} reached rank {rank}'s sockets during the run (the "
                    "kernel's count, outside the rank): a whole copy of the block's weights "
                    f"({format_bytes(copy)}) or more. Tensor parallelism sends each rank only "
                    f"its shards of the split weights and the whole biases "
                    f"({format_bytes(ref['scatter_bytes'])}), then the all-reduced "
                    "activations: was the whole block sent to every rank and run there?"]
    return []
