"""labkit: run distributed training for real from a notebook, and see why it pays."""

from labkit import check, classroom, data_parallel, evidence, models, plots, widgets
from labkit.cluster import (
    Cluster,
    ClusterError,
    OversubscriptionWarning,
    RankContext,
    RankError,
    RanksRestartedWarning,
    RunResults,
    RunTimeout,
)
from labkit.comm import CollectiveTimings, time_all_reduce
from labkit.costs import model_state_bytes, ring_all_reduce_seconds
from labkit.layout import STRATEGIES, Layout
from labkit.memory import DeviceOOM, format_bytes, parse_bytes
from labkit.memory.boundary import BoundaryMap, sweep_boundary
from labkit.memory.estimate import MemoryEstimate, estimate_memory
from labkit.results import record_results
from labkit.sharded_data_parallel.compare import ShardingComparison, compare_sharding
from labkit.step import StepRecord
from labkit.train import TrainConfig, TrainReport, train
from labkit.train.batch_sweep import BatchSweep, batch_sweep
from labkit.train.scaling import ScalingResult, scaling_sweep

__version__ = "0.1.0"

__all__ = ["STRATEGIES", "BatchSweep", "BoundaryMap", "Cluster", "ClusterError",
           "CollectiveTimings", "DeviceOOM", "Layout", "MemoryEstimate", "OversubscriptionWarning",
           "RankContext", "RankError", "RanksRestartedWarning", "RunResults", "RunTimeout",
           "ScalingResult", "ShardingComparison", "StepRecord", "TrainConfig", "TrainReport",
           "batch_sweep", "check", "classroom", "compare_sharding", "data_parallel",
           "estimate_memory", "evidence", "format_bytes", "model_state_bytes", "models",
           "parse_bytes", "plots", "record_results", "ring_all_reduce_seconds", "scaling_sweep",
           "sweep_boundary", "time_all_reduce", "train", "widgets"]
