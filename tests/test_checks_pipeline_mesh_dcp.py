"""The exercises on PyTorch's own engines (03 ``pipeline_schedule``, 07 ``compose_mesh``, 10
``dcp_resume``): the course's reference solution passes, typical wrong answers fail with
their own message, and the learners' copies hold the stub, not the solution."""

from __future__ import annotations

import sys
from pathlib import Path

import cloudpickle
import nbformat
import pytest

import labkit
from labkit.lessons.exercise import result
from labkit.lessons.exercise.runner import resized
from tests.exercises import answer_source, solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value
REPO = Path(__file__).resolve().parent.parent
NEW = {"03_pipeline_parallel": "pipeline_schedule", "07_putting_it_together": "compose_mesh",
       "10_when_a_gpu_dies": "dcp_resume"}


def verdict(check, *args, status="failed"):
    found = check(*args)
    assert found.status == status, str(found)
    assert result.MIME_TYPE in found._repr_mimebundle_()
    return str(found)


# ----- 03: PipelineStage and a schedule -------------------------------------------------------
def _stage(ctx, part, index=None, num_stages=None):
    from torch.distributed.pipelining import PipelineStage

    return PipelineStage(part, stage_index=ctx.rank if index is None else index,
                         num_stages=num_stages or ctx.world_size, device=ctx.device)


def one_f_one_b(ctx, part, micro_batches, loss_fn, schedule_class):
    from torch.distributed.pipelining import Schedule1F1B

    return Schedule1F1B(_stage(ctx, part), n_microbatches=micro_batches, loss_fn=loss_fn)


def every_rank_stage_zero(ctx, part, micro_batches, loss_fn, schedule_class):
    return schedule_class(_stage(ctx, part, index=0), n_microbatches=micro_batches,
                          loss_fn=loss_fn)


def no_loss_on_the_last_stage(ctx, part, micro_batches, loss_fn, schedule_class):
    return schedule_class(_stage(ctx, part), n_microbatches=micro_batches,
                          loss_fn=loss_fn if ctx.rank == 0 else None)


def loss_on_the_last_stage_only(ctx, part, micro_batches, loss_fn, schedule_class):
    """What the docs' picture suggests; rank 0's Schedule1F1B then runs no backward and the
    two ranks wait on each other for ever."""
    return schedule_class(_stage(ctx, part), n_microbatches=micro_batches,
                          loss_fn=loss_fn if ctx.rank == 1 else None)


def three_micro_batches(ctx, part, micro_batches, loss_fn, schedule_class):
    return schedule_class(_stage(ctx, part), n_microbatches=3, loss_fn=loss_fn)


def test_pipeline_schedule_both_ways(two):
    reference = solution("03_pipeline_parallel", "pipeline_schedule_answer",
                         "pipeline_schedule")
    check = labkit.check.pipeline_schedule
    said = verdict(check, two, reference, status="passed")
    assert "equal one device's" in said and "ScheduleGPipe and Schedule1F1B" in said
    said = verdict(check, two, one_f_one_b)  # the class it was given is not the one it built
    assert "returned a Schedule1F1B when it was given schedule_class=ScheduleGPipe" in said
    said = verdict(check, two, every_rank_stage_zero)
    assert "rank 1's PipelineStage is stage_index 0 of num_stages 2" in said
    assert "the last stage's schedule has no loss_fn" in verdict(check, two,
                                                                  no_loss_on_the_last_stage)
    said = verdict(check, two, loss_on_the_last_stage_only)  # named, not hung
    assert "rank 0's schedule has no loss_fn" in said and "runs forward only" in said
    said = verdict(check, two, three_micro_batches)
    assert "3 micro-batches do not divide the batch of 16" in said


def test_pipeline_schedule_reads_what_torch_keeps():
    """The check reads a schedule's private ``_stage``, ``_n_microbatches`` and ``_loss_fn``:
    they must still be where it looks."""
    import inspect

    from torch.distributed.pipelining import schedules

    text = inspect.getsource(schedules.PipelineScheduleSingle) + inspect.getsource(
        schedules._PipelineSchedule)
    for name in ("self._stage =", "self._n_microbatches =", "self._loss_fn =",
                 "self._has_backward = self._loss_fn is not None"):
        assert name in text, name


# ----- 10: DCP save and resume ----------------------------------------------------------------
def save_model_only(model, optimizer, step, folder):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save({"model": get_model_state_dict(model), "step": step}, checkpoint_id=folder)


def load_model_only(model, optimizer, folder):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"model": get_model_state_dict(model), "step": 0}
    dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(model, state["model"])
    return state["step"]


def load_into_plain_dicts(model, optimizer, folder):
    """dcp.load into the optimizer's own state_dict(), never set back: a fresh Adam's has
    no state to fill."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = {"model": get_model_state_dict(model), "optimizer": optimizer.state_dict(),
             "step": 0}
    dcp.load(state, checkpoint_id=folder)
    return state["step"]


def load_the_step_only(model, optimizer, folder):
    import torch.distributed.checkpoint as dcp

    state = {"step": 0}
    dcp.load(state, checkpoint_id=folder)
    return state["step"]


def test_dcp_resume_both_ways(two):
    save = solution("10_when_a_gpu_dies", "dcp_resume_answer", "save_checkpoint")
    load = solution("10_when_a_gpu_dies", "dcp_resume_answer", "load_checkpoint")
    check = labkit.check.dcp_resume
    assert "bit for bit" in verdict(check, two, save, load, status="passed")
    said = verdict(check, two, save_model_only, load_model_only)
    assert "holds no optimizer state" in said and "restarts Adam" in said
    said = verdict(check, two, save, load_into_plain_dicts)
    assert "did not put it into the fresh optimizer" in said and "set_state_dict" in said
    said = verdict(check, two, save, load_the_step_only)
    assert "did not put the weights back" in said and "set_state_dict" in said


# ----- 07: a 2D mesh, a sub-mesh for each parallelism -----------------------------------------
def swapped_sub_meshes(ctx, model, tp_plan, dp, tp):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["dp"], tp_plan)
    fully_shard(model, mesh=mesh["tp"])
    return mesh


def tp_outermost(ctx, model, tp_plan, dp, tp):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(ctx.device.type, (tp, dp), mesh_dim_names=("tp", "dp"))
    parallelize_module(model, mesh["tp"], tp_plan)
    fully_shard(model, mesh=mesh["dp"])
    return mesh


def test_compose_mesh_both_ways(two):
    reference = solution("07_putting_it_together", "compose_mesh_answer", "compose")
    check = labkit.check.compose_mesh
    assert "this check builds a" in verdict(check, two, reference)
    with resized(two, 4) as four:
        assert "equal one device's" in verdict(check, four, reference, status="passed")
        said = verdict(check, four, swapped_sub_meshes)
        assert "parallelize_module got mesh['dp'] and fully_shard mesh['tp']" in said
        said = verdict(check, four, tp_outermost)
        assert "rank 0's dp group on your mesh is [0, 1]" in said and "[0, 2]" in said


# ----- the learners' copies -------------------------------------------------------------------
@pytest.mark.parametrize("stem", sorted(NEW))
def test_the_learners_copy_has_the_stub(stem):
    grade_id = f"{NEW[stem]}_answer"
    course = answer_source(stem, grade_id)
    learners = nbformat.read(REPO / "notebooks" / f"{stem}.ipynb", as_version=4)
    [cell] = [c for c in learners.cells
              if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    assert "raise NotImplementedError()" in cell.source
    assert "### BEGIN SOLUTION" in course and "### BEGIN SOLUTION" not in cell.source
    assert "init_device_mesh(ctx" not in cell.source and "dcp.load(state" not in cell.source
    assert "PipelineStage(part" not in cell.source
    checks = [c for c in learners.cells
              if c.metadata.get("nbgrader", {}).get("grade_id") == f"{NEW[stem]}_check"]
    assert len(checks) == 1 and "assert_passed" not in checks[0].source
    assert checks[0].metadata["nbgrader"]["points"] == 2


# ----- answers that dodge the engine ----------------------------------------------------------
def mesh_only(ctx, model, tp_plan, dp, tp):
    """The right mesh, and the model left whole on every rank: right values, no parallelism."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))


def no_schedule(ctx, part, micro_batches, loss_fn, schedule_class):
    return part


def save_nothing(model, optimizer, step, folder):
    return None


def test_answers_that_skip_the_engine_fail(two):
    said = verdict(labkit.check.pipeline_schedule, two, no_schedule)
    assert "returned Sequential, not a schedule" in said
    load = solution("10_when_a_gpu_dies", "dcp_resume_answer", "load_checkpoint")
    said = verdict(labkit.check.dcp_resume, two, save_nothing, load)
    assert "save_checkpoint wrote no DCP checkpoint" in said
    with resized(two, 4) as four:
        said = verdict(labkit.check.compose_mesh, four, mesh_only)
        assert "sharded over no mesh" in said
