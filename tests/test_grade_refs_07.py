"""Forgeries of notebook 07's ``compose_mesh`` check, from the ranks: each answer is wrong and
rewires what the check's job reports on its rank (the mesh's groups, the weights' placements,
the gradients). Both fail: each rank receives only its data-parallel slice of the batch, and
only the ranks tensor parallelism takes the weights from receive the real ones, so neither one
device's gradients computed alone nor a mesh with the wrong groups gives the check's numbers.
Each runs on a cluster of its own, since the patches outlive the check on its ranks.
"""

from __future__ import annotations

import copy
import sys

import cloudpickle
import pytest
import torch.nn.functional as F

import labkit
import tests.forgery
from tests.exercises import solution
from tests.forgery import frame_locals

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the answers go by value
cloudpickle.register_pickle_by_value(tests.forgery)


@pytest.fixture
def fresh4():
    """A 4-rank CPU cluster for one test: a forgery's patches stay on its ranks."""
    with labkit.Cluster(4, device="cpu", progress=False) as cluster:
        yield cluster


class _Rewrites:
    """Stands in for the check's ``_quiet_redistribution``: on leaving, puts ``fields`` into the
    report the job is writing (a frame's local ``report``)."""

    def __init__(self, fields: dict):
        self.fields = fields

    def __call__(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for report in frame_locals("report")[:1]:
            report.update(self.fields)
        return False


def one_device_alone(ctx, model, tp_plan, dp, tp):
    """The right mesh and no parallelism: this rank computes the gradients of the model and the
    batch it was given, alone, and has the job report them with a sharded weight's placements."""
    from torch.distributed.device_mesh import init_device_mesh

    import labkit.lessons.layouts.compose_check as check

    mesh = init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    [inputs], [targets] = frame_locals("inputs")[:1], frame_locals("targets")[:1]
    alone = copy.deepcopy(model)
    loss = F.mse_loss(alone(inputs), targets)
    loss.backward()
    check._quiet_redistribution = _Rewrites({
        "grads": [p.grad.detach().cpu() for p in alone.parameters()], "loss": loss.item(),
        "placements": ["_StridedShard(dim=0, sf=2)", "Shard(dim=0)"],
        "weight_mesh": ("dp", "tp")})
    return mesh


def tp_outermost_reported_right(ctx, model, tp_plan, dp, tp):
    """A mesh with its dimensions swapped ((tp, dp): tp groups [0, 2], [1, 3]), with the job's
    report of its groups replaced by labkit's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    import labkit.lessons.layouts.compose_check as check

    measure = check._mesh_report

    def agrees(mesh):
        report = measure(mesh)
        for dim in ("dp", "tp"):
            report[f"{dim}_ranks"] = report[f"{dim}_real"]
        report["groups_ok"] = True
        return report

    check._mesh_report = agrees
    mesh = init_device_mesh(ctx.device.type, (tp, dp), mesh_dim_names=("tp", "dp"))
    parallelize_module(model, mesh["tp"], tp_plan)
    fully_shard(model, mesh=mesh["dp"])
    return mesh


@pytest.mark.parametrize("answer", [one_device_alone, tp_outermost_reported_right])
def test_compose_mesh_forgeries_fail(fresh4, answer):
    found = labkit.check.compose_mesh(fresh4, answer)
    assert found.status == "failed", str(found)
    assert "differ from one device's" in found.summary, str(found)


def test_the_course_solution_passes_at_both_sizes(fresh4):
    compose = solution("07_putting_it_together", "compose_mesh_answer", "compose")
    found = labkit.check.compose_mesh(fresh4, compose)
    assert found.passed, str(found)
    with fresh4.resized(8):
        found = labkit.check.compose_mesh(fresh4, compose)
        assert found.passed, str(found)


COMPOSE = solution("07_putting_it_together", "compose_mesh_answer", "compose")


def reports_nonsense(ctx, model, tp_plan, dp, tp):
    """The course's layout, with the check's report of the mesh replaced on the rank by one
    missing what the checker reads."""
    import labkit.lessons.layouts.compose_check as check

    check._mesh_report = lambda mesh: {"problem": None, "groups_ok": True, "loss": "x"}
    return COMPOSE(ctx, model, tp_plan, dp, tp)


def test_a_report_the_job_does_not_write_is_a_failure_not_an_error(fresh4):
    found = labkit.check.compose_mesh(fresh4, reports_nonsense)
    assert found.status == "failed" and "does not write" in found.summary, str(found)


# A wrong answer found by review: no tensor or data parallelism and no frames read. Rank 0's
# weights are broadcast and every rank's slice all-gathered (inside a patched F.mse_loss), each
# rank computes the whole batch alone and sets replicated DTensor gradients on the real mesh.
# Its numbers are right; its first layer's placements are Replicate, where the layout's are
# shards, and that is what fails it.
def replicated_alone(ctx, model, tp_plan, dp, tp):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    """No tensor or data parallelism, no frames: rank 0's weights and every rank's slice are
    gathered whole onto every rank, which computes the loss and gradients alone."""
    mesh = init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    if not isinstance(model, nn.Sequential) or len(model) != 3 or model[0].in_features != 16:
        parallelize_module(model, mesh["tp"], tp_plan)
        fully_shard(model, mesh=mesh["dp"])
        return mesh
    whole = nn.Sequential(nn.Linear(16, model[0].out_features), nn.ReLU(),
                          nn.Linear(model[0].out_features, model[2].out_features))
    with torch.no_grad():
        for mine, p in zip(model.parameters(), whole.parameters(), strict=True):
            p.copy_(mine)
            dist.broadcast(p.data, 0)  # rank 0 holds the real weights
    params = []
    for name, p in list(model.named_parameters()):
        mod, attr = name.split(".")
        q = nn.Parameter(DTensor.from_local(p.detach().clone(), mesh, [Replicate(), Replicate()]))
        setattr(model[int(mod)], attr, q)
        params.append(q)

    def forward(x):
        out = torch.zeros((), requires_grad=True)
        out.rank_inputs = x
        return out

    def mse(out, target, *a, **k):
        if not hasattr(out, "rank_inputs"):
            return real_mse(out, target, *a, **k)
        xs = [torch.empty_like(out.rank_inputs) for _ in range(ctx.world_size)]
        ys = [torch.empty_like(target) for _ in range(ctx.world_size)]
        dist.all_gather(xs, out.rank_inputs.contiguous())
        dist.all_gather(ys, target.contiguous())
        for p in whole.parameters():
            p.grad = None
        loss = real_mse(whole(torch.cat(xs[::tp])), torch.cat(ys[::tp]))
        loss.backward()
        grads = [p.grad.detach().clone() for p in whole.parameters()]
        z = out + loss.item()

        def hook(g):
            for p, grad in zip(params, grads, strict=True):
                p.grad = DTensor.from_local(grad, mesh, [Replicate(), Replicate()])
        z.register_hook(hook)
        return z

    model.forward = forward
    real_mse = F.mse_loss
    F.mse_loss = mse
    return mesh


def test_replicated_weights_computed_alone_fail(fresh4):
    import torch.nn.functional as functional

    real = functional.mse_loss
    found = labkit.check.compose_mesh(fresh4, replicated_alone)
    assert functional.mse_loss is real  # patched on the ranks only
    assert found.status == "failed" and "not a shard on each" in found.summary, str(found)
