"""What a recommender run measures besides the step, as an observer of the training loop:
the time spent in table lookups, the bytes each rank holds by part, the held-out AUC after
every step (and, once, the table plan and the AUC before training).

Lookups are timed by hooks on the table modules (forward) and on the autograd node that
computes each lookup's weight gradient (backward), with the step's clock; the collectives
inside a lookup (a row-wise table's reduce-scatter) are taken out, since the step's meter
counts them as communication.
"""

from __future__ import annotations

from collections import deque

import torch
from torch.distributed.tensor import DTensor

from labkit.parallel.embedding.evaluate import evaluate_on_ranks
from labkit.runtime.comm.meter import time_outside


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _embedding_backward_node(output: torch.Tensor):
    """The autograd node that computes a lookup's weight gradient (plain or DTensor)."""
    queue, seen = deque([output.grad_fn]), set()
    while queue:
        node = queue.popleft()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.name().startswith("EmbeddingBackward"):
            return node
        queue.extend(next_node for next_node, _ in node.next_functions)
    return None


class TableObserver:
    """Observer of a run whose layout places the DLRM's tables (``TrainConfig(tables=...)``)."""

    def __init__(self):
        self._windows: list[tuple] = []  # (start mark, end mark) of each lookup
        self._started: list = []
        self._gradient_bytes: dict[str, int] = {}
        self._auc_before = float("nan")

    # ----- the loop's calls -------------------------------------------------------------
    def on_build(self, run, built, config) -> None:
        self._clock, self._config, model = run.clock, config, built.parts[0]
        for table in model.tables.values():
            table.register_forward_pre_hook(self._lookup_starts)
            table.register_forward_hook(self._lookup_ends)
        self._auc_before = evaluate_on_ranks(run, model, config)
        self._windows.clear()

    def after_backward(self, run, built) -> None:
        self._gradient_bytes = {part: sum(_local(p.grad).nbytes for p in params
                                          if p.grad is not None)
                                for part, params in built.parts[0].parameter_groups().items()}

    def after_step(self, run, built, step: int, meter) -> dict:
        seconds = self._clock.seconds
        windows = [(seconds(a), seconds(b)) for a, b in self._windows]
        extras = {"lookup_s": time_outside(windows, meter.intervals),
                  "state_bytes": self._state_bytes(built),
                  "held_out_auc": evaluate_on_ranks(run, built.parts[0], self._config)}
        self._windows.clear()
        if step == 0:  # once per run: what the rank was given, and where it started
            extras.update(plan=built.table_plan.to_dict(), auc_before=self._auc_before)
        return extras

    # ----- timing a lookup ---------------------------------------------------------------
    def _lookup_starts(self, module, args) -> None:
        self._started.append(self._clock.mark())

    def _lookup_ends(self, module, args, output) -> None:
        self._windows.append((self._started.pop(), self._clock.mark()))
        node = _embedding_backward_node(output) if output.requires_grad else None
        if node is not None:  # time the weight-gradient computation too
            began = []
            node.register_prehook(lambda grads: began.append(self._clock.mark()))
            node.register_hook(lambda grads_in, grads_out: self._windows.append(
                (began.pop(), self._clock.mark())))

    def _state_bytes(self, built) -> dict[str, dict[str, int]]:
        """Bytes this rank holds, by part (tables, dense) and kind."""
        state = built.optimizer.state
        out = {}
        for part, params in built.parts[0].parameter_groups().items():
            optimizer = sum(_local(v).nbytes for p in params for v in state.get(p, {}).values()
                            if isinstance(v, torch.Tensor))
            out[part] = {"parameters": sum(_local(p).nbytes for p in params),
                         "gradients": self._gradient_bytes.get(part, 0),
                         "optimizer": optimizer}
        return out
