"""The links between devices, as their makers specify them: one sourced table.

Figures are per GPU (or per port), in bytes per second, as given in each vendor's datasheet;
"both directions" counts what a GPU sends plus what it receives. Nothing here is measured:
what these ranks measure is in ``time_collectives`` and the notebooks' tables.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float
    counted: str  # what the figure counts
    where: str    # what it connects
    source: str


LINKS = (
    Link("NVLink 4 (H100 SXM)", 900e9, "both directions, per GPU",
         "GPUs inside one machine", "NVIDIA H100 Tensor Core GPU datasheet"),
    Link("NVLink 3 (A100 SXM)", 600e9, "both directions, per GPU",
         "GPUs inside one machine", "NVIDIA A100 Tensor Core GPU datasheet"),
    Link("PCIe 5.0 x16", 128e9, "both directions",
         "a GPU and its host", "PCI-SIG PCIe 5.0 specification (32 GT/s per lane)"),
    Link("InfiniBand NDR", 50e9, "one direction, per port (400 Gb/s)",
         "machines, one port per GPU", "NVIDIA ConnectX-7 / Quantum-2 datasheets"),
    Link("InfiniBand HDR", 25e9, "one direction, per port (200 Gb/s)",
         "machines, one port per GPU", "NVIDIA ConnectX-6 / Quantum datasheets"),
)


def links_table() -> str:
    """The table as text, one link a line."""
    return "\n".join(f"{link.name:<22} {link.bytes_per_s / 1e9:>5.0f} GB/s  {link.counted:<36} "
                     f"{link.where:<28} [{link.source}]" for link in LINKS)
