"""Notebook 05's second exercise: FSDP2 applied to a GPT, with PyTorch's ``fully_shard``.

The learner writes ``shard_model(model, mesh)``: ``fully_shard`` on each block of
``model.blocks``, then on the model itself (the root, which takes the parameters no unit inside
it took: the embeddings, the final norm and the head). On every rank the check builds the zoo's
GPT from a seed drawn for this run (the same on every rank: ``fully_shard`` chunks each rank's
own copy, without communicating), calls the learner's function with the rank's fsdp mesh, and
trains ``STEPS`` Adam steps on this rank's slice of each batch. Each rank's slices are drawn
here and sent to that rank alone, as tensors (``PerRank``; a seed is 8 bytes a rank could pass
on): no rank holds the others' data, so the weights of one device's run on the whole batches
can only be had from every rank's gradients, or data.

Here, outside the ranks, the check joins the slices into the whole batches, runs one
device's Adam on them, and compares the ranks' weights and first gradients (whose scale Adam's
steps hide) with it. It reads the bytes each rank wrote to its TCP sockets (``SocketCount``,
the kernel's count, on gloo): FSDP sends at least ``STEPS * fsdp_bytes`` (per step, (N-1)/N of
the model all-gathered for forward, of the blocks again for backward, and of the gradients
reduce-scattered: about 3(N-1)/N of the parameters' bytes), where an all-reduce of the
gradients (DDP) sends 2(N-1)/N; fewer bytes fail, and when grading (``distrusted()``) so does a
count that cannot be read. What each rank reports of itself (its FSDP units, its bytes of
parameters at rest, about 1/N, the peak of its parameter memory during the steps, measured by
the suite's memory tracker, and the collectives of a step) words the learner's messages. The
check runs at the cluster's rank count and at a second one. labkit's own ``apply_fsdp``
(``labkit/parallel/sharded``) does the same, with the model's plan naming the units.
"""

from __future__ import annotations

import warnings

import torch

from labkit.lessons.exercise.outside import SocketCount, fresh_seed, private_seeds
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, describe_exception, run_checked
from labkit.lessons.exercise.wire import Traffic
from labkit.models.gpt import GPT, GPTConfig
from labkit.runtime.cluster.per_rank import PerRank
from labkit.runtime.memory import MemoryTracker, format_bytes

EXERCISE = "fully_shard_model"
# No biases (as Llama): a key's bias gets no gradient (softmax ignores it), and Adam would turn
# that gradient's rounding noise into full steps, different on each run.
MODEL = GPTConfig(vocab_size=32, seq_len=8, d_model=32, n_heads=2, n_layers=4, bias=False)
BATCH, STEPS, LR = 8, 2, 1e-2
BLOCKS = [f"blocks.{i}" for i in range(MODEL.n_layers)]
# Adam moves each weight by about LR a step whatever its gradient's size, so a gradient that is
# only float32 rounding (summed in another order on the ranks) still moves it a little: up to
# ~4e-5 here. A wrong wrapping moves weights by ~LR per step (an unwrapped root: ~4e-2).
TOLERANCE = 1e-3
# Adam cannot see a gradient's scale (gradients N times too large, summed instead of averaged,
# move the weights alike), so the first step's gradients are compared too, relative to the
# largest of one device's (float32 rounding: ~1e-7).
GRAD_TOLERANCE = 1e-4


def small_gpt() -> GPT:
    """A GPT as the check builds it (print it: ``model.blocks`` holds its blocks)."""
    return GPT(MODEL)


def _model(seed: int) -> GPT:
    """The model, the same on every rank (``fully_shard`` chunks each rank's own copy)."""
    torch.manual_seed(seed)
    return GPT(MODEL)


def _slices(seed: int, share: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One rank's slice of each of the ``STEPS`` batches, from that rank's private seed:
    (tokens, next tokens), (share, seq) each."""
    generator = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(MODEL.vocab_size, (share, MODEL.seq_len), generator=generator)
                  for _ in range(2)) for _ in range(STEPS)]


def _batches(slices: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The whole batches: every rank's slices (``_slices``), in rank order, step by step."""
    return [tuple(torch.cat([mine[step][k] for mine in slices]) for k in range(2))
            for step in range(STEPS)]


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _units(model) -> list[str]:
    from torch.distributed.fsdp import FSDPModule

    return [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def _train(ctx, model, batches) -> dict:
    """``STEPS`` Adam steps on this rank's slices of the batches (``batches``), measured."""
    tracker = MemoryTracker(ctx.rank)
    tracker.track_external(model)  # its parameters (this rank's shards) filed as parameters
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    passes, grads = [], None
    for tokens, targets in batches:
        tokens, targets = tokens.to(ctx.device), targets.to(ctx.device)
        with tracker:
            with Traffic() as forward:
                loss = GPT.loss(model(tokens), targets)
            with Traffic() as backward:
                loss.backward()
        if grads is None:  # the first step's, gathered outside the measurements
            grads = {name: None if p.grad is None else _whole(p.grad)
                     for name, p in model.named_parameters()}
        with tracker:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        passes.append((forward.collectives, backward.collectives))
    weights = {name: _whole(p) for name, p in model.named_parameters()}
    return {"weights": weights, "grads": grads, "passes": passes,
            "parameter_peak": tracker.category_peaks["parameters"]}


def _whole(tensor) -> torch.Tensor:
    """The whole tensor on the CPU (a sharded DTensor gathered from every rank)."""
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().cpu()


def _job(ctx, shard_fn, model_seed: int, batches: list) -> dict:
    """The learner's wrapping of this rank's copy of the model, then training on this rank's
    slices (``batches``, this rank's only), measured."""
    from labkit.training.layout.layout import Layout
    from labkit.training.layout.mesh import mesh_for

    model = _model(model_seed).to(ctx.device)
    mesh = mesh_for(Layout(fsdp=ctx.world_size), ctx.device.type)["fsdp"]
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP2's notice that a unit returned a view
        try:
            shard_fn(model, mesh)
        except NotImplementedError:
            raise  # not attempted yet
        except Exception as exc:  # noqa: BLE001 - a wrong wrapping fails here: said below
            out["error"] = describe_exception(exc).split("\n")[0][:300]
        out["units"] = _units(model)
        out["held_bytes"] = sum(_local(p).nbytes for p in model.parameters())
        if "error" not in out:
            try:
                out.update(_train(ctx, model, batches))
            except Exception as exc:  # noqa: BLE001 - a wrapping that cannot train: said below
                out["train_error"] = describe_exception(exc).split("\n")[0][:300]
    return out


def _reference(model_seed: int, slices: list) -> dict:
    """One device's Adam on the whole batches: the weights, and the parameters' bytes."""
    model, batches = _model(model_seed), _batches(slices)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    grads = None
    for tokens, targets in batches:
        GPT.loss(model(tokens), targets).backward()
        grads = grads or {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    outside = sum(p.nbytes for name, p in model.named_parameters()
                  if not name.startswith("blocks."))
    return {"weights": {name: p.detach() for name, p in model.named_parameters()},
            "grads": grads, "whole_bytes": sum(p.nbytes for p in model.parameters()),
            "outside_bytes": outside}


def fsdp_bytes(ref: dict, n: int) -> float:
    """The fewest bytes FSDP2 sends per rank in a step, in rings that send (N-1)/N of a tensor
    per rank: every unit all-gathered for forward, the blocks again for backward (resharded
    after forward; the root stays whole until its backward), every gradient reduce-scattered.
    gloo reduce-scatters by an all-reduce (2(N-1)/N), and the job gathers the first gradients
    and the last weights whole: a sharded run sends more than this, never less."""
    blocks = ref["whole_bytes"] - ref["outside_bytes"]
    return (n - 1) / n * (2 * ref["whole_bytes"] + blocks)


def ddp_bytes(ref: dict, n: int) -> float:
    """The bytes an all-reduce of every gradient moves per rank per step (DDP): 2(N-1)/N."""
    return 2 * (n - 1) / n * ref["whole_bytes"]


def fully_shard_model(cluster, shard_fn, timeout: float | None = None) -> CheckResult:
    """Check ``shard_fn(model, mesh)`` on a GPT, trained on every rank of ``cluster``."""
    n = cluster.world_size
    if n < 2 or BATCH % n:
        return failed(EXERCISE, f"the check shards over 2, 4 or 8 ranks; this cluster has {n}")
    return at_two_sizes(cluster, lambda: _check(cluster, shard_fn, timeout))


def _check(cluster, shard_fn, timeout: float | None) -> CheckResult:
    from labkit.lessons.sharding.fsdp_problems import problems, wire_problems

    n, model_seed = cluster.world_size, fresh_seed()
    slices = [_slices(seed, BATCH // n) for seed in private_seeds(n).values]
    wire = SocketCount(cluster)
    outcome = run_checked(cluster, EXERCISE, "shard_model", _job, shard_fn, model_seed,
                          PerRank(slices), timeout=timeout)
    on_wire = wire.sent()
    if outcome.verdict:
        return outcome.verdict
    ref = _reference(model_seed, slices)
    ranks = outcome.values
    try:
        found, gap = problems(ranks, ref, n)
        measured = {"units": ranks[0]["units"], "held_bytes": [r["held_bytes"] for r in ranks],
                    "whole_bytes": ref["whole_bytes"],
                    "parameter_peaks": [r.get("parameter_peak") for r in ranks],
                    "passes": ranks[0].get("passes"), "socket_bytes": on_wire,
                    "fsdp_step_bytes": fsdp_bytes(ref, n), "ddp_step_bytes": ddp_bytes(ref, n)}
        summary = "" if found else _summary(ranks, measured, gap, n)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, RuntimeError):
        return failed(EXERCISE, "a rank sent back a report that labkit's check does not "
                      "write: its code on that rank changed the check's measurements")
    found = found or wire_problems(wire, on_wire, ref, n)
    if found:
        return failed(EXERCISE, found[0], found[1:], **measured)
    return passed(EXERCISE, summary, **measured)


def _summary(ranks: list[dict], measured: dict, gap: float, n: int) -> str:
    """What a passing wrapping did, in the learner's terms."""
    whole, on_wire = measured["whole_bytes"], measured["socket_bytes"]
    gathers = ranks[0]["passes"][-1][0]["all_gather"][0]
    sockets = "" if on_wire is None else (
        f"; each rank's sockets carried {format_bytes(min(on_wire))} or more (the kernel's "
        f"count), at least what FSDP's {STEPS} steps send ("
        f"{format_bytes(STEPS * measured['fsdp_step_bytes'])}; an all-reduce of the "
        f"gradients, as DDP's: {format_bytes(STEPS * measured['ddp_step_bytes'])})")
    return (f"the model trains as on one device ({STEPS} Adam steps, weights within "
            f"{gap:.1g}); each rank holds "
            + ", ".join(f"{r['held_bytes'] / whole:.0%}" for r in ranks)
            + f" of the {format_bytes(whole)} of parameters (1/N = {1 / n:.0%}); forward "
            f"gathers one unit at a time ({gathers} all-gathers), so parameters peaked at "
            f"{format_bytes(max(measured['parameter_peaks']))} per rank, below the whole "
            f"model that DDP keeps on every rank{sockets}.")
