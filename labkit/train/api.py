"""``labkit.train``: train a zoo model with a named strategy on a cluster, get a report."""

from __future__ import annotations

from labkit.memory.estimate import estimate_memory
from labkit.memory.fit import model_state_note
from labkit.memory.oom import DeviceOOM
from labkit.train.config import TrainConfig
from labkit.train.loop import train_on_rank
from labkit.train.report import TrainReport
from labkit.train.strategy import strategy_for

_UNSET = object()


def train(cluster, config: TrainConfig | None = None, *, memory_per_device=_UNSET,
          estimate: bool = True, timeout: float | None = None, **fields) -> TrainReport:
    """Train on every rank of ``cluster`` and return a :class:`TrainReport`.

        report = labkit.train(cluster, model="mlp", strategy="ddp", global_batch=256, steps=10)

    ``fields`` are those of :class:`TrainConfig` (model, strategy, global_batch, steps, lr,
    optimizer, precision, seed, bucket_cap_mb). ``memory_per_device`` overrides the
    cluster's capacity for this run. Raises ``DeviceOOM`` when a rank runs out of memory;
    when the model state alone was more than the capacity (worked out before the run), the
    error also says so, and what would fit.
    """
    config = (config or TrainConfig()).replace(**fields) if fields else (config or TrainConfig())
    strategy = strategy_for(config.strategy)
    strategy.check(cluster.world_size, config.global_batch, config.micro_batches)
    strategy.check_model(config.model, cluster.world_size)
    saved = cluster.memory_per_device
    if memory_per_device is not _UNSET:
        cluster.memory_per_device = memory_per_device
    note = model_state_note(config, cluster.world_size, cluster.memory_per_device)
    try:
        ranks = cluster.run(train_on_rank, config.to_dict(), timeout=timeout)
    except DeviceOOM as oom:
        if note:
            oom.explain(note)
        raise
    finally:
        cluster.memory_per_device = saved
    est = None
    if estimate and strategy.estimable:
        est = estimate_memory(config, cluster.world_size).to_dict()
    report = TrainReport(config, cluster.world_size, cluster.device, cluster.backend,
                         ranks.oversubscribed, list(ranks), est)
    report.extra["shared_gpus"] = ranks.shared_gpus  # several ranks on one GPU: say so
    return report
