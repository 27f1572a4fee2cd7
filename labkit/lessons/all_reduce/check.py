"""Notebook 00's exercise: AllReduce as a ring, from point-to-point sends and receives.

The learner writes ``ring_all_reduce(ctx, tensor)`` that returns the sum of ``tensor`` over all
ranks, using only ``dist.send``/``dist.recv`` (or ``isend``/``irecv``). A ring does it in two
phases of N-1 steps each (reduce-scatter, then all-gather), passing one chunk of 1/N of the
tensor per step, so each rank sends 2(N-1)/N of the tensor: the figure that makes the ring
bandwidth-optimal (Patarasuk & Yuan, 2009). The check runs it on every rank on data whose
sums are exact in float32 (multiples of 2**-20) and compares the result (values, dtype,
device), the bytes each rank sent and the largest single message: on 2 ranks, swapping the
whole tensor once sends as many bytes as a ring, but in one message of the whole tensor
instead of two chunks of half of it.
"""

from __future__ import annotations

import torch

from labkit.lessons.exercise.outside import (
    SocketCount,
    framing_allowed,
    private_seeds,
    reported_mismatch,
)
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, run_checked
from labkit.lessons.exercise.wire import Traffic
from labkit.runtime.cluster.per_rank import PerRank
from labkit.runtime.memory import format_bytes

EXERCISE = "ring_all_reduce"
CHUNK_ELEMENTS = 1024  # per rank: the tensor has world_size * 1024 float32 values
# Each value is k / 2**20 for a random integer k in [-2**19, 2**19): sums of up to 8 of them are
# exact in float32 (in any order), and each carries 20 random bits, so the inputs of N-1 other
# ranks cannot be squeezed into the bytes a ring may send from 4 ranks up (see ring_allowance).
VALUE_BITS = 20
HANG_HINT = ("With blocking dist.send and dist.recv, if every rank sends first, each one "
             "waits for a receiver that is itself still sending (gloo and NCCL do not buffer "
             "a send): start the receive with dist.irecv before sending, send with dist.isend, "
             "or let even ranks send first and odd ranks receive first.")


def _data(seed: int, world_size: int) -> torch.Tensor:
    """A rank's input: multiples of 2**-20 in [-0.5, 0.5) as float32, from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    half = 2 ** (VALUE_BITS - 1)
    return torch.randint(-half, half, (world_size * CHUNK_ELEMENTS,),
                         generator=generator).float() / 2 ** VALUE_BITS


def ring_allowance(nbytes: int, n: int) -> float:
    """The most bytes a rank's sockets may carry in the check: a ring's 2(N-1)/N of the
    tensor, 1% more, and gloo's framing of up to twice a ring's 2(N-1) sends and receives."""
    calls = 4 * (n - 1)
    return 1.01 * 2 * (n - 1) / n * nbytes + framing_allowed(calls, calls)


def _job(ctx, fn, data: torch.Tensor) -> dict:
    tensor = data.to(ctx.device)
    with Traffic() as traffic:
        out = fn(ctx, tensor)
    found = {"traffic": traffic.to_dict(), "out": None, "type": type(out).__name__,
             "input": (str(tensor.dtype), str(tensor.device))}
    if isinstance(out, torch.Tensor):
        found["type"] = f"{out.dtype} on {out.device}"
        found["out"] = out.detach().cpu()
        found["dtype_device"] = (str(out.dtype), str(out.device))
    return found


_TRAFFIC = {"sent_bytes": int, "received_bytes": int, "sends": int, "recvs": int,
            "largest_send": int, "collectives": dict}
_FOUND = {"traffic": dict, "type": str, "input": tuple}


def _well_formed(found) -> bool:
    """Whether a rank's report has the shape ``_job`` gives it (a rank's code may change it)."""
    def shaped(value, fields):
        return isinstance(value, dict) and all(isinstance(value.get(k), kind)
                                               for k, kind in fields.items())
    if not shaped(found, _FOUND) or not shaped(found["traffic"], _TRAFFIC):
        return False
    out = found.get("out")
    return out is None or (isinstance(out, torch.Tensor) and isinstance(
        found.get("dtype_device"), tuple) and len(found["dtype_device"]) == 2)


def _value_problem(rank: int, out, expected: torch.Tensor, own: torch.Tensor) -> str | None:
    if out is None:
        return None
    if out.shape != expected.shape:
        return (f"rank {rank} returned a tensor of shape {tuple(out.shape)}; the sum has the "
                f"input's shape {tuple(expected.shape)}")
    if out.dtype != expected.dtype:
        return (f"rank {rank} returned {out.dtype}, the input was {expected.dtype}: an "
                "AllReduce keeps the tensor's dtype (add into the tensor, or into buffers made "
                "with torch.empty_like, without converting)")
    wrong = (out != expected).sum().item()
    if not wrong:
        return None
    hint = ("it is still this rank's own tensor: nothing was added" if torch.equal(out, own)
            else "some chunks are missing contributions: in the reduce-scatter each chunk "
                 "must travel N-1 steps around the ring, adding one rank's piece per step, "
                 "before the all-gather passes the finished chunks on")
    return (f"rank {rank}'s result differs from the sum over ranks at {wrong} of "
            f"{expected.numel()} entries: {hint}")


def _traffic_problems(ranks: list[dict], nbytes: int, world_size: int) -> list[str]:
    ring = 2 * (world_size - 1) / world_size * nbytes
    problems = []
    for rank, r in enumerate(ranks):
        t = r["traffic"]
        if t["collectives"]:
            kinds = ", ".join(f"dist.{k} ({c[0]} call{'s' * (c[0] > 1)})"
                              for k, c in t["collectives"].items())
            problems.append(f"rank {rank} called {kinds}: the exercise is to build the "
                            "AllReduce from dist.send/dist.recv (or isend/irecv) alone")
        elif t["sent_bytes"] == 0:
            problems.append(f"labkit counted no bytes sent by rank {rank}: send with "
                            "dist.send / dist.isend, called through the module as written")
        elif t["sent_bytes"] > 1.01 * ring:
            ratio = t["sent_bytes"] / ring
            problems.append(
                f"rank {rank} sent {ratio:.1f}x the bytes a ring sends "
                f"({format_bytes(t['sent_bytes'])} instead of 2(N-1)/N x "
                f"{format_bytes(nbytes)} = {format_bytes(ring)}): are you sending the whole "
                "tensor at each step instead of one chunk (1/N of it)?")
        if t["largest_send"] > 1.01 * nbytes / world_size:
            problems.append(
                f"rank {rank} sent {format_bytes(t['largest_send'])} in one message, "
                f"{t['largest_send'] * world_size / nbytes:.0f}x a chunk ({format_bytes(nbytes)}"
                f" / N = {format_bytes(nbytes / world_size)}): a ring step passes one chunk to "
                "the right neighbour, never the whole tensor")
    return problems


def ring_all_reduce(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Run ``fn(ctx, tensor)`` on every rank of ``cluster``; check the sum and the bytes sent
    (at the cluster's rank count, then at a second one)."""
    n = cluster.world_size
    if n < 2:
        return failed(EXERCISE, f"a ring needs at least 2 ranks; this cluster has {n}.")
    return at_two_sizes(cluster, lambda: _check(cluster, fn, timeout))


def _wire_problems(ranks: list[dict], wire: SocketCount, on_wire: list[int] | None,
                   nbytes: int, n: int) -> list[str]:
    """The bytes the kernel counted on each rank's sockets (``on_wire``), beside what it
    reported and what a ring needs (2(N-1) sends and as many receives, framed by gloo)."""
    if on_wire is None:
        return [wire.unmeasured()] if wire.required else []
    ring, allowed = 2 * (n - 1) / n * nbytes, ring_allowance(nbytes, n)
    problems = []
    for rank, (r, sent) in enumerate(zip(ranks, on_wire, strict=True)):
        t = r["traffic"]
        if mismatch := reported_mismatch(rank, t["sent_bytes"], t["sends"], t["recvs"], sent):
            problems.append(mismatch)
        elif sent > allowed:
            problems.append(f"{format_bytes(sent)} crossed rank {rank}'s sockets (the "
                            f"kernel's count), more than a ring needs ({format_bytes(ring)} "
                            "in 2(N-1) chunk-sized messages)")
    return problems


def _result_problems(ranks: list[dict], inputs: list[torch.Tensor]) -> list[str]:
    expected = sum(inputs)
    problems = [f"rank {rank} returned {r['type']}, not a tensor: return the summed tensor"
                for rank, r in enumerate(ranks) if r["out"] is None]
    problems += [f"rank {rank} returned its sum on {r['dtype_device'][1]}; the input was on "
                 f"{r['input'][1]}: return it on the rank's device (ctx.device)"
                 for rank, r in enumerate(ranks)
                 if r["out"] is not None and r["dtype_device"][1] != r["input"][1]]
    return problems + [p for rank, r in enumerate(ranks)
                       if (p := _value_problem(rank, r["out"], expected, inputs[rank]))]


def _check(cluster, fn, timeout: float | None) -> CheckResult:
    n = cluster.world_size
    # Each rank's input as a tensor, drawn here: a seed is 8 bytes a rank could pass on,
    # letting every rank make every input and sum them alone; a tensor cannot be sent in
    # fewer bytes than its VALUE_BITS random bits a value.
    inputs = [_data(seed, n) for seed in private_seeds(n).values]
    wire = SocketCount(cluster)
    outcome = run_checked(cluster, EXERCISE, "ring_all_reduce", _job, fn, PerRank(inputs),
                          timeout=timeout, hang_hint=HANG_HINT)
    on_wire = wire.sent()
    if outcome.verdict:
        return outcome.verdict
    ranks = outcome.values
    nbytes = inputs[0].nbytes
    if bad := [rank for rank, r in enumerate(ranks) if not _well_formed(r)]:
        return failed(EXERCISE, f"rank {bad[0]} sent back a report that labkit's check does "
                      "not write: its code on that rank changed the check's measurements")
    measured = {"sent_bytes": [r["traffic"]["sent_bytes"] for r in ranks],
                "ring_bytes": 2 * (n - 1) / n * nbytes, "tensor_bytes": nbytes,
                "socket_bytes": on_wire}
    problems = _result_problems(ranks, inputs) + _traffic_problems(ranks, nbytes, n)
    problems = problems or _wire_problems(ranks, wire, on_wire, nbytes, n)
    if problems:
        return failed(EXERCISE, problems[0], problems[1:], **measured)
    return passed(EXERCISE, f"every rank holds the exact sum, and each sent "
                  f"{format_bytes(measured['ring_bytes'])} = 2(N-1)/N of the "
                  f"{format_bytes(nbytes)} tensor, as a ring does (N = {n}).", **measured)
