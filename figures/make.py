"""Regenerate the README's figures from real runs on this machine.

    python figures/make.py            # documented size (about a minute on 2 CPU cores)
    python figures/make.py --smoke    # tiny, for tests; writes to --out

Every figure is stamped with what was measured and where (CPU ranks or the GPU model).
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch

import labkit

MIB = 1 << 20


def _where(cluster: labkit.Cluster) -> str:
    if cluster.device == "cuda":
        return f"{cluster.world_size} x {torch.cuda.get_device_name(0)}"
    return f"{cluster.world_size} CPU ranks ({platform.processor() or platform.machine()})"


def all_reduce_figure(out: Path, smoke: bool) -> Path:
    sizes = [MIB // 4, MIB] if smoke else [MIB // 64, MIB // 4, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
    with labkit.Cluster(2, progress=False) as cluster:
        timings = labkit.time_all_reduce(cluster, sizes, repeats=2 if smoke else 10)
        where = _where(cluster)
    fig = labkit.plots.plot_all_reduce(timings)
    fig.text(0.01, 0.01, f"measured on {where}, torch {torch.__version__}", fontsize=7)
    path = out / "all_reduce.png"
    fig.savefig(path, dpi=100)
    return path


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description="regenerate figures/ from real runs")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = [all_reduce_figure(args.out, args.smoke)]
    for path in paths:
        print(f"wrote {path}")
    return paths


if __name__ == "__main__":
    main()
