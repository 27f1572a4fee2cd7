"""A rank's pipeline step replayed on fake tensors, for the memory estimator.

The schedules of torch.distributed.pipelining talk to their neighbours before the first step
(a vote on shapes, read back with ``.item()``), which fake tensors cannot do; so the
estimator does not run them. It replays this rank's part of the schedule instead, in the
schedule's own order (``pipeline_order``, the table torch's schedules execute), holding what
torch's stages hold:

* one receive buffer per micro-batch for the stage's input, and one for the gradient of its
  output, made at the first step and kept (``_RecvInfo`` buffers);
* each micro-batch's output and input until its backward (``fwd_cache``);
* on the last stage every micro-batch's output until the next step (``output_chunks``), and
  their concatenation at the end of the step (what ``step()`` returns);
* FSDP2's unsharded gradients until the stage's last backward, where they are reduced (the
  stage holds gradient reduction back, as ``perform_reduce_grad`` does).

The hand-written schedules (``naive.py``) run torch's orders and hold the same, except that
they receive into fresh tensors and keep no outputs past the step.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule

from labkit.models import build_model, example_batch, loss_fn, plan_for
from labkit.models.optim import weight_dtype
from labkit.parallel.pipeline.stages import split_stages
from labkit.runtime.memory.capacity import on_host


def stage_inputs(config, num_stages: int, micro: int, tp: int = 1) -> list[tuple]:
    """(shape, dtype) of what enters each stage, and of the last stage's output, for a
    micro-batch of ``micro`` samples (traced on the meta device). A stage whose first layer
    tensor parallelism feeds a shard (row-wise, after a column-wise layer in the stage
    before) receives this tp rank's 1/tp of the last dimension."""
    with on_host(), torch.no_grad():
        model = build_model(config.model, "meta", config.seed, weight_dtype(config.precision))
        plan = plan_for(config.model)
        styles = plan.tp_styles(model) if tp > 1 else {}
        stages = split_stages(plan.layers(model), num_stages)
        x = example_batch(config.model, micro, "meta")[0]
        out = []
        for stage in stages:
            shape = x.shape
            layouts = getattr(styles.get(stage[0][0]), "input_layouts", None) or ()
            if layouts and layouts[0].is_shard():
                shape = (*shape[:-1], shape[-1] // tp)
            out.append((torch.Size(shape), x.dtype))
            for _, layer in stage:
                x = layer(x)
        return [*out, (x.shape, x.dtype)]


def _order(runner, schedule: str, stage: int, num_stages: int,
           micro_batches: int) -> list[tuple[int, str, int]]:
    """(stage, "F" or "B", micro-batch) in the order this rank runs them: as torch's
    single-stage schedules do in ``_step_microbatches`` (GPipe: every forward, then every
    backward; 1F1B: num_stages - stage forwards, then one backward and one forward in turn),
    and as the interleaved schedule's own table says (``pipeline_order``, what it executes).
    ``schedule`` is the order's name (``Engines.schedule_order``): the hand-written
    schedules run torch's orders."""
    m = micro_batches
    if schedule == "interleaved_1f1b":
        table = runner.schedule.pipeline_order[runner.schedule.rank]
        return [(a.stage_index, a.computation_type.value, a.microbatch_index)
                for a in table if a is not None and a.computation_type.value in ("F", "B")]
    if schedule != "1f1b":
        return [(stage, "F", i) for i in range(m)] + [(stage, "B", i) for i in range(m)]
    warmup = min(m, num_stages - stage)
    order = [(stage, "F", i) for i in range(warmup)]
    forward = warmup
    for backward in range(m):
        order.append((stage, "B", backward))
        if forward < m:
            order.append((stage, "F", forward))
            forward += 1
    return order


class PipelineTrace:
    """This rank's stages of ``built`` (a pipelined ``Built`` of ``run``, a resolved
    ``labkit.training.run.Run``) stepped on fake tensors."""

    def __init__(self, built, run, pp_rank: int, ids: list[int]):
        config, layout, schedule = run.config, run.layout, run.engines.schedule_order
        self.micro_batches = config.micro_batches
        self.num_stages = run.stages
        self.loss_fn = loss_fn(config.model)
        self.order = _order(built.pipeline, schedule, pp_rank,
                            self.num_stages, config.micro_batches)
        self.modules = dict(zip(ids, built.modules, strict=True))
        self.last_backward = {s: max(mb for t, kind, mb in self.order if t == s and kind == "B")
                              for s in ids}
        # torch's stages keep their receive buffers and the last stage's outputs; the
        # hand-written ones receive into fresh tensors and keep nothing past the step
        self.persistent = run.engines.schedule == schedule
        self.shapes = stage_inputs(config, self.num_stages,
                                   config.global_batch // layout.data_size // self.micro_batches,
                                   layout.tp)
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._outputs: list[torch.Tensor] = []

    def _buffer(self, key: tuple, shape, dtype, device) -> torch.Tensor:
        if not self.persistent:
            return torch.empty(shape, dtype=dtype, device=device)
        if key not in self._buffers:
            self._buffers[key] = torch.empty(shape, dtype=dtype, device=device)
        return self._buffers[key]

    def _backward(self, stage: int, mb: int, cached, device) -> None:
        module = self.modules[stage]
        if isinstance(module, FSDPModule):  # reduce once, at the stage's last micro-batch
            last = mb == self.last_backward[stage]
            module.set_is_last_backward(last)
            module.set_reshard_after_backward(last)
            module.set_requires_gradient_sync(last)
        out, _, loss = cached
        if stage == self.num_stages - 1:
            loss.backward()
        else:  # the gradient of this rank's own output (a tp shard where one crosses)
            out.backward(self._buffer(("grad", stage, mb), out.shape, out.dtype, device))

    def step(self, batch, optimizer, sync_gradients=None) -> None:
        inputs, targets = batch
        device = inputs.device
        self._outputs.clear()  # a stage clears the last step's outputs when the next begins
        chunks = inputs.tensor_split(self.micro_batches)
        target_chunks = targets.tensor_split(self.micro_batches)
        cache = {}
        for stage, kind, mb in self.order:
            if kind == "B":
                self._backward(stage, mb, cache.pop((stage, mb)), device)
                continue
            if stage == 0:
                x = chunks[mb]
            else:
                shape, dtype = self.shapes[stage]
                buffer = self._buffer(("input", stage, mb), shape, dtype, device)
                x = buffer.detach().requires_grad_(buffer.is_floating_point())
            out = self.modules[stage](x)
            loss = None
            if stage == self.num_stages - 1:
                loss = self.loss_fn(out, target_chunks[mb])
                if self.persistent:
                    self._outputs.append(out)
            cache[(stage, mb)] = (out, x, loss)
        if self._outputs:  # what step() returns on the last stage: the merged outputs
            merged = torch.cat([o.detach() for o in self._outputs])
            del merged
        if sync_gradients is not None:
            sync_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
