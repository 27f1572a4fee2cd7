"""labkit: run distributed training for real from a notebook, and see why it pays.

    import labkit
    cluster = labkit.Cluster(2)                                   # two ranks
    report = labkit.train(cluster, labkit.TrainConfig(...), strategy="ddp")

The names below are the public API; each loads on first use (PEP 562), so ``import labkit``
costs almost nothing and a rank or the command line never imports matplotlib. The lessons'
helpers are reached the same way: ``labkit.plots``, ``labkit.widgets``, ``labkit.check``,
``labkit.evidence``, ``labkit.models``, ``labkit.plan``, ``labkit.classroom``, and a few
functions the notebooks call by name (``labkit.sweep_boundary``, ``labkit.scaling_sweep``...).
``%load_ext labkit`` adds the ``%%ranks cluster`` cell magic (a cell run on every rank).
``docs/architecture.md`` draws the layers behind them.
"""

from __future__ import annotations

import importlib
import threading

__version__ = "0.2.0"  # the package's version (pyproject.toml reads it here)

_PUBLIC = {
    "Cluster": "labkit.runtime.cluster.cluster",
    "ClusterError": "labkit.runtime.cluster.errors",
    "RankError": "labkit.runtime.cluster.errors",
    "RunTimeout": "labkit.runtime.cluster.errors",
    "DeviceOOM": "labkit.runtime.memory.oom",
    "Layout": "labkit.training.layout.layout",
    "TrainConfig": "labkit.training.config",
    "TrainReport": "labkit.training.report",
    "train": "labkit.training.api",
    "script": "labkit.training.script",
    "estimate_memory": "labkit.training.estimate",
    "format_bytes": "labkit.runtime.memory.units",
    "parse_bytes": "labkit.runtime.memory.units",
}

_MORE = {
    "RankContext": "labkit.runtime.cluster.rank",
    "RunResults": "labkit.runtime.cluster.runs",
    "OversubscriptionWarning": "labkit.runtime.cluster.errors",
    "RanksRestartedWarning": "labkit.runtime.cluster.errors",
    "STRATEGIES": "labkit.training.layout.presets",
    "MemoryEstimate": "labkit.training.estimate",
    "StepRecord": "labkit.training.step.record",
    "CollectiveTimings": "labkit.runtime.comm.timing",
    "time_all_reduce": "labkit.runtime.comm.timing",
    "model_state_bytes": "labkit.runtime.costs",
    "ring_all_reduce_seconds": "labkit.runtime.costs",
    "record_results": "labkit.lessons.show.results",
    "BoundaryMap": "labkit.lessons.memory_wall.boundary",
    "sweep_boundary": "labkit.lessons.memory_wall.boundary",
    "BatchSweep": "labkit.lessons.data_parallel.batch_sweep",
    "batch_sweep": "labkit.lessons.data_parallel.batch_sweep",
    "ScalingResult": "labkit.lessons.data_parallel.scaling",
    "scaling_sweep": "labkit.lessons.data_parallel.scaling",
    "ShardingComparison": "labkit.lessons.sharding.compare",
    "compare_sharding": "labkit.lessons.sharding.compare",
}

_MODULES = {
    "plots": "labkit.lessons.plots",
    "widgets": "labkit.lessons.widgets",
    "check": "labkit.lessons.check",
    "evidence": "labkit.lessons.data_parallel.evidence",
    "costs": "labkit.runtime.costs",
}

__all__ = sorted(_PUBLIC)

# One name loads at a time. Python takes a submodule's import lock before its package's, so
# two threads loading two names for the first time (say ``train`` and ``TrainReport``) can
# each hold what the other waits for, and one of them gets a ``_DeadlockError`` or a
# half-imported module. No labkit module reads a name of this one while it is imported, so
# this lock is never awaited by an import that holds a module's lock.
_LOADING = threading.RLock()


def __getattr__(name: str):
    with _LOADING:
        if name in globals():  # another thread loaded it while this one waited
            return globals()[name]
        value = _load(name)
        globals()[name] = value
    return value


# What a rank runs for ``labkit.train``: its zygote imports them once (about 1 s of CPU that
# each rank would otherwise spend on its first job).
_RANKS_PRELOAD = ("labkit.models", "labkit.training.loop")


def _load(name: str):
    if name == "Cluster":
        from labkit.runtime.cluster.launcher import preload_in_ranks

        preload_in_ranks(*_RANKS_PRELOAD)
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _PUBLIC or name in _MORE:
        value = getattr(importlib.import_module(_PUBLIC.get(name) or _MORE[name]), name)
    else:
        if not name.isidentifier():  # getattr(labkit, "runtime.cluster") is no attribute
            raise AttributeError(f"module 'labkit' has no attribute {name!r}")
        try:
            value = importlib.import_module(f"labkit.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"labkit.{name}":
                raise
            raise AttributeError(f"module 'labkit' has no attribute {name!r}") from None
    return value


def load_ipython_extension(ipython) -> None:
    """``%load_ext labkit`` in a notebook: the ``%%ranks cluster`` cell magic, which runs a
    cell on every rank (``labkit/runtime/cluster/magic.py``; IPython loads only then)."""
    from labkit.runtime.cluster.magic import load_ipython_extension as load

    load(ipython)


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, *_MORE, *_MODULES})
