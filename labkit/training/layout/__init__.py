"""Layouts: how many ways a run splits along each dimension (data, sharded data, tensor,
pipeline, context parallelism), the strategy names as preset layouts with their engine
choices, and the one DeviceMesh each rank builds from a layout. A run's layout is resolved
and checked with the rest of it in ``labkit/training/run.py``."""

from labkit.training.layout.layout import MESH_ORDER, Layout
from labkit.training.layout.presets import STRATEGIES, check_strategy, preset

__all__ = ["MESH_ORDER", "STRATEGIES", "Layout", "check_strategy", "preset"]
