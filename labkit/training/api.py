"""``labkit.train``: train a zoo model with a layout (or a strategy's preset) on a cluster."""

from __future__ import annotations

import os
import warnings

from labkit.runtime.memory.oom import DeviceOOM
from labkit.training.checkpoint.lock import lock_checkpoints
from labkit.training.checkpoint.rules import check_checkpointing, resolved
from labkit.training.config import TrainConfig
from labkit.training.estimate import estimate_memory
from labkit.training.fit import ADVICE, model_state_note
from labkit.training.loop import train_on_rank
from labkit.training.report import TrainReport
from labkit.training.run import Run, resolve

_UNSET = object()


def checked(cluster, config: TrainConfig | None = None, world_size: int | None = None,
            **fields) -> Run:
    """The run of ``config`` with ``fields`` replaced on ``world_size`` ranks of ``cluster``
    (default: its current size), resolved and checked before any process starts
    (``labkit/training/run.py``)."""
    n = cluster.world_size if world_size is None else world_size
    if isinstance(config, Run):  # resolved already (a sweep checks its cells up front)
        return _same_ranks(config, cluster, n, fields)
    config = (config or TrainConfig()).replace(**fields) if fields else (config or TrainConfig())
    # the ranks inherit this process's environment (forked, or spawned with it)
    return resolve(resolved(config), n, cluster.device, cluster.backend,
                   debug=os.environ.get("TORCH_DISTRIBUTED_DEBUG"))


def _same_ranks(run: Run, cluster, world_size: int, fields: dict) -> Run:
    """A resolved ``run`` as it is, if it was resolved for these ranks."""
    if fields:
        raise TypeError(f"a resolved Run trains as it was resolved: give a TrainConfig to "
                        f"change {', '.join(fields)}")
    if not run.checked:
        raise ValueError("this Run was changed or rebuilt after it was resolved (replace, "
                         "from_dict), so nothing checked it: give its TrainConfig "
                         "(labkit.train(cluster, run.config))")
    if resolved(run.config) != run.config:  # resolve() alone leaves "~/ckpt" as it is
        raise ValueError(f"the run's checkpoint_dir {run.config.checkpoint_dir!r} is not an "
                         f"absolute path the ranks can all find: resolve it with "
                         f"labkit.training.api.checked(cluster, config), or give the config")
    where = (world_size, cluster.device, cluster.backend)
    if (run.world_size, run.device_type, run.backend) != where:
        raise ValueError(f"the run was resolved for {run.world_size} {run.device_type} ranks "
                         f"over {run.backend}, and the cluster has {where[0]} {where[1]} ranks "
                         f"over {where[2]}: resolve it again (labkit.train(cluster, "
                         f"run.config)) or resize the cluster")
    return run


def train(cluster, config: TrainConfig | Run | None = None, *, memory_per_device=_UNSET,
          estimate: bool = True, timeout: float | None = None, **fields) -> TrainReport:
    """Train on every rank of ``cluster`` and return a ``TrainReport``.

        report = labkit.train(cluster, model="mlp", strategy="ddp", global_batch=256, steps=10)
        report = labkit.train(cluster, model="gpt", layout=labkit.Layout(fsdp=2, tp=2))

    ``config``: a ``TrainConfig``, or a ``Run`` already resolved for this cluster (by
    ``checked``: a sweep resolves its cells once, up front). ``fields`` are those of
    ``TrainConfig`` (model, strategy or layout and its engine
    choices schedule, dp_kind, tables, tp_kind, cp_engine, global_batch,
    steps, lr, optimizer, precision, seed, micro_batches, bucket_cap_mb, return_weights,
    grad_accumulation, activation_checkpointing, checkpoint_dir, checkpoint_every,
    profile). With
    ``checkpoint_dir`` the run saves sharded checkpoints there and, when it holds one of this
    run, resumes from the newest good one (the report's records then cover every step; those
    done before are marked ``from_checkpoint``). With ``profile`` each rank writes a
    ``torch.profiler`` trace of its timed steps into that folder (``report.traces``).
    ``memory_per_device`` overrides the cluster's capacity for this run. The run is resolved
    and checked against the cluster and the model once, before any rank runs; the ranks, the
    estimate and the report read that resolved run. Raises ``DeviceOOM``
    when a rank runs out of memory; when the model state alone was more than the capacity
    (worked out before the run), the error also says so, and what would fit. ``estimate``:
    trace the peak per rank beside the measurement (``labkit.estimate_memory``).
    """
    run = checked(cluster, config, **fields)
    check_checkpointing(run)  # may warn or raise
    saved, override = cluster.memory_per_device, memory_per_device is not _UNSET
    if override:
        cluster.memory_per_device = memory_per_device
    note = model_state_note(run, cluster.memory_per_device)
    lock = None
    try:
        lock = lock_checkpoints(run.config.checkpoint_dir)  # refused if another run holds it
        ranks = cluster.run(train_on_rank, run.to_dict(), timeout=timeout)
    except DeviceOOM as oom:
        if note:
            oom.explain(note, ADVICE)
        raise
    finally:  # only a cap this call changed: another thread's run may have set one since
        if override:
            cluster.memory_per_device = saved
        if lock is not None:
            lock.release()
    est = _estimate(run) if estimate else None
    report = TrainReport(run, ranks.oversubscribed, list(ranks), est)
    report.extra["shared_gpus"] = ranks.shared_gpus  # several ranks on one GPU: say so
    return report


def _estimate(run: Run) -> dict | None:
    """The traced estimate, or None with a warning: a run that worked is never lost to it."""
    try:
        return estimate_memory(run).to_dict()
    except Exception as exc:  # noqa: BLE001 - any tracer failure; the run's results stand
        warnings.warn(f"the run finished but its memory estimate failed ({type(exc).__name__}: "
                      f"{exc}); the report has no estimate", RuntimeWarning, stacklevel=3)
        return None
