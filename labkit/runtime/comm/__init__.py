"""Communication: timing collectives on this machine, and what they cost in theory."""

from labkit.runtime.comm.alpha_beta import AlphaBeta, fit_alpha_beta
from labkit.runtime.comm.timing import (
    KINDS,
    CollectiveSweep,
    CollectiveTimings,
    time_all_reduce,
    time_collectives,
)

__all__ = ["KINDS", "AlphaBeta", "CollectiveSweep", "CollectiveTimings", "fit_alpha_beta",
           "time_all_reduce", "time_collectives"]
