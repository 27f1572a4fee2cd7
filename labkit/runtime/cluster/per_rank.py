"""A run's arguments, pickled for each rank: the same for all, or one value per rank.

    cluster.run(job, labkit.runtime.cluster.PerRank([seed0, seed1]))  # rank r gets seed r

``PerRank`` is an argument (positional or keyword) that differs by rank: rank ``r`` receives
``values[r]`` in its place, and the job it is sent holds no other rank's value. A check gives
each rank inputs drawn from a seed only that rank and the check know, so no rank can compute
another rank's data; it must receive it.
"""

from __future__ import annotations

import pickle

import cloudpickle


class PerRank:
    """One value per rank, in rank order (see the module's docstring)."""

    def __init__(self, values):
        self.values = list(values)

    def __repr__(self) -> str:
        return f"PerRank(<{len(self.values)} values>)"


def _for_rank(value, rank: int):
    return value.values[rank] if isinstance(value, PerRank) else value


def payloads(fn, args: tuple, kwargs: dict, world_size: int) -> list[bytes]:
    """``(fn, args, kwargs)`` pickled for each rank, a ``PerRank`` replaced by that rank's
    value (pickled once when there is none). Raises ``TypeError`` if it cannot be sent."""
    per_rank = [v for v in (*args, *kwargs.values()) if isinstance(v, PerRank)]
    for value in per_rank:
        if len(value.values) != world_size:
            raise ValueError(f"a PerRank argument has {len(value.values)} values for "
                             f"{world_size} ranks: give one per rank")
    ranks = range(world_size) if per_rank else [0]
    try:
        pickled = [cloudpickle.dumps((fn, tuple(_for_rank(a, r) for a in args),
                                      {k: _for_rank(v, r) for k, v in kwargs.items()}))
                   for r in ranks]
    except Exception as exc:
        raise TypeError(f"cannot send {getattr(fn, '__name__', fn)!r} and its arguments "
                        f"to the ranks: {exc}") from exc
    return pickled if per_rank else pickled * world_size


def jobs(job_id: int, pickled: list[bytes], options: dict) -> list[bytes]:
    """The "run" message for each rank, pickled once for all ranks that share a payload."""
    messages: dict[int, bytes] = {}
    for payload in pickled:
        if id(payload) not in messages:
            messages[id(payload)] = pickle.dumps(("run", job_id, payload, options))
    return [messages[id(payload)] for payload in pickled]
