"""The ring of ``ring.py`` run with two of its collaborators swapped, for the lesson: its
steps noted as it takes them (notebook 08's drawing), or the learner's merge of two partial
attentions in place of labkit's (notebook 08's exercise).

    out, lse = observed_ring_forward(q, k, v, group, True, schedule=steps)

``ring_forward`` stays the algorithm alone; this runs that same function's code (not a
copy of it) with other functions bound to two of the names it calls: ``_pairs`` (the pairs
of chunks a step computes) and ``merge`` (the online softmax's merge).
"""

from __future__ import annotations

import types

from labkit.parallel.context import ring
from labkit.parallel.context.blocks import merge

_SWAPPED = ("_pairs", "merge")


def _ring_function():
    """``ring.ring_forward``, checked to call the swapped names itself: renamed there, or
    wrapped (a decorator's or a patch's code calls the original, which the swap misses),
    it must fail here, not silently run unswapped (an empty schedule, labkit's merge)."""
    function = ring.ring_forward
    called = getattr(getattr(function, "__code__", None), "co_names", ())
    if not set(_SWAPPED) <= set(called):
        raise RuntimeError(f"ring.ring_forward ({function!r}) does not call {_SWAPPED} "
                           "itself (renamed, or wrapped): update observe.py")
    return function


_ring_function()  # at import too: a rename in ring.py fails as soon as this is imported


def _noting(schedule: list):
    """``ring._pairs`` that appends each step's (step, source rank, [(local query chunk,
    local key chunk, kind)]) to ``schedule``: ``ring_forward`` asks for one step's pairs
    once, in step order."""

    def pairs(rank: int, source: int, size: int, causal: bool):
        chosen = list(ring._pairs(rank, source, size, causal))
        schedule.append((len(schedule), source, chosen))
        return chosen

    return pairs


def observed_ring_forward(q, k, v, group, causal: bool, schedule: list | None = None,
                          merge_fn=merge):
    """``ring.ring_forward(q, k, v, group, causal)``; ``schedule``, if given, collects
    (step, source rank, pairs); ``merge_fn`` replaces the online softmax's merge."""
    names = {"merge": merge_fn}
    if schedule is not None:
        names["_pairs"] = _noting(schedule)
    code = _ring_function()
    swapped = types.FunctionType(code.__code__, {**code.__globals__, **names}, code.__name__,
                                 code.__defaults__, code.__closure__)
    swapped.__kwdefaults__ = code.__kwdefaults__  # keyword-only defaults, not copied above
    return swapped(q, k, v, group, causal)
