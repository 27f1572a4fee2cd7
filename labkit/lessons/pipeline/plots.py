"""Plots of pipelines: the measured timeline of every stage (a Gantt chart)."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from labkit.parallel.pipeline.timeline import bubble_fraction, theoretical_bubble

COLORS = {"F": "#4C72B0", "B": "#55A868"}


def plot_gantt(report, step: int = -1, ax=None) -> Figure:
    """When each stage ran each micro-batch's forward (F) and backward (B) in one step, as
    measured; the idle gaps are the bubble, compared with (p-1)/(m+p-1). With a composed
    layout, the pipeline drawn is the first one (the ranks at dp, fsdp, tp coordinates 0)."""
    layout = report.layout
    ranks = [layout.rank_at(pp=s) for s in range(layout.pp)]
    timelines = [report.ranks[r]["records"][step]["timeline"] for r in ranks]
    virtual = report.run.engines.stages_per_rank
    if ax is None:
        ax = Figure(figsize=(9, 0.7 * len(timelines) + 1.6), layout="constrained").subplots()
    t0 = min(e["start"] for timeline in timelines for e in timeline)
    for stage, timeline in enumerate(timelines):
        for e in timeline:
            start, width = (e["start"] - t0) * 1e3, (e["end"] - e["start"]) * 1e3
            ax.barh(stage, width, left=start, height=0.6, color=COLORS[e["kind"]],
                    edgecolor="white")
            ax.text(start + width / 2, stage, f"{e['kind']}{e['microbatch']}", ha="center",
                    va="center", color="white", fontsize=7)
            if virtual > 1:  # which of the rank's stages ran it
                ax.text(start + width / 2, stage + 0.42, f"s{e['stage']}", ha="center",
                        va="center", fontsize=6)
    p, m = len(timelines), report.config.micro_batches
    labels = ([f"rank {ranks[r]}: stages {', '.join(str(r + v * p) for v in range(virtual))}"
               for r in range(p)] if virtual > 1
              else [f"stage {s} (rank {ranks[s]})" for s in range(p)])
    ax.set_yticks(range(p), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step began (measured here)")
    ax.set_title(f"{report.config.label}, {p} stages, {m} micro-batch(es): bubble "
                 f"{100 * bubble_fraction(timelines):.0f}% measured in this step, "
                 f"{100 * theoretical_bubble(p, m, virtual):.0f}% by "
                 f"(p-1)/({'v m' if virtual > 1 else 'm'}+p-1)", fontsize=9)
    ax.legend(handles=[Patch(color=COLORS["F"], label="forward"),
                       Patch(color=COLORS["B"], label="backward")], fontsize=7,
              loc="lower right")
    return ax.figure
