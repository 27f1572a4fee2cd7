"""Start N real ranks from a notebook cell, run functions on them, survive their failures."""

from labkit.runtime.cluster.cluster import Cluster
from labkit.runtime.cluster.errors import (
    ClusterError,
    OversubscriptionWarning,
    RankError,
    RanksRestartedWarning,
    RunTimeout,
)
from labkit.runtime.cluster.per_rank import PerRank
from labkit.runtime.cluster.rank import RankContext
from labkit.runtime.cluster.runs import RunResults

__all__ = ["Cluster", "ClusterError", "OversubscriptionWarning", "PerRank", "RankContext",
           "RankError", "RanksRestartedWarning", "RunResults", "RunTimeout"]
