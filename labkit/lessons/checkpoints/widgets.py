"""The checkpoint-interval explorer: one GPU's mean time between failures and the GPU count
on sliders, the time lost against the interval (simulated and expected), Young/Daly marked."""

from __future__ import annotations

import numpy as np

from labkit.lessons.checkpoints import interval
from labkit.lessons.checkpoints.plots import plot_interval

FAILURES = 100  # simulated per interval: enough for a stable mean, quick enough for a slider
SPAN = 8  # intervals from Young/Daly's / SPAN to x SPAN


def interval_figure(save_s: float, step_s: float, gpu_mtbf_h: float, gpus: int,
                    chosen: int | None = None):
    """The Figure for one GPU's MTBF (hours) and a GPU count, with the measured save cost
    ``save_s`` and step time ``step_s``."""
    mtbf = interval.cluster_mtbf(gpu_mtbf_h * 3600, gpus)
    best = interval.young_daly(save_s, mtbf) / step_s
    steps = sorted({max(1, round(best * f)) for f in np.geomspace(1 / SPAN, SPAN, 9)})
    fig = plot_interval(save_s, step_s, mtbf, steps, FAILURES * mtbf, chosen)
    fig.axes[0].set_title(f"{gpus} GPUs, one GPU fails every {gpu_mtbf_h:g} h on average: "
                          f"the job every {mtbf / 3600:.3g} h (projected)\nC = "
                          f"{1e3 * save_s:.0f} ms and a {1e3 * step_s:.0f} ms step, measured "
                          "here", fontsize=8)
    return fig


def interval_explorer(save_s: float, step_s: float, gpu_mtbf_hours=(1e3, 1e4, 5e4, 1e5),
                      gpu_counts=(8, 512, 16384), value=(5e4, 16384), chosen=None,
                      interactive: bool = True, background: bool = True):
    """Sliders over ``interval_figure``; headless (``interactive=False``) the Figure for
    ``value``."""
    if not interactive:
        return interval_figure(save_s, step_s, *value, chosen)
    import ipywidgets as widgets

    from labkit.lessons.show.render import slider_panel

    mtbf = widgets.SelectionSlider(options=[(f"{h:g} h", h) for h in gpu_mtbf_hours],
                                   value=value[0], description="GPU MTBF",
                                   continuous_update=False)
    gpus = widgets.SelectionSlider(options=list(gpu_counts), value=value[1],
                                   description="GPUs", continuous_update=False)
    box = slider_panel([mtbf, gpus], lambda h, n: interval_figure(save_s, step_s, h, n, chosen),
                       lambda h, n: f"simulating {FAILURES} failures per interval",
                       background=background)
    box.sliders = (mtbf, gpus)
    return box
