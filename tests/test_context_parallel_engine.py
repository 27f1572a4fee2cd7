"""Which engine runs context parallelism (labkit/parallel/context/engine.py): the choice,
its refusal before any rank starts; PyTorch's engine on CPU (refused by
torch 2.13: asserted, so a torch that lifts it is noticed), PyTorch's ring algorithm run on
CPU with the CPU attention kernel against labkit's ring on labkit's shards, and (gpu marker)
training with PyTorch's ``context_parallel`` against labkit's ring and one device."""

from __future__ import annotations

import pytest
import torch

import labkit
from labkit.models import GPTConfig
from labkit.parallel.context import positions, ring_attention, shard_sequence
from labkit.parallel.context.engine import CPU_REFUSAL, resolve_engine
from labkit.training.layout import Layout
from labkit.training.run import resolve
from tests.conftest import assert_trains_as

GPT = GPTConfig(vocab_size=64, seq_len=32, d_model=32, n_heads=2, n_layers=2)
SGD = dict(global_batch=4, steps=3, optimizer="sgd", lr=0.1, return_weights=True)


def test_auto_is_torch_on_cuda_and_the_ring_on_cpu():
    assert resolve_engine("auto", "cuda") == "torch" and resolve_engine("auto", "cpu") == "ring"
    assert resolve_engine("ring", "cuda") == "ring" and resolve_engine("torch", "cuda") == "torch"
    with pytest.raises(ValueError, match="CUDA ranks only.*has no sharding strategy"):
        resolve_engine("torch", "cpu")
    # decided once, when the run is resolved; the ranks read it from the run's engines
    config = labkit.TrainConfig(model=GPT, layout=Layout(cp=2), global_batch=4)
    assert [resolve(config.replace(cp_engine=c), 2, "cuda", "nccl").engines.cp_engine
            for c in ("auto", "torch", "ring")] == ["torch", "torch", "ring"]
    assert resolve(config, 2).engines.cp_engine == "ring"
    assert resolve(config.replace(layout=Layout(dp=2)), 2, "cuda", "nccl").engines.cp_engine is None


def test_the_engine_option_is_checked_before_any_rank_starts():
    with pytest.raises(ValueError, match="cp_engine .* must be one of auto, ring, torch"):
        labkit.TrainConfig(model=GPT, cp_engine="flash")
    config = labkit.TrainConfig(model=GPT, layout=Layout(cp=2), global_batch=4, cp_engine="torch")
    with pytest.raises(ValueError, match="cp_engine='torch' runs on CUDA ranks only"):
        resolve(config, 2, "cpu", "gloo")
    resolve(config, 2, "cuda", "nccl")  # accepted where it runs
    assert labkit.TrainConfig.from_dict(config.to_dict()).cp_engine == "torch"


def test_every_report_says_which_engine_ran():
    """The ranks say which engine ran; the report says so however it was made (the notebook's
    ``labkit.train`` or torchrun's rank 0: the latter's report did not say)."""
    from labkit.training.report import TrainReport

    config = labkit.TrainConfig(model=GPT, layout=Layout(cp=2), global_batch=4)
    ranks = [{"rank": r, "records": [], "cp_engine": "torch context_parallel"} for r in (0, 1)]
    report = TrainReport(resolve(config, 2, "cuda", "nccl"), False, ranks, None,
                         where="torchrun")
    assert report.extra["cp_engine"] == "torch context_parallel"
    assert TrainReport.from_dict(report.to_dict()).extra["cp_engine"] == "torch context_parallel"


def test_torch_head_tail_shards_are_labkits():
    """The tokens torch's default load balancer gives each rank are those labkit's
    ``sharding.py`` gives it, in the same order (so either engine reads the same batch)."""
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _HeadTailLoadBalancer,
    )

    for cp, seq in ((2, 16), (4, 32), (3, 24)):
        order = _HeadTailLoadBalancer(seq, cp, "cpu")._generate_indices()[0]
        theirs = order.view(cp, -1)  # torch then cuts the reordered sequence evenly
        for rank in range(cp):
            assert torch.equal(theirs[rank].long(), positions(rank, cp, seq)), (cp, rank)


def _torch_engine_on_cpu(ctx):
    """PyTorch's public engine on this CPU rank: the error it raises."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    except NotImplementedError as error:
        return str(error)
    return "ran"


def _torch_ring_on_cpu(ctx, seq_len: int = 32):
    """Max |torch's ring - labkit's ring| on this rank's labkit shards: torch's
    ``_templated_ring_attention`` (what ``context_parallel`` runs on GPUs, load balanced,
    keys and values rotated to the next rank) driven by the CPU attention kernel."""
    import torch.distributed as dist
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    gen = torch.Generator().manual_seed(5)
    q, k, v = (shard_sequence(torch.randn(2, 4, seq_len, 8, generator=gen), ctx.rank,
                              ctx.world_size, dim=2) for _ in range(3))
    saved = cp._cp_options.enable_load_balance, cp._cp_options.rotate_method
    cp._cp_options.enable_load_balance, cp._cp_options.rotate_method = (
        True, cp._RotateMethod.ALL_TO_ALL)
    try:
        theirs, _ = cp._templated_ring_attention(
            dist.group.WORLD, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
            q, k, v, is_causal=True)
    finally:
        cp._cp_options.enable_load_balance, cp._cp_options.rotate_method = saved
    return (theirs - ring_attention(q, k, v)).abs().max().item()


def test_torch_engine_refuses_cpu_attention_and_its_ring_equals_ours(two):
    """Why the ring runs on CPU: measured, not assumed. Then the algorithm torch's engine
    runs, on CPU through its own ring function, equals labkit's ring on labkit's shards."""
    for message in two.run(_torch_engine_on_cpu):
        assert "_scaled_dot_product_flash_attention_for_cpu" in message, message
        assert "does not have a sharding strategy" in message, message
    assert "_flash_attention_for_cpu" in CPU_REFUSAL
    assert max(two.run(_torch_ring_on_cpu)) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (each cp rank "
                    "its own GPU, NCCL: ranks sharing one GPU talk over gloo)")
def test_torch_context_parallel_trains_as_the_ring_and_one_device():
    with labkit.Cluster(2, device="cuda", progress=False) as cluster:
        with cluster.resized(1):
            one = labkit.train(cluster, model=GPT, **SGD)
        runs = {engine: labkit.train(cluster, model=GPT, layout=Layout(cp=2), cp_engine=engine,
                                     **SGD) for engine in ("auto", "ring")}
    assert runs["auto"].extra["cp_engine"] == "torch context_parallel"
    assert runs["ring"].extra["cp_engine"] == "labkit ring"
    assert_trains_as(runs["ring"], runs["auto"])
    assert_trains_as(one, runs["auto"])


def test_notebook_08_refuses_a_rank_count_it_cannot_run():
    """world_size drives cp, dp and ep in notebook 08: 1 and 3 ranks failed late (a KeyError
    on 'dp' after every run at 1; seq_len 256 not cut into 6 chunks at 3)."""
    from labkit.lessons.long_context.demo import check_lesson_ranks

    for ranks in (2, 4):
        check_lesson_ranks(ranks, [256, 512], n_experts=4, global_batch=8)
    with pytest.raises(ValueError, match="world_size=1 .* at least 2 ranks.*world_size=2 or 4"):
        check_lesson_ranks(1, [256, 512], n_experts=4, global_batch=8)
    with pytest.raises(ValueError, match="world_size=3 .*multiple of 2 x cp = 6.*n_experts 4"):
        check_lesson_ranks(3, [256, 512], n_experts=4, global_batch=8)


def _train_with_torch_engine_on_cpu(ctx, run_dict: dict) -> dict:
    """labkit's cp_engine="torch" training path (the loop shards nothing, torch's
    ``context_parallel`` shards inputs and targets, swaps SDPA, the loop averages gradients
    over cp) run on this CPU rank: DTensor is given a handler for the CPU attention op that
    calls torch's own ring functions, the part torch 2.13 lacks on CPU. Patches undone.
    The run's engines were resolved for CUDA ranks and say "torch"; the ranks read them."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    aten = torch.ops.aten
    fwd = aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def handler(op, args, kwargs):  # (batch, heads, seq / cp, d_head) shards, Shard(2)
        info = DTensor._op_dispatcher.unwrap_to_op_info(op, args, kwargs)
        mesh, a = info.compute_mesh, info.local_args
        if op is fwd:
            out = cp._templated_ring_attention(mesh.get_group(), 2, op, *a[:3],
                                               is_causal=a[4])[:2]
        else:
            out = cp._templated_ring_attention_backward(
                mesh.get_group(), 2, op, grad_out=a[0], grad_out_name="grad_out", query=a[1],
                key=a[2], value=a[3], out=a[4], logsumexp=a[5], dropout_p=a[6],
                is_causal=a[7], **info.local_kwargs)[:3]
        return tuple(DTensor.from_local(t, mesh, [Shard(2)], run_check=False) for t in out)

    cp.existing_custom_ops.update({fwd: handler, bwd: handler})
    try:
        from labkit.training.loop import train_on_rank

        return train_on_rank(ctx, run_dict)
    finally:
        for op in (fwd, bwd):
            cp.existing_custom_ops.pop(op)


def test_the_torch_engine_path_trains_as_the_ring_on_cpu(two):
    """What runs on GPUs, but on CPU: the batch sharded by torch's load balancer, the
    positions hook, targets, the gradient average over cp (not double counted)."""
    config = labkit.TrainConfig(model=GPT, layout=Layout(cp=2), **SGD)
    resolved = {engine: resolve(config.replace(cp_engine=engine), 2, "cuda", "nccl")
                for engine in ("torch", "ring")}
    runs = {engine: two.run(_train_with_torch_engine_on_cpu,
                            run.replace(device_type="cpu", backend="gloo").to_dict())
            for engine, run in resolved.items()}
    assert [r["cp_engine"] for r in runs["torch"]] == ["torch context_parallel"] * 2
    losses = {e: [rec["loss"] for rec in runs[e][0]["records"]] for e in runs}
    assert max(abs(a - b) for a, b in zip(*losses.values(), strict=True)) < 1e-5
    for name, weight in runs["ring"][0]["weights"].items():
        assert torch.allclose(runs["torch"][0]["weights"][name], weight, atol=1e-6), name
    assert "all_to_all" in {c["kind"] for c in runs["torch"][0]["records"][0]["comm"]}


def test_an_engine_chosen_for_a_layout_without_cp_is_refused_before_any_rank_starts():
    """``cp_engine`` picks what runs context parallelism; on a layout without it nothing
    would use the choice (and the report would name no engine): say so, not train."""
    from labkit.training.run import resolve

    for engine in ("ring", "torch"):
        config = labkit.TrainConfig(model=GPT, strategy="ddp", global_batch=4, cp_engine=engine)
        with pytest.raises(ValueError, match=f"cp_engine={engine!r} .* cp=1"):
            resolve(config.replace(layout=Layout(dp=2)), 2)
    resolve(labkit.TrainConfig(model=GPT, layout=Layout(dp=2), global_batch=4), 2)
