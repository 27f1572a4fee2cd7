"""Notebook 07's second exercise: a 2D mesh, and which sub-mesh each parallelism takes.

The learner writes ``compose(ctx, model, tp_plan, dp, tp)``: build the mesh with
``init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))``, give its "tp"
sub-mesh to ``parallelize_module(model, mesh["tp"], tp_plan)`` and its "dp" sub-mesh to
``fully_shard(model, mesh=mesh["dp"])``, and return the mesh. On every rank the check
compares the ranks of each sub-mesh's group with those of labkit's own mesh for the same
layout (the groups of the first exercise, ``mesh_groups``), then runs one forward and
backward on this rank's slice of the batch (by its dp coordinate) and compares the loss and
the whole gradients here with one device's, from a seed drawn for each run.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked
from labkit.training.build.materialize import _quiet_redistribution
from labkit.training.layout.layout import Layout

EXERCISE = "compose_mesh"
WHERE = "compose"
D_IN, D_HIDDEN, D_OUT, BATCH, TP = 16, 32, 8, 8, 2
NAMES = ("dp", "tp")


def _model_and_batch(seed: int):
    """An MLP (batch, in) -> (batch, hidden) -> (batch, out), a batch and its targets."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.ReLU(), nn.Linear(D_HIDDEN, D_OUT))
    return model, torch.randn(BATCH, D_IN), torch.randn(BATCH, D_OUT)


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


def _job(ctx, fn, seed: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    dp = ctx.world_size // TP
    model, inputs, targets = _model_and_batch(seed)
    model = model.to(ctx.device)
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
    share = BATCH // dp
    mine = slice(mesh["dp"].get_local_rank() * share, (mesh["dp"].get_local_rank() + 1) * share)
    with warnings.catch_warnings():  # the Rowwise output is a view: true, and no in-place op
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        loss = F.mse_loss(model(inputs[mine].to(ctx.device)), targets[mine].to(ctx.device))
    loss.backward()
    loss = loss.detach().clone()
    dist.all_reduce(loss)
    report["loss"] = loss.item() / ctx.world_size  # each dp slice's loss, on tp ranks alike
    with _quiet_redistribution():  # gathering an FSDP-over-TP gradient: two all-gathers
        report["grads"] = [None if p.grad is None else (
            p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().cpu()
            for p in model.parameters()]
    return report


def _judge(values: list[dict], seed: int) -> CheckResult:
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
    model, inputs, targets = _model_and_batch(seed)
    full = F.mse_loss(model(inputs), targets)
    full.backward()
    for rank, v in enumerate(values):
        for got, p in zip(v["grads"], model.parameters(), strict=True):
            if got is None or not torch.allclose(got, p.grad, rtol=1e-4, atol=1e-6):
                return failed(EXERCISE, f"rank {rank}'s gradients differ from one device's on "
                              "the whole batch")
    if abs(r["loss"] - full.item()) > 1e-5 * max(1.0, abs(full.item())):
        return failed(EXERCISE, f"the loss {r['loss']:.6f} differs from one device's "
                      f"{full.item():.6f}")
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
    seed = fresh_seed()
    outcome = run_checked(cluster, EXERCISE, WHERE, _job, fn, seed, timeout=timeout)
    return outcome.verdict or _judge(outcome.values, seed)
