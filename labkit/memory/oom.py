"""``DeviceOOM``: the one out-of-memory error of the suite, on a virtual GPU or a real one."""

from __future__ import annotations

import torch

from labkit.memory.units import format_bytes

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "other")
_MODEL_STATE = ("parameters", "gradients", "optimizer")


def advice(breakdown: dict[str, int]) -> str:
    """What the learner should change, from what fills the device."""
    state = sum(breakdown.get(c, 0) for c in _MODEL_STATE)
    if breakdown.get("activations", 0) > state:
        return ("activations dominate: lower the batch size per device, or spread the batch "
                "over more devices")
    return ("model state (parameters, gradients, optimizer) dominates: add devices and split "
            "it (FSDP / ZeRO, pipeline or tensor parallel; for embedding tables, table-wise or "
            "row-wise sharding), or choose a smaller model")


class DeviceOOM(torch.OutOfMemoryError):
    """A rank ran out of device memory: the cap of a virtual GPU, or CUDA's own limit.

    Attributes: rank, device, requested_bytes, capacity_bytes, in_use_bytes (before the
    failed allocation), breakdown (live bytes by category at that moment), remote_traceback
    (set when raised in the notebook on behalf of a rank).
    """

    def __init__(self, rank: int, device: str, requested_bytes: int, capacity_bytes: int,
                 in_use_bytes: int, breakdown: dict[str, int]):
        self.rank, self.device = rank, device
        self.requested_bytes, self.capacity_bytes = requested_bytes, capacity_bytes
        self.in_use_bytes, self.breakdown = in_use_bytes, dict(breakdown)
        self.remote_traceback = ""
        parts = ", ".join(f"{c} {format_bytes(breakdown.get(c, 0))}" for c in CATEGORIES)
        super().__init__(
            f"rank {rank} is out of device memory on {device}: tried to allocate "
            f"{format_bytes(requested_bytes)} with {format_bytes(in_use_bytes)} of "
            f"{format_bytes(capacity_bytes)} in use ({parts}). To fit, {advice(breakdown)}.")

    def to_dict(self) -> dict:
        """The numbers of this OOM, as plain values (what a notebook records)."""
        return {"rank": self.rank, "device": self.device, "requested": self.requested_bytes,
                "capacity": self.capacity_bytes, "in_use": self.in_use_bytes,
                "breakdown": dict(self.breakdown)}

    def __reduce__(self):
        return (type(self), (self.rank, self.device, self.requested_bytes, self.capacity_bytes,
                             self.in_use_bytes, self.breakdown))
