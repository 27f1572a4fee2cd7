"""Embedding parallelism: the planner against brute force, table-wise and row-wise training
equal to one device, the one-device OOM that sharding fixes, AUC that rises for real."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import labkit
from labkit.models import DLRMConfig
from labkit.models.metrics import auc
from labkit.parallel.embedding import (
    PlacementError,
    auc_curve,
    dlrm_plan,
    held_out_auc,
    memory_by_part,
    merged_weights,
    plan_tables,
    time_split,
)

# 5 tables: 3 + 2 on two ranks, 2 + 1 + 1 + 1 on four; 64 rows split evenly over 2 or 4.
SMALL = DLRMConfig(num_tables=5, rows_per_table=64, embedding_dim=8, bottom_hidden=16,
                   top_hidden=16)
# 8 tables of 4000 x 16 floats: 2 MiB of weights, 8 MiB to train with Adam.
BIG = DLRMConfig(num_tables=8, rows_per_table=4000, embedding_dim=16)
SHARDED = ("table_wise", "row_wise")


# ----- AUC --------------------------------------------------------------------------------
def test_auc_is_the_share_of_correctly_ordered_pairs():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 6, (40,), generator=generator).float()  # many ties
    labels = torch.randint(0, 2, (40,), generator=generator)
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = [(p > n) + 0.5 * (p == n) for p in pos.tolist() for n in neg.tolist()]
    assert auc(scores, labels) == pytest.approx(sum(pairs) / len(pairs))
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert auc([1.0, 2.0], [1, 1]) != auc([1.0, 2.0], [1, 1])  # one class: NaN


# ----- the planner -------------------------------------------------------------------------
def _any_placement_fits(costs, world_size, budget) -> bool:
    for owners in itertools.product(range(world_size), repeat=len(costs)):
        loads = [0] * world_size
        for table, owner in enumerate(owners):
            loads[owner] += costs[table]
        if max(loads) <= budget:
            return True
    return False


def test_planner_never_exceeds_the_cap_when_a_placement_exists():
    rng = random.Random(6)
    exact_used = 0
    for _ in range(400):
        world_size, count = rng.randint(2, 3), rng.randint(2, 7)
        costs = [rng.randint(1, 20) for _ in range(count)]
        reserved = rng.randint(0, 5)
        capacity = reserved + rng.randint(max(costs), sum(costs))  # every table fits whole
        possible = _any_placement_fits(costs, world_size, capacity - reserved)
        try:
            plan = plan_tables(costs, world_size, capacity, reserved)
        except PlacementError:
            assert not possible
            continue
        assert max(plan.total_bytes) <= capacity
        if possible:  # a whole-table placement exists: the planner must find one
            assert plan.row_wise == [] and plan.whole_tables == list(range(count))
        exact_used += plan.method == "exact search"
    assert exact_used > 0, "no instance needed the exact search: the test lost its teeth"


def test_planner_balances_largest_first_and_says_why():
    plan = plan_tables([8, 7, 6, 5, 4], world_size=2)
    assert plan.tables_per_rank == [[0, 3, 4], [1, 2]] and plan.rank_bytes == [17, 13]
    assert plan.method == "greedy" and "least-loaded" in plan.explain()
    # A table bigger than any rank's room is split by rows; the rest still go whole.
    plan = plan_tables([30, 4, 4], world_size=2, capacity_bytes=24, reserved_bytes=2)
    assert plan.row_wise == [0] and plan.total_bytes == [21, 21]
    assert "fits no rank whole" in plan.explain()


def test_planner_says_what_to_change_when_nothing_fits():
    with pytest.raises(PlacementError, match="add ranks"):
        plan_tables([40, 40], world_size=2, capacity_bytes=30, reserved_bytes=5)


def test_plan_of_a_training_run_counts_adam_and_balances_tables():
    config = labkit.TrainConfig(model=BIG, global_batch=128)
    plan = dlrm_plan(config, 2)
    table_weights = BIG.rows_per_table * BIG.embedding_dim * 4
    assert plan.table_bytes == [4 * table_weights] * 8  # weights, gradient, two moments
    assert [len(t) for t in plan.tables_per_rank] == [4, 4]
    sgd = dlrm_plan(config.replace(optimizer="sgd"), 2)
    assert sgd.table_bytes == [2 * table_weights] * 8


# ----- training equals one device ------------------------------------------------------------
def _sgd(**fields):
    return labkit.TrainConfig(model=SMALL, global_batch=32, steps=3, lr=0.5, optimizer="sgd",
                              return_weights=True).replace(**fields)


@pytest.fixture(scope="module")
def reference(one):
    return labkit.train(one, _sgd(), estimate=False)


@pytest.mark.parametrize("strategy", SHARDED)
@pytest.mark.parametrize("ranks", [2, 4])
def test_sharded_training_equals_one_device(request, reference, strategy, ranks):
    cluster = request.getfixturevalue({2: "two", 4: "four"}[ranks])
    report = labkit.train(cluster, _sgd(), strategy=strategy)
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)
    expected = reference.ranks[0]["weights"]
    weights = merged_weights(report)
    assert sorted(weights) == sorted(expected)
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)
    # what each rank holds of the tables: a 1/N share
    table_bytes = SMALL.num_tables * SMALL.rows_per_table * SMALL.embedding_dim * 4
    held = [r["state_bytes"]["tables"]["parameters"] for r in memory_by_part(report)]
    assert sum(held) == table_bytes and max(held) <= table_bytes / ranks + 2 * 64 * 8 * 4


def test_ranks_without_a_table_still_take_part_in_the_exchange(one, four):
    config = _sgd(model=DLRMConfig(num_tables=2, rows_per_table=64, embedding_dim=8))
    reference = labkit.train(one, config, estimate=False)
    report = labkit.train(four, config, strategy="table_wise", timeout=60)  # no hang
    assert report.ranks[0]["records"][0]["plan"]["tables_per_rank"] == [[0], [1], [], []]
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)


def test_table_wise_splits_a_table_that_fits_no_rank_whole(one, two):
    # Three tables, room for about 1.6 per rank: one is split by rows, two stay whole.
    model = DLRMConfig(num_tables=3, rows_per_table=2000, embedding_dim=16)
    config = labkit.TrainConfig(model=model, global_batch=64, steps=2, lr=0.5,
                                optimizer="sgd", return_weights=True)
    capacity = int(dlrm_plan(config, 2).reserved_bytes + 1.6 * 2 * 2000 * 16 * 4)
    plan = dlrm_plan(config, 2, capacity)
    assert plan.row_wise == [0] and plan.whole_tables == [1, 2]
    reference = labkit.train(one, config, estimate=False)
    report = labkit.train(two, config, strategy="table_wise", memory_per_device=capacity)
    assert report.ranks[0]["records"][0]["plan"]["row_wise"] == [0]
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)
    for name, value in reference.ranks[0]["weights"].items():
        torch.testing.assert_close(merged_weights(report)[name], value, rtol=1e-5, atol=1e-6)
    assert max(report.peak_bytes) <= capacity


def test_dtensor_row_wise_trains_the_same_but_holds_whole_table_gradients(two):
    shards = labkit.train(two, _sgd(), strategy="row_wise")
    dtensor = labkit.train(two, _sgd(), strategy="row_wise_dtensor")
    assert dtensor.losses == pytest.approx(shards.losses, rel=1e-6)
    table_bytes = SMALL.num_tables * SMALL.rows_per_table * SMALL.embedding_dim * 4
    for ours, theirs in zip(memory_by_part(shards), memory_by_part(dtensor), strict=True):
        assert ours["state_bytes"]["tables"]["gradients"] == table_bytes // 2
        assert theirs["state_bytes"]["tables"]["gradients"] == table_bytes  # whole, replicated


# ----- the memory wall, and past it ----------------------------------------------------------
def test_tables_that_do_not_fit_one_device_train_when_sharded(one, two, four):
    config = labkit.TrainConfig(model=BIG, global_batch=128, steps=2)
    capacity = 6 * 2**20  # the tables alone need 8 MiB to train with Adam
    with pytest.raises(labkit.DeviceOOM):
        labkit.train(one, config, memory_per_device=capacity, estimate=False)
    with pytest.raises(labkit.DeviceOOM):  # data parallelism copies the tables to every rank
        labkit.train(two, config, strategy="ddp", memory_per_device=capacity, estimate=False)
    for cluster in (two, four):
        for strategy in SHARDED:
            report = labkit.train(cluster, config, strategy=strategy, memory_per_device=capacity)
            assert max(report.peak_bytes) <= capacity
            parts = memory_by_part(report)
            assert all(p["tables"] <= 8 * 2**20 / cluster.world_size + 2**18 for p in parts)


# ----- learning, timing, traffic -------------------------------------------------------------
def test_auc_rises_and_ranks_agree_with_the_host(two):
    config = labkit.TrainConfig(model=DLRMConfig(), global_batch=256, steps=15, lr=0.01,
                                return_weights=True)
    report = labkit.train(two, config, strategy="table_wise")
    before, after = auc_curve(report)
    assert after[-1] > before + 0.1 and after[-1] > 0.6
    assert report.losses[-1] < report.losses[0]
    assert before == pytest.approx(held_out_auc(config.model), abs=1e-6)
    assert after[-1] == pytest.approx(held_out_auc(config.model, merged_weights(report)),
                                      abs=1e-4)


@pytest.mark.parametrize("strategy,exchange", [("table_wise", "all_to_all"),
                                               ("row_wise", "reduce_scatter")])
def test_step_time_splits_into_lookup_communication_and_dense(two, strategy, exchange):
    report = labkit.train(two, _sgd(steps=4), strategy=strategy)
    split = time_split(report)
    assert min(split["lookup_s"], split["comm_s"], split["optimizer_s"]) > 0
    assert split["dense_s"] >= 0
    assert sum(split[k] for k in ("lookup_s", "comm_s", "optimizer_s", "dense_s")) == (
        pytest.approx(split["step_s"]))
    kinds = report.ranks[0]["records"][-1]["comm_kinds"]
    assert exchange in kinds and "all_gather" in kinds and "all_reduce" in kinds


def test_sharded_strategies_refuse_other_models(two):
    with pytest.raises(ValueError, match="dlrm"):
        labkit.train(two, model="mlp", strategy="table_wise")
    with pytest.raises(ValueError, match="without any"):  # before any rank runs
        labkit.train(two, model=DLRMConfig(rows_per_table=1), strategy="row_wise")


def test_recommender_explorer_shows_the_plan_and_the_measured_oom(two):
    from labkit.lessons.recommender.widgets import RecommenderExplorer

    config = labkit.TrainConfig(model=SMALL, global_batch=32, steps=2)
    explorer = RecommenderExplorer(two, config, [64, 16_000], [2], "3MiB")
    box = explorer.widget(background=False)  # slider runs happen here, not in a thread
    first = box.plot.outputs[0]["data"]["image/png"]
    assert "measured: fits" in box.message.value
    box.size.value = 16_000  # 5 tables of 16000 x 8 floats, with Adam: 10 MiB over 2 ranks
    assert box.plot.outputs[0]["data"]["image/png"] != first
    assert "plan: does not fit; measured: out of memory" in box.message.value
