"""The capacity factor, run by run: for each factor the MoE GPT trains for real and keeps the
tokens each expert took and dropped, and the router's choices per step (notebook 08's
capacity slider). Runs are cached per factor, and a cached run is served only to the same
configuration on the same ranks and capacity (``labkit/training/runcache.py``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit.parallel.expert.observe import dropped_by_expert, dropped_tokens, expert_load
from labkit.training.runcache import RunCache


@dataclass
class CapacityRun:
    """One capacity factor trained for real (every count summed over the ranks)."""

    factor: float
    capacity: int  # slots per expert per sequence: MoEGPTConfig.capacity()
    load: list[list[list[int]]]  # [step][layer][expert]: tokens each expert took
    dropped: list[list[int]]  # [layer][expert]: choices over capacity, all steps
    dropped_share: float  # of every choice the router made, all layers and steps
    global_batch: int

    def taken(self, layer: int = 0) -> list[int]:
        """[expert]: tokens the expert took in ``layer``, all steps."""
        return [sum(step[layer][e] for step in self.load) for e in range(len(self.load[0][layer]))]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_capacity(cluster, config, layout, factor: float) -> CapacityRun:
    """Train ``config`` (a TrainConfig of the MoE GPT) under ``layout`` at ``factor``."""
    from labkit.training import train

    model = dataclasses.replace(config.model, capacity_factor=float(factor))
    with cluster.resized(layout.size):
        report = train(cluster, config.replace(model=model, layout=layout), estimate=False)
    routed = config.global_batch * model.seq_len * model.top_k * model.n_layers * report.steps
    return CapacityRun(float(factor), model.capacity(), expert_load(report),
                       dropped_by_expert(report), sum(dropped_tokens(report)) / routed,
                       config.global_batch)


class CapacityExplorer:
    """Runs by capacity factor, trained on first use and cached for this configuration,
    layout (its rank count), device kind and capacity per device (changed since: trained
    again)."""

    def __init__(self, cluster, config, layout):
        if config.model.name != "moe_gpt":
            raise ValueError(f"the capacity factor belongs to a mixture of experts: give a "
                             f"TrainConfig of MoEGPTConfig, not {config.model.name!r}")
        self.cluster, self.config, self.layout = cluster, config, layout
        self._cache: RunCache[CapacityRun] = RunCache()

    def _base(self) -> str:
        model = dataclasses.replace(self.config.model, capacity_factor=1.0)
        return repr((self.config.replace(model=model), self.layout, self.cluster.device,
                     self.cluster.memory_per_device))  # the run resizes to the layout's ranks

    def run(self, factor: float) -> CapacityRun:
        return self._cache.get(self._base(), float(factor), lambda: run_capacity(
            self.cluster, self.config, self.layout, factor))

    def message(self, factor: float) -> str:
        run = self.run(factor)
        dropped = sum(sum(row) for row in run.dropped)
        return (f"capacity factor {run.factor:g}: {run.capacity} slots per expert per "
                f"sequence; {dropped:,} choices dropped over capacity, "
                f"{run.dropped_share:.1%} of all (measured here)")
