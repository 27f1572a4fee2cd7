"""Tensor parallelism, interactively: a TP-degree slider; each degree trains the same model
for real (cached), and the memory of a device and the traffic per step redraw side by side."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.lessons.tensor_parallel.plots import plot_tp_degrees
from labkit.lessons.tensor_parallel.tradeoffs import check_tp_degree
from labkit.training.api import train
from labkit.training.config import TrainConfig


def _strategy(degree: int) -> str:
    return "tp" if degree > 1 else "single"


class TensorParallelExplorer:
    """Measured runs of one model per TP degree (degree 1: one device, ``single``), trained on
    first use without a memory cap, so that even the degrees that would not fit are measured;
    the cluster's capacity is drawn as a line.

    ``reports`` may hand over runs already made (``{degree: TrainReport}``), if they trained
    this same config with that many ranks; they are used instead of training again.
    """

    def __init__(self, cluster, config: TrainConfig, degrees=(1, 2, 4),
                 reports: dict | None = None):
        self.cluster, self.config = cluster, config.replace(strategy="single")
        self.degrees = sorted(degrees)
        for degree in self.degrees:  # bad input fails here, before any process starts
            check_tp_degree(config.model, degree)
        self.capacity = cluster.memory_per_device
        self._reports: dict[int, object] = {}
        for degree, report in (reports or {}).items():
            self.add(degree, report)

    def add(self, degree: int, report) -> None:
        """Use ``report`` as the measured run for ``degree``."""
        expected = self.config.replace(strategy=_strategy(degree))
        if report.config != expected or report.world_size != degree:
            raise ValueError(f"the report for degree {degree} trained another run "
                             f"({report.config.strategy} on {report.world_size} ranks, or "
                             "another config): pass reports of this explorer's config only")
        self._reports[degree] = report

    def report(self, degree: int):
        if degree not in self._reports:
            with self.cluster.resized(degree):  # and back to the rank count it had
                self._reports[degree] = train(self.cluster, self.config,
                                              strategy=_strategy(degree),
                                              memory_per_device=None, estimate=False)
        return self._reports[degree]

    def result(self, degree: int) -> dict:
        """Every degree up to ``degree`` (1 included, the baseline), measured."""
        return {d: self.report(d) for d in sorted({1, *(d for d in self.degrees if d <= degree)})}

    def figure(self, degree: int) -> Figure:
        fig = plot_tp_degrees(self.result(degree), self.capacity)
        shown = f"TP degrees 1 to {degree}" if degree > 1 else "TP degree 1 (one device)"
        fig.suptitle(f"{self.config.model.name}, global batch {self.config.global_batch}: "
                     f"{shown}", fontsize=9)
        return fig

    def widget(self, degree: int | None = None, background: bool = True):
        from labkit.lessons.show.controls import gpu_count_slider
        from labkit.lessons.show.render import slider_panel

        slider = gpu_count_slider(self.degrees, degree)
        slider.description = "TP degree"
        box = slider_panel([slider], self.figure, lambda d: f"training at TP degree {d}",
                           background=background)
        box.slider = slider
        return box


def tp_explorer(cluster, config: TrainConfig, degrees=(1, 2, 4), degree: int | None = None,
                reports: dict | None = None, interactive: bool = True):
    """A TP-degree slider over real runs of ``config``'s model; headless, the Figure for
    ``degree`` (default: the largest)."""
    explorer = TensorParallelExplorer(cluster, config, degrees, reports)
    degree = degree or explorer.degrees[-1]
    return explorer.widget(degree) if interactive else explorer.figure(degree)
