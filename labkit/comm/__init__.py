"""Communication: timing collectives on this machine, and what they cost in theory."""

from labkit.comm.timing import CollectiveTimings, time_all_reduce

__all__ = ["CollectiveTimings", "time_all_reduce"]
