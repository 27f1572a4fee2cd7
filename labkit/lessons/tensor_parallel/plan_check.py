"""Notebook 04's second exercise: the tensor-parallel plan of a GPT block, for PyTorch's engine.

The learner writes ``block_plan(block)``, returning the dict that ``parallelize_module`` takes:
the name of a module inside the block -> ``ColwiseParallel()`` or ``RowwiseParallel()``. Every
rank builds the zoo's GPT block (``labkit.models.gpt.Block``), applies the learner's plan with
``parallelize_module`` on the rank's tp mesh, and runs one forward and backward on the same
input. Here, outside the ranks, the check compares what each rank computed and held with the
whole block on one device: the output, the input's gradient, every parameter's gradient (the
local shard against the matching slice), the shape and bytes of every shard, and the
collectives of each pass (Megatron's block: two all-reduces forward, two backward).

Only rank 0 holds the block's weights: drawn here for each run and sent to rank 0 alone, as
tensors (``PerRank``); every other rank builds its block from a seed of its own.
``parallelize_module`` makes each parameter of a layer it splits from rank 0's copy (its
styles' ``src_data_rank``, 0: a scatter of the shards, a broadcast of what stays whole), so
another rank has the right numbers only through that communication. The bytes that reached
each rank's sockets (``SocketCount``, the kernel's count, read here) are set beside what
tensor parallelism needs: its shard of the split weights, the whole biases and the all-reduced
activations; computing the whole block on a rank takes a whole copy of the weights, more than
that. When grading, bytes that cannot be counted fail the exercise (``outside.py``).

Before the plan is applied, a column-split ``attn.qkv`` gets its fused rows ordered head by
head (``GPTPlan.to_tp_layout``, as labkit's training does), so that an even split by rows gives
each rank the q, k and v of whole heads. The reference solution is labkit's own plan
(``labkit.models.gpt_split.block_styles``). The check runs at the cluster's rank count and at
a second one; its messages (``plan_problems.py``) name the module that is split the wrong way.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch

from labkit.lessons.exercise.outside import SocketCount, fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, describe_exception, run_checked
from labkit.lessons.exercise.wire import Traffic
from labkit.lessons.tensor_parallel.plan_problems import (
    describe_plan,
    measured_problems,
    plan_problems,
    resolve_plan,
    wire_problems,
)
from labkit.models.gpt import Block, GPTConfig
from labkit.models.gpt_split import GPTPlan
from labkit.runtime.cluster.per_rank import PerRank
from labkit.runtime.memory import format_bytes

EXERCISE = "tensor_parallel_plan"
BLOCK = GPTConfig(d_model=32, n_heads=4, seq_len=8)  # 4 heads of 8: whole heads on 1, 2, 4 ranks
BATCH = 2
# How Megatron's plan leaves each parameter on a rank: split on a dimension, or whole.
SPLIT_DIM = {"attn.qkv.weight": 0, "attn.qkv.bias": 0, "attn.proj.weight": 1,
             "mlp.0.weight": 0, "mlp.0.bias": 0, "mlp.2.weight": 1}


def gpt_block() -> Block:
    """A GPT block as the check builds it (print it: its modules' names are the plan's keys)."""
    return Block(BLOCK)


def _weights() -> dict:
    """The block's weights for one run, drawn here (a state dict of tensors: rank 0 receives
    them, never a seed it could pass on in 8 bytes)."""
    with torch.random.fork_rng(devices=[]):  # the notebook's own random state is left alone
        torch.manual_seed(fresh_seed())
        return {name: t.clone() for name, t in Block(BLOCK).state_dict().items()}


def _block(held) -> Block:
    """A rank's block: the check's weights (``held``, a state dict: rank 0), or weights of the
    rank's own (``held``, a seed: the other ranks), which the plan's layers replace by rank
    0's."""
    if isinstance(held, dict):
        block = Block(BLOCK)
        block.load_state_dict(held)
        return block
    torch.manual_seed(held)
    return Block(BLOCK)


def _data(seed: int):
    """The block's input and the loss's weight, on the CPU, from ``seed``: (batch, seq,
    d_model) each; the loss is (y * weight).sum(). The same on every rank, as tensor
    parallelism gives every rank the whole input."""
    generator = torch.Generator().manual_seed(seed)
    shape = (BATCH, BLOCK.seq_len, BLOCK.d_model)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _run_plan(ctx, block, plan, resolved, x, weight) -> dict:
    """parallelize_module with ``plan`` (``resolved``: its keys as module names), then one
    forward and backward: what this rank computed, held and sent (or the error that stopped
    it)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from labkit.training.layout.layout import Layout
    from labkit.training.layout.mesh import mesh_for

    n = ctx.world_size
    if isinstance(resolved.get("attn.qkv"), ColwiseParallel):  # whole heads in each row shard
        with torch.no_grad():
            for name, p in block.attn.qkv.named_parameters():
                p.copy_(GPTPlan().to_tp_layout(f"attn.qkv.{name}", p, n))
    mesh = mesh_for(Layout(tp=n), ctx.device.type)["tp"]
    x = x.clone().requires_grad_()
    parallelize_module(block, mesh, plan)
    with Traffic() as forward:
        y = block(x)
    with Traffic() as backward:
        (y * weight).sum().backward()
    return {"y": y.detach().cpu(), "x_grad": None if x.grad is None else x.grad.cpu(),
            "forward": forward.collectives, "backward": backward.collectives,
            "params": {name: {"shape": tuple(_local(p).shape), "bytes": _local(p).nbytes,
                              "grad": None if p.grad is None else _local(p.grad).cpu()}
                       for name, p in block.named_parameters()}}


def _job(ctx, plan_fn, held, data_seed: int) -> dict:
    """The learner's plan on this rank's block (``held``: see ``_block``)."""
    block = _block(held).to(ctx.device)
    x, weight = (t.to(ctx.device) for t in _data(data_seed))
    plan = plan_fn(block)  # NotImplementedError: not attempted yet
    if not isinstance(plan, dict):
        return {"plan": describe_plan(block, plan)}
    resolved = resolve_plan(block, plan)  # wildcards matched as parallelize_module does
    out = {"plan": describe_plan(block, resolved)}
    with _quiet():
        try:
            out.update(_run_plan(ctx, block, plan, resolved, x, weight))
        except Exception as exc:  # noqa: BLE001 - a wrong plan fails here: the verdict says why
            out["error"] = describe_exception(exc).split("\n")[0][:300]
    return out


@contextlib.contextmanager
def _quiet():
    """No warnings (a name the plan cannot resolve: the verdict says it) and none of the
    tracebacks torch logs when a wrong plan's shapes fail to propagate (the error is
    reported once, in the verdict)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _reference(weights: dict, data_seed: int, n: int) -> dict:
    """One device's block: output, input gradient, and each parameter's gradient as Megatron's
    plan leaves it on each rank ({name: [local gradient of rank r]})."""
    with torch.random.fork_rng(devices=[]):
        block = _block(weights)
    x, weight = _data(data_seed)
    x = x.requires_grad_()
    y = block(x)
    (y * weight).sum().backward()
    grads, shapes, whole = {}, {}, 0
    for name, p in block.named_parameters():
        shapes[name] = tuple(p.shape)
        grad = GPTPlan().to_tp_layout(name, p.grad, n)
        dim = SPLIT_DIM.get(name)
        grads[name] = [grad] * n if dim is None or n == 1 else list(grad.chunk(n, dim))
        whole += p.nbytes
    held = sum(g[0].nbytes for g in grads.values())
    norms = sum(g[0].nbytes for name, g in grads.items() if name.startswith("norm"))
    return {"y": y.detach(), "x_grad": x.grad, "grads": grads, "shapes": shapes,
            "whole_bytes": whole, "held_bytes": held, "norm_bytes": norms,
            # what parallelize_module sends a rank: its shards, and the biases kept whole
            "scatter_bytes": held - norms}


def tensor_parallel_plan(cluster, plan_fn, timeout: float | None = None) -> CheckResult:
    """Check ``plan_fn(block)``'s plan on a GPT block, on every rank of ``cluster``."""
    n = cluster.world_size
    if BLOCK.n_heads % n:
        return failed(EXERCISE, f"the check splits {BLOCK.n_heads} heads: use 1, 2 or 4 ranks")
    return at_two_sizes(cluster, lambda: _check(cluster, plan_fn, timeout))


def _check(cluster, plan_fn, timeout: float | None) -> CheckResult:
    n, weights, data_seed = cluster.world_size, _weights(), fresh_seed()
    blocks = PerRank([weights] + [fresh_seed() for _ in range(n - 1)])  # rank 0's: the block's
    wire = SocketCount(cluster) if n > 1 else None
    outcome = run_checked(cluster, EXERCISE, "block_plan", _job, plan_fn, blocks, data_seed,
                          timeout=timeout)
    received = wire.received() if wire else None
    if outcome.verdict:
        return outcome.verdict
    ref = _reference(weights, data_seed, n)
    try:
        plan = outcome.values[0]["plan"]
        structure = plan_problems(plan)
        found = measured_problems(outcome.values, ref, n) if "entries" in plan else []
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, RuntimeError):
        return failed(EXERCISE, "a rank sent back a report that labkit's check does not "
                      "write: its code on that rank changed the check's measurements")
    held = [sum(p["bytes"] for p in r["params"].values()) for r in outcome.values
            if "params" in r]
    measured = {"held_bytes": held, "whole_bytes": ref["whole_bytes"],
                **{k: outcome.values[0].get(k) for k in ("forward", "backward")},
                "received_bytes": received}
    problems = list(dict.fromkeys(structure + found)) or wire_problems(wire, received, ref, n)
    if problems:
        return failed(EXERCISE, problems[0], problems[1:], **measured)
    shares = ", ".join(f"{h / ref['whole_bytes']:.0%}" for h in held)
    return passed(EXERCISE, f"the split block equals one device's, forward and backward, on "
                  f"every rank; each rank holds {shares} of the block's "
                  f"{format_bytes(ref['whole_bytes'])} of parameters (every weight 1/N; the "
                  "norms and the biases of attn.proj and mlp.2 stay whole), with "
                  + ("2 all-reduces forward and 2 backward" if n > 1 else
                     "no collective (one rank)") + _received(received, ref) + ".", **measured)


def _received(received: list[int] | None, ref: dict) -> str:
    if not received or len(received) < 2:
        return ""
    copy = ref["whole_bytes"] - ref["norm_bytes"]
    return (f"; the other ranks received at most {max(received[1:]) / copy:.0%} of a copy of "
            "rank 0's weights (the kernel's count): their shards, not the whole block")
