"""``DeviceOOM``: the one out-of-memory error of the suite, on a virtual GPU or a real one."""

from __future__ import annotations

import torch

from labkit.runtime.memory.units import format_bytes

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "other")
MODEL_STATE = ("parameters", "gradients", "optimizer")


def advice(breakdown: dict[str, int], category: str | None = None,
           requested_bytes: int = 0) -> str:
    """What the learner should change, from what fills the device and what was asked for."""
    filled = {c: breakdown.get(c, 0) for c in CATEGORIES}
    if category in filled:
        filled[category] += requested_bytes  # the allocation that failed counts for its kind
    state = sum(filled[c] for c in MODEL_STATE)
    if category == "parameters" and not filled["gradients"] and not filled["optimizer"]:
        return ("the model's weights alone do not fit (the allocation that failed was a "
                "weight, made while the model was built): split the model over devices "
                "(FSDP, pipeline or tensor parallel; table-wise or row-wise sharding for "
                "embedding tables), choose a smaller model, or raise the capacity")
    if filled["activations"] > state:
        return ("activations dominate: lower the batch size per device, or spread the batch "
                "over more devices")
    return ("model state (parameters, gradients, optimizer) dominates: add devices and split "
            "it (FSDP / ZeRO, pipeline or tensor parallel; for embedding tables, table-wise or "
            "row-wise sharding), or choose a smaller model")


class DeviceOOM(torch.OutOfMemoryError):
    """A rank ran out of device memory: the cap of a virtual GPU, or CUDA's own limit.

    Attributes: rank, device, requested_bytes, capacity_bytes, in_use_bytes (before the
    failed allocation), breakdown (live bytes by category at that moment), category (the
    kind of the allocation that failed, when known), detail (what CUDA said, on a GPU, and
    what was worked out before the run), advice (what to change, said after "To fit,"),
    remote_traceback (set when raised in the notebook on behalf of a rank).
    """

    def __init__(self, rank: int, device: str, requested_bytes: int, capacity_bytes: int,
                 in_use_bytes: int, breakdown: dict[str, int], detail: str = "",
                 category: str | None = None, advice_text: str | None = None):
        self.rank, self.device = rank, device
        self.requested_bytes, self.capacity_bytes = requested_bytes, capacity_bytes
        self.in_use_bytes, self.breakdown = in_use_bytes, dict(breakdown)
        self.detail, self.category = detail, category
        self.advice = advice_text or advice(breakdown, category, requested_bytes)
        self.remote_traceback = ""
        super().__init__(self._describe() + (f"\n{detail}" if detail else ""))

    def _describe(self) -> str:
        parts = ", ".join(f"{c} {format_bytes(self.breakdown.get(c, 0))}" for c in CATEGORIES)
        return (f"rank {self.rank} is out of device memory on {self.device}: tried to allocate "
                f"{format_bytes(self.requested_bytes)} with {format_bytes(self.in_use_bytes)} "
                f"of {format_bytes(self.capacity_bytes)} in use ({parts}). To fit, "
                f"{self.advice}.")

    def explain(self, note: str, advice_text: str | None = None) -> DeviceOOM:
        """Add ``note`` to what this error says (e.g. what would fit, worked out up front).
        ``advice_text`` replaces the advice read from the breakdown at the failure, which sees
        only what was alive then: a model state too large for the device may fail in the
        forward pass, before its gradients exist, with the activations its largest part."""
        self.detail = f"{self.detail}\n{note}" if self.detail else note
        self.advice = advice_text or self.advice
        self.args = (f"{self._describe()}\n{self.detail}",)
        return self

    def to_dict(self) -> dict:
        """The numbers of this OOM, as plain values (what a notebook records)."""
        return {"rank": self.rank, "device": self.device, "requested": self.requested_bytes,
                "capacity": self.capacity_bytes, "in_use": self.in_use_bytes,
                "breakdown": dict(self.breakdown), "category": self.category}

    def __reduce__(self):
        return (type(self), (self.rank, self.device, self.requested_bytes, self.capacity_bytes,
                             self.in_use_bytes, self.breakdown, self.detail, self.category,
                             self.advice))
