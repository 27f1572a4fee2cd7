"""DDP's buckets over the backward pass: which AllReduce ran while backward still computed."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from labkit.runtime.memory.units import format_bytes


def plot_bucket_timeline(timeline) -> Figure:
    """One row for backward's computation (until the last bucket was ready), one per bucket
    from issue to done, in milliseconds from backward's start, measured on rank 0."""
    buckets = timeline.buckets
    fig = Figure(figsize=(10, 1.6 + 0.35 * (len(buckets) + 1)), layout="constrained")
    ax = fig.subplots()
    ms = 1e3
    ax.barh(0, timeline.compute_end_s * ms, color="tab:gray")
    for row, bucket in enumerate(buckets, start=1):
        hidden = bucket["done"] <= timeline.compute_end_s
        ax.barh(row, (bucket["done"] - bucket["issued"]) * ms, left=bucket["issued"] * ms,
                color="tab:green" if hidden else "tab:red")
        ax.text(bucket["done"] * ms, row, f" {format_bytes(bucket['bytes'])}", va="center",
                fontsize=8)
    ax.axvline(timeline.backward_s * ms, color="black", linestyle="--")
    handles = [Patch(color="tab:gray", label="backward computing"),
               Patch(color="tab:green", label="AllReduce done while computing"),
               Patch(color="tab:red", label="AllReduce still running after"),
               Line2D([], [], color="black", linestyle="--", label="backward() returned")]
    ax.set_yticks(range(len(buckets) + 1),
                  ["compute"] + [f"bucket {b['index']}" for b in buckets])
    ax.invert_yaxis()
    ax.set(xlabel="ms from the start of backward (rank 0, measured here)",
           title=f"DDP on {timeline.world_size} ranks, bucket_cap_mb={timeline.bucket_cap_mb:g}: "
                 f"{len(buckets)} buckets; exposed {timeline.exposed_s * ms:.1f} ms")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.margins(x=0.15)
    return fig
