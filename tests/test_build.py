"""The build path: one mesh per run that is the layout, one allocator that gives every layout
the same initial weights, device tensors for every transfer, and a package graph without
cycles."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

import labkit
from labkit.models import DLRMConfig, GPTConfig, MLPConfig, build_model
from labkit.parallel.pipeline.p2p import recv_tensor, send_tensor
from labkit.training.build import host_shard, parallel_context
from labkit.training.layout import Layout
from labkit.training.layout.mesh import mesh_for
from labkit.training.run import resolve

REPO = Path(__file__).resolve().parent.parent


def _mesh_and_groups(ctx) -> dict:
    layout = Layout(dp=2, tp=2)
    resolved = resolve(labkit.TrainConfig(model=GPTConfig(), layout=layout, global_batch=4), 4)
    run = parallel_context(ctx, resolved)
    found = {dim: dist.get_process_group_ranks(run.group(dim)) for dim in layout.degrees}
    found["coordinates"] = {dim: run.coordinate(dim) for dim in layout.degrees}
    found["data_rank"] = run.data_rank
    before = len(dist.distributed_c10d._world.pg_map)
    again = parallel_context(ctx, resolved)  # a second run with this layout: the same mesh
    found["same_mesh"] = again.mesh is run.mesh
    found["new_groups"] = len(dist.distributed_c10d._world.pg_map) - before
    return found


def _shards_match(ctx) -> list[bool]:
    """host_shard (cut on the host) against distribute_tensor(src_data_rank=None)."""
    full = torch.arange(6 * 10, dtype=torch.float32).view(6, 10)  # uneven over 4 on dim 0
    out = []
    two_d = mesh_for(Layout(fsdp=2, tp=2), "cpu")["fsdp", "tp"]
    for placements in ([Shard(0), Replicate()], [Replicate(), Shard(1)],
                       [_StridedShard(0, split_factor=2), Shard(0)], [Shard(1), Shard(0)]):
        want = distribute_tensor(full, two_d, placements, src_data_rank=None).to_local()
        out.append(torch.equal(host_shard(full, two_d, placements), want))
    return out


def test_the_mesh_is_the_layout_and_is_made_once_per_layout():
    layout = Layout(dp=2, tp=2)
    with labkit.Cluster(4, device="cpu", progress=False) as four:
        found = four.run(_mesh_and_groups)
        assert all(four.run(_shards_match)[r] == [True] * 4 for r in range(4))
    for rank, result in enumerate(found):
        assert result["coordinates"] == layout.coordinates(rank)
        for dim in layout.degrees:
            assert result[dim] in layout.groups(dim)
        assert result["data_rank"] == layout.coordinates(rank)["dp"]
        assert result["same_mesh"] and result["new_groups"] == 0  # no pile of connections


@pytest.mark.parametrize("model, strategies", [
    (MLPConfig(), ("single", "ddp", "zero1", "fsdp", "tp", "gpipe", "naive_dp")),
    (GPTConfig(n_layers=2, d_model=64), ("single", "fsdp", "tp", "1f1b")),
    (DLRMConfig(num_tables=4, rows_per_table=64), ("single", "ddp", "table_wise",
                                                    "row_wise"))], ids=lambda v: str(v)[:4])
def test_one_seed_gives_the_same_initial_weights_for_every_strategy(one, two, model,
                                                                    strategies):
    """Issue 18: weights are made once, on the host with the CPU generator, then each rank
    copies its shard; a step with lr=0 leaves them as they were built."""
    config = labkit.TrainConfig(model=model, global_batch=8, steps=1, lr=0.0, optimizer="sgd",
                                micro_batches=2, return_weights=True, seed=3)
    want = build_model(model, "cpu", seed=3).state_dict()
    for strategy in strategies:
        cluster = one if strategy == "single" else two
        report = labkit.train(cluster, config, strategy=strategy, estimate=False)
        for rank in report.ranks:
            assert rank["weights"], strategy
            for name, value in rank["weights"].items():
                assert torch.equal(value, want[name]), (strategy, name)


def test_a_naive_pipeline_sends_only_tensors_on_the_rank_s_device(monkeypatch):
    """Issue 18: NCCL moves device memory only; the shape header goes on the device too.
    The meta device stands in for a GPU: every tensor handed to send is on it."""
    sent = []
    monkeypatch.setattr(dist, "send", lambda tensor, **kwargs: sent.append(tensor))
    send_tensor(torch.empty(3, 4, device="meta"), dst=1)
    assert len(sent) == 3 and {t.device.type for t in sent} == {"meta"}
    queue = [torch.tensor([4]), torch.tensor([0, 2, 3, 4]), None]

    def recv(tensor, **kwargs):
        received.append(tensor)
        if queue[0] is not None:
            tensor.copy_(queue[0])
        queue.pop(0)

    received = []
    monkeypatch.setattr(dist, "recv", recv)
    out = recv_tensor(0, torch.device("cpu"))
    assert out.shape == (3, 4) and all(t.device.type == "cpu" for t in received)


def test_estimating_leaves_no_rank_prefix_on_the_notebook_s_errors():
    """Issue 11: the fake process group of the estimator used to leave torch's
    ``[rank0]:`` excepthook installed, one more per call."""
    hook = sys.excepthook
    for strategy in ("fsdp", "zero1", "ddp"):
        labkit.estimate_memory(labkit.TrainConfig(strategy=strategy), 2)
    assert sys.excepthook is hook and not dist.is_initialized()


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_edges() -> dict[str, set[str]]:
    """Module -> the labkit modules its top-level imports run: the one named, and every
    package above it that is not also above the importer (importing ``a.b.c`` runs
    ``a/__init__`` and ``a/b/__init__`` first; a package the importer is inside is already
    running, which Python allows as long as no name is taken from it)."""
    files = {_module_name(p): p for p in (REPO / "labkit").rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        targets = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module:
                named = [node.module]
            elif isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            else:
                continue
            for module in named:
                parts = module.split(".")
                parents = {".".join(parts[:i]) for i in range(1, len(parts))}
                targets |= {module} & set(files)
                targets |= (parents - ancestors) & set(files)
        edges[name] = targets - {name}
    return edges


def test_no_module_imports_a_package_that_imports_it_back():
    """The import graph of labkit (through the package __init__s that an import runs) has
    no cycle: any module can be imported first."""
    edges, state, path = _import_edges(), {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                cycle = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)


def test_ranks_forked_after_an_estimate_cut_their_own_shards():
    """DTensor caches sharding decisions by the mesh's value, and the cached results hold the
    mesh: a launcher forked from a process that had estimated (a fake rank 0 of 2) handed rank
    1 rank 0's mesh, and FSDP's rank 1 copied rank 0's shard. Every layout must start from
    the host model's weights whatever the notebook did before."""
    for strategy in ("fsdp", "zero1", "tp"):
        labkit.estimate_memory(labkit.TrainConfig(strategy=strategy), 2)
    config = labkit.TrainConfig(model="mlp", global_batch=16, steps=1, lr=0.0, optimizer="sgd",
                                return_weights=True)
    want = labkit.models.build_model(config.model, "cpu").state_dict()
    with labkit.Cluster(2, device="cpu", progress=False, launcher="fork") as cluster:
        for strategy in ("fsdp", "tp"):
            report = labkit.train(cluster, config, strategy=strategy, estimate=False)
            for rank in report.ranks:
                for name, value in rank["weights"].items():
                    assert torch.equal(value, want[name]), (strategy, rank["rank"], name)
