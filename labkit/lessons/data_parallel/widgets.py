"""Data parallelism, interactively: GPU-count, model-size and batch sliders; each new setting
is trained for real (cached), and the step-time breakdown and speedup redraw."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.lessons.data_parallel.plots import plot_speedup, plot_step_breakdown
from labkit.lessons.data_parallel.scaling import (
    ScalingPoint,
    ScalingResult,
    measure_bus_bandwidth,
    point_of,
    predicted_comm_s,
    reused,
)
from labkit.models import count_parameters, sized
from labkit.runtime.cluster.hardware import physical_cores
from labkit.training.api import train
from labkit.training.config import TrainConfig


class ScalingExplorer:
    """Measured points per (model size, global batch, world size), trained on first use, or
    taken from ``measured`` (reports of runs already made,
    ``labkit.lessons.data_parallel.scaling.reused``)."""

    def __init__(self, cluster, model: str = "mlp", sizes=(1e6, 4e6), world_sizes=(1, 2, 4),
                 strategy: str = "ddp", global_batch: int = 128, steps: int = 4,
                 comm_model=None, batches=None, measured=()):
        self.cluster, self.model, self.strategy = cluster, model, strategy
        self.comm_model = comm_model  # an AlphaBeta fitted over sizes: the ring formula's terms
        self.world_sizes = sorted(world_sizes)
        self.batches = sorted(batches or [global_batch])
        self.measured = list(measured)
        self.configs = {count_parameters(c.model): c for c in (
            TrainConfig(model=sized(model, int(float(s))), strategy=strategy,
                        global_batch=global_batch, steps=steps) for s in sizes)}
        self.sizes = sorted(self.configs)
        self._points: dict[tuple[int, int, int], ScalingPoint] = {}
        self._bandwidth: float = comm_model.bandwidth if comm_model is not None else 0.0

    def point(self, params: int, world_size: int, batch: int | None = None) -> ScalingPoint:
        batch = batch or self.batches[0]
        key = (params, batch, world_size)
        if key not in self._points:
            config = self.configs[params].replace(global_batch=batch)
            report = reused(self.measured, world_size, config)
            if report is None:
                with self.cluster.resized(world_size):  # and back to the rank count it had
                    report = train(self.cluster, config, estimate=False)
            if world_size > 1 and not self._bandwidth:
                with self.cluster.resized(world_size):
                    self._bandwidth = measure_bus_bandwidth(self.cluster,
                                                            report.comm_bytes_per_step)
            self._points[key] = point_of(report)
        point = self._points[key]
        point.predicted_comm_s = predicted_comm_s(point, self.comm_model, self._bandwidth)
        return point

    def result(self, params: int, world_size: int, batch: int | None = None) -> ScalingResult:
        """Every world size up to ``world_size`` (1 included, the baseline), measured."""
        worlds = [n for n in self.world_sizes if n <= world_size] or [1]
        points = [self.point(params, n, batch) for n in sorted({1, *worlds})]
        return ScalingResult(self.model, params, self.strategy, "strong", self._bandwidth,
                             physical_cores(), points)

    def figure(self, params: int, world_size: int, batch: int | None = None) -> Figure:
        result = self.result(params, world_size, batch)
        fig = Figure(figsize=(11, 3.8), layout="constrained")
        left, right = fig.subplots(1, 2)
        plot_step_breakdown(result, ax=left, title=(
            f"{result.model} ({params / 1e6:.2g}M), batch {batch or self.batches[0]}, "
            f"{result.strategy}: measured here"))
        plot_speedup(result, ax=right)
        return fig

    def widget(self, params: int | None = None, world_size: int | None = None,
               background: bool = True, batch: int | None = None):
        from labkit.lessons.show.controls import gpu_count_slider, model_size_slider
        from labkit.lessons.show.render import slider_panel

        gpus = gpu_count_slider(self.world_sizes, world_size)
        size = model_size_slider(self.sizes, params)
        batches = _batch_slider(self.batches, batch)
        box = slider_panel([gpus, size, batches], lambda n, p, b: self.figure(p, n, b),
                           lambda n, p, b: f"measuring {n} GPU(s), {p / 1e6:.2g}M parameters, "
                                           f"batch {b}", background=background)
        box.gpus, box.size, box.batch = gpus, size, batches
        return box


def _batch_slider(batches, value: int | None = None):
    """The global batch: samples per step, split over the devices."""
    import ipywidgets as widgets

    return widgets.SelectionSlider(options=list(batches), value=value or batches[0],
                                   description="batch", continuous_update=False,
                                   disabled=len(batches) == 1)


def scaling_explorer(cluster, model: str = "mlp", sizes=(1e6, 4e6), world_sizes=(1, 2, 4),
                     size: float | None = None, world_size: int | None = None,
                     interactive: bool = True, **options):
    """GPU-count, model-size and batch sliders over real runs (``batches``: the global
    batches offered, ``global_batch`` the first shown; ``measured``: runs already made, shown
    where they match a setting); headless, the Figure for the given ``size``, ``world_size``
    and ``global_batch``."""
    explorer = ScalingExplorer(cluster, model, sizes, world_sizes, **options)
    chosen = explorer.sizes[0] if size is None else min(explorer.sizes,
                                                        key=lambda p: abs(p - size))
    world = world_size or explorer.world_sizes[-1]
    batch = options.get("global_batch") if options.get("global_batch") in explorer.batches \
        else explorer.batches[0]
    if interactive:
        return explorer.widget(chosen, world, batch=batch)
    return explorer.figure(chosen, world, batch)
