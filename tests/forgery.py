"""What the tests' forged answers share: a look into the frames of the check's job that
called them, on the rank (register this module by value with cloudpickle, as the test
modules are, so that it travels with the answers)."""

from __future__ import annotations

import sys


def frame_locals(name: str) -> list:
    """Every value called ``name`` in a frame above the caller (the check's job's locals)."""
    found, frame = [], sys._getframe(1)
    while frame is not None:
        if name in frame.f_locals:
            found.append(frame.f_locals[name])
        frame = frame.f_back
    return found


def failed(found) -> str:
    """``found``, a verdict that must be a failure, as text."""
    assert found.status == "failed", str(found)
    return str(found)
