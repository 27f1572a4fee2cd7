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
  that trained twice held both models. ``phases.Phases`` gives MemTracker what it needs of
  ModTracker (are we in backward? in a forward?) from global module hooks and autograd.

MemTracker's private hooks are overridden here; torch is pinned (2.13.0) and
``tests/test_memory.py`` checks this class against known allocations.
"""

from __future__ import annotations

import contextlib
import threading
from functools import partial

import torch
from torch._guards import active_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed._tools import mem_tracker as upstream
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

from labkit.runtime.memory.collectives import collective_ops, settle_collective
from labkit.runtime.memory.oom import CATEGORIES, DeviceOOM
from labkit.runtime.memory.phases import Phases

_CATEGORY_OF = {
    upstream._MemRefType.PARAM: "parameters", upstream._MemRefType.BUFFER: "parameters",
    upstream._MemRefType.GRAD: "gradients", upstream._MemRefType.OPT: "optimizer",
    upstream._MemRefType.ACT: "activations", upstream._MemRefType.TEMP: "other",
    upstream._MemRefType.OTH: "other",
}
_GROWS = (upstream._UpdateType.ADD, upstream._UpdateType.SIZE)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _may_allocate(func) -> bool:
    """Whether ``func``'s outputs can be storages the tracker has not seen: not a view, and
    not an in-place op (``add_``, ``mul_``: the output is the input), except those that can
    resize their input's storage. About half of a training step's ops are of these kinds;
    skipping them is most of what brings the DLRM's tracking cost under 1.3x."""
    if getattr(func, "is_view", False):
        return False
    name = func._schema.name
    in_place = name.endswith("_") and not name.endswith("__")
    return not in_place or "resize" in name or name.endswith("::set_")


class MemoryTracker(upstream.MemTracker):
    """Tracks the live bytes of one device; enter it (``with tracker:``) around work.

    It may be entered many times: storages created under it stay counted until freed.
    """

    def __init__(self, rank: int = 0, capacity_bytes: int | None = None,
                 count_fake: bool = False):
        super().__init__()
        self.count_fake = count_fake  # the estimator counts fake tensors: they stand for real
        self._mod_tracker = Phases()
        self.rank = rank
        self.capacity_bytes = capacity_bytes
        self._seen_modules = WeakIdKeyDictionary()
        self._forced = None
        self._lock = threading.RLock()
        self._collectives = collective_ops()
        self._by_id: dict[int, tuple] = {}  # id(storage) -> MemTracker's (winfo, weakref)
        self._allocates: dict = {}  # op -> whether its outputs may be new storages
        self._bytes = dict.fromkeys(CATEGORIES, 0)  # live bytes per category
        self._total_bytes = 0
        self.reset_peak()

    # ----- what the tracker reports -----------------------------------------------------
    def live(self) -> dict[str, int]:
        """Live bytes now, by category, plus "total"."""
        return {**self._bytes, "total": self._total_bytes}

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
        if t.device.type == "meta":
            return  # shapes only: no memory anywhere
        if type(t) in _PLAIN:  # one storage and no subclass to look through: the fast path
            self._track_storage(self._forced or reftype, t)
            return
        if not self.count_fake and isinstance(t, FakeTensor):
            # DTensor works out an op's output shape the first time it meets it by running
            # the op on fake tensors: nothing is allocated on the device.
            return
        super()._track(self._forced or reftype, t)

    def _track_storage(self, reftype, t: torch.Tensor) -> None:
        """MemTracker's ``_track`` for a plain tensor (it runs for every output of every op).
        Storages are looked up by ``id`` first: a storage's Python object lives as long as
        its memory, and MemTracker's weak-keyed lookup costs a new weak reference each time."""
        storage = t.untyped_storage()
        key = id(storage)
        known = self._by_id.get(key)
        if known is None or known[1]() is not storage:
            known = self._WINFO.get(storage)
            if known is not None:
                self._by_id[key] = known
        if known is not None:
            winfo = known[0]
            if winfo.size != storage.size():  # resized in place
                old = winfo.mem_consumed
                winfo.update_mem_consumed(storage)
                self._update_snap(upstream._UpdateType.SIZE, winfo, old_mem_consumed=old)
            return
        winfo, ref = upstream._WeakRefInfo.create_winfo(storage, t.device, reftype,
                                                       self._delete_callback)
        winfo.key = key
        self._WINFO[storage] = self._by_id[key] = (winfo, ref)
        if winfo.mem_consumed > 0:
            self._update_snap(upstream._UpdateType.ADD, winfo)

    def _delete_callback(self, winfo, w_st) -> None:
        self._by_id.pop(getattr(winfo, "key", None), None)
        super()._delete_callback(winfo, w_st)

    # ----- the counts: MemTracker's, kept per category too, with the capacity check -----
    def _total(self) -> int:
        return self._total_bytes

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
        # Threads the learner's function starts are tracked too (threads.py), and storages
        # are freed on whichever thread drops them last: one update at a time.
        with self._lock:
            self._update_counts(u_type, winfo, old_mem_consumed, old_reftype)

    def _update_counts(self, u_type, winfo, old_mem_consumed, old_reftype) -> None:
        # MemTracker's bookkeeping of ``_curr_mem_snap``, plus running totals per category so
        # that every op costs O(1) (this runs for every tensor every op creates).
        snap = self._curr_mem_snap.get(winfo.device)
        if snap is None:
            snap = self._curr_mem_snap[winfo.device] = dict.fromkeys(self._ref_class, 0)
            snap[upstream._TOTAL_KEY] = 0
        category = _CATEGORY_OF[winfo.reftype]
        size = winfo.mem_consumed
        if u_type is upstream._UpdateType.REF:
            snap[old_reftype] -= size
            snap[winfo.reftype] += size
            self._bytes[_CATEGORY_OF[old_reftype]] -= size
            self._bytes[category] += size
        else:
            if u_type is upstream._UpdateType.ADD:
                delta = size
            elif u_type is upstream._UpdateType.DEL:
                delta = -size
            else:  # SIZE: a storage was resized
                delta = size - old_mem_consumed
            snap[winfo.reftype] += delta
            snap[upstream._TOTAL_KEY] += delta
            self._bytes[category] += delta
            self._total_bytes += delta
            if delta <= 0:
                return
        self.category_peaks[category] = max(self.category_peaks[category], self._bytes[category])
        if (u_type is not upstream._UpdateType.REF and self.capacity_bytes is not None
                and self._total_bytes > self.capacity_bytes):
            before = self.live()  # what was in use before the allocation that failed
            before[category] -= delta
            before["total"] -= delta
            raise DeviceOOM(self.rank, str(winfo.device), delta, self.capacity_bytes,
                            before["total"], before, category=category)

    def _update_peak_stats(self, peak_state) -> None:
        total = self._total()
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_breakdown, self.peak_phase = (
                total, self.live(), self.phase())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # MemTracker's own, with its pytree walk over outputs replaced by a direct loop (ops
        # return a tensor or a flat tuple/list of them): the per-op cost is what a learner
        # pays on every step.
        if DTensor in types:
            return NotImplemented  # let DTensor run its local ops, which we then see
        res = func(*args, **(kwargs or {}))
        if not self.count_fake:
            if func in self._collectives:
                settle_collective(func, args, res)  # the same peak every run (collectives.py)
            allocates = self._allocates.get(func)
            if allocates is None:
                allocates = self._allocates[func] = _may_allocate(func)
            if not allocates:
                return res  # a view, or an in-place op: no new storage, nothing to count
        elif active_fake_mode() is not self._fake_mode_on_entry:
            # DTensor's sharding propagation on fake tensors of its own: no memory. (Without
            # count_fake, _track skips every fake tensor anyway.)
            return res
        if self._in_opt:
            reftype = upstream._MemRefType.OPT
        elif self._mod_tracker.is_bw and not (self._in_ac or self._mod_tracker.depth):
            # a module's forward inside backward is activation checkpointing recomputing a
            # block: what it makes are activations again, not backward's temporaries
            reftype = upstream._MemRefType.TEMP
        else:
            reftype = upstream._MemRefType.ACT
        outputs = res if isinstance(res, (tuple, list)) else (res,)
        for out in outputs:
            if isinstance(out, torch.Tensor):
                self._track(reftype, out)
            elif isinstance(out, (tuple, list)):
                tree_map_only(torch.Tensor, partial(self._track, reftype), out)
        self._update_peak_stats(None)
        return res

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
