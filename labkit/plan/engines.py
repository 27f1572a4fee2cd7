"""What DTensor tensor parallelism and FSDP2 add to each op of a step, measured here.

The per-op cost (``calibrate``'s ``op_overhead_s``) is measured on plain aten ops. Under tp
every weight is a DTensor, so each op on it goes through DTensor's sharding propagation
before it reaches aten; under FSDP2 each unit's pre/post forward and backward hooks run and
the optimizer walks DTensor shards. On GPUs this is hidden behind kernels queued ahead; on a
CPU rank it is the step's critical path, and small classroom models are mostly overhead.

``measure_engine_overhead(ctx, runs)`` runs on every rank of a cluster (2 ranks or more;
``runs``: ``engine_runs``, resolved in the notebook): a tiny decoder's training step (2
blocks, widths 16 and 64: no arithmetic to speak of) built by labkit's one build path
(``labkit.training.build.build``) with ``Layout(tp=N)`` and with ``Layout(fsdp=N)``, beside
the same model plain on each rank, each timed in the rank's CPU time (like the rest of the
calibration). Both engines work per parameter tensor (a DTensor per weight whose every op is
dispatched through DTensor; FSDP2's copy-in/out, hooks and the optimizer over DTensor
shards), so the extra is counted per parameter tensor, fitted at the two widths so that a
cost growing with the bytes of the weights is separated from it:

    extra(width) = tensors x per_tensor + weight_bytes(width) x per_byte

Only the per-tensor part is charged by ``project`` (``GPUCluster.engine_overhead_s``): bytes
are charged by the collectives' and the memory's bandwidth already. The per-tensor part
includes the CPU time of the engine's own collectives at these tiny sizes (a few KiB each),
which the projection also charges as each collective's fitted alpha: by that much, the
term is an upper bound. Calibrated on a decoder: a model whose engines work per module
rather than per tensor (an MLP's few large layers) is charged by the same per-tensor rate.
"""

from __future__ import annotations

import statistics
import time

import torch

from labkit.models import GPTConfig, build_model, example_batch, loss_fn
from labkit.plan.counts import param_tensors
from labkit.training.layout.layout import Layout

# Two widths of one depth: the same tensors, weight bytes 1 : ~13.
WIDTHS = (16, 64)
ENGINES = ("tp", "fsdp")


def tiny(width: int, ranks: int = 1) -> GPTConfig:
    """A decoder whose step is the framework's work, not arithmetic (d_model about ``width``),
    splittable by tp over ``ranks``: 4 heads when ``ranks`` divides 4, else ``ranks`` heads
    (tp needs heads % tp == 0; 3 ranks on 4 heads failed deep in the build), d_model rounded
    up to a multiple of the heads. The parameter tensors are the same whatever the heads."""
    heads = 4 if 4 % ranks == 0 else ranks
    return GPTConfig(vocab_size=32, seq_len=8, d_model=-(-width // heads) * heads,
                     n_heads=heads, n_layers=2)


def cpu_median(step, repeats: int, warmups: int = 2) -> float:
    """The median of ``repeats`` timings of ``step`` after ``warmups`` untimed calls, in this
    process's CPU time: what the work costs a core, whatever else shares the machine."""
    for _ in range(warmups):
        step()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    return statistics.median(times)


def _plain_step(config, batch: int):
    model = build_model(config)
    optimizer = torch.optim.Adam(model.parameters())
    inputs, targets = example_batch(config, batch)

    def step():
        optimizer.zero_grad()
        loss_fn(config)(model(inputs), targets).backward()
        optimizer.step()

    return step


def engine_runs(world_size: int, device_type: str = "cpu", backend: str = "gloo") -> dict:
    """In the notebook, before any rank starts: the run each engine's step trains at each
    width (``"tp/16"``...), resolved once (``labkit/training/run.py``), as ``Run.to_dict``."""
    from labkit.training.config import TrainConfig
    from labkit.training.run import resolve

    out = {}
    for width in WIDTHS:
        for engine in ENGINES:
            layout = Layout(tp=world_size) if engine == "tp" else Layout(fsdp=world_size)
            train = TrainConfig(model=tiny(width, world_size), layout=layout,
                                global_batch=layout.data_size, precision="fp32")
            out[f"{engine}/{width}"] = resolve(train, world_size, device_type,
                                               backend).to_dict()
    return out


def _engine_step(ctx, run_dict: dict):
    """The step labkit's training loop runs for the resolved run (the real build, the real
    step), one sample per data rank."""
    from labkit.models import local_slice, make_batch
    from labkit.training.build import build, parallel_context
    from labkit.training.run import Run
    from labkit.training.step.spmd import run_step

    run = parallel_context(ctx, Run.from_dict(run_dict))
    built = build(run)
    config, data_size = run.config, run.layout.data_size
    data = local_slice(make_batch(config.model, 0, config.global_batch, 0), run.data_rank,
                       data_size)

    def step():
        run_step(built.model, data, loss_fn(config.model), built.optimizer, "fp32",
                 built.sync_gradients, micro_batches=1, no_sync=built.no_sync)

    return step


def measure_engine_overhead(ctx, runs: dict, repeats: int = 5) -> dict:
    """On each rank: {engine: {width: extra CPU seconds per step over plain}} and the
    parameter tensors of the tiny model (the same at every width). ``runs``:
    :func:`engine_runs`, resolved in the notebook."""
    repeats = max(repeats, 5)  # a few ms each: the median of 5 costs nothing
    n = ctx.world_size
    out = {"tensors": param_tensors(tiny(WIDTHS[0], n)), "extra": {e: {} for e in ENGINES},
           "plain": {}, "weight_bytes": {w: weight_bytes(w, n) for w in WIDTHS}}
    for width in WIDTHS:
        config = tiny(width, n)
        # two warm-ups: the engines' lazy state (FSDP's first all-gather, DTensor caches)
        plain = cpu_median(_plain_step(config, 1), repeats)
        out["plain"][width] = plain
        for engine in ENGINES:
            timed = cpu_median(_engine_step(ctx, runs[f"{engine}/{width}"]), repeats)
            out["extra"][engine][width] = timed - plain
    return out


def weight_bytes(width: int, ranks: int = 1) -> int:
    return sum(p.numel() * 4 for p in build_model(tiny(width, ranks),
                                                   device="meta").parameters())


def fit_overhead(per_rank: list[dict]) -> dict:
    """{engine: (seconds per parameter tensor, seconds per weight byte)} from the slowest
    rank's extras at the two widths; each at least 0 (an engine never makes a step cheaper)."""
    small, large = WIDTHS
    sizes = per_rank[0].get("weight_bytes") or {w: weight_bytes(w) for w in WIDTHS}
    db = sizes[large] - sizes[small]
    tensors = per_rank[0]["tensors"]
    fitted = {}
    for engine in ENGINES:
        lo = max(r["extra"][engine][small] for r in per_rank)
        hi = max(r["extra"][engine][large] for r in per_rank)
        per_byte = max(0.0, (hi - lo) / db)
        per_tensor = max(0.0, (lo - per_byte * sizes[small]) / tensors)
        fitted[engine] = (per_tensor, per_byte)
    return fitted
