"""Notebook 01's exercise: predict what fills a device in one training step, then measure it.

The learner writes ``predict_memory(config, batch)`` returning bytes for "parameters",
"gradients", "optimizer" (Adam's state) and "activations" (what the forward pass keeps for the
backward pass, batch and targets included) of a zoo MLP trained in float32 with Adam. The check
calls it on a rank, for two fixed models, a third whose sizes are drawn for each run
(``outside.fresh_seed``: a table of the first two's measurements does not pass) and a fourth
too large for any machine here to build (the third's shape with a hidden width of ``HUGE``:
hundreds of GB in all, so an answer that builds each model and measures it instead of
predicting fails there), and sends back only what it returned. It measures each category
itself, in its own process (on the CPU: the bytes of float32 tensors are the same on any
device), never on the ranks, with the suite's memory tracker at the moment the category is
largest: parameters after building, activations at the end of the forward pass (loss
computed), gradients after backward, optimizer state after the step. The fourth model's
parameters, gradients and Adam state are measured on the ``meta`` device (shapes, no
storage); its activations, a sum of (batch, width) tensors and so affine in the hidden width,
are measured at two small widths and extended to ``HUGE``.
"""

from __future__ import annotations

import dataclasses
import random

import torch

from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.reports import forged
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
HUGE = 2 ** 17  # the fourth model's hidden width: ~0.55 TB of parameters, gradients and Adam
SMALL = (64, 128)  # the hidden widths its activations are measured at
HINTS = {
    "optimizer": "Adam keeps two float32 numbers per parameter (its two moment estimates)",
    "gradients": "backward leaves one float32 gradient per parameter",
    "parameters": "count every weight and bias of every Linear layer, 4 bytes each",
    "activations": "the forward pass keeps the input batch, each ReLU's output (the next "
                   "Linear reuses it as its saved input), the model's output and the targets; "
                   "a Linear's output before its ReLU is freed",
}


def drawn_case(seed: int) -> tuple[MLPConfig, int]:
    """A model and batch drawn from ``seed``, in a range where the reference prediction is as
    close as it is on ``CASES`` (the loss's extra (batch, d_out) tensor stays under 2%)."""
    draw = random.Random(seed)
    config = MLPConfig(d_in=draw.choice([16, 32, 48, 64]), d_hidden=draw.choice([128, 192, 256]),
                       n_layers=draw.randint(3, 6), d_out=draw.choice([2, 4]))
    return config, draw.choice([64, 128, 256, 512])


def huge_case(case: tuple[MLPConfig, int]) -> tuple[MLPConfig, int]:
    """``case``'s model with a hidden width of ``HUGE``: predicted, never built."""
    config, batch = case
    return dataclasses.replace(config, d_hidden=HUGE), batch


def _measure_huge(config: MLPConfig, batch: int) -> dict:
    """``_measure`` of a model too large to build: its state on the meta device, its
    activations (affine in the hidden width) from two widths that fit, extended."""
    measured = _measure(config, batch, device="meta")
    (w0, a0), (w1, a1) = ((w, _measure(dataclasses.replace(config, d_hidden=w), batch)
                           ["activations"]) for w in SMALL)
    measured["activations"] = a0 + (a1 - a0) * (config.d_hidden - w0) // (w1 - w0)
    return measured


def _measure(config: MLPConfig, batch: int, device: str = "cpu") -> dict:
    """The bytes of each category in one Adam step of ``config``, measured in this process
    (on ``meta``, only the parameters, gradients and optimizer state are counted right)."""
    tracker = MemoryTracker(0)
    with tracker:
        model = build_model(config, device)
    tracker.track_external(model)
    measured = {"parameters": tracker.live()["activations"] + tracker.live()["parameters"]}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    with tracker:
        inputs, targets = (t.to(device) for t in make_batch(config, 0, batch))
        base = tracker.live()["activations"] - inputs.nbytes - targets.nbytes
        loss = loss_fn(config)(model(inputs), targets)
        measured["activations"] = tracker.live()["activations"] - base
        loss.backward()
        measured["gradients"] = tracker.live()["gradients"]
        optimizer.step()
        measured["optimizer"] = tracker.live()["optimizer"]
    return measured


def _job(ctx, fn, cases) -> list:
    return [_predict(fn, config, batch) for config, batch in cases]


def _predict(fn, config: MLPConfig, batch: int):
    if config.d_hidden != HUGE:
        return fn(config, batch)
    try:
        return fn(config, batch)
    except (MemoryError, RuntimeError) as exc:  # it built the model: said by _compare
        return f"raised {type(exc).__name__}"


def _number(value) -> float | None:
    """``value`` as a number of bytes, or None when it is not one."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):  # a tensor of many values,
        # or an int past float's range
        return None
    return number if number == number else None  # NaN is no prediction


def _compare(case: tuple[MLPConfig, int], predicted, measured: dict) -> list[str]:
    config, batch = case
    where = f"for {config} with a batch of {batch}"
    if config.d_hidden == HUGE and isinstance(predicted, str) and predicted.startswith("raised"):
        return [f"predict_memory {predicted} {where}, a model too large to build on any "
                "machine here: predict from the config's sizes, without building the model"]
    if not isinstance(predicted, dict):
        return [f"predict_memory returned {type(predicted).__name__} {where}: return a dict "
                f"with keys {', '.join(CATEGORIES)}"]
    missing = [c for c in CATEGORIES if c not in predicted]
    if missing:
        return [f"the prediction {where} has no {', '.join(missing)}"]
    problems = []
    for category in CATEGORIES:
        guess, real = _number(predicted[category]), measured[category]
        if guess is None:
            problems.append(f"the prediction of {category} {where} is "
                            f"{type(predicted[category]).__name__}, not a number of bytes")
        elif abs(guess - real) > TOLERANCE[category] * real:
            problems.append(f"{category}: you predicted {format_bytes(guess)}, the check "
                            f"measured {format_bytes(real)} ({guess / real:.2f}x) {where}: "
                            f"{HINTS[category]}")
    return problems


def _plain(predicted):
    """A prediction as plain values, for the verdict's record."""
    if not isinstance(predicted, dict):
        return type(predicted).__name__
    return {str(k): _number(v) for k, v in predicted.items()}


def predict_memory(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Check ``fn(config, batch) -> {category: bytes}``, called on rank 0, against what this
    process measures."""
    drawn = drawn_case(fresh_seed())
    cases = [*CASES, drawn, huge_case(drawn)]
    outcome = run_checked(cluster, EXERCISE, "predict_memory", _job, fn, cases, timeout=timeout)
    if outcome.verdict:
        return outcome.verdict
    predictions = outcome.values[0]
    if not isinstance(predictions, list) or len(predictions) != len(cases):
        return forged(EXERCISE, 0)
    found = [(case, predicted, (_measure_huge if case[0].d_hidden == HUGE else _measure)(*case))
             for case, predicted in zip(cases, predictions, strict=True)]
    problems = [p for case, predicted, measured in found
                for p in _compare(case, predicted, measured)]
    measured = {"cases": [{"model": str(config), "batch": batch, "predicted": _plain(predicted),
                           "measured": real} for (config, batch), predicted, real in found]}
    if problems:
        return failed(EXERCISE, problems[0], problems[1:], **measured)
    return passed(EXERCISE, f"all four categories within tolerance on {len(cases)} models "
                  "(parameters and gradients 2%, optimizer and activations 5%).",
                  [f"{config}, batch {batch}: "
                   + ("counted (too large to build) " if config.d_hidden == HUGE else "measured ")
                   + ", ".join(
                      f"{k} {format_bytes(v)}" for k, v in real.items())
                   for (config, batch), _, real in found], **measured)
