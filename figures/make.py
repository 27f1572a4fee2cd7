"""Regenerate the figures of the README and the docs from real runs on this machine.

    python figures/make.py            # documented size: a few minutes on 2 CPU cores
    python figures/make.py --smoke    # tiny, for tests; writes to --out (default
                                      # artifacts/figures-smoke/, never over figures/)

Every figure is stamped with what was measured and where (CPU ranks or the GPU model).
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch
from matplotlib.figure import Figure

import labkit
from labkit.lessons.data_parallel.scaling import COMPUTE_BOUND
from labkit.lessons.widgets import MemoryExplorer
from labkit.runtime.cluster.hardware import physical_cores

MIB = 1 << 20


def _where(cluster: labkit.Cluster) -> str:
    if cluster.device == "cuda":
        return f"{cluster.world_size} x {torch.cuda.get_device_name(0)}"
    return f"CPU ranks on {platform.machine()} ({physical_cores()} cores)"


def _save(fig: Figure, path: Path, what: str, cluster: labkit.Cluster) -> Path:
    fig.text(0.01, 0.005, f"{what}; measured on {_where(cluster)}, torch {torch.__version__}",
             fontsize=6, color="dimgrey")
    fig.savefig(path, dpi=100)
    return path


def all_reduce_figure(cluster, out: Path, smoke: bool) -> Path:
    sizes = [MIB // 4, MIB] if smoke else [MIB // 64, MIB // 4, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
    timings = labkit.time_all_reduce(cluster, sizes, repeats=2 if smoke else 10)
    return _save(labkit.plots.plot_all_reduce(timings), out / "all_reduce.png",
                 f"all_reduce, {cluster.world_size} ranks", cluster)


def memory_figure(cluster, out: Path, smoke: bool) -> Path:
    sizes = (2e5, 2e6) if smoke else (5e5, 4e6)
    explorer = MemoryExplorer(cluster, "gpt", sizes, "32MiB", global_batch=16)
    small, large = (explorer.result(p) for p in explorer.sizes)
    bars = [dict(small["measured"], label=f"{small['params'] / 1e6:.2g}M: measured"),
            dict(small["estimated"], label=f"{small['params'] / 1e6:.2g}M: estimated"),
            dict(large["measured"], label=f"{large['params'] / 1e6:.2g}M: measured"),
            dict(large["estimated"], label=f"{large['params'] / 1e6:.2g}M: estimated")]
    fig = labkit.plots.plot_memory_bars(bars, explorer.capacity,
                                        title="GPT on one virtual GPU: the memory wall")
    return _save(fig, out / "memory_wall.png", "peak memory by category, batch 16", cluster)


def boundary_figure(cluster, out: Path, smoke: bool) -> Path:
    sizes, worlds = ((2e5, 2e6), (1, 2)) if smoke else ((2e5, 5e5, 1e6, 2e6, 4e6), (1, 2, 4))
    boundary = labkit.sweep_boundary(cluster, "gpt", sizes, worlds, strategy="ddp",
                                     memory_per_device="32MiB", global_batch=16)
    return _save(labkit.plots.plot_boundary(boundary), out / "boundary.png",
                 "OOM boundary, every cell trained", cluster)


def sharding_figure(cluster, out: Path, smoke: bool) -> Path:
    # An MLP with Adam: model state, not activations, fills the device, as in notebook 05.
    sizes, worlds = ((2e5, 6e5), (1, 2)) if smoke else ((3e5, 6e5, 8e5, 1.2e6), (1, 2, 4))
    maps = [labkit.sweep_boundary(cluster, "mlp", sizes, worlds, strategy=strategy,
                                  memory_per_device="12MiB", global_batch=32)
            for strategy in ("ddp", "zero1", "fsdp")]
    return _save(labkit.plots.plot_boundaries(maps), out / "sharding.png",
                 "OOM boundary per strategy, every cell trained", cluster)


def speedup_figure(cluster, out: Path, smoke: bool) -> Path:
    # the bench's compute-bound configuration (bench/data_parallel.py); 4 ranks on a machine
    # with fewer cores are drawn, and marked oversubscribed by the plots
    model, batch = COMPUTE_BOUND
    if smoke:
        model, batch = labkit.models.sized("mlp", 2e5), 32
    worlds = (1, 2) if smoke else (1, 2, 4)
    result = labkit.scaling_sweep(cluster, model, world_sizes=worlds, global_batch=batch,
                                  steps=3 if smoke else 10)
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    labkit.plots.plot_step_breakdown(result, ax=left)
    labkit.plots.plot_speedup(result, ax=right)
    return _save(fig, out / "speedup.png", "DDP strong scaling, one core per rank", cluster)


def composed_figure(cluster, out: Path, smoke: bool) -> Path:
    # notebook 07's scenario: an MLP with Adam that one device cannot hold under the cap,
    # trained with tensor parallelism for memory and data parallelism over the copies
    width, cap = (512, "8MiB") if smoke else (1024, "25MiB")
    config = labkit.TrainConfig(model=labkit.models.MLPConfig(d_hidden=width, n_layers=4),
                                global_batch=64 if smoke else 256, steps=3 if smoke else 8)
    layout = labkit.Layout(dp=2, tp=2)
    with cluster.resized(1):  # the loss to match: one device, without a cap
        reference = labkit.train(cluster, config, memory_per_device=None, estimate=False)
    with cluster.resized(4):
        report = labkit.train(cluster, config, layout=layout, memory_per_device=cap,
                              estimate=False)
    fig = labkit.plots.plot_layout_run(report, reference, labkit.parse_bytes(cap))
    fig.suptitle(f"{layout} on 4 ranks: each layer split over 2 ranks, 2 copies of the model",
                 fontsize=10)
    return _save(fig, out / "composed.png", f"{layout}, {cap} per device", cluster)


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description="regenerate figures/ from real runs")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME",
                        help="regenerate only these figures (all_reduce, memory, boundary, "
                             "sharding, speedup, composed)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write (default: figures/, or artifacts/figures-smoke/ "
                             "with --smoke, so that smoke-size figures never replace the "
                             "committed ones)")
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent
    if args.out is None:
        args.out = here.parent / "artifacts" / "figures-smoke" if args.smoke else here
    args.out.mkdir(parents=True, exist_ok=True)
    paths = []
    with labkit.Cluster(2, progress=False) as cluster:
        for make in (all_reduce_figure, memory_figure, boundary_figure, sharding_figure,
                     speedup_figure, composed_figure):
            if args.only is not None and make.__name__.removesuffix("_figure") not in args.only:
                continue
            if make is memory_figure:
                cluster.resize(1)  # one device: the wall itself (the sweeps resize as they go)
            paths.append(make(cluster, args.out, args.smoke))
            print(f"wrote {paths[-1]}", flush=True)
    return paths


if __name__ == "__main__":
    main()
