"""Claims of the README and the user guide (docs/guide/), tried as a new user would: losses of
runs of different lengths side by side (torchrun.md), the oversubscription warning shown once
(cells.md), explorers that leave the cluster as they found it (cells.md), sizes written
sensibly, smoke-size figures that never replace the committed ones (repository.md),
benchmarks whose --help and docstring agree."""

from __future__ import annotations

import importlib.util
import re
import warnings
from pathlib import Path

import pytest

import labkit
from labkit.models import DLRMConfig, MLPConfig
from labkit.runtime.cluster.hardware import physical_cores
from labkit.training import TrainConfig

REPO = Path(__file__).resolve().parent.parent


def _module(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_losses_of_runs_with_different_step_counts_plot_together(one):
    long = labkit.train(one, model="mlp", global_batch=8, steps=4)  # "torchrun --steps 20"
    short = labkit.train(one, model="mlp", global_batch=8, steps=2)  # "steps=10" in a cell
    fig = labkit.plots.plot_losses({"torchrun": long, "notebook": short})
    curves, gaps = fig.axes
    assert [len(line.get_xdata()) for line in curves.lines] == [4, 2]
    assert len(gaps.lines[0].get_xdata()) == 2  # the steps both runs have


def test_the_oversubscription_warning_is_shown_once_per_cluster():
    cores = physical_cores()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cluster = labkit.Cluster(cores + 1, device="cpu", progress=False)
        with cluster:
            labkit.train(cluster, model="mlp", strategy="ddp", global_batch=4 * (cores + 1),
                         steps=1)
            cluster.resize(cores + 2)
            cluster.resize(cores + 1)
            assert cluster.run(lambda ctx: ctx.oversubscribed) == [True] * (cores + 1)
    shown = [w for w in caught if issubclass(w.category, labkit.OversubscriptionWarning)]
    assert len(shown) == 1, [str(w.message) for w in shown]


def test_explorers_leave_the_rank_count_as_they_found_it(two):
    config = TrainConfig(model=MLPConfig(d_hidden=64), global_batch=8, steps=1)
    labkit.widgets.tp_explorer(two, config, degrees=[1], degree=1, interactive=False)
    assert two.world_size == 2 and len(two.ranks) == 2
    dlrm = TrainConfig(model=DLRMConfig(num_tables=2, rows_per_table=100), global_batch=16,
                       steps=1)
    labkit.widgets.recommender_explorer(two, dlrm, rows_options=[100], gpu_options=[1],
                                        memory_per_device="64MiB", interactive=False)
    assert two.world_size == 2 and two.run(lambda ctx: ctx.world_size) == [2, 2]


@pytest.mark.parametrize("size, text", [(1_040_000, "0.992 MiB"), (1536, "1.5 KiB"),
                                        (1023 * 2**20, "0.999 GiB"), (5 * 2**40, "5 TiB"),
                                        (512, "512 B")])
def test_sizes_are_written_in_a_unit_that_fits(size, text):
    assert labkit.format_bytes(size) == text


def test_smoke_size_figures_never_replace_the_committed_ones(monkeypatch):
    make = _module("figures/make.py")
    written = []

    def fake(name):
        def figure(cluster, out, smoke):
            written.append(out / f"{name}.png")
            return written[-1]
        return figure

    for name in ("all_reduce", "memory", "boundary", "sharding", "speedup", "composed"):
        monkeypatch.setattr(make, f"{name}_figure", fake(name))
    make.main(["--smoke"])
    assert written and all(REPO / "figures" not in path.parents for path in written)
    assert all((REPO / "artifacts" / "figures-smoke") in path.parents for path in written)


def test_quick_launch_bench_stays_within_the_machine():
    launch = _module("bench/launch.py")
    assert launch.rank_counts(quick=True) == (1, 2, 4)
    assert launch.rank_counts(quick=False) == (1, 2, 4, 8)


def test_pipeline_bench_alternates_which_schedule_of_a_pair_runs_first(monkeypatch):
    """bench/pipeline_schedules.py: hand-written and torch's take turns to run first, round
    by round, so that the gap between them is not the order they ran in (its runs are faked
    here: only the order of the calls is looked at)."""
    bench = _module("bench/pipeline_schedules.py")
    calls = []

    class Report:
        median_step_s = 0.1

    def train(cluster, config, schedule, micro_batches, estimate):
        calls.append(schedule)
        return Report()

    monkeypatch.setattr(bench.labkit, "train", train)
    monkeypatch.setattr(bench, "measured_bubble", lambda report: 0.5)
    cluster = type("Cluster", (), {"world_size": 2})()
    runs = bench._rounds(cluster, [(4, "naive_gpipe", "gpipe")], rounds=4, steps=2)
    assert calls == ["naive_gpipe", "gpipe", "gpipe", "naive_gpipe"] * 2
    assert runs[(4, "naive_gpipe", "gpipe")]["gpipe"]["bubble"] == [0.5] * 4


@pytest.mark.parametrize("bench", ["launch", "memory", "sharding", "data_parallel",
                                   "model_parallel", "composed", "levers", "long_context",
                                   "comm_model", "pipeline_schedules"])
def test_bench_docstring_and_help_say_the_same_of_quick(bench):
    """The docstring's "--quick  # ..." comment and --quick's help text (read from the
    source: importing every bench would cost a minute)."""
    source = (REPO / "bench" / f"{bench}.py").read_text()
    said = re.search(r"--quick +# (.+)", source).group(1).split(";")[-1].strip()
    helped = re.search(r'"--quick",[^)]*?help=((?:"[^"]*"\s*)+)', source)
    assert helped, f"{bench}: --quick has no help text"
    help_text = "".join(re.findall(r'"([^"]*)"', helped.group(1)))
    assert said in help_text, (said, help_text)
