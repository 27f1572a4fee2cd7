"""When each micro-batch's forward and backward ran, per stage, and the bubble it leaves."""

from __future__ import annotations

import statistics
import time


class StageTimeline:
    """The forward ("F") and backward ("B") chunks a rank's stages ran in a step, timed with the
    step's clock (``runtime/comm/clock.py``: device time on GPUs), reported in wall-clock seconds
    (``time.time``, shared by every process on a machine, so that the timelines of all ranks can be
    drawn on one axis)."""

    def __init__(self, clock):
        self.clock = clock
        self._raw: list[tuple] = []

    def record(self, kind: str, microbatch: int, start, end, stage: int | None = None) -> None:
        """One chunk between two of the clock's marks."""
        self._raw.append((kind, microbatch, start, end, stage))

    def instrument(self, stage) -> None:
        """Record every ``forward_one_chunk`` / ``backward_one_chunk`` of a stage: a
        torch.distributed.pipelining stage (private methods of torch 2.13's
        ``_PipelineStageBase``, pinned; ``tests/test_pipeline_parallel.py`` checks the
        recorded timeline) or a hand-written ``HandStage`` (``naive.py``), which keeps
        their names so that its schedules hold no timing code."""
        for name, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B")):
            original = getattr(stage, name)

            def timed(chunk_id, *args, _original=original, _kind=kind, **kwargs):
                start = self.clock.mark()
                try:
                    return _original(chunk_id, *args, **kwargs)
                finally:
                    self.record(_kind, chunk_id, start, self.clock.mark(), stage.stage_index)

            setattr(stage, name, timed)

    def take(self) -> list[dict]:
        """The step's events (after the clock synchronized), and a fresh start."""
        raw, self._raw = self._raw, []
        to_wall = time.time() - time.perf_counter()
        seconds = self.clock.seconds
        return [{"kind": kind, "microbatch": mb, "start": seconds(a) + to_wall,
                 "end": seconds(b) + to_wall, "stage": stage}
                for kind, mb, a, b, stage in raw]


def bubble_fraction(timelines: list[list[dict]]) -> float:
    """Share of the step's span that stages sat idle: 1 - mean busy time / span."""
    events = [e for timeline in timelines for e in timeline]
    span = max(e["end"] for e in events) - min(e["start"] for e in events)
    busy = [sum(e["end"] - e["start"] for e in timeline) for timeline in timelines]
    return 1 - sum(busy) / len(busy) / span


def theoretical_bubble(stages: int, microbatches: int, virtual: int = 1) -> float:
    """(p - 1) / (m + p - 1): GPipe's idle share with equal stages (Huang et al., 2019), for
    p devices and m micro-batches. With v stages per device (interleaved 1F1B, Narayanan et
    al., 2021) the fill and drain shrink v-fold: (p - 1) / (v m + p - 1)."""
    return (stages - 1) / (virtual * microbatches + stages - 1)


def measured_bubble(report) -> float:
    """A pipelined run's bubble: the median, over its steps after the first (which builds
    lazy state and warms the links up), of ``bubble_fraction`` over the stages of its first
    pipeline (``report``: a TrainReport). One step's bubble moves by a few points from run
    to run on shared CPU cores; the median over steps moves less."""
    layout = report.layout
    ranks = [report.ranks[layout.rank_at(pp=s)] for s in range(layout.pp)]
    steps = len(ranks[0]["records"])
    return statistics.median(bubble_fraction([rank["records"][i]["timeline"] for rank in ranks])
                             for i in range(1 if steps > 1 else 0, steps))
