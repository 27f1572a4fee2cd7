"""Pipelines, interactively: sliders for stages and micro-batches redraw the measured Gantt
chart and its bubble beside (p-1)/(m+p-1)."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.plots.pipeline import plot_gantt
from labkit.train.api import train


class PipelineExplorer:
    """Measured pipeline runs per (stages, micro-batches), trained on first use."""

    def __init__(self, cluster, config, stage_options=(2, 4), micro_options=(1, 2, 4, 8),
                 schedule: str = "gpipe"):
        self.cluster, self.config, self.schedule = cluster, config, schedule
        self.stage_options, self.micro_options = sorted(stage_options), sorted(micro_options)
        self._reports: dict[tuple[int, int], object] = {}

    def report(self, stages: int, micro_batches: int):
        key = (stages, micro_batches)
        if key not in self._reports:
            if self.cluster.world_size != stages:
                self.cluster.resize(stages)  # only when the stage count changes
            self._reports[key] = train(self.cluster, self.config, strategy=self.schedule,
                                       micro_batches=micro_batches)
        return self._reports[key]

    def figure(self, stages: int, micro_batches: int) -> Figure:
        return plot_gantt(self.report(stages, micro_batches))

    def widget(self, stages: int | None = None, micro_batches: int | None = None,
               background: bool = True):
        import ipywidgets as widgets

        from labkit.widgets.controls import gpu_count_slider, micro_batches_slider
        from labkit.widgets.render import LatestOnly, show_figure

        stage_slider = gpu_count_slider(self.stage_options, stages)
        stage_slider.description = "stages"
        micro = micro_batches_slider(self.micro_options, micro_batches)
        plot, status = widgets.Output(), widgets.HTML()

        def draw(setting: tuple[int, int]) -> None:
            status.value = f"<i>running {setting[0]} stages, {setting[1]} micro-batches ...</i>"
            try:
                show_figure(plot, self.figure(*setting))
                status.value = ""
            except Exception as exc:  # noqa: BLE001 - a widget shows its errors, never hangs
                status.value = f"<span style='color:firebrick'>{type(exc).__name__}: {exc}"

        runner = LatestOnly(draw, background)
        for control in (stage_slider, micro):
            control.observe(lambda change: runner.submit((stage_slider.value, micro.value)),
                            names="value")
        draw((stage_slider.value, micro.value))
        box = widgets.VBox([widgets.HBox([stage_slider, micro]), status, plot])
        box.stages, box.micro_batches, box.plot, box.runner = stage_slider, micro, plot, runner
        return box


def pipeline_explorer(cluster, config, stage_options=(2, 4), micro_options=(1, 2, 4, 8),
                      schedule: str = "gpipe", stages: int | None = None,
                      micro_batches: int | None = None, interactive: bool = True):
    """Stage and micro-batch sliders over real pipeline runs; headless, the Gantt chart for
    the given ``stages`` and ``micro_batches``."""
    explorer = PipelineExplorer(cluster, config, stage_options, micro_options, schedule)
    stages = stages or explorer.stage_options[0]
    micro_batches = micro_batches or explorer.micro_options[-1]
    if interactive:
        return explorer.widget(stages, micro_batches)
    return explorer.figure(stages, micro_batches)
