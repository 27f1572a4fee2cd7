"""A ring answer that forwards each rank's input seed inside ring-sized messages of padding,
then sums every rank's input alone: the traffic is exactly a ring's (2(N-1) chunk-sized sends
per rank, counted right by labkit and by the kernel) and the sum is exact, so a check that
handed out seeds would pass it. The check hands each rank its input as a tensor, which no rank
can make from a few numbers."""

from __future__ import annotations

import sys

import cloudpickle
import torch
import torch.distributed as dist

import labkit
from tests.exercises import solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value

BITS = 21  # a 63-bit seed as three exact float32 integers


def _seed_in_frames():
    frame = sys._getframe(2)
    while frame is not None:
        seed = frame.f_locals.get("seed")
        if isinstance(seed, int):
            return seed
        frame = frame.f_back
    return None


def forwards_seeds(ctx, tensor):
    """A ring's messages, carrying seeds instead of partial sums."""
    n, r = ctx.world_size, ctx.rank
    chunk = torch.zeros(tensor.numel() // n)
    known = {r: _seed_in_frames()}
    for step in range(2 * (n - 1)):
        out = torch.zeros_like(chunk)
        if step < n - 1:
            for rank, seed in known.items():
                if seed is not None:
                    out[3 * rank:3 * rank + 3] = torch.tensor(
                        [(seed >> (BITS * k)) & ((1 << BITS) - 1) for k in range(3)],
                        dtype=torch.float32)
                    out[3 * n + rank] = 1.0  # present
        incoming = torch.empty_like(chunk)
        right, left = (r + 1) % n, (r - 1) % n
        if r % 2 == 0:
            dist.send(out, right)
            dist.recv(incoming, left)
        else:
            dist.recv(incoming, left)
            dist.send(out, right)
        for rank in range(n):
            if incoming[3 * n + rank] == 1.0:
                known[rank] = sum(int(incoming[3 * rank + k]) << (BITS * k) for k in range(3))
    if len(known) == n and None not in known.values():
        from labkit.lessons.all_reduce.check import _data

        return sum(_data(known[rank], n) for rank in range(n))
    return tensor


def test_a_ring_that_forwards_seeds_does_not_pass(two):
    found = labkit.check.ring_all_reduce(two, forwards_seeds)
    assert not found.passed, str(found)


def test_the_course_ring_still_passes(two):
    found = labkit.check.ring_all_reduce(two, solution("00_your_cluster", "ring_all_reduce_answer",
                                                       "ring_all_reduce"))
    assert found.passed, str(found)


def test_other_ranks_inputs_do_not_fit_in_what_a_ring_may_send():
    """From 4 ranks up, the random bits of the N-1 other inputs exceed the bytes the check lets
    a rank's sockets carry: no rank can gather them, however packed, and sum alone."""
    from labkit.lessons.all_reduce.check import CHUNK_ELEMENTS, VALUE_BITS, _data, ring_allowance

    for n in (4, 8):
        data = _data(1, n)
        assert data.numel() == n * CHUNK_ELEMENTS
        assert len(torch.unique(data)) > 0.99 * data.numel()  # ~20 random bits, not a few
        information = (n - 1) * data.numel() * VALUE_BITS / 8
        assert information > 1.1 * ring_allowance(data.nbytes, n), n
