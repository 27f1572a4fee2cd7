"""Layouts: how a run splits over its ranks (data, sharded data, tensor, pipeline, context
parallelism), the strategy names as preset layouts, and the one DeviceMesh each rank builds
from a layout. A run's layout is resolved and checked with the rest of it in
``labkit/training/run.py``."""

from labkit.training.layout.layout import DP_KINDS, MESH_ORDER, SCHEDULES, TABLES, Layout
from labkit.training.layout.presets import STRATEGIES, check_strategy, preset

__all__ = ["DP_KINDS", "MESH_ORDER", "SCHEDULES", "STRATEGIES", "TABLES", "Layout",
           "check_strategy", "preset"]
