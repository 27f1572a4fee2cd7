"""The GEMMs' tile and wave quantization (labkit.plan.waves) and the embedding gradient's
share per rank (labkit.plan.traffic.table_share)."""

import pytest

from labkit import plan
from labkit.models import DLRMConfig, GPTConfig
from labkit.plan.counts import sample_counts
from labkit.plan.levers import Lever
from labkit.plan.parallelism import Parallelism
from labkit.plan.traffic import memory_bound_bytes, table_share
from labkit.plan.waves import gemm_efficiency, wave_efficiency


def test_a_shape_that_fills_its_waves_loses_nothing_and_a_tail_wave_costs_a_full_one():
    # 108 SMs (an A100): 8 x 54 tiles of 256 x 128 are 4 full waves
    assert wave_efficiency(2048, 54 * 128, 108) == pytest.approx(1.0)
    # one tile more than a wave runs two waves
    assert wave_efficiency(128, 109 * 256, 108) == pytest.approx(109 / 216)
    # an output smaller than one tile pays the whole tile
    assert wave_efficiency(64, 64, 1) == pytest.approx(64 * 64 / (128 * 256))


def test_a_decoders_gemms_run_below_the_microbenchmarks_shape_and_not_on_this_machine():
    model = GPTConfig(vocab_size=51200, seq_len=2048, d_model=2304, n_heads=24, n_layers=4)
    a100 = gemm_efficiency(model, 1, 2048, 108)
    assert 0.5 < a100 < 1.0
    assert gemm_efficiency(model, 1, 2048, 0) == 1.0  # no SM count: uncorrected
    # the projection charges it: the same step on a GPU row without SMs is faster
    cluster = plan.GPUCluster("A100-80GB")
    p = plan.project(model, Parallelism.of(dp=8), cluster, global_batch=8)
    from labkit.plan.project import _matmul_s
    plain = _matmul_s(cluster, p.lever, p.costs)
    assert _matmul_s(cluster, p.lever, p.costs, model, p.layout) > plain


def test_a_vocab_parallel_embedding_writes_its_rows_share_of_the_gradient():
    model = GPTConfig(vocab_size=51200, seq_len=256, d_model=512, n_heads=8, n_layers=2)
    layout = Parallelism.of(tp=8)
    table = sample_counts(model).table_bytes
    assert table > 0
    sharded = Lever(8, framework="megatron-2021")
    whole = Lever(8, framework="labkit")  # DTensor's plan leaves the embedding whole
    assert table_share(model, layout, sharded) == pytest.approx(1 / 8)
    assert table_share(model, layout, whole) == 1.0
    gap = memory_bound_bytes(model, layout, whole, 0.0) - memory_bound_bytes(
        model, layout, sharded, 0.0)
    assert gap == pytest.approx(table * (1 - 1 / 8))


@pytest.mark.parametrize("tables, share", [("row_wise", 1 / 4), ("table_wise", 2 / 8),
                                           (None, 1.0)])
def test_sharded_tables_charge_a_rank_only_its_rows(tables, share):
    model = DLRMConfig(num_tables=8, rows_per_table=100_000, embedding_dim=16)
    layout = Parallelism.of(fsdp=4, tables=tables) if tables else Parallelism.of(fsdp=4)
    assert table_share(model, layout, Lever(64)) == pytest.approx(share)
    table = sample_counts(model).table_bytes
    other = memory_bound_bytes(model, layout, Lever(64), 0.0) - table * share
    assert other == pytest.approx(memory_bound_bytes(model, Parallelism.of(fsdp=4), Lever(64),
                                                     0.0) - table)


def test_megatron_cores_distributed_optimizer_reduce_scatters_and_gathers_parameters():
    # --overlap-grad-reduce --overlap-param-gather: fp32 gradients reduce-scattered in
    # backward, bf16 parameters all-gathered in the next forward; no AllReduce
    model = GPTConfig(vocab_size=32000, seq_len=1024, d_model=1024, n_heads=16, n_layers=4)
    cluster = plan.GPUCluster("H100", nodes=2)
    layout = Parallelism.of(dp=16)
    core = plan.project(model, layout, cluster, global_batch=64, zero_stage=1,
                        framework="megatron-core")
    comm = core.costs.comm
    assert ("dp", "all_reduce") not in comm
    (_, grads), (_, params) = comm[("dp", "reduce_scatter")], comm[("dp", "all_gather")]
    assert grads == pytest.approx(2 * params)  # fp32 gradients, bf16 parameters
    plain = plan.project(model, layout, cluster, global_batch=64, framework="megatron-core")
    assert plain.costs.comm[("dp", "all_reduce")][1] == pytest.approx(grads)
