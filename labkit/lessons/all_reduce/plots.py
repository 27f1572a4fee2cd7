"""Plots of measured communication."""

from __future__ import annotations

from matplotlib.figure import Figure


def plot_all_reduce(timings) -> Figure:
    """Time and bus bandwidth of all_reduce against message size, as measured."""
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    ax_time, ax_bw = fig.subplots(1, 2)
    mib = [r["bytes"] / 2**20 for r in timings.rows]
    ax_time.plot(mib, [r["seconds"] * 1e3 for r in timings.rows], "o-")
    ax_time.set(xscale="log", yscale="log", xlabel="message size (MiB)", ylabel="time (ms)",
                title="all_reduce time")
    ax_bw.plot(mib, [r["busbw_GBps"] for r in timings.rows], "o-", color="tab:green")
    ax_bw.set(xscale="log", xlabel="message size (MiB)", ylabel="bus bandwidth (GB/s)",
              title="bus bandwidth by message size")
    where = f"{timings.world_size} {timings.device} ranks"
    if timings.oversubscribed:
        where += ", oversubscribed"
    fig.suptitle(f"measured here: {where}", fontsize=9)
    return fig
