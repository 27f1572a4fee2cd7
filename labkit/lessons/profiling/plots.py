"""A ``torch.profiler`` trace drawn: per rank, a lane of computation and a lane of
communication, from the Chrome trace JSON (``labkit/lessons/profiling/trace.py``)."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.lessons.profiling.trace import first_step_us, load_trace, trace_events

COLORS = {"compute": "tab:blue", "comm": "tab:orange", "step": "0.85"}


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Nested and overlapping intervals as disjoint ones (an operator and its children are
    one bar)."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def plot_trace(traces, title: str | None = None, ax=None) -> Figure:
    """The timeline of one run's traces (``report.traces``: one path per rank, or loaded
    JSON): for each rank, its steps (grey), the time it computed (blue) and the time inside
    a collective (orange), on the profiler's clock shared by the ranks of one machine."""
    loaded = [t if isinstance(t, dict) else load_trace(t) for t in traces]
    if not loaded:
        raise ValueError("no traces: train with profile=DIR and pass report.traces")
    origin = min(first_step_us(t) for t in loaded)
    if ax is None:
        ax = Figure(figsize=(9, 0.9 * len(loaded) + 1.4), layout="constrained").subplots()
    lanes = {"step": -0.35, "compute": -0.12, "comm": 0.22}
    heights = {"step": 0.12, "compute": 0.3, "comm": 0.3}
    for rank, trace in enumerate(loaded):
        events = trace_events(trace, origin)
        for kind, offset in lanes.items():
            bars = _merged([(e.start_s * 1e3, e.end_s * 1e3) for e in events
                            if e.kind == kind])
            ax.broken_barh([(s, e - s) for s, e in bars], (rank + offset - heights[kind] / 2,
                           heights[kind]), color=COLORS[kind],
                           label=kind if rank == 0 else None)
    ax.set_yticks(range(len(loaded)), [f"rank {r}" for r in range(len(loaded))])
    ax.set_ylim(len(loaded) - 0.4, -0.6)
    ax.set_xlabel("ms since the first profiled step began (torch.profiler's clock)")
    names = {"step": "ProfilerStep", "compute": "computation", "comm": "communication"}
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, [names[k] for k in labels], loc="upper left", bbox_to_anchor=(1, 1),
              fontsize=8)
    ax.set_title(title or "torch.profiler trace, per rank")
    return ax.figure


def plot_trace_totals(report, title: str | None = None) -> Figure:
    """A profiled run's computation and communication per rank, as its trace totals them
    and as labkit's clocks do over the same steps (``trace_vs_clocks``)."""
    import numpy as np

    from labkit.lessons.profiling.trace import trace_vs_clocks

    ranks = trace_vs_clocks(report)
    fig = Figure(figsize=(7.5, 0.55 * len(ranks) + 2.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    y = np.arange(len(ranks))
    for ax, key, name in zip(axes, ("compute_s", "comm_s"),
                             ("computation", "inside collectives"), strict=True):
        trace = np.array([r["trace"][key] for r in ranks]) * 1e3
        clocks = np.array([r["labkit"][key] for r in ranks]) * 1e3
        ax.barh(y - 0.2, trace, height=0.4, color=COLORS["comm" if "comm" in key else
                                                          "compute"], label="torch.profiler")
        ax.barh(y + 0.2, clocks, height=0.4, color="0.55", label="labkit's clocks")
        ax.set_xlabel(f"{name}, ms")
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_yticks(y, [f"rank {r}" for r in y])
    axes[0].invert_yaxis()
    steps = ranks[0]["trace"]["steps"]
    fig.suptitle(title or f"the trace's totals beside labkit's, the same {steps} steps")
    return fig
