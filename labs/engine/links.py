"""The links off the chip: NVLink between GPUs and PCI Express to the host, from each GPU's datasheet, and
the PCIe bandwidth a model uses (generation and lanes from the attached GPU, else its datasheet)."""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from typing import Optional

from labs.engine.gpu import _H100_SOURCE, Datasheet, Target
from labs.engine.params import ParamError


# --------------------------------------------------------------------------------------------
# NVLink and PCIe, per datasheet row
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Links:
    """A GPU's links off the chip, from its vendor's datasheet (per GPU)."""

    nvlink_gbps: Optional[float]  # NVLink, both directions together, GB/s (None: no NVLink)
    pcie_gen: int  # PCI Express generation of the host link
    pcie_lanes: int  # lanes of the host link (x16)
    source: str

    @property
    def nvlink_per_direction_gbps(self) -> Optional[float]:
        return self.nvlink_gbps / 2 if self.nvlink_gbps else None


# Per DATASHEET row name. NVLink figures count both directions (900 GB/s = 450 each way).
LINKS: dict[str, Links] = {
    "H100 SXM": Links(900, 5, 16, _H100_SOURCE + ": NVLink 900 GB/s, PCIe Gen5 128 GB/s (both directions, before the 128b/130b line code; ~63 GB/s each way after)"),
    "H100 PCIe": Links(600, 5, 16, _H100_SOURCE + ": NVLink bridge 600 GB/s, PCIe Gen5 128 GB/s (both directions, before encoding)"),
    "H200": Links(900, 5, 16, "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200), SXM: NVLink 900 GB/s, PCIe Gen5 128 GB/s (both directions, before encoding)"),
    "A100 40GB": Links(600, 4, 16, "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100), SXM: NVLink 600 GB/s, PCIe Gen4 64 GB/s (both directions, before encoding)"),
    "A100 80GB": Links(600, 4, 16, "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100), SXM: NVLink 600 GB/s, PCIe Gen4 64 GB/s (both directions, before encoding)"),
    "L4": Links(None, 4, 16, "NVIDIA L4 datasheet (nvidia.com/en-us/data-center/l4): PCIe Gen4 x16, no NVLink"),
    "L40S": Links(None, 4, 16, "NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s): PCIe Gen4 x16, no NVLink"),
    "T4": Links(None, 3, 16, "NVIDIA T4 datasheet (nvidia.com/en-us/data-center/tesla-t4): PCIe Gen3 x16, no NVLink"),
    "A10G": Links(None, 4, 16, "NVIDIA A10 datasheet (nvidia.com/en-us/data-center/products/a10-gpu): PCIe Gen4 x16"),
    "RTX 4090": Links(None, 4, 16, "NVIDIA GeForce RTX 4090 specifications: PCIe Gen4 x16, no NVLink"),
    "B200": Links(1800, 5, 16, "NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx): NVLink 5 1.8 TB/s per GPU, PCIe Gen5"),
}


def links_for(sheet: Optional[Datasheet]) -> Optional[Links]:
    return LINKS.get(sheet.name) if sheet else None


# PCI Express raw rate per lane (GT/s) and line-code efficiency, by generation (PCI-SIG base specifications:
# 8b/10b for generations 1 and 2, 128b/130b for 3 to 5). Per direction, x16 Gen5 = 32 x 16 x 128/130 / 8 = 63 GB/s.
PCIE_GTPS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}
PCIE_CODE = {1: 0.8, 2: 0.8, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130}

# ---------------------------------------------------------------------------------------------
# The PCIe link between host and GPU: generation and lanes from the GPU or its datasheet
# ---------------------------------------------------------------------------------------------
# Data travels in transaction-layer packets: at most MAX_PAYLOAD bytes of data each, plus framing, a sequence
# number, a 4-dword header (64-bit addresses) and a CRC (PCI Express base specification: 4 + 2 + 16 + 4 bytes).
# 256 bytes is the payload size data-centre GPUs and their root ports commonly settle on (lspci shows MaxPayload).
PCIE_MAX_PAYLOAD_BYTES = 256
PCIE_PACKET_OVERHEAD_BYTES = 26


def pcie_packet_efficiency(payload_bytes: int = PCIE_MAX_PAYLOAD_BYTES) -> float:
    """The share of the link's bytes that are data, with full packets."""
    return payload_bytes / (payload_bytes + PCIE_PACKET_OVERHEAD_BYTES)


def pcie_gbps(gen: int, lanes: int) -> float:
    """Bandwidth per direction of a PCIe link, GB/s (10^9 bytes/s), after line coding."""
    if gen not in PCIE_GTPS:
        raise ParamError(f"PCIe generation {gen} is not modelled (known: {', '.join(map(str, PCIE_GTPS))}).")
    return PCIE_GTPS[gen] * lanes * PCIE_CODE[gen] / 8


@functools.lru_cache(maxsize=1)
def reported_link() -> tuple:
    """(generation, lanes) that the attached GPU's link reports through nvidia-smi, or (None, None).

    The maximum the GPU and the slot both support: an idle link drops to a lower generation to save power,
    so the current reading understates what a copy gets.
    """
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=pcie.link.gen.max,pcie.link.width.max",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
        gen, width = (int(v) for v in out.stdout.strip().splitlines()[0].split(", "))
        return gen, width
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None, None


def link_for(target: Target) -> dict:
    """The PCIe link a model of this GPU uses: what the live GPU reports, else its datasheet."""
    gen, lanes, source = None, None, ""
    if target.live:
        gen, lanes = reported_link()
        source = "reported by the GPU (nvidia-smi)"
    links = links_for(target.datasheet)
    if (gen is None or gen not in PCIE_GTPS) and links:
        gen, lanes, source = links.pcie_gen, links.pcie_lanes, f"datasheet: {links.source}"
    if gen is None or gen not in PCIE_GTPS:
        gen, lanes, source = 4, 16, "unknown GPU: assumed PCIe Gen4 x16"
    line = pcie_gbps(gen, lanes)
    return {"pcie_gen": gen, "pcie_lanes": lanes, "pcie_line_gbps": line,
            "pcie_gbps": line * pcie_packet_efficiency(), "link_source": source}
