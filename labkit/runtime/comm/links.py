"""The links between devices, as their makers specify them: one sourced table.

Figures are per GPU (or per port), in bytes per second, as given in each vendor's own pages;
"both directions" counts what a GPU sends plus what it receives. Nothing here is measured:
what these ranks measure is in ``time_collectives`` and the notebooks' tables. Each row names
its source with a URL and the date it was read; a figure that could be read only in copies of
the source (not in the source itself) says so in ``unverified``, and the table prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

ACCESSED = "2026-12-01"  # when each URL below was checked (against stored copies of the pages)


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float
    counted: str  # what the figure counts
    where: str    # what it connects
    source: str
    url: str = ""
    accessed: str = ACCESSED
    unverified: str = ""  # empty: the figure was read in the source itself


LINKS = (
    Link("NVLink 4 (H100 SXM)", 900e9, "both directions, per GPU",
         "GPUs inside one machine", "NVIDIA Hopper architecture page (German edition)",
         "https://www.nvidia.com/de-de/technologies/hopper-architecture/"),
    Link("NVLink 3 (A100 SXM)", 600e9, "both directions, per GPU",
         "GPUs inside one machine", "NVIDIA NVLink page (German edition)",
         "https://www.nvidia.com/de-de/data-center/nvlink/"),
    Link("PCIe 5.0 x16", 128e9, "both directions",
         "a GPU and its host", "PCI-SIG PCIe 5.0 specification (32 GT/s per lane)",
         "https://pcisig.com/specifications",
         unverified="the specification is members-only; '32 GT/s, up to 128 GB/s via x16' "
                    "is PCI-SIG's announcement of May 2019, read in copies of it"),
    Link("InfiniBand NDR", 50e9, "one direction, per port (400 Gb/s)",
         "machines, one port per GPU", "NVIDIA ConnectX-7 adapter user manual",
         "https://docs.nvidia.com/networking/display/ConnectX7VPI/Introduction"),
    Link("InfiniBand HDR", 25e9, "one direction, per port (200 Gb/s)",
         "machines, one port per GPU", "NVIDIA ConnectX-6 Ethernet adapter user manual",
         "https://docs.nvidia.com/networking/display/ConnectX6EN/Introduction"),
)


def links_table() -> str:
    """The table as text, one link a line (and a line saying so under an unverified one)."""
    lines = []
    for link in LINKS:
        lines.append(f"{link.name:<22} {link.bytes_per_s / 1e9:>5.0f} GB/s  {link.counted:<36} "
                     f"{link.where:<28} [{link.source}, {link.url}, read {link.accessed}]")
        if link.unverified:
            lines.append(f"{'':<22} unverified: {link.unverified}")
    return "\n".join(lines)
