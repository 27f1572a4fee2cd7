"""Tensor parallelism: the hand-written layers and DTensor's equal the plain layers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import labkit
from labkit.models import GPTConfig, MLPConfig, loss_fn, make_batch, plan_for
from labkit.parallel.tensor import parallel_mlp, tensor_parallel_mlp
from labkit.training.build import build, parallel_context
from labkit.training.layout import Layout
from labkit.training.layout.mesh import mesh_for
from labkit.training.run import Run, resolve


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _compare_with_plain(ctx, kind: str) -> dict:
    return _compare_on_mesh(ctx, kind, mesh_for(Layout(tp=ctx.world_size), "cpu"))


def _compare_on_mesh(ctx, kind: str, mesh) -> dict:
    torch.manual_seed(0)  # the same weights and input on every rank
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    plain, x_plain = copy.deepcopy(mlp), x.clone().requires_grad_()
    plain(x_plain).pow(2).sum().backward()
    if kind == "scratch":
        tp = parallel_mlp(copy.deepcopy(mlp), ctx.rank, ctx.world_size)
    else:
        tp = tensor_parallel_mlp(copy.deepcopy(mlp), mesh["tp"])
    x_tp = x.clone().requires_grad_()
    y = tp(x_tp)
    y.pow(2).sum().backward()
    n, r = ctx.world_size, ctx.rank
    expected = {  # this rank's shard of every plain gradient
        "0.weight": plain[0].weight.grad.chunk(n, 0)[r], "0.bias": plain[0].bias.grad.chunk(n)[r],
        "2.weight": plain[2].weight.grad.chunk(n, 1)[r], "2.bias": plain[2].bias.grad}
    grads = {name: _local(p.grad) for name, p in tp.named_parameters()}
    return {"output": (y - plain(x)).abs().max().item(),
            "input_grad": (x_tp.grad - x_plain.grad).abs().max().item(),
            "weight_grads": max((grads[k] - v).abs().max().item() for k, v in expected.items()),
            "local_params": sum(_local(p).numel() for p in tp.parameters()),
            "plain_params": sum(p.numel() for p in mlp.parameters())}


@pytest.mark.parametrize("kind", ["scratch", "dtensor"])
def test_tensor_parallel_mlp_equals_the_plain_layers(two, kind):
    for result in two.run(_compare_with_plain, kind):
        assert result["output"] < 1e-6
        assert result["input_grad"] < 1e-6
        assert result["weight_grads"] < 1e-6
        # Weights split in two; only the row layer's bias (8 values) is kept whole.
        assert result["local_params"] == (result["plain_params"] - 8) // 2 + 8


@pytest.mark.parametrize("model", [MLPConfig(n_layers=4), MLPConfig(n_layers=3),
                                   GPTConfig(n_layers=2)], ids=["mlp", "mlp-odd", "gpt"])
def test_tensor_parallel_training_equals_one_device(one, two, model):
    config = labkit.TrainConfig(model=model, global_batch=16, steps=3, lr=0.05,
                                optimizer="sgd")
    reference = labkit.train(one, config, estimate=False)
    report = labkit.train(two, config, strategy="tp")
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)
    full = reference.ranks[0]["memory"]["at_peak"]["parameters"]
    for rank in report.ranks:  # each rank holds about half the weights
        assert rank["memory"]["at_peak"]["parameters"] < 0.6 * full
    if model.name == "mlp" and model.n_layers == 4:
        assert max(report.peak_bytes) < 0.6 * reference.peak_bytes[0]


def test_tensor_parallel_on_four_ranks_splits_heads(one):
    config = labkit.TrainConfig(model=GPTConfig(n_layers=1), global_batch=8, steps=2,
                                lr=0.05, optimizer="sgd")
    reference = labkit.train(one, config, estimate=False)
    with labkit.Cluster(4, device="cpu", progress=False) as four:
        report = labkit.train(four, config, strategy="tp")
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)


# ----- the lesson's tools: split matmul, per-layer traffic, TP vs DDP, the degree slider ----

def test_split_matmul_joins_to_the_one_piece_product(two):
    from labkit.lessons.tensor_parallel import split_matmul

    demo = split_matmul(two, m=3, k=4, n=6)
    assert demo.errors() == {"column": 0.0, "row": 0.0}  # small integers: exact
    assert [b.shape for b in demo.column_blocks] == [(3, 3), (3, 3)]  # (m, n / N) each
    assert torch.equal(torch.cat(demo.column_blocks, dim=1), demo.y)
    assert all(p.shape == (3, 6) for p in demo.row_partials)  # (m, n): shares of a sum
    assert torch.equal(sum(demo.row_partials), demo.y)
    assert not torch.equal(demo.row_partials[0], demo.y)  # one share alone is not Y
    fig = labkit.plots.plot_split_matmul(demo)
    assert len(fig.axes) == 2


def test_split_matmul_refuses_an_uneven_split_before_running(two):
    from labkit.lessons.tensor_parallel import split_matmul

    with pytest.raises(ValueError, match="does not split over 2 ranks"):
        split_matmul(two, n=3)


@pytest.mark.parametrize("model, degree, message", [
    (MLPConfig(d_hidden=100), 3, "d_hidden=100"), (GPTConfig(n_heads=4), 3, "4 attention heads"),
    (MLPConfig(), 0, "at least 1")])
def test_tp_degree_must_divide_the_width_or_heads(model, degree, message):
    from labkit.lessons.tensor_parallel import check_tp_degree

    with pytest.raises(ValueError, match=message):
        check_tp_degree(model, degree)


def _comm_debug_mode_counts(ctx, run_dict: dict) -> dict:
    """PyTorch's own per-module collective counts (CommDebugMode), the reference."""
    from torch.distributed.tensor.debug import CommDebugMode

    run = Run.from_dict(run_dict)
    config = run.config
    model = build(parallel_context(ctx, run)).model
    inputs, targets = make_batch(config.model, 0, config.global_batch, config.seed)
    with CommDebugMode() as mode:
        loss_fn(config.model)(model(inputs), targets).backward()
    prefix = type(model).__name__ + "."
    split = plan_for(config.model).tp_styles(model)
    return {(name, phase): sum(counts.values())
            for module, passes in mode.comm_module_counts.items()
            if module.startswith(prefix) and module[len(prefix):] in split
            for phase, counts in passes.items() for name in [module[len(prefix):]] if counts}


def test_comm_per_layer_matches_theory_and_pytorch(two):
    """The zoo MLP with 4 linears = 2 column/row pairs, on 2 ranks: forward, one AllReduce of
    each row layer's output (batch, out); backward, one AllReduce of each column layer's input
    gradient (batch, in), except the first layer's: its input is the data, which needs none.
    The per-layer total is exactly what a training step records."""
    from labkit.lessons.tensor_parallel import comm_per_layer

    config = labkit.TrainConfig(model=MLPConfig(d_in=16, d_hidden=64, n_layers=4, d_out=8),
                                global_batch=12, strategy="tp")
    layers = comm_per_layer(two, config)
    found = {(r["layer"], r["phase"]): (r["kind"], r["calls"], r["bytes"], r["shape"])
             for r in layers.rows}
    assert found == {("layers.2", "forward"): ("all_reduce", 1, 12 * 64 * 4, [12, 64]),
                     ("layers.6", "forward"): ("all_reduce", 1, 12 * 8 * 4, [12, 8]),
                     ("layers.4", "backward"): ("all_reduce", 1, 12 * 64 * 4, [12, 64])}
    assert layers.calls("forward") == 2 and layers.calls("backward") == 1
    assert all(r["seconds"] > 0 for r in layers.rows)
    run = resolve(config.replace(strategy="tp"), two.world_size)
    reference = two.run(_comm_debug_mode_counts, run.to_dict())[0]
    assert reference == {key: calls for key, (_, calls, _, _) in found.items()}
    step = labkit.train(two, config, steps=2).ranks[0]["records"][-1]
    assert step["comm_kinds"] == {"all_reduce": [3, layers.total("bytes"),
                                                 layers.total("bytes")]}  # 2(N-1)/N = 1
    assert "output (12, 64)" in layers._repr_html_()


def test_comm_per_layer_of_a_gpt_block(two):
    """Attention split by heads and the MLP: two AllReduces forward, two backward a block."""
    from labkit.lessons.tensor_parallel import comm_per_layer

    layers = comm_per_layer(two, model=GPTConfig(n_layers=1, seq_len=8, d_model=32),
                            global_batch=2)
    found = {(r["layer"], r["phase"]): r["bytes"] for r in layers.rows}
    activation = 2 * 8 * 32 * 4  # (batch, seq, d_model) float32
    assert found == {("blocks.0.attn.proj", "forward"): activation,
                     ("blocks.0.mlp.2", "forward"): activation,
                     ("blocks.0.mlp.0", "backward"): activation,
                     ("blocks.0.attn.qkv", "backward"): activation}


def test_tp_traffic_grows_with_the_batch_and_ddp_traffic_does_not(two):
    from labkit.lessons.tensor_parallel import compare_with_ddp
    from labkit.models import count_parameters

    config = labkit.TrainConfig(model=MLPConfig(d_in=16, d_hidden=64, n_layers=4, d_out=8),
                                steps=2)
    result = compare_with_ddp(two, config, batches=[8, 64])
    tp, ddp = result.series("tp", "bytes"), result.series("ddp", "bytes")
    assert tp[1] == 8 * tp[0]  # activations: proportional to the batch
    assert ddp[0] == ddp[1] == 4 * count_parameters(config.model)  # the gradients, once
    assert result.series("tp", "calls") == [3, 3] and result.series("ddp", "calls") == [1, 1]
    assert result.crossover() == pytest.approx(ddp[0] / (tp[1] / 64))
    assert all(row["step_s"] > 0 for row in result.rows)
    assert len(labkit.plots.plot_tp_vs_ddp(result).axes) == 2
    with pytest.raises(ValueError, match="split over 2 ranks"):
        compare_with_ddp(two, config, batches=[7])


def test_tp_explorer_slider_redraws_from_measured_runs(one, two):
    config = labkit.TrainConfig(model=MLPConfig(d_in=16, d_hidden=64, n_layers=4, d_out=8),
                                global_batch=16, steps=2)
    single = labkit.train(one, config, estimate=False)
    explorer = labkit.widgets.TensorParallelExplorer(two, config, [1, 2], {1: single})
    box = explorer.widget(background=False)  # degree 2 trains on the two ranks, in this thread
    assert box.slider.description == "TP degree" and box.slider.value == 2
    explorer_png = box.plot.outputs[0]["data"]["image/png"]
    box.slider.value = 1
    assert box.status.value == ""  # no error shown
    assert box.plot.outputs[0]["data"]["image/png"] != explorer_png
    with pytest.raises(ValueError, match="another run"):
        labkit.widgets.tp_explorer(two, config, degrees=[1, 2], reports={2: single})
    with pytest.raises(ValueError, match="d_hidden=64"):
        labkit.widgets.tp_explorer(two, config, degrees=[1, 3])


def test_train_refuses_an_uneven_split_before_the_ranks_run(two):
    with pytest.raises(ValueError, match="d_hidden=63 does not split over 2 ranks"):
        labkit.train(two, model=MLPConfig(d_hidden=63), strategy="tp", global_batch=8)
