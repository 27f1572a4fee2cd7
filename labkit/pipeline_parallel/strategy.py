"""Pipeline parallelism as training strategies: "naive_pipeline" (hand-written, one batch at
a time), "gpipe", "1f1b" and "interleaved_1f1b" (torch.distributed.pipelining's schedules over
micro-batches). Interleaved 1F1B (Narayanan et al., 2021) gives each rank two stages that are
not neighbours (rank r holds stages r and r + N of 2N): with smaller stages the pipeline
fills sooner, and the bubble shrinks to (p-1)/(v m + p-1) for v stages per rank.

Each rank builds only its own stage on the device: the host assembles the model and the
device receives its slice, so a model too big for one device can train on several.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from labkit.memory.capacity import on_host
from labkit.models import build_model, loss_fn
from labkit.pipeline_parallel.naive import NaivePipeline
from labkit.pipeline_parallel.stages import split_stages
from labkit.pipeline_parallel.timeline import instrument_stage
from labkit.train.step import weight_dtype
from labkit.train.strategy import Strategy


class PipelineStrategy(Strategy):
    """Stage ``rank`` of ``world_size`` on every rank; ``schedule`` picks the engine."""

    estimable = False  # estimate_memory does not trace stages yet

    def __init__(self, schedule: str):
        self.name = schedule
        self.virtual = 2 if schedule == "interleaved_1f1b" else 1  # stages per rank
        self.schedule = None
        self.events: list[dict] = []

    def check(self, world_size: int, global_batch: int, micro_batches: int = 1) -> None:
        if self.name == "naive_pipeline" and micro_batches != 1:
            raise ValueError("the naive pipeline sends one whole batch at a time: use "
                             "micro_batches=1, or the 'gpipe' / '1f1b' schedules")
        if global_batch % micro_batches:
            raise ValueError(f"global_batch {global_batch} does not split into {micro_batches}"
                             " micro-batches: choose a multiple")
        if self.name == "1f1b" and micro_batches < world_size:
            raise ValueError(f"1F1B needs at least as many micro-batches as stages "
                             f"({world_size}); got {micro_batches}")
        if self.virtual > 1 and (micro_batches < world_size or micro_batches % world_size):
            raise ValueError(f"interleaved 1F1B sends micro-batches round the {world_size} "
                             f"ranks in rounds: use a multiple of {world_size} micro-batches, "
                             f"not {micro_batches}")

    def check_model(self, model_config, world_size: int = 1) -> None:
        if model_config.name not in ("mlp", "gpt"):
            raise ValueError(f"a pipeline cuts a chain of layers: choose the zoo's 'mlp' or "
                             f"'gpt', not {model_config.name!r} (DLRM's embedding tables are "
                             "split by sharding instead)")

    def build(self, ctx, config) -> nn.Module:
        with on_host():  # the host assembles the model; only this stage goes to the device
            full = build_model(config.model, "cpu", config.seed, weight_dtype(config.precision))
            stages = split_stages(full, self.virtual * ctx.world_size)
            mine = [stages[ctx.rank + v * ctx.world_size] for v in range(self.virtual)]
            stage = mine[0] if self.virtual == 1 else nn.ModuleList(mine)
            values = {k: v.clone() for k, v in stage.state_dict().items()}
        stage.to_empty(device=ctx.device)  # fresh device memory (counted on a virtual GPU)
        stage.load_state_dict(values)
        return stage

    def wrap(self, ctx, model: nn.Module, meter, config) -> nn.Module:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )

        lossf = loss_fn(config.model)
        if self.name == "naive_pipeline":
            self.schedule = NaivePipeline(model, ctx.rank, ctx.world_size, ctx.device, lossf,
                                          self.events)
            return model
        if self.virtual > 1:
            total = self.virtual * ctx.world_size
            stages = [PipelineStage(module, ctx.rank + v * ctx.world_size, total, ctx.device)
                      for v, module in enumerate(model)]
            for stage in stages:
                instrument_stage(stage, self.events)
            self.schedule = ScheduleInterleaved1F1B(stages, config.micro_batches,
                                                    loss_fn=lossf)
            return model
        stage = PipelineStage(model, ctx.rank, ctx.world_size, ctx.device)
        instrument_stage(stage, self.events)
        engine = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[self.name]
        self.schedule = engine(stage, config.micro_batches, loss_fn=lossf)
        return model

    def step(self, ctx, model, batch, optimizer, config, synchronize) -> dict:
        inputs, targets = batch
        first, last = ctx.rank == 0, ctx.rank == ctx.world_size - 1
        self.events.clear()
        losses: list[torch.Tensor] = []
        start = time.perf_counter()
        kwargs = {"target": targets, "losses": losses} if last else {}
        if first:
            self.schedule.step(inputs, **kwargs)
        else:
            self.schedule.step(**kwargs)
        if synchronize:
            synchronize()
        compute_end = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = time.perf_counter()
        busy = sum(e["end"] - e["start"] for e in self.events)
        loss = torch.stack(losses).mean().item() if losses else math.nan
        return {"loss": loss, "step_s": end - start, "optimizer_s": end - compute_end,
                "busy_s": busy, "waiting_s": max(0.0, compute_end - start - busy),
                "timeline": [dict(e) for e in self.events]}
