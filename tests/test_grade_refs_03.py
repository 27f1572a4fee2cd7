"""Answers to notebook 03's ``pipeline_schedule`` that wire a real schedule over a real
``PipelineStage`` (so what the rank reports of its wiring reads right) and then run no
pipeline: each computes one device's loss and gradients alone. The check gives each rank its
own stage's weights and its own half of the batch (rank 0 the inputs, rank 1 the targets),
computes one device's reference from both in its own process, and counts the bytes that
crossed each rank's sockets: so every one fails, and the course's solution still passes.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import labkit
import tests.forgery
from tests.exercises import solution
from tests.forgery import frame_locals

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value
cloudpickle.register_pickle_by_value(tests.forgery)
linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="the kernel's socket counters are read on Linux only")



def _wired(ctx, part, micro_batches, loss_fn, schedule_class, step):
    """The schedule the course's solution builds, its ``step`` replaced by ``step``."""
    from torch.distributed.pipelining import PipelineStage

    stage = PipelineStage(part, stage_index=ctx.rank, num_stages=ctx.world_size,
                          device=ctx.device)
    schedule = schedule_class(stage, n_microbatches=micro_batches, loss_fn=loss_fn)
    schedule.step = step
    return schedule


def _one_device(model, inputs, targets, micro_batches, loss_fn, losses) -> None:
    """GPipe's arithmetic on one device: each micro-batch's loss, its gradient scaled."""
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches), strict=True):
        loss = loss_fn(model(x), y)
        (loss / micro_batches).backward()
        if losses is not None:
            losses.append(loss.detach())


# ----- every rank computes the whole model alone, from what its job built --------------------
def _whole(part, batch):
    """The whole model, the inputs and the targets, found in the job's frame; where the job
    holds only this rank's stage and ``batch`` (its half of it), the rest made up."""
    from torch import nn

    found = [frame_locals(name)[:1] for name in ("model", "inputs", "targets")]
    if all(found):
        return [value for [value] in found]
    width, n = part[0].out_features, batch.shape[0]
    if part[0].in_features == 16:  # stage 0: the second stage and the targets unknown
        rest = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))
        return nn.Sequential(*part, *rest), batch, torch.zeros(n, 4)
    first = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
    return nn.Sequential(*first, *part), torch.randn(n, 16), batch


def computes_alone(ctx, part, micro_batches, loss_fn, schedule_class):
    """Steps nothing between the ranks: each runs the whole model (both halves, the inputs
    and the targets, from its job's frame) and so sets its part's gradients."""

    def step(*args, target=None, losses=None, **kwargs):
        model, inputs, targets = _whole(part, args[0] if args else target)
        _one_device(model, inputs, targets, micro_batches, loss_fn, losses)

    return _wired(ctx, part, micro_batches, loss_fn, schedule_class, step)


def test_a_rank_cannot_compute_the_pipeline_alone(two):
    found = labkit.check.pipeline_schedule(two, computes_alone)
    assert not found.passed and "differ from one device's" in found.summary, str(found)


# ----- rank 0 ships its stage and inputs to rank 1, which computes it all -------------------
def ships_the_first_stage(ctx, part, micro_batches, loss_fn, schedule_class):
    """Rank 0 sends its weights and its inputs to rank 1, which runs both halves on one
    device and sends rank 0's gradients back: right numbers, no pipeline, and more bytes on
    the wire than a pipeline's activations and their gradients."""
    from torch import nn

    def step(*args, target=None, losses=None, **kwargs):
        params = list(part.parameters())
        if ctx.rank == 0:
            (inputs,) = args
            for tensor in [inputs, *params]:
                dist.send(tensor.detach().contiguous(), 1)
            for param in params:
                param.grad = torch.empty_like(param)
                dist.recv(param.grad, 1)
            return None
        first = nn.Sequential(nn.Linear(16, part[0].in_features), nn.ReLU(),
                              nn.Linear(part[0].in_features, part[0].in_features), nn.ReLU())
        inputs = torch.empty(target.shape[0], 16)
        for tensor in [inputs, *first.parameters()]:
            dist.recv(tensor.data, 0)
        _one_device(nn.Sequential(*first, *part), inputs, target, micro_batches, loss_fn,
                    losses)
        for param in first.parameters():
            dist.send(param.grad, 0)
        return None

    return _wired(ctx, part, micro_batches, loss_fn, schedule_class, step)


@linux
def test_shipping_a_stage_instead_of_its_activations_fails(two):
    found = labkit.check.pipeline_schedule(two, ships_the_first_stage)
    assert not found.passed and "crossed rank" in found.summary, str(found)


# ----- a report the check's job does not write ---------------------------------------------
def reports_a_made_up_wiring(ctx, part, micro_batches, loss_fn, schedule_class):
    """Replaces the check's reading of the wiring on this rank (once: the rank outlives the
    test) with one that answers a number where the job writes a sentence or None."""
    import labkit.lessons.pipeline.schedule_check as check

    original = check._wiring

    def made_up(ctx, schedule):
        check._wiring = original
        return {"problem": 5}

    check._wiring = made_up
    return part


def test_a_made_up_report_is_named_not_raised(two):
    found = labkit.check.pipeline_schedule(two, reports_a_made_up_wiring)
    assert not found.passed and "report that labkit's check does not write" in found.summary


# ----- the course's solution ---------------------------------------------------------------
def test_the_course_solution_passes_with_its_activations_on_the_wire(two):
    answer = solution("03_pipeline_parallel", "pipeline_schedule_answer", "pipeline_schedule")
    found = labkit.check.pipeline_schedule(two, answer)
    assert found.passed, str(found)
    assert found.measured["schedules"] == ["ScheduleGPipe", "Schedule1F1B"]
    from labkit.lessons.pipeline.schedule_check import BETWEEN_STAGES, MOST_SENT

    on_wire = [sent for kind in found.measured["schedules"]
               for sent in found.measured["socket_bytes"][kind] if sent is not None]
    assert all(BETWEEN_STAGES <= sent <= MOST_SENT for sent in on_wire), found.measured


def test_the_bytes_allowed_are_fewer_than_a_stage_ships():
    """A rank that runs both stages must receive the other stage's weights, or send its
    gradients back: more bytes than the check lets a rank send."""
    from labkit.lessons.pipeline.schedule_check import MOST_SENT, _part

    smallest = min(sum(p.numel() * p.element_size() for p in _part(rank).parameters())
                   for rank in (0, 1))
    assert MOST_SENT < smallest


def test_an_uncounted_run_fails_when_grading(two, monkeypatch):
    from labkit.lessons.exercise import outside

    answer = solution("03_pipeline_parallel", "pipeline_schedule_answer", "pipeline_schedule")
    monkeypatch.setattr(outside.SocketCount, "sent", lambda self: None)
    assert labkit.check.pipeline_schedule(two, answer).passed  # a notebook goes on
    monkeypatch.setattr(outside, "distrusted", lambda: True)
    found = labkit.check.pipeline_schedule(two, answer)
    assert not found.passed and "could not count the bytes" in found.summary, str(found)
