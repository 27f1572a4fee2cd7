"""Type and range checks for config fields, so that a bad value fails where it is written,
before any rank starts (a float batch or a zero width would otherwise fail on the ranks, or
worse, train without error)."""

from __future__ import annotations

import math
import numbers


def _name(config, field: str) -> str:
    return f"{type(config).__name__}.{field}"


def _store(config, field: str, value):
    object.__setattr__(config, field, value)  # configs are frozen dataclasses
    return value


def whole(config, *fields: str, minimum: int = 1) -> None:
    """Each field is an int (not a bool, not a float like 8.0) of at least ``minimum``."""
    for field in fields:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{_name(config, field)} must be a whole number, got {value!r} "
                            f"({type(value).__name__})")
        value = _store(config, field, int(value))  # numpy's integers become plain ints
        if value < minimum:
            raise ValueError(f"{_name(config, field)} must be at least {minimum}, got {value}")


def positive(config, *fields: str, allow_zero: bool = False) -> None:
    """Each field is a finite number (int or float, not a string) greater than 0 (or equal
    to it, with ``allow_zero``)."""
    for field in fields:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{_name(config, field)} must be a number, got {value!r} "
                            f"({type(value).__name__})")
        if not isinstance(value, (int, float)):
            value = _store(config, field, float(value))
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            bound = "0 or more" if allow_zero else "above 0"
            raise ValueError(f"{_name(config, field)} must be a finite number {bound}, "
                             f"got {value!r}")


def one_of(config, field: str, choices) -> None:
    value = getattr(config, field)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"unknown {field} {value!r}: {_name(config, field)} must be one of "
                         f"{', '.join(choices)}")


def flag(config, *fields: str) -> None:
    for field in fields:
        value = getattr(config, field)
        if not isinstance(value, bool):
            raise TypeError(f"{_name(config, field)} must be True or False, got {value!r}")
