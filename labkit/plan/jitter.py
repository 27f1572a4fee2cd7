"""What meeting in collectives adds to ranks' compute, measured on this machine.

A rank's compute between two collectives takes a little more or less time from one segment
to the next and from rank to rank (caches, the other core's work, the scheduler, gloo's
threads waking); a collective ends when the last rank arrives, so each meeting costs what
the slowest rank's segment took beyond the others'. Timing collectives back to back (the
alpha-beta fit) never sees it; a training step, whose every layout meets at least once per
step, always does.

``measure_jitter(ctx)`` runs on every rank (2 ranks or more): rounds of ``CALLS`` x [a
segment of classroom matmuls, then an AllReduce of ``MESSAGE_FLOATS`` floats], beside the
same AllReduces back to back. What a segmented round takes beyond the bare one and the
ranks' mean compute, over that compute, is ``sync_jitter``: ``project`` charges a measured
cluster's multi-rank step compute x (1 + sync_jitter). It is measured on matmuls and small
messages, not on the runs the bench compares. GPUs get 0: not measured (kernels queue ahead
of the device, and their times vary far less). Neither do ranks that outnumber the cores:
there a rank that waits in a collective hands its core to another rank, so the waits are
absorbed by the turn-taking that ``Calibration.core_share`` models (the probe on 4 ranks of
2 cores measures mostly that turn-taking: 0.4-0.5, against 0.14-0.22 on 2 ranks).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

CALLS = 16  # collectives per round: a classroom step's tp AllReduces
MATMULS = 4  # per segment: ~5 ms of compute on one core, a classroom tp segment's order
SHAPE = (256, 512, 512)  # (rows, inner, columns) of each matmul
MESSAGE_FLOATS = 1 << 14  # 64 KiB: small, so the message's own time varies little


def _round(x: torch.Tensor, segment) -> tuple[float, float]:
    """(wall seconds of one round, seconds this rank computed in it)."""
    computing = 0.0
    start = time.perf_counter()
    for _ in range(CALLS):
        if segment is not None:
            begin = time.perf_counter()
            segment()
            computing += time.perf_counter() - begin
        dist.all_reduce(x)
    return time.perf_counter() - start, computing


def measure_jitter(ctx, repeats: int = 6) -> dict:
    """On each rank: medians over rounds of the bare and the segmented round and of this
    rank's compute in a segmented round (wall seconds: waiting is what is measured)."""
    rows, inner, cols = SHAPE
    a, b = torch.randn(rows, inner), torch.randn(inner, cols)

    def segment():
        for _ in range(MATMULS):
            torch.mm(a, b)

    x = torch.zeros(MESSAGE_FLOATS)
    _round(x, segment)  # warm-up: the allocator, gloo's buffers
    bare, segmented, compute = [], [], []
    for _ in range(max(repeats, 6)):
        dist.barrier()
        bare.append(_round(x, None)[0])
        dist.barrier()
        wall, computing = _round(x, segment)
        segmented.append(wall)
        compute.append(computing)
    return {"bare_s": statistics.median(bare), "segmented_s": statistics.median(segmented),
            "compute_s": statistics.median(compute)}


def fit_jitter(per_rank: list[dict]) -> float:
    """``sync_jitter``: the segmented round's extra wall time, beyond the bare round and the
    ranks' mean compute, over that compute; at least 0."""
    compute = statistics.fmean(r["compute_s"] for r in per_rank)
    extra = statistics.fmean(r["segmented_s"] - r["bare_s"] for r in per_rank) - compute
    return max(0.0, extra / compute) if compute > 0 else 0.0
