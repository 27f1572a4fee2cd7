"""Forgeries of notebooks 06, 07, 09 and 10's checks, from the ranks: each answer is wrong and
either rewires what the check measures on the ranks (the code an answer cell can reach there,
as the grader runs it) or answers the check's fixed cases from a table. Every one fails: the
inputs are drawn for each run, and the references and comparisons are the check's own, outside
the ranks. Each runs on a cluster of its own, since the patches outlive the check on its ranks.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch

import labkit
import tests.forgery
from labkit.lessons.layouts.check import LAYOUTS
from labkit.lessons.planning.check import CASES
from labkit.lessons.recommender.check import cases
from tests.exercises import solution
from tests.forgery import failed

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the answers go by value
cloudpickle.register_pickle_by_value(tests.forgery)




# ----- 06: the bytes a placement needs are added up outside the ranks -----------------------
def all_on_rank_0_hiding_the_oom(table_bytes, world_size, capacity_bytes):
    """Every table on rank 0, with the rank's allocation of them replaced by nothing."""
    import labkit.lessons.recommender.check as check

    check._hold = lambda ctx, tables, table_bytes, capacity: 0
    return [list(range(len(table_bytes)))] + [[] for _ in range(world_size - 1)]


def table_of_answers(table_bytes, world_size, capacity_bytes):
    """The course's placement for the check's fixed sets, everything on rank 0 otherwise."""
    known = [list(tables) for tables, _ in cases(world_size)]
    if list(table_bytes) in known:
        return REFERENCE_06(table_bytes, world_size, capacity_bytes)
    return [list(range(len(table_bytes)))] + [[] for _ in range(world_size - 1)]


REFERENCE_06 = solution("06_recommender_at_scale", "place_tables_answer", "place_tables")


@pytest.mark.parametrize("answer, message", [
    (all_on_rank_0_hiding_the_oom, "yet the rank reported holding them"),
    (table_of_answers, "ran out of memory holding tables")])
def test_place_tables_forgeries_fail(fresh, answer, message):
    said = failed(labkit.check.place_tables(fresh, answer))
    assert message in said, said


# ----- 07: the groups come from the layout's grid, computed outside the ranks ----------------
def consecutive_with_a_mesh_that_agrees(degrees, dim):
    """Consecutive ranks for every dimension (right for tp only), and the rank's DeviceMesh
    made to report the same group."""
    import math

    import torch.distributed as dist

    size, k = math.prod(degrees.values()), degrees[dim]
    groups = [list(range(start, start + k)) for start in range(0, size, k)]
    dist.get_process_group_ranks = lambda group: next(g for g in groups if dist.get_rank() in g)
    return groups


def groups_from_a_table(degrees, dim):
    """The right groups for the check's fixed layouts, consecutive ranks otherwise."""
    import math

    known = [dict(layout.degrees) for layouts in LAYOUTS.values() for layout in layouts]
    if dict(degrees) in known:
        return labkit.Layout(**degrees).groups(dim)
    size, k = math.prod(degrees.values()), degrees[dim]
    return [list(range(start, start + k)) for start in range(0, size, k)]


@pytest.mark.parametrize("answer, message", [
    (consecutive_with_a_mesh_that_agrees, "on the real DeviceMesh is [0, 2], yours is [0, 1]"),
    (groups_from_a_table, "drawn for this run")])
def test_mesh_groups_forgeries_fail(fresh, answer, message):
    with fresh.resized(4):
        said = failed(labkit.check.mesh_groups(fresh, answer))
    assert message in said and "yours is" in said, said


# ----- 09: cases drawn for each run --------------------------------------------------------
def seconds_from_a_table(nbytes, ranks, alpha_s, bandwidth):
    """The right times for the check's fixed cases, no latency otherwise."""
    if (nbytes, ranks, alpha_s, bandwidth) in CASES:
        return labkit.runtime.costs.collective_seconds("all_reduce", nbytes, ranks, alpha_s,
                                                       bandwidth)
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth


def test_all_reduce_seconds_from_a_table_fails(fresh):
    said = failed(labkit.check.all_reduce_seconds(fresh, seconds_from_a_table))
    assert "left out alpha" in said, said


# ----- 10: one device's run, in the check's process ----------------------------------------
def _forged_state():
    from torch.distributed.checkpoint.stateful import Stateful

    class ForgetsAdamAndTheLosses(Stateful):
        """Saves the weights and the step only; puts zeros for Adam's state, and makes the
        check's training on the rank report the same losses for both runs."""

        def __init__(self, model, optimizer, step):
            import labkit.lessons.checkpoints.check as check

            self.model, self.optimizer, self.step = model, optimizer, step
            check._train = lambda ctx, model, optimizer, steps, *rest: [0.5 for _ in steps]

        def state_dict(self):
            return {"model": self.model.state_dict(), "step": self.step}

        def load_state_dict(self, state_dict):
            self.model.load_state_dict(state_dict["model"])
            self.step = state_dict["step"]
            for p in self.model.parameters():
                self.optimizer.state[p] = {"step": torch.tensor(2.0),
                                           "exp_avg": torch.zeros_like(p),
                                           "exp_avg_sq": torch.zeros_like(p)}

    return ForgetsAdamAndTheLosses


def test_training_state_forgery_fails(fresh):
    said = failed(labkit.check.training_state(fresh, _forged_state()))
    assert "changed the check's measurements" in said, said


# ----- every check: a rank's report in another shape is a failure, not a crash -------------
def _replace_job(ctx, module: str, job: str):
    """On a rank, as an answer cell may: the check's job (sent by name) returns nonsense."""
    import importlib

    setattr(importlib.import_module(module), job, lambda *args, **kwargs: {"nonsense": 1})


@pytest.mark.parametrize("check, module, job, notebook, grade_id, name", [
    ("place_tables", "recommender", "_job", "06_recommender_at_scale", "place_tables_answer",
     "place_tables"),
    ("mesh_groups", "layouts", "_on_rank", "07_putting_it_together", "mesh_groups_answer",
     "mesh_groups"),
    ("all_reduce_seconds", "planning", "_job", "09_plan_a_real_run",
     "all_reduce_seconds_answer", "all_reduce_seconds"),
    ("training_state", "checkpoints", "_job", "10_when_a_gpu_dies", "training_state_answer",
     "TrainingState")])
def test_a_report_in_another_shape_fails_the_check(fresh, check, module, job, notebook,
                                                    grade_id, name):
    fresh.run(_replace_job, f"labkit.lessons.{module}.check", job)
    said = failed(getattr(labkit.check, check)(fresh, solution(notebook, grade_id, name)))
    assert "a rank sent back a report that labkit's check does not write" in said, said


# ----- malformed answers fail in the check's own process, quickly ---------------------------
def test_groups_naming_ranks_outside_the_layout_fail():
    from labkit.lessons.layouts.check import _judge_groups

    said = _judge_groups("dp2", "dp", [[0, 1], [999], [-5]], 2)  # the right group, and more
    assert isinstance(said, str) and "more members than the layout's 2 ranks" in said, said
    said = _judge_groups("dp2", "dp", [[0], [5]], 2)
    assert isinstance(said, str) and "rank(s) [5], not among its 2 ranks" in said, said


def test_groups_of_any_length_are_judged_at_once():
    from labkit.lessons.layouts.check import _judge_groups

    for groups in ([[0, 1], range(10**15)], [[0, 1], list(range(2, 400_000))],
                   [[0] * 400_000, [1]]):  # a rank may send any of these
        said = _judge_groups("dp2", "dp", groups, 2)
        assert isinstance(said, str) and len(said) < 600, said[:600]


def test_placements_are_whole_numbers_from_every_rank(fresh):
    from labkit.lessons.recommender.check import _as_placement

    assert isinstance(_as_placement([[torch.tensor(0.7), 1], [2]], 3, 2), str)  # not table 0
    assert _as_placement([[torch.tensor(0), 1], [2]], 3, 2) == [[0, 1], [2]]
    fresh.run(_replace_job_with_tensors)  # rank 1's placement holds a tensor of two tables
    said = failed(labkit.check.place_tables(fresh, REFERENCE_06))
    assert "different placements" in said, said


def _replace_job_with_tensors(ctx):
    import labkit.lessons.recommender.check as check

    real = check._job

    def job(ctx, fn, sets):
        out = real(ctx, fn, sets)
        if ctx.rank == 1:
            for entry in out:
                entry["placement"] = [[torch.tensor([0, 1])], []]
        return out
    check._job = job


def test_reports_of_another_dtype_or_numbers_past_floats_fail_without_raising():
    from labkit.lessons.data_parallel.check import _well_formed
    from labkit.lessons.memory_wall.check import _number

    assert _number(10**400) is None  # float() of it raises OverflowError
    traffic = {"sent_bytes": 0, "received_bytes": 0, "sends": 0, "recvs": 0,
               "largest_send": 0, "collectives": {}}
    report = {"grads": [torch.zeros(3, dtype=torch.float64)], "traffic": traffic}
    assert not _well_formed(report, [(3,)], hook=False)  # allclose with float32 would raise
    assert _well_formed(dict(report, grads=[torch.zeros(3)]), [(3,)], hook=False)


def seconds_as_text(nbytes, ranks, alpha_s, bandwidth):
    """The right formula, its answer returned as text."""
    if ranks == 1:
        return "0"
    return repr(2 * (ranks - 1) * alpha_s + 2 * (ranks - 1) / ranks * nbytes / bandwidth)


def test_all_reduce_seconds_returned_as_text_fails(fresh):
    found = labkit.check.all_reduce_seconds(fresh, seconds_as_text)
    assert "return seconds as a number" in failed(found)
