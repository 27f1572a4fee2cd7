"""Composed layouts, interactively: one slider per mesh dimension (only divisors of the rank
count offered); dp takes whatever the others leave, as torchtitan's ``-1`` degree does. Each
layout trains for real under the cluster's cap (cached), and its memory per rank, step time
per dimension and loss on top of one device's redraw."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.lessons.layouts.plots import plot_layout_run
from labkit.runtime.memory.oom import DeviceOOM
from labkit.training.api import train
from labkit.training.config import TrainConfig
from labkit.training.layout.layout import Layout

SLIDER_DIMS = ("fsdp", "tp", "pp")  # dp fills the rest


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_from(world_size: int, fsdp: int, tp: int, pp: int) -> Layout:
    """The layout with these degrees and dp = what is left of ``world_size``."""
    split = fsdp * tp * pp
    if world_size % split:
        raise ValueError(f"fsdp x tp x pp = {split} does not divide the {world_size} ranks: "
                         "lower one of the sliders")
    return Layout(dp=world_size // split, fsdp=fsdp, tp=tp, pp=pp)


class LayoutExplorer:
    """Runs of ``config`` per layout on ``cluster`` (its rank count, its cap), trained on
    first use; one device's run (no cap) is the loss reference. ``reports`` ({Layout:
    TrainReport}) hands over runs already made with this config."""

    def __init__(self, cluster, config: TrainConfig, reports: dict | None = None,
                 reference=None):
        self.cluster, self.config = cluster, config
        self.world_size = cluster.world_size
        self.capacity = cluster.memory_per_device
        self._runs: dict[Layout, tuple] = {k: (v, None) for k, v in (reports or {}).items()}
        self._reference = reference

    def config_for(self, layout: Layout) -> TrainConfig:
        # a pipeline needs micro-batches (1F1B: at least one per stage): two per stage where
        # they split a data rank's samples, else the fewest (>= pp) that do
        micro = self.config.micro_batches
        if layout.pp > 1:
            samples = self.config.global_batch // layout.data_size
            fits = [m for m in range(layout.pp, samples + 1) if samples % m == 0]
            micro = 2 * layout.pp if 2 * layout.pp in fits or not fits else fits[0]
        return self.config.replace(layout=layout, micro_batches=micro)

    def reference(self):
        if self._reference is None:
            with self.cluster.resized(1):
                self._reference = train(self.cluster, self.config.replace(strategy="single"),
                                        memory_per_device=None, estimate=False)
        return self._reference

    def run(self, layout: Layout) -> tuple:
        """(report, None) or (None, DeviceOOM) for ``layout``."""
        if layout not in self._runs:
            try:
                self._runs[layout] = (train(self.cluster, self.config_for(layout),
                                            estimate=False), None)
            except DeviceOOM as oom:
                self._runs[layout] = (None, oom)
        return self._runs[layout]

    def figure(self, fsdp: int, tp: int, pp: int) -> Figure:
        layout = layout_from(self.world_size, fsdp, tp, pp)
        report, oom = self.run(layout)
        fig = plot_layout_run(report, self.reference(), self.capacity, oom)
        fig.suptitle(f"{layout} on {self.world_size} ranks", fontsize=10)
        return fig

    def message(self, fsdp: int, tp: int, pp: int) -> str:
        layout = layout_from(self.world_size, fsdp, tp, pp)
        report, oom = self.run(layout)
        if oom is not None:
            return f"<b>{layout}</b>: out of memory on rank {oom.rank}"
        return (f"<b>{layout}</b>: {report.samples_per_s:.0f} samples/s measured, peak "
                f"{max(report.peak_bytes) / 2**20:.2f} MiB on the fullest rank")

    def widget(self, layout: Layout, background: bool = True):
        import ipywidgets as widgets

        from labkit.lessons.show.render import slider_panel

        options = divisors(self.world_size)
        sliders = [widgets.SelectionSlider(options=options, value=getattr(layout, dim),
                                           description=dim, continuous_update=False)
                   for dim in SLIDER_DIMS]
        dp = widgets.SelectionSlider(options=options, value=layout.dp, disabled=True,
                                     description="dp", continuous_update=False)

        def figure_for(fsdp: int, tp: int, pp: int) -> Figure:
            fig = self.figure(fsdp, tp, pp)
            dp.value = layout_from(self.world_size, fsdp, tp, pp).dp  # what is left
            return fig

        def describe(fsdp: int, tp: int, pp: int) -> str:
            return f"training fsdp={fsdp}, tp={tp}, pp={pp}, dp with the ranks left"

        box = slider_panel(sliders, figure_for, describe, self.message, background=background)
        box.children = (widgets.HBox([dp, widgets.HTML("<i>dp: the ranks the others leave"
                                                       "</i>")]),) + box.children
        box.sliders = dict(zip(SLIDER_DIMS, sliders, strict=True), dp=dp)
        return box


def layout_explorer(cluster, config: TrainConfig, layout: Layout, reports: dict | None = None,
                    reference=None, interactive: bool = True):
    """Sliders for fsdp, tp and pp (dp takes the rest) over real runs of ``config``; headless,
    the Figure for ``layout``."""
    explorer = LayoutExplorer(cluster, config, reports, reference)
    if interactive:
        return explorer.widget(layout)
    return explorer.figure(layout.fsdp, layout.tp, layout.pp)
