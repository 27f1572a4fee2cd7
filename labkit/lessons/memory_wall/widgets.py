"""The memory wall, interactively: pick a model size, train it for real under a capacity, see
the measured breakdown beside the estimate, and the OOM when it does not fit."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.lessons.memory_wall.plots import plot_memory_bars
from labkit.models import count_parameters, sized
from labkit.runtime.memory.oom import DeviceOOM
from labkit.runtime.memory.units import format_bytes, parse_bytes
from labkit.training import TrainConfig, train
from labkit.training.estimate import estimate_memory


def _label(params: int) -> str:
    return f"{params / 1e6:.2g}M params"


class MemoryExplorer:
    """Results per model size, computed on first use and cached."""

    def __init__(self, cluster, model: str = "gpt", sizes=(2e5, 5e5, 1e6, 2e6),
                 memory_per_device="32MiB", strategy: str = "single", global_batch: int = 16,
                 steps: int = 2):
        self.cluster, self.model = cluster, model
        self.capacity = parse_bytes(memory_per_device)
        self.configs = [TrainConfig(model=sized(model, int(float(s))), strategy=strategy,
                                    global_batch=global_batch, steps=steps) for s in sizes]
        self.sizes = [count_parameters(c.model) for c in self.configs]
        self._cache: dict[tuple[int, int], dict] = {}

    def result(self, params: int) -> dict:
        """Measured (or OOM) and estimated bars for the model of ``params`` parameters."""
        key = (params, self.cluster.world_size)
        if key not in self._cache:
            config = self.configs[self.sizes.index(params)]
            estimate = estimate_memory(config, self.cluster.world_size)
            try:
                report = train(self.cluster, config, memory_per_device=self.capacity,
                               estimate=False)
                memory = report.ranks[0]["memory"]
                measured = {"label": "measured", "breakdown": memory["at_peak"], "oom": False}
                message = (f"Fits: peak {format_bytes(memory['peak_bytes'])} during "
                           f"{memory['peak_phase']}, of {format_bytes(self.capacity)}.")
            except DeviceOOM as oom:
                measured = {"label": "measured", "breakdown": oom.breakdown, "oom": True,
                            "requested": oom.requested_bytes}
                message = f"DeviceOOM: {oom}"
            est = {"label": "estimated", "breakdown": estimate.at_peak, "oom": False}
            self._cache[key] = {"params": params, "measured": measured, "estimated": est,
                                "message": message, "fits": not measured["oom"],
                                "estimated_bytes": estimate.peak_bytes}
        return self._cache[key]

    def figure(self, params: int) -> Figure:
        result = self.result(params)
        return plot_memory_bars([result["measured"], result["estimated"]], self.capacity,
                                title=f"{self.model}, {_label(params)}, "
                                      f"{self.cluster.world_size} device(s)")

    def widget(self, params: int | None = None, background: bool = True):
        from labkit.lessons.show.controls import model_size_slider
        from labkit.lessons.show.render import slider_panel

        slider = model_size_slider(self.sizes, params)
        box = slider_panel([slider], self.figure, lambda p: f"training {_label(p)}",
                           lambda p: self.result(p)["message"], background)
        box.slider = slider
        return box


def memory_explorer(cluster, model: str = "gpt", sizes=(2e5, 5e5, 1e6, 2e6),
                    memory_per_device="32MiB", size: float | None = None,
                    interactive: bool = True, **options):
    """A model-size slider over real training runs; headless, the Figure for ``size``."""
    explorer = MemoryExplorer(cluster, model, sizes, memory_per_device, **options)
    chosen = explorer.sizes[0] if size is None else min(
        explorer.sizes, key=lambda p: abs(p - size))
    return explorer.widget(chosen) if interactive else explorer.figure(chosen)
