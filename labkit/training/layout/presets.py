"""The strategy names every notebook uses, each a preset layout over all the ranks with its
engine choices.

    preset("ddp", 4)   -> (Layout(dp=4), {"dp_kind": "ddp"})
    preset("1f1b", 2)  -> (Layout(pp=2), {"schedule": "1f1b"})

A preset names its engine explicitly, so that it runs even on one rank ("ddp" on 1 rank still
wraps the model in DDP, as a baseline measured with the same engine).
"""

from __future__ import annotations

from labkit.training.layout.layout import Layout

_PRESETS = {
    "single": lambda n: (Layout(), {}),
    "naive_dp": lambda n: (Layout(dp=n), {"dp_kind": "naive"}),
    "ddp": lambda n: (Layout(dp=n), {"dp_kind": "ddp"}),
    "zero1": lambda n: (Layout(dp=n), {"dp_kind": "zero1"}),
    "fsdp": lambda n: (Layout(fsdp=n), {"dp_kind": "fsdp"}),
    "naive_pipeline": lambda n: (Layout(pp=n), {"schedule": "naive"}),
    "gpipe": lambda n: (Layout(pp=n), {"schedule": "gpipe"}),
    "1f1b": lambda n: (Layout(pp=n), {"schedule": "1f1b"}),
    "interleaved_1f1b": lambda n: (Layout(pp=n), {"schedule": "interleaved_1f1b"}),
    "tp": lambda n: (Layout(tp=n), {}),
    "table_wise": lambda n: (Layout(fsdp=n), {"tables": "table_wise"}),
    "row_wise": lambda n: (Layout(fsdp=n), {"tables": "row_wise"}),
    "row_wise_dtensor": lambda n: (Layout(fsdp=n), {"tables": "row_wise_dtensor"}),
}
STRATEGIES = tuple(_PRESETS)


def check_strategy(name: str) -> None:
    if name not in _PRESETS:
        raise ValueError(f"unknown strategy {name!r}: choose one of {', '.join(STRATEGIES)}, "
                         "or give a labkit.Layout")


def preset(name: str, world_size: int) -> tuple[Layout, dict[str, str]]:
    """The layout that strategy ``name`` means on ``world_size`` ranks, and its engine
    choices (``TrainConfig`` fields: schedule, dp_kind, tables)."""
    check_strategy(name)
    if name == "single" and world_size != 1:
        raise ValueError(f"strategy 'single' trains on one device, not {world_size}: use "
                         "labkit.Cluster(1) or a data-parallel strategy such as 'ddp'")
    return _PRESETS[name](world_size)
