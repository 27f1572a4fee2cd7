"""How much faster N ranks can compute than one on this machine, right now.

N ranks can run a step at most N times faster than one, and only if each has a device of its
own to itself. A CPU rank's device is a core: other programs, hyperthreads that share one
physical core, or a busy laptop take some of it away. So a lesson that times one rank against
N measures this first: every rank runs the same fixed computation (matrix products, no
communication) alone, then all at once, and the ratio is the ceiling of any speedup here.

    capacity = parallel_capacity(one_gpu, gpus)
    capacity.speedup        # ~2.0 on a quiet 2-core machine, ~1.3 with one core busy
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

SIZE = 256  # a matrix product of SIZE x SIZE float32: about a millisecond on one core
TARGET_S = 0.25  # how long the computation runs on one rank alone
ROUNDS = 2  # alone, together, alone, together: the best of each, past a moment's noise
QUIET = 0.75  # N ranks doing >= 0.75 N times one's work at once: the machine is theirs


@dataclass(frozen=True)
class Capacity:
    """``world_size`` ranks computing at once vs one: ``alone_s`` is the computation's time
    on one rank alone, ``together_s`` the slowest rank's with all computing at the same time,
    ``speedup`` = world_size x alone_s / together_s (world_size on idle, separate devices)."""

    world_size: int
    device: str
    products: int
    alone_s: float
    together_s: float

    @property
    def speedup(self) -> float:
        return self.world_size * self.alone_s / self.together_s

    @property
    def busy(self) -> bool:
        """Whether the ranks shared their cores with other work (below ``QUIET`` x N)."""
        return self.speedup < QUIET * self.world_size

    def to_dict(self) -> dict:
        return {**asdict(self), "speedup": self.speedup, "busy": self.busy}

    def __str__(self) -> str:
        return (f"{self.world_size} ranks at once do {self.speedup:.2f}x one rank's work in "
                f"the same time ({self.products} products of {SIZE}x{SIZE}: "
                f"{self.alone_s * 1e3:.0f} ms alone, {self.together_s * 1e3:.0f} ms together)"
                + (": a busy machine, whose cores other work shares, and so do the times "
                   "measured on it" if self.busy else ""))


def _square(ctx):
    """A SIZE x SIZE matrix on this rank's device, its first product done (kernels and
    threads set up, not timed), and the device's synchronisation."""
    a = torch.randn(SIZE, SIZE, device=ctx.device)
    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    a @ a  # noqa: B018
    sync()
    return a, sync


def _calibrate(ctx) -> int:
    """How many matrix products this rank does in about TARGET_S."""
    a, sync = _square(ctx)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < TARGET_S:
        a @ a  # noqa: B018
        done += 1
    sync()
    return done


def _products(ctx, count: int) -> float:
    """Seconds for ``count`` matrix products on this rank's device."""
    a, sync = _square(ctx)
    start = time.perf_counter()
    for _ in range(count):
        a @ a  # noqa: B018
    sync()
    return time.perf_counter() - start


def parallel_capacity(one, many) -> Capacity:
    """Time the same computation on ``one`` (a 1-rank cluster) and on every rank of ``many``
    at once; the best of ``ROUNDS`` rounds each."""
    if one.world_size != 1:
        raise ValueError(f"the first cluster must have 1 rank, not {one.world_size}")
    count = max(1, int(one.run(_calibrate)[0]))
    alone, together = [], []
    for _ in range(ROUNDS):
        alone.append(one.run(_products, count)[0])
        together.append(max(many.run(_products, count)))
    return Capacity(many.world_size, str(many.device), count, min(alone), min(together))
