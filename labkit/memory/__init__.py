"""Device memory: virtual GPU capacity, measured breakdown, estimates, the OOM boundary."""

from labkit.memory.oom import CATEGORIES, DeviceOOM
from labkit.memory.tracker import MemoryTracker
from labkit.memory.units import format_bytes, parse_bytes

__all__ = ["CATEGORIES", "DeviceOOM", "MemoryTracker", "format_bytes", "parse_bytes"]
