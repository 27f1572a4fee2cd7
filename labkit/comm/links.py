"""The links between devices, as their makers specify them: one sourced table.

Figures are per GPU (or per port), in bytes per second, as given in each vendor's datasheet;
"both directions" counts what a GPU sends plus what it receives. Nothing here is measured:
what these ranks measure is in ``time_collectives`` and the notebooks' tables. Each row names
its source with a URL and the date it was read; a figure read only from a copy of the vendor's
page (not the page itself) says so in ``note``, starting with UNSURE.
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
    note: str = ""


LINKS = (
    Link("NVLink 4 (H100 SXM)", 900e9, "both directions, per GPU",
         "GPUs inside one machine", "NVIDIA H100 Tensor Core GPU datasheet",
         "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
         note="UNSURE: 900 GB/s read in copies of the datasheet's table, not in the PDF"),
    Link("NVLink 3 (A100 SXM)", 600e9, "both directions, per GPU",
         "GPUs inside one machine", "NVIDIA A100 Tensor Core GPU datasheet",
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
         note="UNSURE: 600 GB/s (300 + 300) read in pages citing this PDF, not in the PDF"),
    Link("PCIe 5.0 x16", 128e9, "both directions",
         "a GPU and its host", "PCI-SIG PCIe 5.0 specification (32 GT/s per lane)",
         "https://pcisig.com/specifications",
         note="UNSURE: the specification is members-only; '32 GT/s, up to 128 GB/s via x16' "
              "is PCI-SIG's announcement of May 2019, read in copies of the press release"),
    Link("InfiniBand NDR", 50e9, "one direction, per port (400 Gb/s)",
         "machines, one port per GPU", "NVIDIA ConnectX-7 adapter user manual",
         "https://docs.nvidia.com/networking/display/ConnectX7VPI/Introduction"),
    Link("InfiniBand HDR", 25e9, "one direction, per port (200 Gb/s)",
         "machines, one port per GPU", "NVIDIA ConnectX-6 adapter user manual",
         "https://docs.nvidia.com/networking/display/ConnectX6VPI/Introduction",
         note="UNSURE: 200 Gb/s per HDR port read on NVIDIA's ConnectX-6 Ethernet manual and "
              "a Lenovo product guide for the VPI card, not on this page itself"),
)


def links_table() -> str:
    """The table as text, one link a line."""
    return "\n".join(f"{link.name:<22} {link.bytes_per_s / 1e9:>5.0f} GB/s  {link.counted:<36} "
                     f"{link.where:<28} [{link.source}, {link.url}, read {link.accessed}"
                     f"{'; UNSURE' if link.note.startswith('UNSURE') else ''}]"
                     for link in LINKS)
