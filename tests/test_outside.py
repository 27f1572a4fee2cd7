"""What a check measures outside the learner's ranks: private per-rank arguments, and the
bytes the kernel counted on a process's TCP sockets (honest code only: the forgeries these
stop are graded in the sandbox, tests/test_grade_forgeries.py)."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist

import labkit
from labkit.lessons.exercise.outside import (
    SocketCount,
    framing_allowed,
    private_seeds,
    reported_mismatch,
)
from labkit.runtime.cluster import PerRank
from labkit.runtime.cluster.per_rank import payloads
from labkit.runtime.comm.sockets import WireSnapshot
from tests.exercises import solution

linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="the kernel's socket counters are read on Linux only")


def _own(ctx, value):
    return value


def test_each_rank_receives_its_own_value_and_no_other(two):
    assert two.run(_own, PerRank(["zero", "one"])) == ["zero", "one"]
    assert two.run(_own, value=PerRank([3, 4])) == [3, 4]
    assert two.run(_own, "same") == ["same", "same"]
    secrets = [b"first-rank-secret", b"second-rank-secret"]
    for rank, payload in enumerate(payloads(_own, (PerRank(secrets),), {}, 2)):
        assert secrets[rank] in payload and secrets[1 - rank] not in payload
    with pytest.raises(ValueError, match="3 values for 2 ranks"):
        two.run(_own, PerRank([1, 2, 3]))


def test_private_seeds_differ_from_run_to_run():
    first, second = private_seeds(4).values, private_seeds(4).values
    assert len(set(first)) == 4 and set(first).isdisjoint(second)


@linux
def test_the_kernel_counts_what_a_socket_carried():
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            before = WireSnapshot([os.getpid()])
            client.sendall(b"x" * 10_000)
            assert len(peer.recv(10_000, socket.MSG_WAITALL)) == 10_000
            peer.sendall(b"y" * 300)
            after = WireSnapshot([os.getpid()])
    assert after.sent_since(before) == [10_300]  # both ends are this process's
    assert after.received_since(before) == [10_300]


@linux
def test_a_ring_on_the_ranks_sends_its_payload_and_gloos_framing(two):
    ring = solution("00_your_cluster", "ring_all_reduce_answer", "ring_all_reduce")
    verdict = labkit.check.ring_all_reduce(two, ring)
    assert verdict.passed, verdict.summary
    reported, on_wire = verdict.measured["sent_bytes"], verdict.measured["socket_bytes"]
    for sent, counted in zip(reported, on_wire, strict=True):
        assert reported_mismatch(0, sent, 2, 2, counted) is None
        assert counted > sent  # gloo frames every message


def _swap(ctx, numel):
    tensor, peer = torch.ones(numel), 1 - ctx.rank
    sending = dist.isend(tensor, peer)
    dist.recv(torch.empty(numel), peer)
    sending.wait()


@linux
def test_socket_count_sees_every_byte_a_job_sends(two):
    count = SocketCount(two)
    two.run(_swap, 100_000)
    on_wire, received = count.sent(), count.received()
    assert count.problem is None
    for counted in on_wire + received:  # each rank sends its 400 kB and receives the other's
        assert 400_000 <= counted <= 400_000 + framing_allowed(1, 1)


def test_a_report_that_hides_bytes_is_named():
    assert reported_mismatch(1, 2048, 2, 2, 2048 + 2 * 96 + 2 * 48) is None
    message = reported_mismatch(1, 2048, 2, 2, 2624)
    assert "rank 1 reported are not what crossed its sockets" in message
    assert reported_mismatch(0, 2048, 2, 2, 1000) is not None  # fewer than reported
