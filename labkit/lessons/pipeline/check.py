"""Notebook 03's exercise: the micro-batch loop of a two-stage pipeline (GPipe's schedule).

The learner writes ``pipeline_step(ctx, stage, inputs, targets, micro_batches,
activation_shape)``: rank 0 holds the first half of an MLP and the batch, rank 1 the second
half and the targets. Split the batch into micro-batches, run every forward (rank 0 sends each
activation on), then every backward (rank 1 sends each activation's gradient back), scale
each micro-batch's loss by 1/micro_batches, and return the batch's loss on rank 1.

The check compares each stage's gradients with one device's on the whole batch, counts each
stage's forward calls and the bytes sent, and times every forward and backward of each stage
(module hooks) to measure the bubble beside (p-1)/(m+p-1).

The weights and the batch come from seeds drawn for each run (``outside.fresh_seed``); rank 0
receives only the inputs and rank 1 only the targets (``PerRank``), so neither can make the
other's half of the work without receiving it. One device's loss and gradients are computed
here, in the check's process, and compared here with the gradients and the loss the ranks
send back. The forward calls, the bytes sent and the timings are the rank's word: counted on
the rank, where the learner's code could change them.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from labkit.lessons.exercise import reports
from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked
from labkit.lessons.exercise.wire import Traffic
from labkit.models import MLPConfig, build_model, loss_fn, make_batch
from labkit.parallel.pipeline.timeline import bubble_fraction, theoretical_bubble
from labkit.runtime.cluster.per_rank import PerRank
from labkit.runtime.memory import format_bytes

EXERCISE = "pipeline_step"
# Wide enough that a micro-batch's compute (a few ms per stage) outweighs a gloo message
# (about 1 ms): at width 256 the measured bubble was ~90%, all of it waiting on messages.
MODEL = MLPConfig(d_in=32, d_hidden=1024, n_layers=4, d_out=4)
BATCH, MICRO_BATCHES = 128, 4
HANG_HINT = ("Each recv needs a matching send: rank 0 sends one activation per micro-batch "
             "and receives one gradient per micro-batch; rank 1 does the opposite, in the "
             "same order.")


def _timed(stage: nn.Sequential, events: list) -> tuple[list, list]:
    """Record (kind, start, end) of every forward of ``stage`` into ``events``; return the
    lists that collect when each backward begins and ends (``_backwards`` pairs them).

    The forward hooks sit on its first and last layers, so that ``stage(x)``,
    ``stage.forward(x)`` and a loop over the layers are all seen (a hook on the Sequential
    itself sees only the first). A backward begins when the gradient of that forward's output
    arrives and ends when the first layer's weight has its gradient: one hook on that weight,
    not one per forward (every such hook fires at the first backward)."""
    first, last = stage[0], stage[-1]
    begins, ends = [], []

    def forward_pre(module, args):
        first._labkit_start = time.time()

    def forward_post(module, args, output):
        events.append({"kind": "F", "start": first._labkit_start, "end": time.time()})
        if output.requires_grad:
            output.register_hook(lambda grad: begins.append(time.time()))

    first.register_forward_pre_hook(forward_pre)
    last.register_forward_hook(forward_post)
    next(stage.parameters()).register_post_accumulate_grad_hook(
        lambda param: ends.append(time.time()))
    return begins, ends


def _backwards(begins: list, ends: list) -> list[dict]:
    """A stage runs one backward at a time (GPipe, 1F1B): the k-th to begin is the k-th to
    end."""
    return [{"kind": "B", "start": b, "end": e}
            for b, e in zip(sorted(begins), sorted(ends), strict=False)]


def _stage(weights_seed: int, rank: int, device) -> nn.Sequential:
    layers = list(build_model(MODEL, device, seed=weights_seed).layers)
    half = len(layers) // 2  # Linear, ReLU, Linear, ReLU | Linear, ReLU, Linear
    return nn.Sequential(*(layers[:half] if rank == 0 else layers[half:]))


class _Run:
    """One check run's inputs, drawn here: the weights' seed and the batch (CPU)."""

    def __init__(self):
        self.weights_seed = fresh_seed()
        # make_batch seeds a generator with seed * 1_000_003 + step: 39 bits keep it in 64
        self.inputs, self.targets = make_batch(MODEL, 0, BATCH, seed=fresh_seed() >> 24)

    def halves(self) -> PerRank:
        """Rank 0's part of the batch (the inputs) and rank 1's (the targets)."""
        return PerRank([(self.inputs, None), (None, self.targets)])

    def reference(self) -> tuple[float, list[list[torch.Tensor]]]:
        """One device's loss on the whole batch, and each stage's gradients, computed a
        micro-batch at a time as the pipeline does (each micro-batch's mean loss over
        ``MICRO_BATCHES``, the gradients summed in order). The same arithmetic as the whole
        batch's, with the matrix products' rounding the stages' own: on the whole batch at
        once, a pre-activation within rounding of 0 can fall on the other side of a ReLU
        and move a gradient by a sample's share (seen in about 3% of runs). On one thread,
        as a CPU rank computes (a virtual GPU: one core), so that the products are blocked
        alike."""
        stages = [_stage(self.weights_seed, rank, "cpu") for rank in (0, 1)]
        losses, threads = [], torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for inputs, targets in zip(self.inputs.chunk(MICRO_BATCHES),
                                       self.targets.chunk(MICRO_BATCHES), strict=True):
                loss = loss_fn(MODEL)(stages[1](stages[0](inputs)), targets) / MICRO_BATCHES
                loss.backward()
                losses.append(loss.item())
        finally:
            torch.set_num_threads(threads)
        return sum(losses), [[p.grad.clone() for p in stage.parameters()] for stage in stages]


def _job(ctx, fn, weights_seed: int, half) -> dict:
    inputs, targets = (None if t is None else t.to(ctx.device) for t in half)
    stage = _stage(weights_seed, ctx.rank, ctx.device)
    events: list = []
    begins, ends = _timed(stage, events)
    shape = (BATCH // MICRO_BATCHES, MODEL.d_hidden)
    with Traffic() as traffic:
        loss = fn(ctx, stage, inputs, targets, MICRO_BATCHES, shape)
    events += _backwards(begins, ends)
    return {"grads": [None if p.grad is None else p.grad.detach().cpu().clone()
                      for p in stage.parameters()],
            "loss": float(loss) if ctx.rank == 1 and loss is not None else None,
            "events": events, "traffic": traffic.to_dict()}


def _event(value) -> bool:
    return (isinstance(value, dict) and value.get("kind") in ("F", "B")
            and all(type(value.get(k)) is float for k in ("start", "end")))


def _compared(ranks: list, reference: list[list[torch.Tensor]]) -> list[dict] | CheckResult:
    """Each stage's report with its gradients paired with one device's, or the verdict on a
    report the job does not write."""
    for rank, (r, grads) in enumerate(zip(ranks, reference, strict=True)):
        shapes = [tuple(g.shape) for g in grads]
        if not reports.fields(r, {
                "grads": lambda g, shapes=shapes: reports.tensor_list(g, shapes, True,
                                                                    torch.float32),
                "loss": lambda x: x is None or type(x) is float,
                "events": lambda e: isinstance(e, list) and all(map(_event, e)),
                "traffic": reports.traffic}):
            return reports.forged(EXERCISE, rank)
    return [dict(r, grads=list(zip(r["grads"], grads, strict=True)))
            for r, grads in zip(ranks, reference, strict=True)]


def _grad_problem(rank: int, r: dict) -> str | None:
    pairs = r["grads"]
    if any(g is None for g, _ in pairs):
        return f"stage {rank}'s parameters have no gradient: did its backward run?"
    ratios = [(g.flatten() @ ref.flatten() / (ref.flatten() @ ref.flatten())).item()
              for g, ref in pairs]
    if all((g - ref).abs().max() <= 1e-4 * ref.abs().max() + 1e-7 for g, ref in pairs):
        return None
    if all(abs(x - MICRO_BATCHES) < 1e-2 for x in ratios):
        return (f"stage {rank}'s gradients are {MICRO_BATCHES}x one device's: scale each "
                f"micro-batch's loss by 1/micro_batches (their gradients add up)")
    return (f"stage {rank}'s gradients differ from one device's on the whole batch: is each "
            "gradient sent back to the micro-batch whose activation it belongs to?")


def pipeline_step(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Run ``fn`` as a two-stage pipeline on a 2-rank ``cluster``; check it."""
    if cluster.world_size != 2:
        return failed(EXERCISE, f"the exercise is a two-stage pipeline: check it on a 2-rank "
                      f"cluster (this one has {cluster.world_size})")
    run = _Run()
    outcome = run_checked(cluster, EXERCISE, "pipeline_step", _job, fn, run.weights_seed,
                          run.halves(), timeout=timeout, hang_hint=HANG_HINT)
    if outcome.verdict:
        return outcome.verdict
    full, reference = run.reference()
    ranks = _compared(outcome.values, reference)
    if isinstance(ranks, CheckResult):
        return ranks
    forwards = [sum(e["kind"] == "F" for e in r["events"]) for r in ranks]
    problems = [f"stage {rank} ran its forward {n} time(s): split the batch into "
                f"{MICRO_BATCHES} micro-batches and run each one" for rank, n in
                enumerate(forwards) if n != MICRO_BATCHES]
    problems += [p for rank, r in enumerate(ranks) if (p := _grad_problem(rank, r))]
    loss = ranks[1]["loss"]
    if loss is None or not abs(loss - full) <= 1e-4 * abs(full):  # a NaN loss is wrong too
        problems.append(f"rank 1 returned loss {loss}, one device's is {full:.6f}: return the "
                        "sum of the scaled micro-batch losses (the batch's mean)")
    activations = BATCH * MODEL.d_hidden * 4
    sent = [r["traffic"]["sent_bytes"] for r in ranks]
    if not problems and min(sent) < activations:
        problems.append(f"labkit counted {format_bytes(min(sent))} sent by a stage, less than "
                        f"the activations ({format_bytes(activations)}): send with dist.send "
                        "or dist.isend, called through the module")
    timelines = [[e for e in r["events"]] for r in ranks]
    bubble = bubble_fraction(timelines) if all(timelines) else None
    theory = theoretical_bubble(2, MICRO_BATCHES)
    backward_ms = [[round(1e3 * (e["end"] - e["start"]), 3) for e in timeline
                    if e["kind"] == "B"] for timeline in timelines]
    measured = {"forwards": forwards, "sent_bytes": sent, "bubble": bubble, "theory": theory,
                "backward_ms": backward_ms}
    if problems:
        return failed(EXERCISE, problems[0], problems[1:], **measured)
    return passed(EXERCISE, f"both stages' gradients equal one device's on the whole batch, "
                  f"with {MICRO_BATCHES} micro-batches; measured bubble {bubble:.0%} beside "
                  f"(p-1)/(m+p-1) = {theory:.0%}.",
                  [f"each stage sent {format_bytes(sent[0])} (activations forward, gradients "
                   "back); a measured bubble above the formula's comes from unequal stages, "
                   "the cost of each send, and sends that block (dist.isend lets stage 0 go "
                   "on while an activation travels)"], **measured)
