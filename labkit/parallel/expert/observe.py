"""What a MoE run records each step, beside the step (outside its timing and meter): the
tokens each expert took and those dropped over capacity, per MoE layer, on this rank."""

from __future__ import annotations


def moe_layers(built) -> list:
    from labkit.models.moe import MoE

    return [m for part in built.parts for m in part.modules() if isinstance(m, MoE)]


class ExpertObserver:
    """``record.extras``: ``expert_load`` [layer][expert] tokens taken (this rank's tokens),
    ``dropped_tokens`` [layer] choices over capacity, ``dropped_by_expert`` [layer][expert]
    those by the expert they chose, ``routed_tokens`` choices made."""

    def on_build(self, run, built, config) -> None:
        self.layers = moe_layers(built)
        self.choices = config.model.top_k

    def after_backward(self, run, built) -> None:
        pass

    def after_step(self, run, built, step: int, meter) -> dict:
        load = [layer.stats["load"].tolist() for layer in self.layers]
        dropped = [int(layer.stats["dropped"]) for layer in self.layers]
        over = [layer.stats["dropped_by_expert"].tolist() for layer in self.layers]
        return {"expert_load": load, "dropped_tokens": dropped, "dropped_by_expert": over,
                "routed_tokens": [sum(row) + d for row, d in zip(load, dropped, strict=True)]}


def expert_load(report) -> list[list[list[int]]]:
    """[step][layer][expert]: tokens each expert took, summed over the ranks."""
    per_rank = [[rec["expert_load"] for rec in r["records"]] for r in report.ranks]
    return [[[sum(rank[step][layer][e] for rank in per_rank) for e in range(len(row))]
             for layer, row in enumerate(per_rank[0][step])] for step in range(len(per_rank[0]))]


def dropped_tokens(report) -> list[int]:
    """Per step: choices dropped over capacity, all layers and ranks."""
    return [sum(sum(r["records"][step]["dropped_tokens"]) for r in report.ranks)
            for step in range(report.steps)]


def dropped_by_expert(report) -> list[list[int]]:
    """[layer][expert]: choices over the expert's capacity, all steps and ranks."""
    rows = [rec["dropped_by_expert"] for r in report.ranks for rec in r["records"]]
    return [[sum(row[layer][e] for row in rows) for e in range(len(rows[0][layer]))]
            for layer in range(len(rows[0]))]
