"""Pipelines, interactively: sliders for stages and micro-batches redraw the measured Gantt
chart and its bubble beside (p-1)/(m+p-1)."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.lessons.pipeline.plots import plot_gantt
from labkit.training.api import train


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
            with self.cluster.resized(stages):  # and back to the rank count it had
                self._reports[key] = train(self.cluster, self.config, strategy=self.schedule,
                                           micro_batches=micro_batches)
        return self._reports[key]

    def figure(self, stages: int, micro_batches: int) -> Figure:
        return plot_gantt(self.report(stages, micro_batches))

    def widget(self, stages: int | None = None, micro_batches: int | None = None,
               background: bool = True):
        from labkit.lessons.show.controls import gpu_count_slider, micro_batches_slider
        from labkit.lessons.show.render import slider_panel

        stage_slider = gpu_count_slider(self.stage_options, stages)
        stage_slider.description = "stages"
        micro = micro_batches_slider(self.micro_options, micro_batches)
        box = slider_panel([stage_slider, micro], self.figure,
                           lambda p, m: f"running {p} stages, {m} micro-batches",
                           background=background)
        box.stages, box.micro_batches = stage_slider, micro
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
