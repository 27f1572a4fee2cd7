"""What a rank sends back to a check, read as untrusted data.

A check's job on a rank returns plain values (tensors, numbers, a ``Traffic`` count); the
learner's code runs in that process and can change them, or their shape. A check compares
them here, in its own process, with references it computed itself, and first asks these
helpers whether each report has the shape its job gives it: a malformed one is a failed
exercise (``forged``), never an exception in the checker.
"""

from __future__ import annotations

import torch

from labkit.lessons.exercise.result import CheckResult, failed


def forged(exercise: str, rank: int) -> CheckResult:
    """The verdict on a rank whose report is not one the check's job writes."""
    return failed(exercise, f"rank {rank} sent back a report that labkit's check does not "
                  "write: its code on that rank changed the check's measurements")


def tensor_list(value, shapes: list[tuple], allow_none: bool = False,
                dtype: torch.dtype | None = None) -> bool:
    """Whether ``value`` is a list of float tensors of ``shapes`` (or None where allowed),
    each of ``dtype`` if given (the references' dtype: a comparison of two dtypes raises)."""
    if not isinstance(value, list) or len(value) != len(shapes):
        return False
    return all((item is None and allow_none) or (
        isinstance(item, torch.Tensor) and tuple(item.shape) == tuple(shape)
        and item.is_floating_point() and (dtype is None or item.dtype == dtype))
        for item, shape in zip(value, shapes, strict=True))


def collectives(value) -> bool:
    """Whether ``value`` is a ``Traffic.collectives``: {kind: [calls, bytes]}."""
    return isinstance(value, dict) and all(
        isinstance(kind, str) and isinstance(count, list) and len(count) == 2
        and all(type(c) is int for c in count) for kind, count in value.items())


def traffic(value) -> bool:
    """Whether ``value`` is a ``Traffic.to_dict()``."""
    counts = ("sent_bytes", "received_bytes", "sends", "recvs", "largest_send")
    return (isinstance(value, dict) and all(type(value.get(k)) is int for k in counts)
            and collectives(value.get("collectives")))


def fields(value, kinds: dict) -> bool:
    """Whether ``value`` is a dict whose fields pass ``kinds`` ({name: predicate})."""
    return isinstance(value, dict) and all(ok(value.get(name)) for name, ok in kinds.items())
