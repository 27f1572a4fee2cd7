"""Notebook 08's capacity slider: per expert, the tokens taken and dropped at one capacity
factor, beside the router's choices per step (all measured)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure


def plot_capacity(run, layer: int = 0) -> Figure:
    """``run``: a ``CapacityRun``. Left: per expert, tokens taken and choices dropped over the
    run in MoE layer ``layer``; right: the tokens each expert took per step (heat map, the
    colour scale ending at the capacity of one step)."""
    taken, dropped = run.taken(layer), run.dropped[layer]
    experts = np.arange(len(taken))
    matrix = np.array([step[layer] for step in run.load]).T  # (experts, steps)
    fig = Figure(figsize=(9.5, 0.45 * len(taken) + 2.4), layout="constrained")
    bars, heat = fig.subplots(1, 2, width_ratios=[1, 1.4])
    bars.barh(experts, taken, color="tab:blue", label="taken")
    bars.barh(experts, dropped, left=taken, color="tab:red", label="dropped (over capacity)")
    bars.set_yticks(experts)
    bars.invert_yaxis()
    bars.set_ylabel("expert")
    bars.set_xlabel(f"router's choices, all {len(run.load)} steps")
    bars.legend(fontsize=7, loc="lower right")
    top = run.capacity * run.global_batch  # slots per expert per step, all sequences
    image = heat.imshow(matrix, cmap="viridis", aspect="auto", vmin=0, vmax=top)
    for (e, s), value in np.ndenumerate(matrix):
        heat.text(s, e, str(value), ha="center", va="center", fontsize=7,
                  color="black" if value > 0.6 * top else "white")
    heat.set_xlabel("training step")
    heat.set_yticks(experts)
    heat.set_xticks(range(matrix.shape[1]))
    fig.colorbar(image, ax=heat, label="tokens taken (max = capacity)")
    fig.suptitle(f"capacity factor {run.factor:g}: {run.dropped_share:.1%} of all choices "
                 f"dropped (every layer); MoE layer {layer} drawn (measured)", fontsize=10)
    return fig
