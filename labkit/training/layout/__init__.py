"""Layouts: how a run splits over its ranks (data, sharded data, tensor, pipeline
parallelism), the rules a layout must pass before any process starts, the strategy names as
preset layouts, and the one DeviceMesh each rank builds from a layout."""

from labkit.training.layout.layout import DP_KINDS, MESH_ORDER, SCHEDULES, TABLES, Layout
from labkit.training.layout.presets import STRATEGIES, check_strategy, layout_for, preset
from labkit.training.layout.rules import check_run

__all__ = ["DP_KINDS", "MESH_ORDER", "SCHEDULES", "STRATEGIES", "TABLES", "Layout",
           "check_run", "check_strategy", "layout_for", "preset"]
