"""Forgeries of notebook 05's ``fully_shard_model`` check, from the ranks: each answer trains
without FSDP (all-reducing the gradients as DDP does, or not communicating at all) and patches
what the check's job reports on its rank (the FSDP units, the bytes held, the parameter peak,
labkit's collective counts) to look sharded. Each rank receives only its own slice of each
batch, so training alone misses the other ranks' gradients; and the bytes the kernel counts on
each rank's sockets, outside the ranks, are fewer than FSDP's collectives send. Each forgery
runs on a cluster of its own, since a patch that goes wrong would stay on its ranks.
"""

from __future__ import annotations

import sys

import cloudpickle
import torch
import torch.distributed as dist

import labkit
from labkit.lessons.sharding.fsdp_check import STEPS
from tests.exercises import solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the answers go by value

UNITS = ["", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]



def _sharded_passes(steps: int) -> list:
    """Collective counts of a step as FSDP2 runs them on this GPT (root and 4 blocks)."""
    return [({"all_gather": [5, 51_744]},
             {"all_gather": [4, 49_408], "reduce_scatter": [5, 51_744]}) for _ in range(steps)]


def _report_as_sharded(train) -> None:
    """Make the check's job on this rank report FSDP's units, 1/N of the parameters held, a
    peak below the whole model and FSDP's collectives, with ``train(original_train, ctx,
    model, batches)`` doing the training; the patches undo themselves once it has run."""
    import labkit.lessons.sharding.fsdp_check as check

    originals = {name: getattr(check, name) for name in ("_units", "_local", "_train")}
    n = dist.get_world_size()
    check._units = lambda model: list(UNITS)
    check._local = lambda tensor: tensor.detach().flatten()[:-(-tensor.numel() // n)]

    def reported(ctx, model, batches):
        try:
            out = train(originals["_train"], ctx, model, batches)
        finally:
            for name, original in originals.items():
                setattr(check, name, original)
        whole = sum(p.nbytes for p in model.parameters())
        out["parameter_peak"], out["passes"] = int(0.6 * whole), _sharded_passes(STEPS)
        return out

    check._train = reported


def all_reduces_and_reports_fsdp(model, mesh):
    """DDP: every gradient all-reduced and averaged as it is made, no unit sharded; the job's
    reports patched to look like FSDP's."""
    n = dist.get_world_size()

    def average(param):
        dist.all_reduce(param.grad)
        param.grad /= n

    for param in model.parameters():
        param.register_post_accumulate_grad_hook(average)
    _report_as_sharded(lambda original, ctx, model, batches: original(ctx, model, batches))


def trains_alone_and_reports_fsdp(model, mesh):
    """One device's Adam on the batches the job holds, no communication at all; the job's
    reports patched to look like FSDP's."""
    from labkit.lessons.sharding.fsdp_check import LR
    from labkit.models.gpt import GPT

    def train(original, ctx, model, batches):
        optimizer, grads = torch.optim.Adam(model.parameters(), lr=LR), None
        for tokens, targets in batches:  # every row the job was given, unsliced
            GPT.loss(model(tokens), targets).backward()
            grads = grads or {name: p.grad.clone() for name, p in model.named_parameters()}
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return {"weights": {name: p.detach().clone() for name, p in model.named_parameters()},
                "grads": grads, "passes": [], "parameter_peak": 0}

    _report_as_sharded(train)


def test_ddp_reported_as_fsdp_fails_on_the_bytes_its_sockets_carried(fresh):
    found = labkit.check.fully_shard_model(fresh, all_reduces_and_reports_fsdp)
    assert found.status == "failed", str(found)
    assert "crossed rank 0's sockets" in found.summary, str(found)
    assert "less than FSDP sends" in found.summary, str(found)
    bound = STEPS * found.measured["fsdp_step_bytes"]
    assert max(found.measured["socket_bytes"]) < 0.85 * bound  # DDP's all-reduce: ~0.75


def test_training_alone_reported_as_fsdp_fails_on_the_weights(fresh):
    found = labkit.check.fully_shard_model(fresh, trains_alone_and_reports_fsdp)
    assert found.status == "failed", str(found)
    assert "differs from one device's" in found.summary, str(found)


def _honest_margin(found) -> float:
    """How far above FSDP's fewest bytes the fewest a rank's sockets carried lie."""
    return min(found.measured["socket_bytes"]) / (STEPS * found.measured["fsdp_step_bytes"])


def test_the_course_solution_sends_what_fsdp_sends_at_both_sizes(two, four):
    honest = solution("05_sharded_data_parallel", "fully_shard_model_answer", "shard_model")
    for cluster, other in ((two, 4), (four, 2)):
        found = labkit.check.fully_shard_model(cluster, honest)
        assert found.passed and found.measured["also_passed_on"] == other, str(found)
        assert "sockets carried" in found.summary
        # gloo reduce-scatters by an all-reduce, and the job gathers its reports: ~1.7x
        assert _honest_margin(found) > 1.3, found.measured["socket_bytes"]


def test_an_unmeasurable_count_fails_when_grading_only(two, monkeypatch):
    import labkit.lessons.exercise.outside as outside
    from labkit.runtime.comm.sockets import Unmeasurable

    def closed(pids):
        raise Unmeasurable("the ranks' /proc entries are closed")

    honest = solution("05_sharded_data_parallel", "fully_shard_model_answer", "shard_model")
    monkeypatch.setattr(outside, "WireSnapshot", closed)
    found = labkit.check.fully_shard_model(two, honest)
    assert found.passed and found.measured["socket_bytes"] is None, str(found)
    monkeypatch.setattr(outside, "distrusted", lambda: True)
    found = labkit.check.fully_shard_model(two, honest)
    assert found.status == "failed" and "could not count the bytes" in found.summary, str(found)
