"""Start N real ranks from a notebook cell, run functions on them, survive their failures."""

from labkit.cluster.cluster import Cluster, OversubscriptionWarning, RunResults
from labkit.cluster.errors import ClusterError, RankError, RanksRestartedWarning, RunTimeout
from labkit.cluster.rank import RankContext

__all__ = ["Cluster", "ClusterError", "OversubscriptionWarning", "RankContext", "RankError",
           "RanksRestartedWarning", "RunResults", "RunTimeout"]
