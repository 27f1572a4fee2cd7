"""Notebook 01's exercise: predict what fills a device in one training step, then measure it.

The learner writes ``predict_memory(config, batch)`` returning bytes for "parameters",
"gradients", "optimizer" (Adam's state) and "activations" (what the forward pass keeps for the
backward pass, batch and targets included) of a zoo MLP trained in float32 with Adam. The check
calls it on a rank, then measures each category there with the suite's memory tracker at the
moment it is largest: parameters after building, activations at the end of the forward pass
(loss computed), gradients after backward, optimizer state after the step.
"""

from __future__ import annotations

import torch

from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked
from labkit.models import MLPConfig, build_model, loss_fn, make_batch
from labkit.runtime.memory import MemoryTracker, format_bytes

EXERCISE = "predict_memory"
CATEGORIES = ("parameters", "gradients", "optimizer", "activations")
# The reference prediction is within 1% of the measurement in every category (the loss keeps
# one more (batch, d_out) tensor than the hint lists); forgetting the input batch is 5-8% off.
TOLERANCE = {"parameters": 0.02, "gradients": 0.02, "optimizer": 0.05, "activations": 0.05}
CASES = ((MLPConfig(d_in=64, d_hidden=256, n_layers=4, d_out=8), 64),
         (MLPConfig(d_in=32, d_hidden=128, n_layers=6, d_out=4), 512))
HINTS = {
    "optimizer": "Adam keeps two float32 numbers per parameter (its two moment estimates)",
    "gradients": "backward leaves one float32 gradient per parameter",
    "parameters": "count every weight and bias of every Linear layer, 4 bytes each",
    "activations": "the forward pass keeps the input batch, each ReLU's output (the next "
                   "Linear reuses it as its saved input), the model's output and the targets; "
                   "a Linear's output before its ReLU is freed",
}


def _measure(ctx, config: MLPConfig, batch: int) -> dict:
    tracker = MemoryTracker(ctx.rank)
    with tracker:
        model = build_model(config, ctx.device)
    tracker.track_external(model)
    measured = {"parameters": tracker.live()["activations"] + tracker.live()["parameters"]}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    with tracker:
        inputs, targets = (t.to(ctx.device) for t in make_batch(config, 0, batch))
        base = tracker.live()["activations"] - inputs.nbytes - targets.nbytes
        loss = loss_fn(config)(model(inputs), targets)
        measured["activations"] = tracker.live()["activations"] - base
        loss.backward()
        measured["gradients"] = tracker.live()["gradients"]
        optimizer.step()
        measured["optimizer"] = tracker.live()["optimizer"]
    return measured


def _job(ctx, fn) -> list[dict]:
    out = []
    for config, batch in CASES:
        predicted = fn(config, batch)
        out.append({"predicted": dict(predicted) if isinstance(predicted, dict) else predicted,
                    "measured": _measure(ctx, config, batch) if ctx.rank == 0 else None})
    return out


def _compare(case: int, predicted, measured: dict) -> list[str]:
    config, batch = CASES[case]
    where = f"for {config} with a batch of {batch}"
    if not isinstance(predicted, dict):
        return [f"predict_memory returned {type(predicted).__name__} {where}: return a dict "
                f"with keys {', '.join(CATEGORIES)}"]
    missing = [c for c in CATEGORIES if c not in predicted]
    if missing:
        return [f"the prediction {where} has no {', '.join(missing)}"]
    problems = []
    for category in CATEGORIES:
        guess, real = float(predicted[category]), measured[category]
        if abs(guess - real) > TOLERANCE[category] * real:
            problems.append(f"{category}: you predicted {format_bytes(guess)}, the rank "
                            f"measured {format_bytes(real)} ({guess / real:.2f}x) {where}: "
                            f"{HINTS[category]}")
    return problems


def predict_memory(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Check ``fn(config, batch) -> {category: bytes}`` against measurements on rank 0."""
    outcome = run_checked(cluster, EXERCISE, "predict_memory", _job, fn, timeout=timeout)
    if outcome.verdict:
        return outcome.verdict
    cases = outcome.values[0]
    problems = [p for i, c in enumerate(cases) for p in _compare(i, c["predicted"],
                                                                   c["measured"])]
    measured = {"cases": [{"predicted": c["predicted"], "measured": c["measured"]}
                          for c in cases]}
    if problems:
        return failed(EXERCISE, problems[0], problems[1:], **measured)
    return passed(EXERCISE, f"all four categories within tolerance on {len(CASES)} models "
                  "(parameters and gradients 2%, optimizer and activations 5%).",
                  [f"{config}, batch {batch}: measured " + ", ".join(
                      f"{k} {format_bytes(v)}" for k, v in c["measured"].items())
                   for (config, batch), c in zip(CASES, cases, strict=True)], **measured)
