"""One resolved run: ``labkit/training/run.py`` resolves and checks a run once; everything
downstream (the estimate, the checkpoint rules, the ranks, the report) reads the ``Run``;
the build's gradient sync is an explicit list of named steps."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import labkit
from labkit.models import DLRMConfig, GPTConfig, MoEGPTConfig
from labkit.runtime.comm.clock import HostClock
from labkit.runtime.memory.tracker import MemoryTracker
from labkit.training import run as run_module
from labkit.training.build import ParallelContext, build
from labkit.training.estimate import _fake_group
from labkit.training.layout import Layout
from labkit.training.layout.mesh import build_mesh
from labkit.training.run import Engines, Run, resolve

REPO = Path(__file__).resolve().parent.parent
GPT = GPTConfig(vocab_size=64, seq_len=32, d_model=32, n_heads=2, n_layers=2)


def _counting(monkeypatch) -> list:
    """Count resolutions: ``resolve`` checks each run once with ``check_run``."""
    calls = []
    original = run_module.check_run

    def counted(run):
        calls.append(run)
        return original(run)

    monkeypatch.setattr(run_module, "check_run", counted)
    return calls


def test_a_train_call_resolves_its_run_once(monkeypatch):
    calls = _counting(monkeypatch)
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        report = labkit.train(cluster, model="mlp", strategy="fsdp", global_batch=8, steps=2)
    assert len(calls) == 1  # not again for the estimate, the checkpoint rules or the report
    assert report.run is calls[0] and report.estimate is not None
    assert report.layout == Layout(fsdp=2) and report.config.strategy == "fsdp"
    assert report.run.engines == Engines(dp_kind="fsdp")


def test_a_run_round_trips_to_the_ranks_without_being_checked_again(monkeypatch):
    config = labkit.TrainConfig(model=GPT, layout=Layout(dp=2, cp=2), global_batch=4)
    run = resolve(config, 4, "cuda", "nccl")
    calls = _counting(monkeypatch)
    again = Run.from_dict(run.to_dict())
    assert again == run and not calls
    assert again.engines == Engines(dp_kind="ddp", cp_engine="torch")


@pytest.mark.parametrize("layout, choices, engines", [
    (Layout(), {}, Engines()),
    (Layout(pp=2), {}, Engines(schedule="1f1b")),
    (Layout(), {"schedule": "gpipe"}, Engines(schedule="gpipe")),  # one stage: a pipeline
    (Layout(dp=2), {}, Engines(dp_kind="ddp")),
    (Layout(dp=2, fsdp=2), {}, Engines(dp_kind="fsdp")),
    (Layout(dp=2), {"dp_kind": "naive"}, Engines(dp_kind="naive")),
    (Layout(fsdp=2), {"tables": "row_wise"}, Engines(tables="row_wise")),
    (Layout(cp=2), {}, Engines(cp_engine="ring")),
    (Layout(tp=2), {}, Engines(tp_kind="dtensor")),
    (Layout(tp=2), {"tp_kind": "naive"}, Engines(tp_kind="naive")),
    (Layout(dp=2, tp=2), {"tp_kind": "naive", "dp_kind": "naive"},
     Engines(dp_kind="naive", tp_kind="naive"))])
def test_every_default_engine_is_filled_in_when_the_run_is_resolved(layout, choices, engines):
    model = DLRMConfig() if "tables" in choices else GPT
    config = labkit.TrainConfig(model=model, layout=layout, global_batch=8, micro_batches=2,
                                **choices)
    assert resolve(config, layout.size).engines == engines


def test_a_strategy_sets_the_layout_and_its_engines_and_both_cannot_be_given():
    run = resolve(labkit.TrainConfig(model=GPT, strategy="gpipe", global_batch=8), 2)
    assert run.layout == Layout(pp=2) and run.engines == Engines(schedule="gpipe")
    with pytest.raises(ValueError, match="strategy 'ddp' has its own"):
        resolve(labkit.TrainConfig(model=GPT, strategy="ddp", dp_kind="naive"), 2)


def _names_used(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    return names


def test_no_module_but_run_py_resolves_or_checks_a_run():
    """The layout is worked out and the rules are applied in ``training/run.py`` only: no
    other module calls the rules, picks a preset for a config or decides a cp engine. The
    planner's ``Parallelism`` (no run: a projection) calls the engine rules alone, the same
    function, so that it refuses what no run can run."""
    checks = {"check_run", "check_fields", "check_engine_choices", "check_debug_env",
              "resolve_engine", "layout_for", "engine_on"}
    own = {REPO / "labkit/training/run.py", REPO / "labkit/training/rules.py",
           REPO / "labkit/parallel/context/engine.py"}
    found = {str(p.relative_to(REPO)): sorted(_names_used(p) & checks)
             for p in (REPO / "labkit").rglob("*.py") if p not in own}
    assert found.pop("labkit/plan/parallelism.py") == ["check_engine_choices"]
    assert {p: names for p, names in found.items() if names} == {}


def _grad_sync(config, world_size: int) -> list[str]:
    """The names of rank 0's gradient-sync steps, built on a fake process group."""
    run = resolve(config, world_size)
    with _fake_group(world_size, 0):
        mesh = build_mesh(run.layout, "cpu")
        with FakeTensorMode(allow_non_fake_inputs=True), MemoryTracker(count_fake=True) as t:
            ctx = ParallelContext(0, world_size, torch.device("cpu"), t, run, mesh, HostClock())
            built = build(ctx)
    return [str(step) for step in built.grad_sync]


@pytest.mark.parametrize("model, layout, choices, steps", [
    (GPT, Layout(dp=2), {}, []),  # DDP synchronises by itself
    (GPT, Layout(fsdp=2), {}, []),  # FSDP2 too
    (GPT, Layout(dp=2), {"dp_kind": "naive"}, ["average gradients over dp"]),
    (GPT, Layout(dp=2, cp=2), {"dp_kind": "naive"},
     ["average gradients over dp", "average gradients over cp"]),
    (GPT, Layout(fsdp=2, cp=2), {}, ["average gradients over cp"]),
    (MoEGPTConfig(vocab_size=64, seq_len=32, d_model=32, n_heads=2, n_layers=2),
     Layout(dp=2, ep=2), {}, ["expert replicas over dp"]),
    (DLRMConfig(), Layout(fsdp=2), {"tables": "table_wise"},
     ["table gradients over fsdp and dp"])])
def test_gradient_sync_is_a_list_of_named_steps(model, layout, choices, steps):
    config = labkit.TrainConfig(model=model, layout=layout, global_batch=8, **choices)
    assert _grad_sync(config, layout.size) == steps


@pytest.mark.parametrize("name, label, engines", [
    ("gpipe", "1 device (gpipe)", Engines(schedule="gpipe")),
    ("naive", "1 device (naive)", Engines(dp_kind="naive")),
])
def test_a_report_saved_before_runs_were_resolved_loads(name, label, engines):
    """Reports saved by b5ce528 (config, world_size, device and backend at the top, the
    engine choices inside the layout) load as the run they were: the choice beside the
    degrees, the engines filled in, the records as saved."""
    path = REPO / "tests" / "data" / f"report_b5ce528_{name}_1rank.json"
    report = labkit.TrainReport.load(path)
    assert report.config.layout == Layout() and report.config.label == label
    assert report.run.engines == engines and report.world_size == 1
    assert report.device == "cpu" and report.backend == "gloo" and len(report.losses) == 2
    again = labkit.TrainReport.from_dict(report.to_dict())
    assert again.run == report.run and again.losses == report.losses


class _Ranks:
    """What run_cells and checked read of a cluster (no rank starts)."""

    def __init__(self, world_size: int):
        self.world_size, self.device, self.backend = world_size, "cpu", "gloo"

    def resize(self, n: int) -> None:
        self.world_size = n

    def resized(self, n: int):
        import contextlib

        @contextlib.contextmanager
        def scope():
            before, self.world_size = self.world_size, n
            yield
            self.world_size = before
        return scope()


def test_a_sweep_resolves_each_cell_once(monkeypatch):
    """run_cells resolves every cell up front and hands each its Run: labkit.train and
    estimate_memory take it as it is (no second resolve per cell)."""
    from labkit.training import api
    from labkit.training.sweep import run_cells

    calls = []
    monkeypatch.setattr(api, "resolve", lambda *a, **k: calls.append(a) or resolve(*a, **k))
    config = labkit.TrainConfig(model="mlp", strategy="ddp", global_batch=8)
    got = run_cells(_Ranks(1), [(1, config.replace(strategy="single")), (2, config)],
                    lambda cluster, run: (api.checked(cluster, run), cluster.world_size))
    assert len(calls) == 2 and [g[1] for g in got] == [1, 2]
    assert [g[0].world_size for g in got] == [1, 2] and got[1][0].engines.dp_kind == "ddp"


def test_train_takes_a_run_resolved_for_its_ranks_only():
    run = resolve(labkit.TrainConfig(model="mlp", strategy="ddp", global_batch=8), 2)
    with pytest.raises(ValueError, match="resolved for 2 cpu ranks over gloo, and the cluster "
                                         "has 4 cpu ranks"):
        labkit.train(_Ranks(4), run)
    with pytest.raises(TypeError, match="give a TrainConfig to change steps"):
        labkit.train(_Ranks(2), run, steps=3)


def test_a_run_changed_after_it_was_resolved_is_not_trained():
    import dataclasses

    run = resolve(labkit.TrainConfig(model="mlp", strategy="ddp", global_batch=8), 2)
    assert run.checked and not Run.from_dict(run.to_dict()).checked
    for changed in (dataclasses.replace(run, layout=Layout(tp=2)), run.replace(world_size=2)):
        assert not changed.checked
        with pytest.raises(ValueError, match="changed or rebuilt after it was resolved"):
            labkit.train(_Ranks(2), changed)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.layout = Layout(tp=2)


def test_a_run_resolved_without_its_checkpoint_folder_made_absolute_is_refused(tmp_path):
    from labkit.training.api import checked

    config = labkit.TrainConfig(model="mlp", global_batch=8, checkpoint_dir="ckpt")
    with pytest.raises(ValueError, match="'ckpt' is not an absolute path"):
        labkit.train(_Ranks(1), resolve(config, 1))
    run = checked(_Ranks(1), config)
    assert Path(run.config.checkpoint_dir).is_absolute() and checked(_Ranks(1), run) is run
