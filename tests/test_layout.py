"""Layouts: the degree rules, checked before any process starts (each error says what to
change), the presets the strategy names stand for, and rank numbering with tp innermost.
Pure arithmetic: no rank starts here."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import labkit
from labkit.models import DLRMConfig, GPTConfig, MLPConfig
from labkit.training.layout import STRATEGIES, Layout, preset
from labkit.training.run import resolve


def _config(model=None, **fields):
    return labkit.TrainConfig(model=model or MLPConfig(), **fields)


@pytest.mark.parametrize("fields, message", [
    ({"dp": 0}, "at least 1"), ({"tp": 1.5}, "whole number"), ({"pp": True}, "whole number"),
    ({"schedule": "zero_bubble"}, "choose one of naive, naive_gpipe, naive_1f1b, gpipe"),
    ({"dp_kind": "ddp2"}, "choose one of ddp"), ({"tables": "column_wise"}, "table_wise"),
    ({"fsdp": 2, "dp_kind": "ddp"}, "replicates the model"),
    ({"dp": 2, "dp_kind": "fsdp"}, "write fsdp=2"),
    ({"dp": 2, "tp": 2, "dp_kind": "zero1"}, "plain replicas only"),
    ({"dp": 2, "tables": "table_wise", "dp_kind": "naive"}, "leave dp_kind out"),
    ({"fsdp": 2, "tp": 2, "tables": "row_wise"}, "leave them at 1")])
def test_layouts_that_no_engine_runs_are_refused(fields, message):
    """A degree or an engine choice out of range is refused where it is written (the Layout,
    the TrainConfig); choices that no engine runs with these degrees, when the run is
    resolved."""
    engines = {k: fields.pop(k) for k in ("schedule", "dp_kind", "tables") if k in fields}
    with pytest.raises(ValueError, match=message):
        layout = Layout(**fields)
        resolve(_config(layout=layout, global_batch=8, **engines), layout.size)


def test_numpy_degrees_are_taken_as_plain_ints():
    """As every config field: a degree computed with numpy is a whole number too."""
    layout = Layout(dp=np.int64(2), tp=np.int32(2))
    assert type(layout.dp) is int and layout == Layout(dp=2, tp=2)
    assert hash(layout) == hash(Layout(dp=2, tp=2))  # the layout picker caches runs by it


def test_the_product_of_the_degrees_is_the_rank_count():
    assert Layout(pp=2, dp=2, fsdp=1, tp=2).size == 8
    with pytest.raises(ValueError, match="needs 4 ranks and the cluster has 2"):
        resolve(_config(layout=Layout(dp=2, tp=2)), 2)


@pytest.mark.parametrize("model, degree, message", [
    (MLPConfig(d_hidden=100), 3, "d_hidden=100 does not split over 3"),
    (GPTConfig(n_heads=4), 3, "4 attention heads do not split over 3"),
    (DLRMConfig(), 2, "tables='table_wise'")])
def test_tensor_parallel_degree_must_suit_the_model(model, degree, message):
    with pytest.raises(ValueError, match=message):
        resolve(_config(model, layout=Layout(tp=degree)), degree)


def test_pipeline_stages_need_layers_with_weights():
    # The MLP has one layer with weights per n_layers; a GPT adds embeddings, norm, head.
    resolve(_config(MLPConfig(n_layers=4), micro_batches=4, layout=Layout(pp=4)), 4)
    with pytest.raises(ValueError, match="cannot fill 4 stages"):
        resolve(_config(MLPConfig(n_layers=3), micro_batches=4, layout=Layout(pp=4)), 4)
    resolve(_config(GPTConfig(n_layers=1), micro_batches=4, layout=Layout(pp=4)), 4)
    # Interleaved 1F1B: two stages per rank.
    interleaved = dict(layout=Layout(pp=2), schedule="interleaved_1f1b")
    resolve(_config(MLPConfig(n_layers=4), micro_batches=2, **interleaved), 2)
    with pytest.raises(ValueError, match="cannot fill 4 stages"):
        resolve(_config(MLPConfig(n_layers=3), micro_batches=2, **interleaved), 2)
    with pytest.raises(ValueError, match="chain of layers"):
        resolve(_config(DLRMConfig(), micro_batches=2, layout=Layout(pp=2)), 2)
    # The model is said first: more micro-batches would not make the DLRM a chain.
    with pytest.raises(ValueError, match="chain of layers"):
        resolve(_config(DLRMConfig(), layout=Layout(pp=4)), 4)
    with pytest.raises(ValueError, match="cannot fill 4 stages"):
        resolve(_config(MLPConfig(n_layers=3), layout=Layout(pp=4)), 4)


def test_schedules_need_their_micro_batches():
    with pytest.raises(ValueError, match="at least as many micro-batches as stages"):
        resolve(_config(micro_batches=1, layout=Layout(pp=2)), 2)  # 1F1B by default
    resolve(_config(micro_batches=1, layout=Layout(pp=2), schedule="gpipe"), 2)
    with pytest.raises(ValueError, match="one whole batch"):
        resolve(_config(micro_batches=2, layout=Layout(pp=2), schedule="naive"), 2)
    with pytest.raises(ValueError, match="multiple of 2 micro-batches, not 3"):
        resolve(_config(MLPConfig(n_layers=4), micro_batches=3, global_batch=12,
                        layout=Layout(pp=2), schedule="interleaved_1f1b"), 2)


def test_the_batch_splits_over_data_ranks_and_micro_batches_not_over_tp_or_pp():
    layout = Layout(pp=2, dp=2, tp=2)  # 2 data slices, whatever tp and pp are
    resolve(_config(global_batch=8, micro_batches=4, layout=layout), 8)
    with pytest.raises(ValueError, match="does not split evenly over 2 ranks x 4 "
                                         "micro-batches: choose a multiple of 8"):
        resolve(_config(global_batch=12, micro_batches=4, layout=layout), 8)
    with pytest.raises(ValueError, match="does not split into 4 micro-batches"):
        resolve(_config(global_batch=6, micro_batches=4, layout=Layout(tp=2)), 2)


def test_tables_need_the_dlrm_and_rows_for_every_rank():
    with pytest.raises(ValueError, match="embedding tables of the zoo's 'dlrm'"):
        resolve(_config(layout=Layout(fsdp=2), tables="table_wise"), 2)
    with pytest.raises(ValueError, match="without any"):
        resolve(_config(DLRMConfig(rows_per_table=1), layout=Layout(fsdp=2), tables="row_wise"),
                2)
    resolve(_config(DLRMConfig(), layout=Layout(dp=2, fsdp=2), tables="table_wise"), 4)


def test_pipelines_on_shared_gpus_are_refused_before_any_rank_starts():
    """Issue 18: ranks sharing a GPU talk over gloo, which cannot send GPU tensors point to
    point; a pipeline there is refused with what to do instead."""
    config = _config(micro_batches=2)
    resolve(config.replace(layout=Layout(pp=2)), 2, "cuda", "nccl")
    with pytest.raises(ValueError, match="gloo cannot send GPU tensors"):
        resolve(config.replace(layout=Layout(pp=2)), 2, "cuda", "gloo")


def test_ddp_under_torch_distributed_debug_detail_is_refused_before_any_rank_starts(
        monkeypatch):
    """PyTorch 2.13's DDP over gloo dies of SIGSEGV under TORCH_DISTRIBUTED_DEBUG=DETAIL (a
    plain torch.multiprocessing DDP script too): refused by labkit.train with what to do,
    before a rank starts; FSDP and INFO are left to run."""
    def run(layout, backend, debug, **engines):
        return resolve(_config(layout=layout, global_batch=8, **engines), layout.size, "cpu",
                       backend, debug=debug)

    with pytest.raises(ValueError, match="unset it, or set it to INFO"):
        run(Layout(dp=2), "gloo", "detail")
    with pytest.raises(ValueError, match="DETAIL crashes"):
        run(Layout(dp=2), "gloo", "DETAIL", dp_kind="zero1")
    for layout, backend, debug in ((Layout(fsdp=2), "gloo", "DETAIL"),
                                   (Layout(dp=2), "gloo", "INFO"), (Layout(dp=2), "gloo", None),
                                   (Layout(dp=2), "nccl", "DETAIL")):
        run(layout, backend, debug)
    import labkit

    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    cluster = labkit.Cluster(2, device="cpu", progress=False)  # no rank starts until a run
    try:
        with pytest.raises(ValueError, match="DETAIL crashes"):
            labkit.train(cluster, model="mlp", strategy="ddp", global_batch=8, steps=1)
    finally:
        cluster.close()


def test_every_strategy_name_is_a_preset_layout():
    dp, fsdp, pp = Layout(dp=4), Layout(fsdp=4), Layout(pp=4)
    expected = {"single": (Layout(), {}), "naive_dp": (dp, {"dp_kind": "naive"}),
                "ddp": (dp, {"dp_kind": "ddp"}), "zero1": (dp, {"dp_kind": "zero1"}),
                "fsdp": (fsdp, {"dp_kind": "fsdp"}),
                "naive_pipeline": (pp, {"schedule": "naive"}),
                "gpipe": (pp, {"schedule": "gpipe"}), "1f1b": (pp, {"schedule": "1f1b"}),
                "interleaved_1f1b": (pp, {"schedule": "interleaved_1f1b"}),
                "tp": (Layout(tp=4), {}), "table_wise": (fsdp, {"tables": "table_wise"}),
                "row_wise": (fsdp, {"tables": "row_wise"}),
                "row_wise_dtensor": (fsdp, {"tables": "row_wise_dtensor"})}
    assert set(expected) == set(STRATEGIES)
    for name, layout in expected.items():
        assert preset(name, 1 if name == "single" else 4) == layout
    with pytest.raises(ValueError, match="one device"):
        preset("single", 2)
    with pytest.raises(ValueError, match="unknown strategy"):
        preset("magic", 2)
    # A preset's engine runs even on one rank: "ddp" x1 is DDP, measured with DDP's buckets.
    one = labkit.TrainConfig(global_batch=8)
    assert resolve(one.replace(strategy="ddp"), 1).engines.data_engine == "ddp"
    assert resolve(one.replace(strategy="gpipe"), 1).engines.pipelined
    assert resolve(one, 1).engines.data_engine is None and not resolve(one, 1).engines.pipelined


def test_ranks_are_numbered_pp_outermost_and_tp_innermost():
    layout = Layout(pp=2, dp=2, tp=2)
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]  # neighbours: one node
    assert layout.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("fsdp") == [[r] for r in range(8)]
    assert layout.coordinates(6) == {"pp": 1, "dp": 1, "fsdp": 0, "cp": 0, "tp": 0}
    assert all(layout.rank_at(**layout.coordinates(r)) == r for r in range(8))
    assert str(layout) == "pp2 x dp2 x tp2"  # degrees; the run's label names the schedule
    assert labkit.TrainConfig(layout=layout).label == "pp2 x dp2 x tp2 (1f1b)"
    assert labkit.TrainConfig(layout=layout, schedule="gpipe").label == "pp2 x dp2 x tp2 (gpipe)"


def test_train_config_takes_a_layout_or_a_strategy_name():
    config = labkit.TrainConfig(layout=Layout(fsdp=2, tp=2))
    assert config.label == "fsdp2 x tp2" and config.strategy == "single"
    assert labkit.TrainConfig.from_dict(config.to_dict()) == config
    assert config.replace(strategy="ddp").layout is None  # a name replaces the layout
    assert labkit.TrainConfig(strategy="ddp").replace(layout=Layout(dp=2)).strategy == "single"
    with pytest.raises(ValueError, match="not both"):  # when the run is resolved
        resolve(labkit.TrainConfig(strategy="ddp", layout=Layout(dp=2)), 2)
    with pytest.raises(ValueError, match="unknown strategy"):
        labkit.TrainConfig(strategy="magic")


def test_cp_sits_between_fsdp_and_tp():
    layout = Layout(dp=2, cp=2, tp=2)
    assert layout.groups("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert str(layout) == "dp2 x cp2 x tp2" and layout.data_size == 2
    with pytest.raises(ValueError, match="cp=0"):
        Layout(cp=0)


def test_an_engine_choice_given_to_layout_says_where_it_goes():
    """Layout holds the degrees only: an engine choice there names the TrainConfig field."""
    with pytest.raises(TypeError, match=r"degrees only; schedule='gpipe' is chosen beside it: "
                       r"labkit.train\(cluster, layout=labkit.Layout\(pp=2\), schedule='gpipe'\)"):
        Layout(pp=2, schedule="gpipe")
    for name in ("dp_kind", "tables", "cp_engine"):
        with pytest.raises(TypeError, match=f"{name}='x' is chosen beside it"):
            Layout(dp=2, **{name: "x"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'dpp'"):
        Layout(dpp=2)
    assert pickle.loads(pickle.dumps(Layout(dp=2, tp=2))) == Layout(dp=2, tp=2)
    import inspect  # what a notebook's help shows: the degrees, not (*args, **kwargs)

    assert list(inspect.signature(Layout).parameters) == ["dp", "fsdp", "tp", "pp", "cp", "ep"]


def test_a_new_layout_runs_with_its_own_engines():
    """``replace(layout=...)`` drops the engine choices not given with it, as a strategy
    name does: a gpipe pipeline's config given dp=2 trains DDP, not a one-stage pipeline
    over replicas; choices given with the new layout stay."""
    piped = labkit.TrainConfig(layout=Layout(pp=2), schedule="gpipe", micro_batches=2)
    moved = piped.replace(layout=Layout(dp=2))
    assert moved.schedule is None and resolve(moved, 2).engines == resolve(
        labkit.TrainConfig(layout=Layout(dp=2), micro_batches=2), 2).engines
    assert not resolve(moved, 2).engines.pipelined
    kept = piped.replace(layout=Layout(pp=4), schedule="gpipe", micro_batches=4)
    assert resolve(kept, 4).engines.schedule == "gpipe"
    naive = labkit.TrainConfig(layout=Layout(dp=2), dp_kind="naive")
    assert resolve(naive.replace(layout=Layout(fsdp=2)), 2).engines.dp_kind == "fsdp"
    assert naive.replace(steps=3).dp_kind == "naive"  # other fields keep them
