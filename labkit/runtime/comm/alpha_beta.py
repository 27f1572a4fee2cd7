"""The latency + bandwidth ("alpha-beta") model of a collective, fitted to measured times.

A collective that makes each rank send ``w`` bytes over its link takes about

    t(w) = alpha + w / beta

``alpha`` is the fixed cost of starting it (software, synchronisation, the first byte's trip)
and ``beta`` the bytes per second a link carries (Hockney, 1994; the model behind NCCL's
tuning and the "bus bandwidth" of nccl-tests). ``w`` is what a ring sends per rank
(``labkit.runtime.costs.ring_share``): 2(N-1)/N of the tensor for AllReduce, (N-1)/N for the other
collectives, the whole tensor for a point-to-point send. Small messages are all alpha, large
ones all bandwidth: that is why data-parallel engines bucket gradients.

The two numbers are fitted to times measured over several sizes, minimising the *relative*
error (sizes span orders of magnitude; a plain least-squares fit would only see the largest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.runtime.costs import ring_share, ring_steps


@dataclass(frozen=True)
class AlphaBeta:
    """t(bytes) = alpha_s + ring_share(kind, N) x bytes / bandwidth, fitted on measurements.

    Attributes:
        kind: the collective ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
            "broadcast", "send").
        world_size: ranks in the group it was measured on.
        alpha_s: seconds a collective of no size takes on this group (its ring's steps
            together; ``latency_per_step`` is one step's).
        bandwidth: bytes per second each rank's link carries (beta).
        sizes_bytes, seconds: the measurements it was fitted on.
    """

    kind: str
    world_size: int
    alpha_s: float
    bandwidth: float
    sizes_bytes: tuple[int, ...] = ()
    seconds: tuple[float, ...] = ()

    def wire_bytes(self, nbytes: float) -> float:
        """What each rank sends for a collective on a tensor of ``nbytes``."""
        return ring_share(self.kind, self.world_size) * nbytes

    def predict(self, nbytes: float) -> float:
        """Seconds for a collective on a tensor of ``nbytes`` on this group."""
        return self.alpha_s + self.wire_bytes(nbytes) / self.bandwidth

    @property
    def latency_per_step(self) -> float:
        """alpha per message of the ring: ``alpha_s`` is paid over ``ring_steps`` steps
        (2(N-1) for AllReduce, N-1 for the others, 1 for a send)."""
        return self.alpha_s / max(ring_steps(self.kind, self.world_size), 1)

    def on_group(self, world_size: int) -> AlphaBeta:
        """The same links on ``world_size`` ranks: the ring's share changes, and so does its
        latency, which is paid once per step (``ring_steps``)."""
        alpha = self.latency_per_step * ring_steps(self.kind, world_size)
        return AlphaBeta(self.kind, world_size, alpha, self.bandwidth,
                         self.sizes_bytes, self.seconds)

    def relative_errors(self, sizes_bytes, seconds) -> list[float]:
        """|predicted - measured| / measured at each size (e.g. sizes held out of the fit)."""
        return [abs(self.predict(b) - s) / s for b, s in zip(sizes_bytes, seconds, strict=True)]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "world_size": self.world_size, "alpha_s": self.alpha_s,
                "bandwidth": self.bandwidth, "sizes_bytes": list(self.sizes_bytes),
                "seconds": list(self.seconds)}

    def __str__(self) -> str:
        return (f"{self.kind} on {self.world_size} ranks: alpha {self.alpha_s * 1e6:.0f} us, "
                f"bandwidth {self.bandwidth / 1e9:.2f} GB/s")


def fit_alpha_beta(kind: str, world_size: int, sizes_bytes, seconds) -> AlphaBeta:
    """Fit alpha and beta to ``seconds`` measured at ``sizes_bytes`` (two sizes at least).

    Minimises sum(((alpha + x_i / beta) - t_i) / t_i)^2 over x_i = wire bytes: a weighted
    linear least squares, solved in closed form. Neither number may be negative: a fit that
    asks for a negative alpha (measurements dominated by bandwidth) is redone with alpha = 0,
    and one with no bandwidth term (all latency) gets an infinite bandwidth.
    """
    sizes = [int(b) for b in sizes_bytes]
    times = [float(t) for t in seconds]
    if len(sizes) != len(times) or len(set(sizes)) < 2:
        raise ValueError("fit_alpha_beta needs times at two different sizes at least")
    if min(times) <= 0:
        raise ValueError("measured times must be positive")
    if ring_share(kind, world_size) == 0:
        raise ValueError(f"a {kind!r} on {world_size} rank(s) sends nothing: nothing to fit")
    wire = [ring_share(kind, world_size) * b for b in sizes]
    weights = [1 / t**2 for t in times]  # relative error: each residual divided by t_i
    s_w = sum(weights)
    s_x = sum(w * x for w, x in zip(weights, wire, strict=True))
    s_xx = sum(w * x * x for w, x in zip(weights, wire, strict=True))
    s_t = sum(w * t for w, t in zip(weights, times, strict=True))
    s_xt = sum(w * x * t for w, x, t in zip(weights, wire, times, strict=True))
    det = s_w * s_xx - s_x * s_x
    alpha = (s_xx * s_t - s_x * s_xt) / det
    slope = (s_w * s_xt - s_x * s_t) / det  # seconds per byte: 1 / beta
    if alpha < 0:  # no latency to speak of: fit the slope alone through the origin
        alpha, slope = 0.0, s_xt / s_xx
    if slope <= 0:  # no bandwidth term: every size takes the same time
        alpha, slope = s_t / s_w, 0.0
    bandwidth = 1 / slope if slope > 0 else math.inf
    return AlphaBeta(kind, world_size, alpha, bandwidth, tuple(sizes), tuple(times))
