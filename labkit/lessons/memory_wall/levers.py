"""Before buying more GPUs: what one device's memory levers save and cost, each a real run.

A lever is a set of ``TrainConfig`` fields (``activation_checkpointing``, ``precision``,
``grad_accumulation``). ``try_levers`` trains the same config plain and with each lever on the
same cluster, under its capacity, and keeps per run the measured peak by category, the
estimator's peak, the median step time (measured here) and, when it did not fit, the
``DeviceOOM``'s numbers. ``LeverPicker`` caches runs by lever, for the notebook's picker.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.runtime.memory.oom import DeviceOOM
from labkit.training.api import train
from labkit.training.config import TrainConfig
from labkit.training.runcache import RunCache

PLAIN: dict = {}
LEVERS = {"activation checkpointing": {"activation_checkpointing": True},
          "accumulation x4": {"grad_accumulation": 4},
          "bf16": {"precision": "bf16"},
          "mixed precision": {"precision": "mixed"}}


@dataclass
class LeverRun:
    """One configuration trained for real: peak by category at the peak, or the OOM."""

    name: str
    options: dict
    at_peak: dict[str, int]
    peak_bytes: int
    estimated_bytes: int
    step_s: float | None  # median step, measured here; None when it ran out of memory
    category_peaks: dict[str, int]  # each category's own highest value (not at one moment)
    oom: dict | None = None
    base: str = ""  # the config without its levers and the cluster (``base_of``)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def lever_name(options: dict) -> str:
    """A short label: "plain", or the levers on ("checkpointing + bf16 + accumulation x4")."""
    parts = []
    if options.get("activation_checkpointing"):
        parts.append("checkpointing")
    if options.get("precision", "fp32") != "fp32":
        parts.append(options["precision"])
    if options.get("grad_accumulation", 1) > 1:
        parts.append(f"accumulation x{options['grad_accumulation']}")
    return " + ".join(parts) or "plain"


def levers_of(config: TrainConfig) -> dict:
    """The levers ``config`` really trains with (its own settings included)."""
    return {"activation_checkpointing": config.activation_checkpointing,
            "precision": config.precision, "grad_accumulation": config.grad_accumulation}


def base_of(config: TrainConfig, cluster) -> str:
    """What a run depends on besides its levers (the config's other fields, the ranks and
    their capacity): two runs compare only on the same base."""
    plain = config.replace(activation_checkpointing=False, precision="fp32", grad_accumulation=1)
    return repr((plain, cluster.world_size, cluster.memory_per_device))


def run_lever(cluster, config: TrainConfig, options: dict) -> LeverRun:
    """Train ``config`` with ``options`` on ``cluster`` (its capacity applies). The run keeps
    the levers it trained with, the config's own included (``options`` may change some)."""
    changed = config.replace(**options)
    ran, base = levers_of(changed), base_of(changed, cluster)
    try:
        report = train(cluster, changed)
    except DeviceOOM as oom:
        total = sum(oom.breakdown.values())
        return LeverRun(lever_name(ran), ran, dict(oom.breakdown), total, 0, None, {},
                        {"requested": oom.requested_bytes, "capacity": oom.capacity_bytes},
                        base)
    memory = report.ranks[0]["memory"]
    return LeverRun(lever_name(ran), ran, dict(memory["at_peak"]),
                    memory["peak_bytes"], report.estimate["peak_bytes"], report.median_step_s,
                    dict(memory["category_peaks"]), None, base)


def try_levers(cluster, config: TrainConfig, levers: dict | None = None) -> list[LeverRun]:
    """The plain run, then one run per lever (``{name: TrainConfig fields}``)."""
    levers = LEVERS if levers is None else levers
    return [run_lever(cluster, config, PLAIN)] + [run_lever(cluster, config, options)
                                                  for options in levers.values()]


class LeverPicker:
    """Runs by lever combination, trained on first use and cached for this config, the
    cluster's ranks and capacity as they are when picked (``runs`` given to seed the cache
    must have been trained with the same config, on the same ranks and capacity)."""

    def __init__(self, cluster, config: TrainConfig, runs: list[LeverRun] = ()):
        self.cluster, self.config = cluster, config
        stale = [run.name for run in runs if run.base != base_of(config, cluster)]
        if stale:
            raise ValueError(f"runs {stale} were trained with another configuration (or on "
                             f"another cluster or capacity) than this picker's; pass the runs "
                             f"of try_levers(cluster, config) for the same both, or none")
        self._cache: RunCache[LeverRun] = RunCache()
        for run in runs:
            self._cache.put(run.base, self._key(run.options), run)

    @staticmethod
    def _key(options: dict) -> tuple:
        return (bool(options.get("activation_checkpointing", False)),
                options.get("precision", "fp32"), int(options.get("grad_accumulation", 1)))

    def run(self, checkpointing: bool, precision: str, accumulation: int) -> LeverRun:
        options = {"activation_checkpointing": checkpointing, "precision": precision,
                   "grad_accumulation": accumulation}
        return self._cache.get(base_of(self.config, self.cluster), self._key(options),
                               lambda: run_lever(self.cluster, self.config, options))
