"""Data parallelism, interactively: a GPU-count slider and a model-size slider; each new
setting is trained for real (cached), and the step-time breakdown and speedup redraw."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.cluster.hardware import physical_cores
from labkit.models import count_parameters, sized
from labkit.plots.scaling import plot_speedup, plot_step_breakdown
from labkit.train.api import train
from labkit.train.config import TrainConfig
from labkit.train.scaling import ScalingPoint, ScalingResult, measure_bus_bandwidth
from labkit.train.scaling import ring_all_reduce_seconds as ring_seconds


class ScalingExplorer:
    """Measured points per (model size, world size), trained on first use."""

    def __init__(self, cluster, model: str = "mlp", sizes=(1e6, 4e6), world_sizes=(1, 2, 4),
                 strategy: str = "ddp", global_batch: int = 128, steps: int = 4,
                 comm_model=None):
        self.cluster, self.model, self.strategy = cluster, model, strategy
        self.comm_model = comm_model  # an AlphaBeta fitted over sizes: the ring formula's terms
        self.world_sizes = sorted(world_sizes)
        self.configs = {count_parameters(c.model): c for c in (
            TrainConfig(model=sized(model, int(float(s))), strategy=strategy,
                        global_batch=global_batch, steps=steps) for s in sizes)}
        self.sizes = sorted(self.configs)
        self._points: dict[tuple[int, int], ScalingPoint] = {}
        self._bandwidth: float = comm_model.bandwidth if comm_model is not None else 0.0

    def point(self, params: int, world_size: int) -> ScalingPoint:
        key = (params, world_size)
        if key not in self._points:
            with self.cluster.resized(world_size):  # and back to the rank count it had
                report = train(self.cluster, self.configs[params], estimate=False)
                if world_size > 1 and not self._bandwidth:
                    self._bandwidth = measure_bus_bandwidth(self.cluster,
                                                            report.comm_bytes_per_step)
            split = report.split()
            self._points[key] = ScalingPoint(
                world_size, report.config.global_batch, split["step_s"], split["compute_s"],
                split["comm_s"], split["comm_busy_s"], report.samples_per_s,
                report.comm_bytes_per_step, 0.0, report.oversubscribed, report.losses)
        point = self._points[key]
        if self.comm_model is not None:
            point.predicted_comm_s = (self.comm_model.on_group(world_size).predict(
                point.comm_bytes) if world_size > 1 else 0.0)
        elif self._bandwidth:
            point.predicted_comm_s = ring_seconds(point.comm_bytes, world_size, self._bandwidth)
        return point

    def result(self, params: int, world_size: int) -> ScalingResult:
        """Every world size up to ``world_size`` (1 included, the baseline), measured."""
        worlds = [n for n in self.world_sizes if n <= world_size] or [1]
        points = [self.point(params, n) for n in sorted({1, *worlds})]
        return ScalingResult(self.model, params, self.strategy, "strong", self._bandwidth,
                             physical_cores(), points)

    def figure(self, params: int, world_size: int) -> Figure:
        result = self.result(params, world_size)
        fig = Figure(figsize=(11, 3.8), layout="constrained")
        left, right = fig.subplots(1, 2)
        plot_step_breakdown(result, ax=left)
        plot_speedup(result, ax=right)
        return fig

    def widget(self, params: int | None = None, world_size: int | None = None,
               background: bool = True):
        from labkit.widgets.controls import gpu_count_slider, model_size_slider
        from labkit.widgets.render import slider_panel

        gpus = gpu_count_slider(self.world_sizes, world_size)
        size = model_size_slider(self.sizes, params)
        box = slider_panel([gpus, size], lambda n, p: self.figure(p, n),
                           lambda n, p: f"measuring {n} GPU(s), {p / 1e6:.2g}M parameters",
                           background=background)
        box.gpus, box.size = gpus, size
        return box


def scaling_explorer(cluster, model: str = "mlp", sizes=(1e6, 4e6), world_sizes=(1, 2, 4),
                     size: float | None = None, world_size: int | None = None,
                     interactive: bool = True, **options):
    """GPU-count and model-size sliders over real runs; headless, the Figure for the given
    ``size`` and ``world_size``."""
    explorer = ScalingExplorer(cluster, model, sizes, world_sizes, **options)
    chosen = explorer.sizes[0] if size is None else min(explorer.sizes,
                                                        key=lambda p: abs(p - size))
    world = world_size or explorer.world_sizes[-1]
    return explorer.widget(chosen, world) if interactive else explorer.figure(chosen, world)
