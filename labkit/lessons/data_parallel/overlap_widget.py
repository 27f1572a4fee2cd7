"""A ``bucket_cap_mb`` slider over real DDP steps: the buckets' AllReduces over backward."""

from __future__ import annotations

from labkit.lessons.data_parallel.overlap import bucket_timeline, timeline_setup
from labkit.lessons.data_parallel.overlap_plots import plot_bucket_timeline


def bucket_explorer(cluster, model, global_batch: int = 64, caps=(0.25, 1.0, 4.0, 25.0),
                    cap: float | None = None, interactive: bool = True, measured=()):
    """Each cap runs for real the first time it is chosen (cached; ``measured``: timelines
    already run); headless, the Figure for ``cap`` (default: the smallest)."""
    setup = timeline_setup(cluster, model, global_batch)
    stale = [t.bucket_cap_mb for t in measured if t.setup != setup]
    if stale:
        raise ValueError(f"the timelines measured with bucket_cap_mb={stale} ran another model, "
                         f"batch or cluster than this explorer's; pass timelines of the same "
                         f"bucket_timeline(cluster, model, global_batch, cap), or none")
    cache: dict[float, object] = {t.bucket_cap_mb: t for t in measured}

    def timeline(value: float):
        if value not in cache:
            cache[value] = bucket_timeline(cluster, model, global_batch, value)
        return cache[value]

    chosen = min(caps) if cap is None else cap
    if not interactive:
        return plot_bucket_timeline(timeline(chosen))
    import ipywidgets as widgets

    from labkit.lessons.show.render import slider_panel

    slider = widgets.SelectionSlider(options=list(caps), value=chosen,
                                     description="bucket_cap_mb", continuous_update=False)

    def message(value: float) -> str:
        t = timeline(value)
        return (f"{len(t.buckets)} buckets (DDP reports {t.ddp_buckets}); backward computed "
                f"for {t.compute_end_s * 1e3:.1f} ms and returned at {t.backward_s * 1e3:.1f} ms")

    box = slider_panel([slider], lambda v: plot_bucket_timeline(timeline(v)),
                       lambda v: f"DDP step with bucket_cap_mb={v:g}", message)
    box.slider, box.cache = slider, cache
    return box
