"""What a run returns, and the run's arguments that are checked before anything is sent."""

from __future__ import annotations

import math


class RunResults(list):
    """Per-rank return values in rank order, plus how they were obtained."""

    def __init__(self, values, *, world_size: int, device: str, backend: str,
                 oversubscribed: bool, seconds: float, shared_gpus: bool = False):
        super().__init__(values)
        self.world_size, self.device, self.backend = world_size, device, backend
        self.oversubscribed, self.seconds, self.shared_gpus = oversubscribed, seconds, shared_gpus


def seconds(value, name: str, allow_none: bool = True) -> float | None:
    """A positive, finite number of seconds (or None), checked before anything is sent."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds{' or None' * allow_none}, "
                        f"got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be more than 0 seconds, got {value!r}")
    return float(value)


def ranks_html(title: str, ranks: list[dict]) -> str:
    """The cluster's rich view in a notebook: its repr, then a row per rank."""
    rows = "".join(
        f"<tr><td>{r.get('rank')}</td><td>{r.get('pid', '')}</td><td>{r.get('device', '')}"
        f"</td><td>{r.get('backend', '')}</td><td>{r.get('threads', '')}</td></tr>"
        for r in ranks)
    return (f"<b>{title}</b><table><tr><th>rank</th><th>pid</th><th>device</th>"
            f"<th>backend</th><th>threads</th></tr>{rows}</table>")
