"""Device memory: virtual GPU capacity, measured breakdown, estimates, the OOM boundary."""

from labkit.runtime.memory.oom import CATEGORIES, DeviceOOM
from labkit.runtime.memory.tracker import MemoryTracker
from labkit.runtime.memory.units import format_bytes, parse_bytes

__all__ = ["CATEGORIES", "DeviceOOM", "MemoryTracker", "format_bytes", "parse_bytes"]
