"""What the tracker would miss on its own, made visible to it while a cap is enforced.

* A ``TorchDispatchMode`` is per thread: allocations in a thread that the learner's function
  starts (``threading.Thread``, a ``ThreadPoolExecutor``) would not be counted.
  ``follow_threads`` puts the tracker on every thread started while it is active.
* Tensors made while no cap was set (no tracker running) and kept in ``ctx.state`` would
  not be counted once a cap is set. ``track_kept`` registers them.
* oneDNN's recurrent kernels (``nn.LSTM`` on CPU) allocate their workspaces inside one op,
  where the dispatcher never sees them: measured against the CPU allocator's own events, a
  2-layer LSTM's peak was 14% above what its tensors held. ``countable_rnn_kernels`` runs
  RNN modules on PyTorch's own kernels instead (every byte they hold is a tensor; the
  autograd graph, and so backward, follows the forward's choice). They are slower (~4x on
  one core), so this applies only while a cap is enforced.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.distributed._tools import mem_tracker as upstream
from torch.nn.modules import module as nn_module
from torch.utils._python_dispatch import _pop_mode, _push_mode

_MAX_DEPTH = 6  # how deep track_kept looks into nested containers and objects


@contextlib.contextmanager
def follow_threads(tracker):
    """While active, every thread started runs its target under ``tracker``."""
    original_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        run = thread.run

        def tracked_run() -> None:
            _push_mode(tracker)
            try:
                run()
            finally:
                _pop_mode()

        thread.run = tracked_run
        original_start(thread)

    threading.Thread.start = start
    try:
        yield
    finally:
        threading.Thread.start = original_start


def track_kept(tracker, value, _depth: int = 0, _seen: set | None = None) -> None:
    """Count every tensor reachable from ``value`` (a dict, list, module, optimizer, object)
    that the tracker does not know yet: parameters, gradients and buffers of modules,
    optimizer state, and loose tensors ("other")."""
    seen = set() if _seen is None else _seen
    if _depth > _MAX_DEPTH or id(value) in seen:
        return
    seen.add(id(value))
    refs = upstream._MemRefType
    if isinstance(value, torch.Tensor):
        _track_new(tracker, refs.OTH, value)
    elif isinstance(value, torch.nn.Module):
        for param in value.parameters():
            _track_new(tracker, refs.PARAM, param)
            if param.grad is not None:
                _track_new(tracker, refs.GRAD, param.grad)
        for buffer in value.buffers():
            _track_new(tracker, refs.BUFFER, buffer)
    elif isinstance(value, torch.optim.Optimizer):
        for state in value.state.values():
            for item in state.values():
                if isinstance(item, torch.Tensor):
                    _track_new(tracker, refs.OPT, item)
    elif isinstance(value, dict):
        for item in list(value.values()):
            track_kept(tracker, item, _depth + 1, seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in list(value):
            track_kept(tracker, item, _depth + 1, seen)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        track_kept(tracker, vars(value), _depth + 1, seen)


def _track_new(tracker, reftype, tensor: torch.Tensor) -> None:
    if tensor.device.type == "meta":
        return
    try:
        tracker._track(reftype, tensor)  # a storage it already knows keeps its category
    except RuntimeError:  # a tensor without storage (some wrapper subclasses)
        return


@contextlib.contextmanager
def countable_rnn_kernels():
    """While active, RNN modules (LSTM, GRU, RNN) run without oneDNN."""
    saved: list[bool] = []

    def before(module, args) -> None:
        if isinstance(module, torch.nn.RNNBase):
            saved.append(torch._C._get_mkldnn_enabled())
            torch._C._set_mkldnn_enabled(False)

    def after(module, args, output) -> None:
        if isinstance(module, torch.nn.RNNBase) and saved:
            torch._C._set_mkldnn_enabled(saved.pop())

    handles = [nn_module.register_module_forward_pre_hook(before),
               nn_module.register_module_forward_hook(after, always_call=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
