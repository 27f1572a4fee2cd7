"""Live device memory of one rank, by category, with an optional capacity (a virtual GPU).

Built on PyTorch's own ``MemTracker`` (``torch.distributed._tools.mem_tracker``), which
already counts every tensor storage an op creates, follows ``UntypedStorage.resize_`` (how
FSDP2 frees gathered parameters), looks through DTensor to the local shard, and tells
parameters, gradients, optimizer state and forward/backward allocations apart. labkit adds
what it lacks:

* a capacity: the allocation that takes live bytes past it raises ``DeviceOOM`` from the op
  that allocated, as a GPU would;
* the phase of the step (forward, backward, optimizer) at which the peak happened;
* per-category peaks, and no per-module statistics (their cost grows with model depth);
* no ``ModTracker``: in torch 2.13 its backward hooks keep a step's whole autograd graph, and
  so the model, alive after the step whenever a module saves its output (ReLU does). A rank
  that trained twice held both models. ``_Phases`` below gives MemTracker what it needs of
  ModTracker (are we in backward? in a forward?) from global module hooks and autograd.

MemTracker's private hooks are overridden here; torch is pinned (2.13.0) and
``tests/test_memory.py`` checks this class against known allocations.
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed._tools import mem_tracker as upstream
from torch.nn.modules import module as nn_module
from torch.utils.weak import WeakIdKeyDictionary

from labkit.memory.oom import CATEGORIES, DeviceOOM

_CATEGORY_OF = {
    upstream._MemRefType.PARAM: "parameters", upstream._MemRefType.BUFFER: "parameters",
    upstream._MemRefType.GRAD: "gradients", upstream._MemRefType.OPT: "optimizer",
    upstream._MemRefType.ACT: "activations", upstream._MemRefType.TEMP: "other",
    upstream._MemRefType.OTH: "other",
}
_GROWS = (upstream._UpdateType.ADD, upstream._UpdateType.SIZE)


class _Phases:
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


class MemoryTracker(upstream.MemTracker):
    """Tracks the live bytes of one device; enter it (``with tracker:``) around work.

    It may be entered many times: storages created under it stay counted until freed.
    """

    def __init__(self, rank: int = 0, capacity_bytes: int | None = None):
        super().__init__()
        self._mod_tracker = _Phases()
        self.rank = rank
        self.capacity_bytes = capacity_bytes
        self._seen_modules = WeakIdKeyDictionary()
        self._forced = None
        self.reset_peak()

    # ----- what the tracker reports -----------------------------------------------------
    def live(self) -> dict[str, int]:
        """Live bytes now, by category, plus "total"."""
        return self._by_category(self._curr_mem_snap)

    def reset_peak(self) -> None:
        """Start a new peak window (e.g. one training step) from the current live bytes."""
        now = self.live()
        self.peak_bytes = now["total"]
        self.peak_breakdown = now
        self.peak_phase = self.phase()
        self.category_peaks = {c: now[c] for c in CATEGORIES}

    def phase(self) -> str:
        if self._in_opt:
            return "optimizer"
        if self._mod_tracker.is_bw:
            return "backward"
        return "forward" if self._mod_tracker.depth > 0 else "outside"

    def report(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "peak_phase": self.peak_phase,
                "at_peak": dict(self.peak_breakdown), "category_peaks": dict(self.category_peaks),
                "capacity_bytes": self.capacity_bytes}

    def _by_category(self, snapshot: dict) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        total = 0
        for device_snap in snapshot.values():
            for reftype, nbytes in device_snap.items():
                if reftype in _CATEGORY_OF:
                    out[_CATEGORY_OF[reftype]] += nbytes
            total += device_snap.get(upstream._TOTAL_KEY, 0)
        out["total"] = total
        return out

    @contextlib.contextmanager
    def label_as(self, category: str):
        """File every allocation made inside under ``category`` (e.g. communication buffers
        that a wrapper allocates during forward, which MemTracker would call activations)."""
        reftype = {c: r for r, c in _CATEGORY_OF.items()}[category]
        if category == "other":
            reftype = upstream._MemRefType.OTH
        saved, self._forced = self._forced, reftype
        try:
            yield
        finally:
            self._forced = saved

    def _track(self, reftype, t) -> None:
        super()._track(self._forced or reftype, t)

    # ----- the capacity, checked where MemTracker updates its counts ---------------------
    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        if u_type not in _GROWS:
            return
        live = self.live()
        for category in CATEGORIES:
            self.category_peaks[category] = max(self.category_peaks[category], live[category])
        if self.capacity_bytes is not None and live["total"] > self.capacity_bytes:
            grown = winfo.mem_consumed
            if u_type is upstream._UpdateType.SIZE:
                grown -= old_mem_consumed
            before = dict(live)  # what was in use before the allocation that failed
            before[_CATEGORY_OF[winfo.reftype]] -= grown
            before["total"] -= grown
            raise DeviceOOM(self.rank, str(winfo.device), grown, self.capacity_bytes,
                            before["total"], before)

    def _update_peak_stats(self, peak_state) -> None:
        live = self.live()
        if live["total"] > self.peak_bytes:
            self.peak_bytes, self.peak_breakdown, self.peak_phase = (
                live["total"], live, self.phase())

    # ----- MemTracker's per-module statistics are not needed: keep only what classifies ----
    def _pre_fw_hook(self, module, inputs) -> None:
        if module not in self._seen_modules:  # parameters, buffers, gradient hooks
            self._track_module_params_and_buffers(module, install_grad_hooks=True)
            self._seen_modules[module] = True

    def _post_fw_hook(self, module, inputs, outputs) -> None:
        pass

    def _pre_bw_hook(self, module, args) -> None:
        pass

    def _post_bw_hook(self, module, args) -> None:
        pass




def relabel_live(tracker: MemoryTracker, old: str = "activations", new: str = "other") -> None:
    """Re-file live storages of category ``old`` under ``new`` (e.g. buffers made at set-up,
    which MemTracker files as activations because no backward or optimizer step is running)."""
    reftypes = {c: r for r, c in _CATEGORY_OF.items()}
    old_ref = upstream._MemRefType.ACT if old == "activations" else reftypes[old]
    new_ref = upstream._MemRefType.OTH if new == "other" else reftypes[new]
    for winfo, _ in list(tracker._WINFO.values()):
        if winfo.reftype == old_ref:
            winfo.reftype = new_ref
            tracker._update_snap(upstream._UpdateType.REF, winfo, old_reftype=old_ref)
