"""``profile=DIR``: a torch.profiler Chrome trace per rank, with the run's collectives in it;
a folder no rank could write to refused before any rank starts; the trace read back and drawn
(``labkit/training/profile.py``, ``labkit/lessons/profiling``)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from matplotlib.figure import Figure

import labkit
from labkit.lessons.profiling.trace import trace_events, trace_totals, trace_vs_clocks


@pytest.fixture(scope="module")
def profiled(two, tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces") / "ddp"  # made by the run
    report = labkit.train(two, model="mlp", strategy="ddp", global_batch=32, steps=4,
                          estimate=False, profile=folder)
    return report, folder


def test_each_rank_writes_a_trace_with_the_run_s_collectives(profiled):
    report, folder = profiled
    assert report.traces == [str(folder / f"rank{r}.pt.trace.json") for r in range(2)]
    assert report.config.profile == str(folder)
    for path in report.traces:
        events = json.loads(open(path).read())["traceEvents"]
        names = {e.get("name") for e in events}
        # DDP's gradient AllReduce: the c10d op on the step's thread, gloo's work on its own
        assert {"c10d::allreduce_", "gloo:all_reduce"} <= names, sorted(names)[:40]
        # the timed steps only (steps 0 and 1 build state and track memory)
        steps = sorted(n for n in names if n and n.startswith("ProfilerStep#"))
        assert steps == ["ProfilerStep#2", "ProfilerStep#3"]


def test_the_trace_totals_count_the_steps_their_collectives_and_their_computation(profiled):
    report, _ = profiled
    totals = trace_totals(report.traces[0])
    assert totals["steps"] == 2 and totals["comm_s"] > 0 and totals["compute_s"] > 0
    assert totals["comm_s"] + totals["compute_s"] <= 1.5 * totals["step_s"]
    assert {e.kind for e in trace_events(report.traces[1])} == {"step", "comm", "compute"}
    ranks = trace_vs_clocks(report)
    for rank in ranks:  # the same steps on labkit's clocks
        assert rank["trace"]["steps"] == rank["labkit"]["steps"] == 2
    agreement = labkit.plots.trace_agreement(ranks)
    assert set(agreement) == {"step_s", "compute_s", "comm_s", "comm_of_step"}
    assert isinstance(labkit.plots.plot_trace_totals(report), Figure)


def test_plot_trace_draws_every_rank(profiled):
    fig = labkit.plots.plot_trace(profiled[0].traces)
    assert isinstance(fig, Figure)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 0", "rank 1"]


def test_a_run_without_profile_writes_no_trace(two):
    report = labkit.train(two, model="mlp", strategy="ddp", global_batch=32, steps=2,
                          estimate=False)
    assert report.traces == []


def test_a_checkpointed_run_resumes_with_the_profiler_on(two, tmp_path):
    """Where the traces go is not part of what a checkpoint is of: a run saved without a
    profiler resumes with one, and its two resumed steps are traced (the profiler numbers
    its own steps from 0)."""
    config = labkit.TrainConfig(model="mlp", strategy="ddp", global_batch=32, steps=2,
                                checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2)
    labkit.train(two, config, estimate=False)
    report = labkit.train(two, config.replace(steps=4, profile=str(tmp_path / "traces")),
                          estimate=False)
    assert report.ranks[0]["resumed_from"] == "step-00000002"
    steps = {e.get("name") for e in json.loads(open(report.traces[0]).read())["traceEvents"]}
    assert {"ProfilerStep#0", "ProfilerStep#1"} <= steps


def test_a_folder_holds_one_run_s_traces(two, tmp_path):
    """An earlier run's traces of ranks this run does not have are removed: TensorBoard and
    HTA read every trace in the folder. Other files stay."""
    for name in ("rank2.pt.trace.json", "rank3.pt.trace.json", "notes.txt"):
        (tmp_path / name).write_text("{}")
    report = labkit.train(two, model="mlp", strategy="ddp", global_batch=32, steps=2,
                          estimate=False, profile=tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", *(os.path.basename(p)
                                                           for p in report.traces)]


def test_a_memory_capped_run_traces_the_steps_its_report_times(two, tmp_path):
    """Under a cap every step is memory-tracked, and the report times all but the first:
    the trace holds those steps, so trace_vs_clocks compares the same ones."""
    report = labkit.train(two, model="mlp", strategy="ddp", global_batch=32, steps=4,
                          estimate=False, profile=tmp_path, memory_per_device="1GB")
    for rank in trace_vs_clocks(report):
        assert rank["trace"]["steps"] == rank["labkit"]["steps"] == 3


class _NoRanks:
    """A cluster whose ranks must not start."""
    world_size, device, backend, memory_per_device = 2, "cpu", "gloo", None

    def run(self, *args, **kwargs):
        raise AssertionError("a rank started")


def test_a_folder_no_rank_can_write_to_is_refused_before_any_rank_starts(tmp_path):
    a_file = tmp_path / "taken"
    a_file.write_text("")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        labkit.train(_NoRanks(), strategy="ddp", profile=a_file / "traces")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # root may write anywhere
            with pytest.raises(ValueError, match="cannot be written to"):
                labkit.train(_NoRanks(), strategy="ddp", profile=locked / "traces")
    finally:
        locked.chmod(0o700)
    with pytest.raises(TypeError, match="profile must be a folder's path"):
        labkit.TrainConfig(profile=3)
    with pytest.raises(ValueError, match="names no folder"):  # not the working folder
        labkit.train(_NoRanks(), strategy="ddp", profile="")


def test_the_profiler_s_start_and_stop_notes_are_not_shown(two, tmp_path, capsys):
    labkit.train(two, model="mlp", strategy="ddp", global_batch=32, steps=2, estimate=False,
                 profile=tmp_path)
    assert "profiler_start" not in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_rank_s_trace_holds_its_kernels(tmp_path):
    """On a CUDA rank the profiler records the device too (ProfilerActivity.CUDA)."""
    with labkit.Cluster(1, device="cuda", progress=False) as cluster:
        report = labkit.train(cluster, model="mlp", steps=4, estimate=False, profile=tmp_path)
    events = json.loads(open(report.traces[0]).read())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)
