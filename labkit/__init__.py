"""labkit: run distributed training for real from a notebook, and see why it pays."""

from labkit import plots
from labkit.cluster import (
    Cluster,
    ClusterError,
    OversubscriptionWarning,
    RankContext,
    RankError,
    RunResults,
    RunTimeout,
)
from labkit.comm import CollectiveTimings, time_all_reduce
from labkit.results import record_results

__version__ = "0.1.0"

__all__ = ["Cluster", "ClusterError", "CollectiveTimings", "OversubscriptionWarning", "plots",
           "RankContext", "RankError", "RunResults", "RunTimeout", "record_results",
           "time_all_reduce"]
