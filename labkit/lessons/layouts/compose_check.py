"""Notebook 07's second exercise: a 2D mesh, and which sub-mesh each parallelism takes.

The learner writes ``compose(ctx, model, tp_plan, dp, tp)``: build the mesh with
``init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))``, give its "tp"
sub-mesh to ``parallelize_module(model, mesh["tp"], tp_plan)`` and its "dp" sub-mesh to
``fully_shard(model, mesh=mesh["dp"])``, and return the mesh. On every rank the check
compares the ranks of each sub-mesh's group with those of labkit's own mesh for the same
layout (the groups of the first exercise, ``mesh_groups``), then runs one forward and
backward on this rank's slice of the batch and compares, here, the loss and the whole
gradients each rank reports with one device's.

The inputs are private (``PerRank``), drawn for each run and sent as tensors: each rank
receives only its data-parallel slice of the batch (the ranks of one tp group the same
slice), and only the ranks that ``parallelize_module`` takes the weights from receive the
real ones: it scatters
each layer's shards from rank 0 of each tp group (``ParallelStyle.src_data_rank``, 0 by
default, through ``distribute_tensor``), and ``fully_shard`` then chunks what each rank holds
without communicating. The other ranks build weights of their own from seeds of their own. So
the gradients of the whole batch can only be had by communicating: a rank that computes them
without the others' data, or a mesh whose groups are not labkit's (tp outermost, say), gets
other numbers, whatever the ranks report about their groups and placements (those give the
messages for honest mistakes). The bytes are not counted (``SocketCount``): gathering the
batch and the weights onto every rank and computing there moves fewer bytes than the layout,
so that tensor and sharded parallelism did the work is the ranks' word.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.reports import tensor_list
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked
from labkit.runtime.cluster.per_rank import PerRank
from labkit.training.build.materialize import _quiet_redistribution
from labkit.training.layout.layout import Layout

EXERCISE = "compose_mesh"
WHERE = "compose"
D_IN, D_HIDDEN, D_OUT, BATCH, TP = 16, 32, 8, 8, 2
NAMES = ("dp", "tp")


def _model(seed: int) -> nn.Module:
    """An MLP (batch, in) -> (batch, hidden) -> (batch, out), its weights from ``seed``."""
    with torch.random.fork_rng(devices=()):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.ReLU(), nn.Linear(D_HIDDEN, D_OUT))


def _batch(seed: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` inputs (rows, in) and their targets (rows, out), from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, D_IN, generator=generator),
            torch.randn(rows, D_OUT, generator=generator))


class _Run:
    """One run's inputs, drawn here: the weights, one data-parallel slice of the batch per dp
    coordinate, and a seed of its own for each rank that tensor parallelism takes no weights
    from. Tensors, not seeds, go to the ranks that hold them: a seed is 8 bytes a rank could
    pass to the others."""

    def __init__(self, world_size: int):
        self.world_size, self.dp = world_size, world_size // TP
        self.weights_seed = fresh_seed()
        self.slices = [_batch(fresh_seed(), BATCH // self.dp) for _ in range(self.dp)]
        self.own_seeds = [fresh_seed() for _ in range(world_size)]

    def weights(self) -> PerRank:
        """The real weights (a state dict) for rank 0 of each tp group (labkit's layout: tp
        innermost), whose shards parallelize_module scatters; a seed of its own for any
        other."""
        real = _model(self.weights_seed).state_dict()
        return PerRank(real if rank % TP == 0 else self.own_seeds[rank]
                       for rank in range(self.world_size))

    def data(self) -> PerRank:
        """Each rank's slice: by its dp coordinate, alike on the ranks of a tp group."""
        return PerRank(self.slices[rank // TP] for rank in range(self.world_size))

    def one_device(self) -> tuple[float, list[torch.Tensor]]:
        """One device's loss and gradients on the whole batch (the slices in dp order)."""
        model = _model(self.weights_seed)
        inputs, targets = (torch.cat(parts) for parts in zip(*self.slices, strict=True))
        loss = F.mse_loss(model(inputs), targets)
        loss.backward()
        return loss.item(), [p.grad for p in model.parameters()]


def _mesh_report(mesh) -> dict:
    """The learner's mesh: its names and each sub-mesh's ranks, beside labkit's mesh's."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from labkit.training.layout.mesh import mesh_for

    if not isinstance(mesh, DeviceMesh):
        return {"problem": f"compose returned {type(mesh).__name__}, not the DeviceMesh"}
    names = tuple(mesh.mesh_dim_names or ())
    if sorted(names) != sorted(NAMES):
        return {"problem": f"the mesh's dimensions are named {names or None}: build it with "
                "mesh_dim_names=('dp', 'tp')"}
    real = mesh_for(Layout(dp=dist.get_world_size() // TP, tp=TP), mesh.device_type)
    found = {"problem": None, "names": names}
    for d in NAMES:
        found[f"{d}_ranks"] = sorted(dist.get_process_group_ranks(mesh[d].get_group()))
        found[f"{d}_real"] = sorted(dist.get_process_group_ranks(real.get_group(d)))
    found["groups_ok"] = all(found[f"{d}_ranks"] == found[f"{d}_real"] for d in NAMES)
    return found


def _job(ctx, fn, weights, data) -> dict:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    dp = ctx.world_size // TP
    model = _model(weights if isinstance(weights, int) else 0)
    if not isinstance(weights, int):
        model.load_state_dict(weights)  # the real weights: on rank 0 of each tp group only
    model = model.to(ctx.device)
    inputs, targets = (t.to(ctx.device) for t in data)  # this rank's slice
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    mesh = fn(ctx, model, plan, dp, TP)
    report = _mesh_report(mesh)
    everyone = [None] * ctx.world_size  # run only if every rank's mesh is right: no hang
    dist.all_gather_object(everyone, report.get("groups_ok", False))
    if not all(everyone):
        return report
    weight = model[0].weight
    report["placements"] = ([str(p) for p in weight.placements]
                            if isinstance(weight, DTensor) else None)
    report["weight_mesh"] = (tuple(weight.device_mesh.mesh_dim_names or ())
                             if isinstance(weight, DTensor) else None)
    with warnings.catch_warnings():  # the Rowwise output is a view: true, and no in-place op
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        loss = F.mse_loss(model(inputs), targets)
    loss.backward()
    loss = loss.detach().clone()
    dist.all_reduce(loss)
    report["loss"] = loss.item() / ctx.world_size  # each dp slice's loss, on tp ranks alike
    with _quiet_redistribution():  # gathering an FSDP-over-TP gradient: two all-gathers
        report["grads"] = [None if p.grad is None else (
            p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().cpu()
            for p in model.parameters()]
    return report


def _judge(values: list[dict], run: _Run) -> CheckResult:
    try:
        return _judged(values, run)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, RuntimeError):
        return failed(EXERCISE, "a rank sent back a report that labkit's check does not "
                      "write: its code on that rank changed the check's measurements")


def _judged(values: list[dict], run: _Run) -> CheckResult:
    for rank, r in enumerate(values):
        if r["problem"]:
            return failed(EXERCISE, f"rank {rank}: {r['problem']}")
    for rank, r in enumerate(values):
        for dim in NAMES:
            if r[f"{dim}_ranks"] != r[f"{dim}_real"]:
                return failed(EXERCISE, f"rank {rank}'s {dim} group on your mesh is "
                              f"{r[f'{dim}_ranks']}, on labkit's (the groups of mesh_groups) "
                              f"it is {r[f'{dim}_real']}: the mesh's shape is (dp, tp), "
                              f"named {NAMES}, tp last (innermost)")
    r = values[0]
    where = r["weight_mesh"]
    if where == ("tp", "dp"):
        return failed(EXERCISE, "parallelize_module got mesh['dp'] and fully_shard "
                      "mesh['tp']: swap them. Tensor parallelism splits each layer over the "
                      "ranks that share a batch slice (tp), FSDP shards over those that "
                      "average gradients (dp)")
    if where != NAMES:
        over = f"over {' and '.join(where)} only" if where else "over no mesh"
        return failed(EXERCISE, f"the first layer's weight is sharded {over}: "
                      "parallelize_module(model, mesh['tp'], tp_plan) first, then "
                      "fully_shard(model, mesh=mesh['dp']), so that it is sharded over both")
    placements = r["placements"]
    if not (isinstance(placements, list) and len(placements) == 2
            and all(isinstance(p, str) and p.lstrip("_")[:1] == "S" for p in placements)):
        return failed(EXERCISE, f"the first layer's weight has placements {placements} on the "
                      "(dp, tp) mesh, not a shard on each: parallelize_module splits it over "
                      "tp, fully_shard over dp, so that each rank holds a quarter of it")
    full, grads = run.one_device()
    for rank, v in enumerate(values):
        if not tensor_list(v["grads"], [g.shape for g in grads], allow_none=True,
                           dtype=grads[0].dtype) or type(v["loss"]) is not float:
            raise ValueError(rank)  # not what the job writes: said by _judge
        for got, want in zip(v["grads"], grads, strict=True):
            if got is None or not torch.allclose(got, want, rtol=1e-4, atol=1e-6):
                return failed(EXERCISE, f"rank {rank}'s gradients differ from one device's on "
                              "the whole batch")
    if not abs(r["loss"] - full) <= 1e-5 * max(1.0, abs(full)):  # NaN fails too
        return failed(EXERCISE, f"the loss {r['loss']:.6f} differs from one device's "
                      f"{full:.6f}")
    n = len(values)
    return passed(EXERCISE, f"a ({n // TP}, {TP}) mesh on {n} ranks: each sub-mesh's groups "
                  "are labkit's, and the loss and gradients equal one device's on the whole "
                  "batch", [f"tp groups like {r['tp_ranks']}, dp groups like {r['dp_ranks']}; "
                            f"the first layer's weight is {', '.join(r['placements'])}"],
                  tp_ranks=r["tp_ranks"], dp_ranks=r["dp_ranks"], placements=r["placements"])


def compose_mesh(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Run ``fn`` on every rank of a cluster of 4 (or 8) ranks; check its mesh and values."""
    n = cluster.world_size
    if n % TP or n < 2 * TP or BATCH % (n // TP):
        return failed(EXERCISE, f"this check builds a (world_size / {TP}, {TP}) mesh: run it "
                      f"on 4 or 8 ranks, not {n}")
    run = _Run(n)
    outcome = run_checked(cluster, EXERCISE, WHERE, _job, fn, run.weights(), run.data(),
                          timeout=timeout)
    return outcome.verdict or _judge(outcome.values, run)
