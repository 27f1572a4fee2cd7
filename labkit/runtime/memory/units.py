"""Byte sizes as people write them: "2GB" (10**9), "2GiB" (2**30), "512MiB", or an int."""

from __future__ import annotations

import math
import re

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: int | float | str | None) -> int | None:
    """``"2GB"`` -> 2_000_000_000; ``None`` stays ``None`` (no cap)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"a memory size must be a finite number of bytes, got {value!r}")
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"cannot read {value!r} as a size: write e.g. '2GB', '512MiB' "
                             "or a number of bytes")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"a memory size must be positive, got {value!r}")
    return size


def format_bytes(size: float) -> str:
    """Binary units, three significant figures: 1536 -> '1.5 KiB', 1_040_000 -> '0.992 MiB'
    (a value that would round to 1000 or more is written in the next unit)."""
    units = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
    for i, (unit, scale) in enumerate(units):
        if abs(size) >= scale or (i + 1 < len(units) and abs(size) >= 999.5 * units[i + 1][1]):
            return f"{size / scale:.3g} {unit}"
    if abs(size) >= 999.5:
        return f"{size / 2**10:.3g} KiB"
    return f"{int(size)} B"
