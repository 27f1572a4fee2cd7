"""Answers that rewire what the ranks measure, for the checks of notebooks 01, 02, 03 and 05:
each is wrong, and changes the values a check once computed on the ranks (the one-device
reference, the memory measured, the batch) so that its check would see what it wants. The
checks draw their inputs per run, compute their references in their own process and compare
there, so every one fails; and the grader flags answers that call labkit's own parallelisms.
"""

from __future__ import annotations

import sys

import cloudpickle
import torch
import torch.distributed as dist

import labkit
import tests.forgery
from labkit.classroom.answers import review_notes
from tests.exercises import answer_source, solution
from tests.forgery import frame_locals

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value
cloudpickle.register_pickle_by_value(tests.forgery)



def _dummy_all_reduce() -> None:
    dist.all_reduce(torch.zeros(1))  # a collective, for the check's count


# ----- 01: the measurement, made to agree with the prediction --------------------------------
WRONG_BYTES = {"parameters": 1_000, "gradients": 1_000, "optimizer": 1_000, "activations": 1_000}


def predicts_and_measures(config, batch):
    """A wrong prediction, and the rank's measurement replaced by it (for as long as the rank
    lives: the module's last use of its cluster)."""
    import labkit.lessons.memory_wall.check as check

    check._measure = lambda *args: dict(WRONG_BYTES)
    check.MemoryTracker.live = lambda self: {k: 1_000 for k in ("parameters", "activations",
                                                                "gradients", "optimizer")}
    return dict(WRONG_BYTES)


def test_a_table_of_the_fixed_models_measurements_does_not_pass(one):
    from labkit.lessons.memory_wall.check import CASES

    honest = labkit.check.predict_memory(one, solution("01_the_memory_wall",
                                                       "predict_memory_answer",
                                                       "predict_memory"))
    table = {str(case): found["measured"]  # what the notebook shows under a passed check
             for case, found in zip(CASES, honest.measured["cases"], strict=False)}

    def looks_up(config, batch):
        return table.get(str((config, batch)), dict(WRONG_BYTES))

    found = labkit.check.predict_memory(one, looks_up)
    assert not found.passed and "you predicted" in found.summary, str(found)
    assert len(found.measured["cases"]) == len(CASES) + 2


def measures_instead(config, batch):
    """Builds each model and measures it, as the check does, instead of predicting."""
    from labkit.lessons.memory_wall.check import _measure

    return _measure(config, batch)


def test_an_answer_that_measures_instead_of_predicting_fails(one):
    from labkit.lessons.memory_wall.check import HUGE

    found = labkit.check.predict_memory(one, measures_instead)
    assert not found.passed and f"d_hidden={HUGE}" in found.summary, str(found)
    assert "too large to build" in found.summary


def test_predict_memory_does_not_trust_the_ranks_measurement(one):
    found = labkit.check.predict_memory(one, predicts_and_measures)
    assert not found.passed and "the check measured" in found.summary, str(found)


# ----- 02: the one-device reference, made equal to the rank's own gradients -------------------
def averages_nothing_but_the_reference(ctx, model):
    """Leaves each rank's own gradients, and makes the rank's reference say they are right."""
    for reference in frame_locals("reference"):
        for ref, param in zip(reference, model.parameters(), strict=True):
            ref.copy_(param.grad)
    _dummy_all_reduce()


def hook_rewrites_the_reference(state, bucket):
    """Hands back the bucket un-averaged, and copies it into the rank's reference."""
    for model in frame_locals("model")[:1]:
        index = {id(p): i for i, p in enumerate(model.parameters())}
        for reference in frame_locals("reference"):
            for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True):
                reference[index[id(param)]].copy_(grad)
    dist.all_reduce(torch.zeros(1))
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def test_average_gradients_does_not_trust_the_ranks_reference(two):
    found = labkit.check.average_gradients(two, averages_nothing_but_the_reference)
    assert not found.passed and "still those of its own slice" in found.summary, str(found)


def test_bucket_hook_does_not_trust_the_ranks_reference(two):
    found = labkit.check.bucket_hook(two, hook_rewrites_the_reference)
    assert not found.passed and "differ from one device's" in found.summary, str(found)


# ----- 03: one device's gradients, scaled to match unscaled micro-batch losses -----------------
def unscaled_but_reference_scaled(ctx, stage, inputs, targets, micro_batches, activation_shape):
    """GPipe's schedule without the 1/micro_batches scale (gradients micro_batches x one
    device's), with the rank's one-device gradients multiplied to match."""
    import torch.nn.functional as F

    if ctx.rank == 0:
        outputs = []
        for chunk in inputs.chunk(micro_batches):
            outputs.append(stage(chunk))
            dist.send(outputs[-1].detach(), 1)
        for out in outputs:
            grad = torch.empty(activation_shape)
            dist.recv(grad, 1)
            out.backward(grad)
        loss = None
    else:
        received, losses = [], []
        for chunk in targets.chunk(micro_batches):
            x = torch.empty(activation_shape)
            dist.recv(x, 0)
            received.append(x.requires_grad_())
            losses.append(F.mse_loss(stage(x), chunk))
        for x, micro_loss in zip(received, losses, strict=True):
            micro_loss.backward()
            dist.send(x.grad, 0)
        loss = sum(micro.item() for micro in losses) / micro_batches
    for reference in frame_locals("reference"):
        for param in reference.parameters():
            param.grad.mul_(micro_batches)
    return loss


def test_pipeline_check_does_not_trust_the_ranks_reference(two):
    found = labkit.check.pipeline_step(two, unscaled_but_reference_scaled)
    assert not found.passed and "scale each micro-batch's loss" in found.summary, str(found)


# ----- 05: one device's Adam, made to agree with the rank's unshared weights --------------------
class ShardsWithoutSharing:
    """Adam over this rank's shard, never sent to the others; the rank's one-device model is
    set to the rank's own weights, and a broadcast of nothing is counted."""

    def __init__(self, ctx, params, lr):
        self.params, loads, mine = params, [0] * ctx.world_size, []
        for param in sorted(params, key=lambda p: -p.numel()):  # balanced, as ZeRO's
            owner = loads.index(min(loads))
            loads[owner] += param.numel()
            mine += [param] if owner == ctx.rank else []
        self.optimizer = torch.optim.Adam(mine, lr=lr)

    def step(self):
        self.optimizer.step()
        dist.broadcast(torch.zeros(1), src=0)
        for reference in frame_locals("reference"):
            with torch.no_grad():
                for ref, param in zip(reference.parameters(), self.params, strict=True):
                    ref.copy_(param)


def test_zero1_check_does_not_trust_the_ranks_reference(two):
    found = labkit.check.zero1(two, ShardsWithoutSharing)
    assert not found.passed and "receive the parameters their owner" in found.summary, str(found)


# ----- reports the checks do not write -------------------------------------------------------
def malformed_gradients(ctx, model):
    import labkit.lessons.data_parallel.check as check

    check._grads = lambda model: ["not a gradient"]  # a report the check never writes
    _dummy_all_reduce()


class MalformedState:
    """A working ZeRO-1 whose rank reports Adam's state in words (the patch stays on the
    ranks: this is the module's last use of its cluster)."""

    def __init__(self, ctx, params, lr):
        import labkit.lessons.sharding.check as check

        check.MemoryTracker.live = lambda self: {"optimizer": "a lot"}
        self.params, self.optimizer = params, torch.optim.Adam(params, lr=lr)

    def step(self):
        self.optimizer.step()
        dist.broadcast(torch.zeros(1), src=0)


def test_a_malformed_report_is_a_failure_not_a_crash(two):
    found = labkit.check.average_gradients(two, malformed_gradients)
    assert not found.passed and "does not write" in found.summary, str(found)
    found = labkit.check.zero1(two, MalformedState)
    assert not found.passed and "does not write" in found.summary, str(found)


# ----- the grader's review column: labkit's own parallelisms ----------------------------------
def test_answers_calling_labkits_parallelisms_are_flagged():
    assert review_notes("from labkit.models.gpt_split import block_styles\n"
                        "def block_plan(block):\n    return block_styles(block)\n") == [
        "labkit.models.gpt_split"]
    assert review_notes("import labkit.parallel.sharded.fsdp as f\n"
                        "def shard_model(model, mesh):\n    f.apply_fsdp(model, [], mesh)\n") \
        == ["labkit.parallel.sharded.fsdp"]
    assert review_notes("from labkit import parallel\n") == ["from labkit import parallel"]
    assert review_notes("import labkit\nlabkit.train(cluster, config)\n") == ["labkit.train"]
    # the pieces notebook 04 hands out are not flagged alone, but beside another name they are
    given = "from labkit.parallel.tensor import copy_to_parallel_region\n"
    assert review_notes(given) == []
    assert review_notes(given.replace("copy_to_parallel_region",
                                      "ColumnParallelLinear")) == ["labkit.parallel.tensor"]
    for notebook, answer in [("04_tensor_parallel", "tensor_parallel_linears_answer"),
                             ("04_tensor_parallel", "tensor_parallel_plan_answer"),
                             ("05_sharded_data_parallel", "zero1_answer"),
                             ("05_sharded_data_parallel", "fully_shard_model_answer")]:
        assert review_notes(answer_source(notebook, answer)) == [], answer
