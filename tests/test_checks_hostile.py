"""The checks against wrong solutions a hostile learner writes (not the ones planted in
test_checks.py), and against PyTorch's own engines: a false positive is the worst defect a
check can have. Every run here is on a warm 2-rank CPU cluster, the classroom's default on a
2-core laptop, where some wrong answers used to pass."""

from __future__ import annotations

import _thread
import copy
import sys
import threading
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import labkit
from labkit.lessons.exercise.wire import Traffic
from labkit.parallel.tensor import copy_to_parallel_region
from tests.exercises import solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value


def verdict(check, *args, status="failed", timeout=None) -> str:
    found = check(*args, timeout=timeout)
    assert found.status == status, str(found)
    return str(found)


def ring_reference():
    return solution("00_your_cluster", "ring_all_reduce_answer", "ring_all_reduce")


# ----- 00: ring AllReduce ---------------------------------------------------------------------
def swap_whole_tensor(ctx, tensor):
    """Right on 2 ranks, and as many bytes as a ring there: but not a ring."""
    incoming = torch.empty_like(tensor)
    sending = dist.isend(tensor, (ctx.rank + 1) % ctx.world_size)
    dist.recv(incoming, (ctx.rank - 1) % ctx.world_size)
    sending.wait()
    return tensor + incoming


def ring_in_float64(ctx, tensor):
    return ring_reference()(ctx, tensor).double()


def test_ring_bytes_match_the_formula_by_hand_and_a_swap_is_not_a_ring(two):
    found = labkit.check.ring_all_reduce(two, ring_reference())
    assert found.passed, str(found)
    # by hand: 2 ranks x 1024 float32 = 8192 B; a ring sends 2 (N-1)/N of it = 8192 B a rank
    assert found.measured["sent_bytes"] == [8192, 8192]
    assert found.measured["also_passed_on"] == 4
    assert "sent 8 KiB in one message, 2x a chunk" in verdict(labkit.check.ring_all_reduce,
                                                              two, swap_whole_tensor)
    assert "returned torch.float64, the input was torch.float32" in verdict(
        labkit.check.ring_all_reduce, two, ring_in_float64)


def test_code_that_uses_the_notebook_s_cluster_gets_a_verdict(two):
    def uses_the_cluster(ctx, tensor):
        return tensor * two.world_size  # the notebook's cluster: it cannot go to the ranks

    assert "cannot be sent to the ranks" in verdict(labkit.check.ring_all_reduce, two,
                                                    uses_the_cluster)


def prints_a_lot(ctx, tensor):
    for _ in range(2_000):
        print("x" * 99)
    return ring_reference()(ctx, tensor)


def test_a_function_that_prints_a_lot_does_not_flood_the_notebook(two, capsys):
    verdict(labkit.check.ring_all_reduce, two, prints_a_lot, status="passed")
    shown = capsys.readouterr().out
    assert "more characters printed on this rank were not shown" in shown
    assert len(shown) < 8 * 6_000  # 2 + 4 ranks, 5,000 characters each and the notes


# ----- code written for 2 ranks only ----------------------------------------------------------
def halves(ctx, model):
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= 2


def hangs_on_four(ctx, tensor):
    if ctx.world_size == 4:
        dist.recv(tensor, (ctx.rank + 1) % 4)
    return ring_reference()(ctx, tensor)


def test_code_for_two_ranks_fails_on_four_and_the_cluster_gets_its_size_back(two):
    message = verdict(labkit.check.average_gradients, two, halves)
    assert message.startswith("average_gradients: FAILED: on 4 ranks (it passed on 2")
    assert "2x the whole batch's" in message
    assert two.world_size == 2
    # interrupted (the kernel's stop button) while the second size hangs: 2 ranks again
    def interrupt_the_second_size():
        deadline = time.monotonic() + 60
        while two.world_size != 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the 4-rank job is sent, and hangs
        _thread.interrupt_main()

    threading.Thread(target=interrupt_the_second_size, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        labkit.check.ring_all_reduce(two, hangs_on_four, timeout=20)
    assert two.world_size == 2
    verdict(labkit.check.ring_all_reduce, two, ring_reference(), status="passed")


# ----- 01, 02, 06: answers that are close, or take a shortcut ---------------------------------
def forgets_the_input(config, batch):
    answer = solution("01_the_memory_wall", "predict_memory_answer", "predict_memory")
    found = answer(config, batch)
    found["activations"] -= 4 * batch * config.d_in
    return found


def all_gather_hook(state, bucket):
    flat = bucket.buffer()
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, flat)
    done = torch.futures.Future()
    done.set_result(sum(copies) / len(copies))
    return done


def first_bucket_only(state, bucket):
    flat = bucket.buffer()
    if bucket.index() == 0:
        flat.div_(dist.get_world_size())
        dist.all_reduce(flat)
    done = torch.futures.Future()
    done.set_result(flat)
    return done


def round_robin(table_bytes, world_size, capacity_bytes):
    return [list(range(rank, len(table_bytes), world_size)) for rank in range(world_size)]


def least_loaded_unsorted(table_bytes, world_size, capacity_bytes):
    loads, placement = [0] * world_size, [[] for _ in range(world_size)]
    for table, size in enumerate(table_bytes):
        rank = loads.index(min(loads))
        placement[rank].append(table)
        loads[rank] += size
    return placement


def test_shortcuts_that_used_to_pass(one, two):
    assert "activations: you predicted" in verdict(labkit.check.predict_memory, one,
                                                   forgets_the_input)
    assert "your hook ran all_gather" in verdict(labkit.check.bucket_hook, two, all_gather_hook)
    assert "gradients differ from one device's" in verdict(labkit.check.bucket_hook, two,
                                                           first_bucket_only)
    for shortcut in (round_robin, least_loaded_unsorted):
        assert "ran out of memory holding tables" in verdict(labkit.check.place_tables, two,
                                                             shortcut)
    flat = verdict(labkit.check.place_tables, two, lambda table_bytes, n, cap: list(range(n)))
    assert "must return one list of table indices per rank" in flat and "raised" not in flat


# ----- 03: a correct pipeline, written another way -------------------------------------------
def layer_by_layer(ctx, stage, inputs, targets, micro_batches, activation_shape):
    """The course's loop, with each stage run one layer at a time (as a learner may)."""
    class Looped(nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers = layers

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    answer = solution("03_pipeline_parallel", "pipeline_step_answer", "pipeline_step")
    return answer(ctx, Looped(stage), inputs, targets, micro_batches, activation_shape)


def test_the_pipeline_check_passes_the_course_answer_on_every_draw(two):
    """Forty runs, forty fresh draws: the reference computes as the stages do (a micro-batch
    at a time, one thread), so no ReLU near its kink falls the other way in it (the whole
    batch at once failed about 3% of draws)."""
    answer = solution("03_pipeline_parallel", "pipeline_step_answer", "pipeline_step")
    verdicts = [labkit.check.pipeline_step(two, answer) for _ in range(40)]
    assert all(v.passed for v in verdicts), [str(v) for v in verdicts if not v.passed][:1]


def test_a_pipeline_that_runs_its_layers_one_by_one_passes(two):
    found = labkit.check.pipeline_step(two, layer_by_layer)
    assert found.passed, str(found)
    # every micro-batch's backward is timed (each one used to end when the first one did)
    for stage in found.measured["backward_ms"]:
        assert len(stage) == 4 and min(stage) > 0.2, found.measured["backward_ms"]


# ----- 04: the layers, found by shape, and against DTensor's ColwiseParallel/RowwiseParallel --
class NamedW(nn.Module):
    """The course's column layer with its parameters named w and b."""

    def __init__(self, linear, rank, world_size):
        super().__init__()
        self.w = nn.Parameter(linear.weight.detach().chunk(world_size, 0)[rank].clone())
        self.b = nn.Parameter(linear.bias.detach().chunk(world_size, 0)[rank].clone())

    def forward(self, x):
        return F.linear(copy_to_parallel_region(x), self.w, self.b)


class BiasNotTrained(NamedW):
    def __init__(self, linear, rank, world_size):
        super().__init__(linear, rank, world_size)
        del self.b
        self.b = linear.bias.detach().chunk(world_size, 0)[rank].clone()  # a plain tensor


class KeepsTheWholeLinear(nn.Module):
    def __init__(self, linear, rank, world_size):
        super().__init__()
        self.linear, self.rank, self.world_size = linear, rank, world_size

    def forward(self, x):
        weight = self.linear.weight.chunk(self.world_size, 0)[self.rank]
        bias = self.linear.bias.chunk(self.world_size, 0)[self.rank]
        return F.linear(copy_to_parallel_region(x), weight, bias)


def course_layers():
    return tuple(solution("04_tensor_parallel", "tensor_parallel_linears_answer", name)
                 for name in ("ColumnParallelLinear", "RowParallelLinear"))


class Borrowed(labkit.parallel.tensor.ColumnParallelLinear):
    """labkit's layer under the learner's name."""


def test_layers_are_found_by_shape_and_every_slice_must_train(two):
    _, row = course_layers()
    check = labkit.check.tensor_parallel_linears
    assert "derives from) labkit's own ColumnParallelLinear" in verdict(check, two, Borrowed,
                                                                         row)
    verdict(check, two, NamedW, row, status="passed")
    assert "holds no parameter of shape (16,)" in verdict(check, two, BiasNotTrained, row)
    assert "also holds parameters of shape (32, 16), (32,)" in verdict(check, two,
                                                                       KeepsTheWholeLinear, row)


def _ours_and_torchs(ctx, column_class, row_class) -> dict:
    """The course's layers and DTensor's plan on the same two Linears: outputs, the input's
    gradient, each parameter's local gradient, and the collectives of each pass."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    first, second, x = nn.Linear(16, 32), nn.Linear(32, 8), torch.randn(4, 16)
    r, n = ctx.rank, ctx.world_size
    ours = nn.Sequential(column_class(copy.deepcopy(first), r, n), nn.ReLU(),
                         row_class(copy.deepcopy(second), r, n))
    theirs = parallelize_module(nn.Sequential(copy.deepcopy(first), nn.ReLU(),
                                              copy.deepcopy(second)),
                                init_device_mesh("cpu", (n,)),
                                {"0": ColwiseParallel(), "2": RowwiseParallel()})
    found = {}
    for name, model in (("ours", ours), ("torch", theirs)):
        x_in = x.clone().requires_grad_()
        with Traffic() as forward:
            y = model(x_in)
        with Traffic() as backward:
            (y * torch.arange(8.0)).sum().backward()
        found[name] = {"y": y.detach().clone(), "x_grad": x_in.grad.clone(),
                       "grads": [getattr(p.grad, "_local_tensor", p.grad).clone()
                                 for p in model.parameters()],
                       "passes": (forward.collectives, backward.collectives)}
    return found


def test_the_course_layers_equal_torch_colwise_and_rowwise_parallel(two):
    for found in two.run(_ours_and_torchs, *course_layers()):
        ours, theirs = found["ours"], found["torch"]
        torch.testing.assert_close(ours["y"], theirs["y"])
        torch.testing.assert_close(ours["x_grad"], theirs["x_grad"])
        for mine, torchs in zip(ours["grads"], theirs["grads"], strict=True):
            torch.testing.assert_close(mine, torchs)
        # what the check demands (one all_reduce forward, one backward) is what DTensor runs
        assert [{k: c[0] for k, c in p.items()} for p in theirs["passes"]] == \
            [{"all_reduce": 1}, {"all_reduce": 1}]
        assert ours["passes"] == theirs["passes"]


# ----- 05: ZeRO-1 against torch's ZeroRedundancyOptimizer -------------------------------------
class TorchZero:
    def __init__(self, ctx, params, lr):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.optimizer = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam,
                                                 lr=lr)

    def step(self):
        self.optimizer.step()


def test_zero1_check_passes_torch_zero_and_measures_the_same_memory(two):
    ours = labkit.check.zero1(two, solution("05_sharded_data_parallel", "zero1_answer", "Zero1"))
    theirs = labkit.check.zero1(two, TorchZero)
    assert ours.passed and theirs.passed, (str(ours), str(theirs))
    # both give each parameter to the least-loaded rank, largest first: the same shards
    assert sorted(ours.measured["optimizer_bytes"]) == sorted(theirs.measured["optimizer_bytes"])
    assert sum(theirs.measured["optimizer_bytes"]) >= theirs.measured["full_state_bytes"]
