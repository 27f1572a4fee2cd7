"""Plots of failures and checkpoints: a recovered run's loss curve, and the time lost
against the checkpoint interval (Young/Daly)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from labkit.lessons.checkpoints import interval


def plot_recovery(recovery, reference=None, title: str = "") -> Figure:
    """The recovered run's loss per step (steps loaded from the checkpoint, then trained
    after the restart), the steps lost to the failure shaded (done, then done again), and
    an uninterrupted run's losses on top if given."""
    fig = Figure(figsize=(8, 3.4), layout="constrained")
    ax = fig.subplots()
    report = recovery.report
    losses = np.array(report.losses)
    steps = np.arange(1, len(losses) + 1)
    marks = np.array([r.get("from_checkpoint", False) for r in report.ranks[0]["records"]])
    ax.axvspan(recovery.resumed_at + 0.5, recovery.failed_after + 0.5, color="#C44E52",
               alpha=0.15, label=f"lost: {recovery.lost_steps} steps done again")
    ax.axvline(recovery.failed_after + 0.5, color="#C44E52", lw=1.5, ls="--",
               label=f"rank {recovery.rank} {recovery.how}ed")
    ax.plot(steps[marks], losses[marks], "o-", color="#4C72B0", lw=2,
            label="before the failure (records from the checkpoint)")
    ax.plot(steps[~marks], losses[~marks], "o-", color="#55A868", lw=2,
            label="after the restart")
    if reference is not None:
        ax.plot(np.arange(1, len(reference.losses) + 1), reference.losses, "k:", lw=1.5,
                label="uninterrupted run")
    ax.set(xlabel="step", ylabel="loss",
           title=title or f"{report.layout} on {report.world_size} ranks: measured here")
    ax.legend(fontsize=8)
    return fig


def plot_interval(save_s: float, step_s: float, mtbf_s: float, intervals, work_s: float,
                  chosen: int | None = None, seed: int = 0, title: str = "") -> Figure:
    """Time lost per unit of work against the checkpoint interval (in steps): simulated over
    many failures (points), Daly's expectation (line), saving's and recomputing's shares
    (first order), and the Young/Daly interval sqrt(2 C M)."""
    fig = Figure(figsize=(8, 3.6), layout="constrained")
    ax = fig.subplots()
    steps = np.array(sorted(intervals), dtype=float)
    taus = steps * step_s
    simulated = [interval.simulate(t, save_s, mtbf_s, work_s, seed=seed).overhead
                 for t in taus]
    dense = np.geomspace(taus[0], taus[-1], 200)
    ax.plot(dense / step_s, [100 * interval.expected_overhead(t, save_s, mtbf_s)
                             for t in dense], color="k", lw=1.5, label="expected (Daly)")
    ax.plot(dense / step_s, 100 * save_s / dense, ":", color="#4C72B0", label="saving: C / T")
    ax.plot(dense / step_s, 100 * dense / (2 * mtbf_s), ":", color="#C44E52",
            label="recomputing: T / 2M")
    ax.plot(steps, 100 * np.array(simulated), "o", color="#55A868",
            label="simulated failures")
    best = interval.young_daly(save_s, mtbf_s) / step_s
    ax.axvline(best, color="#8172B2", lw=2, label=f"Young/Daly: {best:.0f} steps")
    if chosen is not None:
        ax.axvline(chosen, color="grey", ls="--", lw=1, label=f"this run: every {chosen}")
    top = max(simulated + [interval.expected_overhead(t, save_s, mtbf_s) for t in taus])
    ax.set(xscale="log", xlabel="checkpoint every ... steps", ylabel="% of time lost",
           ylim=(0, min(100, 1.3 * 100 * top)),
           title=title or f"C = {save_s * 1e3:.0f} ms measured, step {step_s * 1e3:.0f} ms, "
                          f"MTBF {mtbf_s / 3600:.2g} h: projected")
    ax.legend(fontsize=8)
    return fig
