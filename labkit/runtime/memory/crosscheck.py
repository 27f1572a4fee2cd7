"""The tracker checked against an independent instrument: the CPU allocator's own events.

``torch.profiler`` with ``profile_memory=True`` records every allocation and free the CPU
allocator makes (its summary rows mislead; the raw events do not). Summed in time order from
the same start, they give the allocator's peak, to set beside the tracker's. Used by
``tests/test_memory_coverage.py`` and ``bench/memory.py`` on ``torch.nn`` models that are
not from the zoo.
"""

from __future__ import annotations

import torch
from torch import nn


def _model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    """A small ``torch.nn`` model and its input shape (batch first)."""
    if name == "transformer":
        layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        return nn.TransformerEncoder(layer, 2), (16, 32, 64)
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(32, 10)), (16, 3, 32, 32)
    if name in ("lstm", "gru"):
        return getattr(nn, name.upper())(64, 128, num_layers=2, batch_first=True), (16, 50, 64)
    raise ValueError(f"unknown model {name!r}: transformer, cnn, lstm or gru")


def allocator_peak(events) -> int:
    """The allocator's highest running total over ``[memory]`` events, from zero."""
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def cross_check(ctx, name: str, steps: int = 2) -> tuple[int, int]:
    """On a rank: (tracked peak, allocator peak) of ``steps`` Adam steps of model ``name``,
    both counted from the same start (the model and its optimizer exist before)."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model, shape = _model(name)
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)
    start = ctx.memory.live()["total"]
    ctx.memory.reset_peak()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            out = model(torch.randn(shape))  # the batch is made on the device
            out = out[0] if isinstance(out, tuple) else out
            out.pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del out
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    return ctx.memory.peak_bytes - start, allocator_peak(events)
