"""A rank's pipeline: its stages, the schedule that drives them, and one step of it.

"naive_gpipe" and "naive_1f1b" are the hand-written schedules (``naive.py``; "naive" is the
hand-written GPipe with one micro-batch); "gpipe", "1f1b" and "interleaved_1f1b" are
torch.distributed.pipelining's, over the same micro-batches. Interleaved 1F1B (Narayanan
et al., 2021) gives each rank two stages that are not neighbours (rank r holds stages r and
r + p of 2p): with smaller stages the pipeline fills sooner, and the bubble shrinks to
(p-1)/(v m + p-1) for v stages per rank.

A stage may itself be split: its module may be tensor parallel and wrapped by a data-parallel
engine (FSDP2's ``fully_shard`` or ``replicate``, which torch's stages know how to drive: they
hold gradient reduction back until a step's last micro-batch; the hand-written stages do the
same).

The timeline records each stage's forward and backward chunks from outside the schedule:
``StageTimeline.instrument`` wraps the stage's ``forward_one_chunk`` and
``backward_one_chunk``, torch's stages and the hand-written ones alike.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from labkit.parallel.pipeline.naive import SCHEDULES as HAND_WRITTEN
from labkit.parallel.pipeline.naive import HandStage
from labkit.parallel.pipeline.p2p import StageLinks
from labkit.parallel.pipeline.timeline import StageTimeline

_SINGLE = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class PipelineRunner:
    """The stages of one rank and their schedule.

    Args:
        modules: this rank's stage modules (two with interleaved 1F1B).
        stage_ids: their stage indices; ``num_stages`` of them in the whole pipeline.
        pp_rank, pp_size, group: this rank's place in its pipeline, and the pipeline's group.
        device, micro_batches, loss_fn, schedule: what to run, and how.
        clock: times the stages' chunks (``runtime/comm/clock.py``).
    """

    def __init__(self, modules, stage_ids: list[int], num_stages: int, pp_rank: int,
                 pp_size: int, group, device: torch.device, micro_batches: int, loss_fn,
                 schedule: str, clock):
        self.first, self.last = pp_rank == 0, pp_rank == pp_size - 1
        self.micro_batches, self.timeline = micro_batches, StageTimeline(clock)
        self.hand_written = HAND_WRITTEN.get(schedule)
        if self.hand_written is not None:
            self.stage = HandStage(modules[0], stage_ids[0], num_stages, micro_batches, loss_fn)
            self.links = StageLinks(pp_rank, pp_size, group, device)
            self.timeline.instrument(self.stage)
            return
        stages = [PipelineStage(module, index, num_stages, device, group=group)
                  for module, index in zip(modules, stage_ids, strict=True)]
        for stage in stages:
            self.timeline.instrument(stage)
        if schedule == "interleaved_1f1b":
            self.schedule = ScheduleInterleaved1F1B(stages, micro_batches, loss_fn=loss_fn)
        else:
            self.schedule = _SINGLE[schedule](stages[0], micro_batches, loss_fn=loss_fn)

    def run(self, inputs, targets) -> list[torch.Tensor]:
        """One pass of every micro-batch; the losses (on the last stage) of each."""
        if self.hand_written is not None:  # split as torch's schedules split: tensor_split
            m = self.micro_batches
            return self.hand_written(
                self.stage, self.links, inputs.tensor_split(m) if self.first else None,
                targets.tensor_split(m) if self.last else None)
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets, "losses": losses} if self.last else {}
        if self.first:
            self.schedule.step(inputs, **kwargs)
        else:
            self.schedule.step(**kwargs)
        return losses


def pipeline_step(runner: PipelineRunner, batch, optimizer, clock,
                  sync_gradients=None) -> dict:
    """One training step through the pipeline: the stage's busy time (its chunks) is
    computation, the rest of the pass is waiting (the bubble, and the transfers).
    ``sync_gradients`` (hand-written data parallelism) runs after the pass, counted as
    waiting too."""
    inputs, targets = batch
    start = clock.now()
    losses = runner.run(inputs, targets)
    if sync_gradients is not None:
        sync_gradients()
    compute_end = clock.now()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    end = clock.now()
    events = runner.timeline.take()
    spent = {kind: sum(e["end"] - e["start"] for e in events if e["kind"] == kind)
             for kind in ("F", "B")}
    waiting = max(0.0, compute_end - start - spent["F"] - spent["B"])
    loss = torch.stack(losses).mean().item() if losses else math.nan
    return {"loss": loss, "step_s": end - start, "forward_s": spent["F"],
            "backward_s": spent["B"], "optimizer_s": end - compute_end, "comm_s": waiting,
            "compute_s": end - start - waiting, "timeline": events}
