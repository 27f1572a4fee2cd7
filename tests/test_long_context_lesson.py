"""Notebook 08's exercise check, both ways (the course's reference merge passes; planted
wrong merges fail with the message meant for them), its ring drawing and its explorer."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch

import labkit
from labkit.lessons.long_context.demo import ring_schedule
from labkit.models import GPTConfig
from tests.exercises import solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value


def forgets_to_rescale(out_a, lse_a, out_b, lse_b):
    return out_a + out_b, torch.logaddexp(lse_a, lse_b)


def exponentiates_directly(out_a, lse_a, out_b, lse_b):
    total = torch.exp(lse_a) + torch.exp(lse_b)  # overflows for scores in the hundreds
    out = (out_a * torch.exp(lse_a).unsqueeze(-1) + out_b * torch.exp(lse_b).unsqueeze(-1))
    return out / total.unsqueeze(-1), torch.log(total)


def forgets_the_empty_start(out_a, lse_a, out_b, lse_b):
    lse = lse_a + torch.log1p(torch.exp(lse_b - lse_a))  # -inf - -inf: NaN at the ring's start
    out = (out_a * torch.exp(lse_a - lse).unsqueeze(-1)
           + out_b * torch.exp(lse_b - lse).unsqueeze(-1))
    return out, lse


def drops_a_dimension(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b).sum(-1), torch.logaddexp(lse_a, lse_b)


def returns_only_the_output(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return (out_a * torch.exp(lse_a - lse).unsqueeze(-1)
            + out_b * torch.exp(lse_b - lse).unsqueeze(-1))  # no lse: one tensor


def test_merge_check_both_ways(two):
    reference = solution("08_long_sequences_and_experts", "merge_attention_answer",
                         "merge_attention")
    found = labkit.check.merge_attention(two, reference)
    assert found.passed, str(found)
    assert "passed on 4 ranks too" in str(found)
    for wrong, message in [(forgets_to_rescale, "differs from the whole sequence's"),
                           (exponentiates_directly, "inf or NaN"),
                           (forgets_the_empty_start, "inf or NaN"),
                           (drops_a_dimension, "raised on rank"),
                           (returns_only_the_output, "return the pair (out, lse)")]:
        found = labkit.check.merge_attention(two, wrong)
        assert found.status == "failed" and message in str(found), str(found)


def test_ring_schedule_is_balanced_and_visits_every_block(two):
    schedule = ring_schedule(two)
    assert [[s["holds"] for s in rank] for rank in schedule] == [[0, 1], [1, 0]]
    # 2N chunks: the causal triangle has 2N(2N+1)/2 blocks, 2N+1 on each of the N ranks
    assert [sum(len(s["pairs"]) for s in rank) for rank in schedule] == [5, 5]


def test_sequence_explorer_refuses_lengths_that_do_not_cut():
    with pytest.raises(ValueError, match="2 x cp = 4"):
        labkit.widgets.SequenceExplorer(None, GPTConfig(), [64, 66], "4MiB")


def test_sequence_explorer_says_what_to_change_when_nothing_fits():
    explorer = labkit.widgets.SequenceExplorer(None, GPTConfig(), [64, 128], "1MiB")
    oom = {"oom": True}
    explorer._cache = {64: {"one device": oom, "cp=2": {"oom": False}}, 128: {"one device": oom,
                                                                            "cp=2": oom}}
    with pytest.raises(ValueError, match="raise memory_per_device or add shorter lengths"):
        explorer.fitting()
    explorer._cache[64]["one device"] = {"oom": False}
    assert explorer.fitting() == [64]
