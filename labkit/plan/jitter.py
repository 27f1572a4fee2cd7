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
ranks' mean compute (CPU time), over that compute, is ``sync_jitter``, with the time any
rank waited for a core taken out (other programs' load is the bench's load factor's to
apply, once): ``project`` charges a measured
cluster's multi-rank step compute x (1 + sync_jitter). It is measured on matmuls and small
messages, not on the runs the bench compares. GPUs get 0: not measured (kernels queue ahead
of the device, and their times vary far less). Neither do ranks that outnumber the cores:
there a rank that waits in a collective hands its core to another rank, so the waits are
absorbed by the turn-taking that ``Calibration.core_share`` models (the probe in wall time
on 4 ranks of 2 cores read mostly that turn-taking: 0.4-0.5, against 0.14-0.22 on 2 ranks;
with the load taken out, 2 ranks read 0.03-0.17 on a quiet machine).

One number for a rhythm that varies: the fraction falls as the segments between meetings
grow (0.9 at one matmul a segment, 0.3 at four, 0.15 at sixteen, measured on 2 ranks), and it is
measured at a classroom tp step's rhythm (16 meetings, ~5 ms segments), so a layout that
meets rarely (DDP: its buckets at the end of backward) is charged too much and tp, meeting
in shorter segments, too little. A two-parameter form (a cost per meeting plus a fraction of
the segment, fitted at two segment lengths) does not fit stably: it swings 0.04-0.34
between runs.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from labkit.training.runqueue import read_schedstat

CALLS = 16  # collectives per round: a classroom step's tp AllReduces
MATMULS = 4  # per segment: ~5 ms of compute on one core, a classroom tp segment's order
SHAPE = (256, 512, 512)  # (rows, inner, columns) of each matmul
MESSAGE_FLOATS = 1 << 14  # 64 KiB: small, so the message's own time varies little


def _round(x: torch.Tensor, segment) -> tuple[float, float, float]:
    """(wall seconds of one round, CPU seconds this rank computed in it, seconds it waited
    for a core in the round)."""
    computing = 0.0
    queued = read_schedstat() or 0.0
    start = time.perf_counter()
    for _ in range(CALLS):
        if segment is not None:
            begin = time.thread_time()
            segment()
            computing += time.thread_time() - begin
        dist.all_reduce(x)
    wall = time.perf_counter() - start
    return wall, computing, (read_schedstat() or 0.0) - queued


def measure_jitter(ctx, repeats: int = 6) -> dict:
    """On each rank: medians over rounds of the bare and the segmented round (wall seconds:
    waiting is what is measured), of this rank's compute in a segmented round (CPU seconds)
    and of the time it waited for a core in each kind of round."""
    rows, inner, cols = SHAPE
    a, b = torch.randn(rows, inner), torch.randn(inner, cols)

    def segment():
        for _ in range(MATMULS):
            torch.mm(a, b)

    x = torch.zeros(MESSAGE_FLOATS)
    _round(x, segment)  # warm-up: the allocator, gloo's buffers
    bare, segmented = [], []
    for _ in range(max(repeats, 6)):
        dist.barrier()
        bare.append(_round(x, None))
        dist.barrier()
        segmented.append(_round(x, segment))

    def median(rows, i):
        return statistics.median(r[i] for r in rows)

    return {"bare_s": median(bare, 0), "segmented_s": median(segmented, 0),
            "compute_s": median(segmented, 1), "queued_bare_s": median(bare, 2),
            "queued_segmented_s": median(segmented, 2)}


def fit_jitter(per_rank: list[dict]) -> float:
    """``sync_jitter``: the segmented round's extra wall time, beyond the bare round and the
    ranks' mean compute, over that compute; at least 0. Load is taken out: each round loses
    at least the longest wait for a core of any rank (the others wait for that rank in the
    next collective), and compute is CPU time; the load of the run itself is
    ``labkit.lessons.planning.checkrun``'s to apply, once."""
    compute = statistics.fmean(r["compute_s"] for r in per_rank)
    segmented = (statistics.fmean(r["segmented_s"] for r in per_rank)
                 - max(r.get("queued_segmented_s", 0.0) for r in per_rank))
    bare = (statistics.fmean(r["bare_s"] for r in per_rank)
            - max(r.get("queued_bare_s", 0.0) for r in per_rank))
    extra = segmented - bare - compute
    return max(0.0, extra / compute) if compute > 0 else 0.0
