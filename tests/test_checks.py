"""Every exercise's check, both ways: the course's reference solution passes, and planted
wrong solutions (a wrong value, a wrong communication pattern, a hang) fail with the message
meant for them. The learner's code runs on the ranks of a real 2-rank cluster."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import labkit
from labkit.lessons.exercise import result
from labkit.parallel.tensor import copy_to_parallel_region, reduce_from_parallel_region
from tests.exercises import solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value
HANG_S = 3  # a correct answer takes well under a second at the checks' sizes


def verdict(check, *args, status="failed", timeout=None):
    found = check(*args, timeout=timeout)
    assert found.status == status, str(found)
    assert result.MIME_TYPE in found._repr_mimebundle_()
    return str(found)


# ----- 00: ring AllReduce ---------------------------------------------------------------------
def whole_tensor_each_step(ctx, tensor):
    total, incoming = tensor.clone(), torch.empty_like(tensor)
    for _ in range(ctx.world_size - 1):
        sending = dist.isend(tensor, (ctx.rank + 1) % ctx.world_size)
        dist.recv(incoming, (ctx.rank - 1) % ctx.world_size)
        sending.wait()
        total += incoming
    return total


def everyone_sends_first(ctx, tensor):
    incoming = torch.empty_like(tensor)
    dist.send(tensor, (ctx.rank + 1) % ctx.world_size)
    dist.recv(incoming, (ctx.rank - 1) % ctx.world_size)
    return tensor + incoming


def one_call(ctx, tensor):
    dist.all_reduce(tensor)
    return tensor


def not_written(ctx, tensor):
    raise NotImplementedError()


@pytest.fixture(scope="module")
def three():
    """3 ranks: on 2, a ring step already moves half the tensor, the whole of it in all."""
    with labkit.Cluster(3, device="cpu", progress=False) as cluster:
        yield cluster


def test_ring_all_reduce_both_ways(three):
    two = three
    reference = solution("00_your_cluster", "ring_all_reduce_answer", "ring_all_reduce")
    assert "2(N-1)/N" in verdict(labkit.check.ring_all_reduce, two, reference, status="passed")
    assert "1.5x the bytes a ring sends" in verdict(labkit.check.ring_all_reduce, two,
                                                    whole_tensor_each_step)
    assert "build the AllReduce from dist.send" in verdict(labkit.check.ring_all_reduce, two,
                                                           one_call)
    assert "hangs" in verdict(labkit.check.ring_all_reduce, two, everyone_sends_first,
                              timeout=HANG_S)
    assert "not attempted yet" in verdict(labkit.check.ring_all_reduce, two, not_written,
                                          status="not attempted")
    # the cluster recovered: the reference passes again on fresh ranks
    verdict(labkit.check.ring_all_reduce, two, reference, status="passed")


# ----- 01: predict the memory of a step -------------------------------------------------------
def _counts(config, batch):
    widths = [config.d_in] + [config.d_hidden] * (config.n_layers - 1) + [config.d_out]
    params = sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))
    kept = batch * (config.d_in + config.d_hidden * (config.n_layers - 1) + 2 * config.d_out)
    return params, kept


def one_moment(config, batch):
    params, kept = _counts(config, batch)
    return {"parameters": 4 * params, "gradients": 4 * params, "optimizer": 4 * params,
            "activations": 4 * kept}


def saves_pre_activations_too(config, batch):
    params, kept = _counts(config, batch)
    extra = batch * config.d_hidden * (config.n_layers - 1)
    return {"parameters": 4 * params, "gradients": 4 * params, "optimizer": 8 * params,
            "activations": 4 * (kept + extra)}


def test_predict_memory_both_ways(one):
    reference = solution("01_the_memory_wall", "predict_memory_answer", "predict_memory")
    verdict(labkit.check.predict_memory, one, reference, status="passed")
    assert "two float32 numbers per parameter" in verdict(labkit.check.predict_memory, one,
                                                          one_moment)
    assert "ReLU's output" in verdict(labkit.check.predict_memory, one,
                                      saves_pre_activations_too)


# ----- 02: gradients by hand, and a DDP bucket hook -------------------------------------------
def sums_only(ctx, model):
    for param in model.parameters():
        dist.all_reduce(param.grad)


def reduce_to_rank_0(ctx, model):
    for param in model.parameters():
        dist.reduce(param.grad, dst=0)
        param.grad /= ctx.world_size


def rank_0_alone(ctx, model):
    if ctx.rank == 0:
        for param in model.parameters():
            dist.all_reduce(param.grad)


def test_average_gradients_both_ways(two):
    reference = solution("02_data_parallel", "average_gradients_answer", "average_gradients")
    verdict(labkit.check.average_gradients, two, reference, status="passed")
    assert "divide by the number of ranks (2)" in verdict(labkit.check.average_gradients, two,
                                                          sums_only)
    assert "every rank needs it (AllReduce)" in verdict(labkit.check.average_gradients, two,
                                                        reduce_to_rank_0)
    assert "hangs" in verdict(labkit.check.average_gradients, two, rank_0_alone,
                              timeout=HANG_S)


def per_gradient_hook(state, bucket):
    for grad in bucket.gradients():
        dist.all_reduce(grad)
        grad /= dist.get_world_size()
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def undivided_hook(state, bucket):
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


def test_bucket_hook_both_ways(two):
    reference = solution("02_data_parallel", "bucket_hook_answer", "bucket_hook")
    verdict(labkit.check.bucket_hook, two, reference, status="passed")
    assert "in one AllReduce" in verdict(labkit.check.bucket_hook, two, per_gradient_hook)
    assert "divide by the number of ranks" in verdict(labkit.check.bucket_hook, two,
                                                      undivided_hook)


# ----- 03: a two-stage pipeline ---------------------------------------------------------------
def whole_batch_at_once(ctx, stage, inputs, targets, micro_batches, activation_shape):
    shape = (activation_shape[0] * micro_batches, activation_shape[1])
    if ctx.rank == 0:
        out = stage(inputs)
        dist.send(out.detach(), 1)
        grad = torch.empty(shape)
        dist.recv(grad, 1)
        out.backward(grad)
        return None
    x = torch.empty(shape)
    dist.recv(x, 0)
    x.requires_grad_()
    loss = F.mse_loss(stage(x), targets)
    loss.backward()
    dist.send(x.grad, 0)
    return loss.item()


def unscaled_losses(ctx, stage, inputs, targets, micro_batches, activation_shape):
    if ctx.rank == 0:
        outputs = []
        for chunk in inputs.chunk(micro_batches):
            outputs.append(stage(chunk))
            dist.send(outputs[-1].detach(), 1)
        for out in outputs:
            grad = torch.empty(activation_shape)
            dist.recv(grad, 1)
            out.backward(grad)
        return None
    received, losses = [], []
    for chunk in targets.chunk(micro_batches):
        x = torch.empty(activation_shape)
        dist.recv(x, 0)
        received.append(x.requires_grad_())
        losses.append(F.mse_loss(stage(x), chunk))
    for x, loss in zip(received, losses, strict=True):
        loss.backward()
        dist.send(x.grad, 0)
    return sum(loss.item() for loss in losses) / micro_batches


def gradients_never_sent(ctx, stage, inputs, targets, micro_batches, activation_shape):
    if ctx.rank == 0:
        for chunk in inputs.chunk(micro_batches):
            dist.send(stage(chunk).detach(), 1)
        dist.recv(torch.empty(activation_shape), 1)
        return None
    for _ in range(micro_batches):
        dist.recv(torch.empty(activation_shape), 0)
    return 0.0


def test_pipeline_step_both_ways(two):
    reference = solution("03_pipeline_parallel", "pipeline_step_answer", "pipeline_step")
    assert "bubble" in verdict(labkit.check.pipeline_step, two, reference, status="passed")
    assert "ran its forward 1 time(s)" in verdict(labkit.check.pipeline_step, two,
                                                  whole_batch_at_once)
    assert "scale each micro-batch's loss" in verdict(labkit.check.pipeline_step, two,
                                                      unscaled_losses)
    assert "hangs" in verdict(labkit.check.pipeline_step, two, gradients_never_sent,
                              timeout=HANG_S)


# ----- 04: column- and row-parallel layers ----------------------------------------------------
def _layers():
    column = solution("04_tensor_parallel", "tensor_parallel_linears_answer",
                      "ColumnParallelLinear")
    row = solution("04_tensor_parallel", "tensor_parallel_linears_answer", "RowParallelLinear")
    return column, row


class BiasInsideTheSum(nn.Module):
    def __init__(self, linear, rank, world_size):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, 1)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return reduce_from_parallel_region(F.linear(x, self.weight, self.bias))


class GatheringColumn(nn.Module):
    def __init__(self, linear, rank, world_size):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, 0)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().chunk(world_size, 0)[rank].clone())

    def forward(self, x):
        y = F.linear(copy_to_parallel_region(x), self.weight, self.bias)
        dist.all_gather([torch.empty_like(y) for _ in range(dist.get_world_size())], y.detach())
        return y


class ColumnWithoutF(GatheringColumn):
    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def test_tensor_parallel_linears_both_ways(two):
    column, row = _layers()
    verdict(labkit.check.tensor_parallel_linears, two, column, row, status="passed")
    assert "carries its bias 2 times" in verdict(labkit.check.tensor_parallel_linears, two,
                                                 column, BiasInsideTheSum)
    assert "ran 1 all_gather" in verdict(labkit.check.tensor_parallel_linears, two,
                                         GatheringColumn, row)
    assert "all-reduce the gradient of its input" in verdict(
        labkit.check.tensor_parallel_linears, two, ColumnWithoutF, row)


# ----- 05: ZeRO-1 by hand ---------------------------------------------------------------------
class EveryRankAllState:
    def __init__(self, ctx, params, lr):
        self.optimizer = torch.optim.Adam(params, lr=lr)

    def step(self):
        self.optimizer.step()


class NoBroadcast:
    def __init__(self, ctx, params, lr):
        self.optimizer = torch.optim.Adam(params[ctx.rank::ctx.world_size], lr=lr)

    def step(self):
        self.optimizer.step()


def test_zero1_both_ways(two):
    reference = solution("05_sharded_data_parallel", "zero1_answer", "Zero1")
    assert "of Adam's state per rank" not in verdict(labkit.check.zero1, two, reference,
                                                     status="passed")
    assert "2.0 copies of Adam's state" in verdict(labkit.check.zero1, two, EveryRankAllState)
    message = verdict(labkit.check.zero1, two, NoBroadcast)
    assert "receive the parameters their owner updated" in message
    assert "step() ran no collective" in message


# ----- 06: tables on ranks under a cap --------------------------------------------------------
def fill_rank_0_first(table_bytes, world_size, capacity_bytes):
    loads, placement = [0] * world_size, [[] for _ in range(world_size)]
    for table, size in enumerate(table_bytes):
        rank = next((r for r in range(world_size) if loads[r] + size <= capacity_bytes), 0)
        placement[rank].append(table)
        loads[rank] += size
    return placement


def every_table_everywhere(table_bytes, world_size, capacity_bytes):
    return [list(range(len(table_bytes))) for _ in range(world_size)]


def test_place_tables_both_ways(two):
    reference = solution("06_recommender_at_scale", "place_tables_answer", "place_tables")
    verdict(labkit.check.place_tables, two, reference, status="passed")
    message = verdict(labkit.check.place_tables, two, fill_rank_0_first)
    assert "ran out of memory holding tables" in message and "the planner's" in message
    assert "on exactly one rank" in verdict(labkit.check.place_tables, two,
                                            every_table_everywhere)


def test_a_check_refuses_a_cluster_it_cannot_use(one):
    assert "at least 2 ranks" in verdict(labkit.check.ring_all_reduce, one, one_call)
    assert "2-rank cluster" in verdict(labkit.check.pipeline_step, one, whole_batch_at_once)


def test_gradient_checks_say_which_rank_counts_split_their_batch():
    """Both gradient checks refuse a rank count that does not divide their batch, with a
    verdict that names the counts that do (no job is sent to the ranks)."""
    with labkit.Cluster(3, device="cpu", progress=False) as three:
        for check, answer in ((labkit.check.average_gradients, lambda ctx, model: None),
                              (labkit.check.bucket_hook, lambda state, bucket: None)):
            found = check(three, answer)
            assert found.status == "failed", found
            assert found.summary == "the check splits 32 samples: use 1, 2, 4 or 8 ranks"


# ----- 10: what a checkpoint must hold ------------------------------------------------------
def _state_classes():
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.stateful import Stateful

    class ModelOnly(Stateful):  # forgets Adam's state
        def __init__(self, model, optimizer, step):
            self.model, self.optimizer, self.step = model, optimizer, step

        def state_dict(self):
            return {"model": self.model.state_dict(), "step": self.step}

        def load_state_dict(self, state_dict):
            self.model.load_state_dict(state_dict["model"])
            self.step = state_dict["step"]

    class NoStep(ModelOnly):  # forgets the data position
        def state_dict(self):
            model, optimizer = get_state_dict(self.model, self.optimizer)
            return {"model": model, "optimizer": optimizer}

        def load_state_dict(self, state_dict):
            set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                           optim_state_dict=state_dict["optimizer"])

    return ModelOnly, NoStep


def test_training_state_both_ways(two):
    reference = solution("10_when_a_gpu_dies", "training_state_answer", "TrainingState")
    assert "bit for bit" in verdict(labkit.check.training_state, two, reference,
                                    status="passed")
    model_only, no_step = _state_classes()
    assert "Adam's state did not" in verdict(labkit.check.training_state, two, model_only)
    assert "the step was not restored" in verdict(labkit.check.training_state, two, no_step)


def test_training_state_judges_the_step_s_type_not_adam(two):
    """Found by review: a step saved as a tensor (as torchtitan's TrainState does) and put
    back without ``.item()`` resumes exactly (range() takes a 0-d integer tensor) but was
    failed as "Adam's state did not" come back; a step of another type got that message too."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _, no_step = _state_classes()

    class TensorStep(no_step):
        def state_dict(self):
            model, optimizer = get_state_dict(self.model, self.optimizer)
            return {"model": model, "optimizer": optimizer, "step": torch.tensor(self.step)}

        def load_state_dict(self, state_dict):
            super().load_state_dict(state_dict)
            self.step = state_dict["step"]

    class FloatStep(TensorStep):
        def load_state_dict(self, state_dict):
            super().load_state_dict(state_dict)
            self.step = float(state_dict["step"])

    assert "bit for bit" in verdict(labkit.check.training_state, two, TensorStep,
                                    status="passed")
    said = verdict(labkit.check.training_state, two, FloatStep)
    assert "step came back as 2.0 (float)" in said and "Adam" not in said
