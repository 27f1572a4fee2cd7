"""Where a step is (in a forward? in backward?), told to MemTracker without ModTracker.

In torch 2.13 ModTracker's backward hooks keep a step's whole autograd graph, and so the
model, alive after the step whenever a module saves its output; this gives MemTracker what it
uses of ModTracker from global module hooks and autograd's own state instead.
"""

from __future__ import annotations

import torch
from torch.nn.modules import module as nn_module


class Phases:
    """The part of ModTracker that MemTracker uses, without hooks on autograd graphs."""

    def __init__(self):
        self.depth = 0  # how many module forwards are running
        self._user_pre_fw = None
        self._handles = []

    @property
    def is_bw(self) -> bool:
        return torch._C._current_graph_task_id() != -1  # an autograd graph is executing

    def register_user_hooks(self, pre_fw=None, post_fw=None, pre_bw=None, post_bw=None):
        self._user_pre_fw = pre_fw

    def clear_user_hooks(self) -> None:
        self._user_pre_fw = None

    def _pre(self, module, args) -> None:
        self.depth += 1
        if self._user_pre_fw is not None and not self.is_bw:
            self._user_pre_fw(module, args)

    def _post(self, module, args, output) -> None:
        self.depth -= 1

    def __enter__(self):
        self._handles = [nn_module.register_module_forward_pre_hook(self._pre),
                         nn_module.register_module_forward_hook(self._post, always_call=True)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self.depth = [], 0
