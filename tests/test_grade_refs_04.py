"""Answers to notebook 04's ``tensor_parallel_plan`` that compute the block replicated on each
rank and patch what the check's job reports (shard shapes, the collectives counted by labkit's
``Traffic``) to look like Megatron's split. Only rank 0 holds the block's weights: a rank that
computes alone has the wrong numbers, and one that is sent the whole block shows it in the
bytes the kernel counted on its sockets, read outside the ranks. Megatron's plan passes, at
both rank counts of the check.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch.distributed as dist
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import labkit
from tests.exercises import solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value

linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="the kernel's socket counters are read on Linux only")

# The split dimension of each tensor Megatron's plan splits, by its whole shape (they differ).
SPLIT_BY_SHAPE = {(96, 32): 0, (96,): 0, (32, 32): 1, (128, 32): 0, (128,): 0, (32, 128): 1}
QKV = {(96, 32): "attn.qkv.weight", (96,): "attn.qkv.bias"}  # rows reordered by the check


class _MegatronCount:
    """What labkit's Traffic reports for Megatron's block, whatever ran."""

    collectives = {"all_reduce": [2, 4096]}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _plant(send_whole_block: bool) -> None:
    """On this rank: parallelize_module that leaves the block whole (after a broadcast of rank
    0's weights, or not), the job's Traffic replaced by Megatron's counts, and the job's view of
    each parameter and gradient (``_local``) by the slice Megatron's plan would leave here."""
    import torch.distributed.tensor.parallel as tp

    import labkit.lessons.tensor_parallel.plan_check as check
    from labkit.models.gpt_split import GPTPlan

    rank, n = dist.get_rank(), dist.get_world_size()
    if not hasattr(check, "_before_forgery"):
        check._before_forgery = (tp.parallelize_module, check.Traffic, check._local)

    def replicated(block, mesh, plan, **kwargs):
        for name, param in block.named_parameters():
            if send_whole_block:
                dist.broadcast(param.data, 0)
            if name.startswith("attn.qkv"):  # the heads back in the block's own order
                param.data.copy_(GPTPlan().from_tp_layout(name, param.data, n))
        return block

    def slice_here(tensor):
        dim = SPLIT_BY_SHAPE.get(tuple(tensor.shape)) if n > 1 else None
        if dim is None:
            return tensor
        if tuple(tensor.shape) in QKV:
            tensor = GPTPlan().to_tp_layout(QKV[tuple(tensor.shape)], tensor, n)
        return tensor.chunk(n, dim)[rank]

    tp.parallelize_module = replicated
    check.Traffic, check._local = _MegatronCount, slice_here


def _restore(ctx) -> None:
    import torch.distributed.tensor.parallel as tp

    import labkit.lessons.tensor_parallel.plan_check as check

    if hasattr(check, "_before_forgery"):
        tp.parallelize_module, check.Traffic, check._local = check._before_forgery
        del check._before_forgery


def _megatron() -> dict:
    return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}


def computes_alone(block):
    """Every rank runs the block it built itself, reported as Megatron's shards."""
    _plant(send_whole_block=False)
    return _megatron()


def broadcasts_the_block(block):
    """Rank 0's whole block broadcast to every rank, run there, reported as Megatron's shards."""
    _plant(send_whole_block=True)
    return _megatron()


def broadcasts_on_four(block):
    """Megatron's plan on 2 ranks; on 4, rank 0's whole block broadcast and run replicated."""
    if dist.get_world_size() == 4:
        _plant(send_whole_block=True)
    return _megatron()


@pytest.fixture
def restored(two):
    """The 2-rank cluster, its ranks' plan check and torch as they were after the test."""
    yield two
    two.run(_restore)


def test_a_rank_computing_the_block_alone_has_the_wrong_numbers(restored):
    found = labkit.check.tensor_parallel_plan(restored, computes_alone)
    assert not found.passed, str(found)
    assert "the block's output on rank 1 differs from one device's" in found.summary, str(found)


@linux
def test_the_whole_block_sent_to_every_rank_is_seen_on_its_sockets(restored):
    found = labkit.check.tensor_parallel_plan(restored, broadcasts_the_block)
    assert not found.passed, str(found)
    assert "reached rank 1's sockets" in found.summary, str(found)
    assert "a whole copy of the block's weights" in found.summary, str(found)
    copy = found.measured["whole_bytes"]
    assert found.measured["received_bytes"][1] > 0.98 * copy


@linux
def test_the_socket_bound_holds_on_four_ranks_too(restored):
    found = labkit.check.tensor_parallel_plan(restored, broadcasts_on_four)
    assert not found.passed, str(found)
    assert found.summary.startswith("on 4 ranks (it passed on 2"), str(found)
    assert "reached rank 1's sockets" in found.summary, str(found)


@linux
def test_megatrons_plan_stays_below_a_copy_of_the_weights(two):
    found = labkit.check.tensor_parallel_plan(two, solution("04_tensor_parallel",
                                                            "tensor_parallel_plan_answer",
                                                            "block_plan"))
    assert found.passed and found.measured["also_passed_on"] == 4, str(found)
    copy, received = found.measured["whole_bytes"], found.measured["received_bytes"]
    assert 0.5 * copy < received[1] < 0.85 * copy, received  # its shards, and the activations
    assert "the other ranks received at most" in found.summary


def test_grading_fails_when_the_bytes_cannot_be_counted(two, monkeypatch):
    import labkit.lessons.exercise.outside as outside
    from labkit.runtime.comm.sockets import Unmeasurable

    def unreadable(pids):
        raise Unmeasurable("no counters here")

    monkeypatch.setattr(outside, "WireSnapshot", unreadable)
    monkeypatch.setattr(outside, "distrusted", lambda: True)
    found = labkit.check.tensor_parallel_plan(two, solution("04_tensor_parallel",
                                                            "tensor_parallel_plan_answer",
                                                            "block_plan"))
    assert not found.passed and "could not count the bytes" in found.summary, str(found)
    assert "no counters here" in found.summary
