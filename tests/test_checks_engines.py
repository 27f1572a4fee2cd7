"""The exercises that call PyTorch's engines themselves (notebook 04's tensor-parallel plan,
notebook 05's FSDP2 wrapping), both ways: the course's reference solution passes with full
marks, typical wrong answers fail with the message meant for them, and the grader's way of
calling an answer (``answers.Answer``, its source executed on the ranks) works too. The
learner's code runs on the ranks of a real 2-rank cluster."""

from __future__ import annotations

import sys

import cloudpickle
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import labkit
from labkit.classroom.answers import Answer
from labkit.lessons.exercise import result
from tests.exercises import answer_source, solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value


def verdict(check, *args, status="failed") -> str:
    found = check(*args)
    assert found.status == status, str(found)
    assert result.MIME_TYPE in found._repr_mimebundle_()
    return str(found)


# ----- 04: the tensor-parallel plan of a GPT block --------------------------------------------
def plan_reference():
    return solution("04_tensor_parallel", "tensor_parallel_plan_answer", "block_plan")


def proj_by_columns(block):
    return {"attn.qkv": ColwiseParallel(), "attn.proj": ColwiseParallel(),
            "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}


def names_of_the_whole_gpt(block):
    return {"blocks.0.attn.qkv": ColwiseParallel(), "blocks.0.attn.proj": RowwiseParallel(),
            "blocks.0.mlp.0": ColwiseParallel(), "blocks.0.mlp.2": RowwiseParallel()}


def mlp_only(block):
    return {"mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}


def gathers_instead(block):
    """Right values, every weight split, but all-gathers where Megatron all-reduces."""
    return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.0": ColwiseParallel(output_layouts=Replicate()),
            "mlp.2": ColwiseParallel(output_layouts=Replicate())}


def test_the_course_plan_is_labkits_own():
    from labkit.models.gpt_split import block_styles

    block = labkit.lessons.tensor_parallel.gpt_block()
    ours, labkits = plan_reference()(block), block_styles(block)
    assert {k: type(v) for k, v in ours.items()} == {k: type(v) for k, v in labkits.items()}


def test_tensor_parallel_plan_both_ways(two):
    check = labkit.check.tensor_parallel_plan
    found = check(two, plan_reference())
    assert found.passed, str(found)
    assert found.measured["forward"]["all_reduce"][0] == 2
    assert found.measured["backward"]["all_reduce"][0] == 2
    whole, held = found.measured["whole_bytes"], found.measured["held_bytes"]
    assert all(0.5 < h / whole < 0.55 for h in held), held  # 1/N, and the few whole biases
    assert found.measured["also_passed_on"] == 4
    message = verdict(check, two, proj_by_columns)
    assert message.startswith("tensor_parallel_plan: FAILED: attn.proj is column-split")
    assert "split it by rows (RowwiseParallel())" in message
    assert "names no module of the block" in verdict(check, two, names_of_the_whole_gpt)
    message = verdict(check, two, mlp_only)
    assert "attn.qkv is not in the plan: its weight stays whole on every rank" in message
    assert "attn.qkv.weight is of shape (96, 32) on each rank (the whole tensor)" in message
    message = verdict(check, two, gathers_instead)
    assert "mlp.2 is column-split" in message and "2 all_gather" in message


def with_wildcards(block):
    """Megatron's plan, its keys written with parallelize_module's fnmatch wildcards."""
    return {"*.qkv": ColwiseParallel(), "*.proj": RowwiseParallel(),
            "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}


def test_a_plan_with_wildcards_is_read_as_parallelize_module_reads_it(two):
    found = labkit.check.tensor_parallel_plan(two, with_wildcards)
    assert found.passed, str(found)
    message = verdict(labkit.check.tensor_parallel_plan, two,
                      lambda block: {"attn.*": ColwiseParallel(), "mlp.0": ColwiseParallel(),
                                     "mlp.2": RowwiseParallel()})
    assert message.startswith("tensor_parallel_plan: FAILED: attn.proj is column-split")


def test_the_hand_written_layers_as_the_grader_calls_them(two):
    """An answer the grader hands the check is labkit's Answer object, not a labkit class."""
    source = answer_source("04_tensor_parallel", "tensor_parallel_linears_answer")
    column, row = (Answer(name, (source,), {}) for name in ("ColumnParallelLinear",
                                                            "RowParallelLinear"))
    assert labkit.check.tensor_parallel_linears(two, column, row).passed


def test_tensor_parallel_plan_as_the_grader_calls_it(two):
    source = answer_source("04_tensor_parallel", "tensor_parallel_plan_answer")
    graded = Answer("block_plan", (source,), {})
    assert labkit.check.tensor_parallel_plan(two, graded).passed
    unwritten = Answer("block_plan", ("def block_plan(block):\n    raise NotImplementedError()",),
                       {})
    verdict(labkit.check.tensor_parallel_plan, two, unwritten, status="not attempted")


# ----- 05: FSDP2 on a GPT ---------------------------------------------------------------------
def fsdp_reference():
    return solution("05_sharded_data_parallel", "fully_shard_model_answer", "shard_model")


def blocks_only(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)


def root_only(model, mesh):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, mesh=mesh)


def root_first(model, mesh):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, mesh=mesh)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)


def every_linear(model, mesh):
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if isinstance(module, nn.Linear):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def test_fully_shard_model_both_ways(two):
    check = labkit.check.fully_shard_model
    found = check(two, fsdp_reference())
    assert found.passed, str(found)
    whole = found.measured["whole_bytes"]
    assert all(h / whole <= 0.51 for h in found.measured["held_bytes"])  # ~1/N at rest
    assert all(p < whole for p in found.measured["parameter_peaks"])     # below DDP's
    assert found.measured["units"] == ["", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert found.measured["also_passed_on"] == 4
    message = verdict(check, two, blocks_only)
    assert message.startswith("fully_shard_model: FAILED: the root is not wrapped")
    assert "differs from one device's" in message  # the embeddings' gradients not averaged
    message = verdict(check, two, root_only)
    assert message.startswith("fully_shard_model: FAILED: only the root is wrapped")
    assert "in one all-gather" in message and "more than the" in message
    assert "ran before the blocks'" in verdict(check, two, root_first)


def gradients_too_large(model, mesh):
    """Right wrapping, every gradient 1.25 times one device's: Adam's steps hide the scale."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.register_forward_hook(lambda m, i, out: out.register_hook(lambda g: g * 1.25) and None)


def test_a_gradient_of_the_wrong_scale_fails(two):
    message = verdict(labkit.check.fully_shard_model, two, gradients_too_large)
    assert "differs from one device's (its norm is 1.25 times one device's)" in message


def replicated_units(model, mesh):
    """Every unit right, on a mesh of its own that shards over 1 rank: whole copies (HSDP)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    own = init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("copy", "shard"))
    for block in model.blocks:
        fully_shard(block, mesh=own)
    fully_shard(model, mesh=own)


def test_units_on_a_mesh_that_shards_over_one_rank_are_named_for_it(two):
    message = verdict(labkit.check.fully_shard_model, two, replicated_units)
    assert "every block and the root are units, but they keep more than 1/N" in message
    assert "every parameter should be in some unit" not in message


def sets_float64_and_raises(model, mesh):
    import torch

    torch.set_default_dtype(torch.float64)  # on the rank, which outlives the check
    raise ValueError("a first attempt that fails")


def test_a_failed_attempt_leaves_the_ranks_defaults_as_they_were(two):
    assert "a first attempt that fails" in verdict(labkit.check.fully_shard_model, two,
                                                    sets_float64_and_raises)
    found = labkit.check.fully_shard_model(two, fsdp_reference())  # then the right answer
    assert found.passed, str(found)


def test_smaller_units_lower_the_peak_and_run_more_collectives(two):
    """The lesson: "the smaller the units, the lower the peak, and the more collectives"."""
    blocks = labkit.check.fully_shard_model(two, fsdp_reference())
    linears = labkit.check.fully_shard_model(two, every_linear)
    assert "are not FSDP units of their own" in str(linears)  # the exercise asks for blocks
    assert max(linears.measured["parameter_peaks"]) < min(blocks.measured["parameter_peaks"])
    gathers = [m.measured["passes"][-1][0]["all_gather"][0] for m in (blocks, linears)]
    assert gathers[0] == 5 and gathers[1] > gathers[0]  # root + 4 blocks; 16 linears + head + root


def test_fully_shard_model_as_the_grader_calls_it(two):
    source = answer_source("05_sharded_data_parallel", "fully_shard_model_answer")
    assert labkit.check.fully_shard_model(two, Answer("shard_model", (source,), {})).passed


def test_the_learners_copies_hold_the_stubs_not_the_solutions():
    import nbformat

    from tests.exercises import COURSE

    for stem, grade_id, solution_line in [
            ("04_tensor_parallel", "tensor_parallel_plan_answer", '"attn.proj": RowwiseParallel()'),
            ("05_sharded_data_parallel", "fully_shard_model_answer", "fully_shard(block, mesh")]:
        learners = nbformat.read(COURSE.parent / "notebooks" / f"{stem}.ipynb", as_version=4)
        cell = next(c for c in learners.cells
                    if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
        assert "raise NotImplementedError()" in cell.source, stem
        assert solution_line not in cell.source, stem
        assert solution_line in answer_source(stem, grade_id), stem
