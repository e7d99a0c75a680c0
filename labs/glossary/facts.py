"""The numbers entries quote: per-SM facts of each architecture, vendor figures that are not in the datasheet
table, load-to-use latencies, and the placeholders that fill them in (`{{H100 SXM.sm_count}}` -> "132").

Five kinds of placeholder, each rendered with the source it came from:
- `{{<datasheet row>.<field>}}`: labs.engine.gpu.DATASHEET ("H100 SXM", "H200", "A100 80GB", ...), plus a few
  derived fields (`ridge_fp32`, `ridge_bf16`, `bf16_over_fp32`, `clock_ghz`, ...);
- `{{<architecture>.<field>}}`: per-SM facts of an architecture (ARCH below: "Hopper", "Ampere",
  "Ada Lovelace"), chosen for a datasheet row by its compute capability;
- `{{<fact>}}`: other vendor figures (interconnects, memory granularity), FACTS below;
- `{{latency.<level>}}`: approximate load-to-use latencies in cycles from published microbenchmarks;
- `{{recorded:<gpu key>.<field>}}`: a calibration this app recorded on a real GPU
  (content/recorded/<gpu key>/ceilings.json), e.g. `{{recorded:nvidia-h200.copy_tbps}}`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Optional

from labs.engine.gpu import DATASHEET, RECORDED_DIR, Datasheet

# --------------------------------------------------------------------------------------------
# Facts that are not in the datasheet table
# --------------------------------------------------------------------------------------------
_HOPPER_SRC = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper and the CUDA C++ Programming Guide "
               "(compute capability 9.0)")
_AMPERE_SRC = ("NVIDIA A100 Tensor Core GPU Architecture whitepaper and the CUDA C++ Programming Guide "
               "(compute capability 8.0)")
_ADA_SRC = ("NVIDIA Ada GPU Architecture whitepaper and the CUDA C++ Programming Guide "
            "(compute capability 8.9)")


@dataclass(frozen=True)
class ArchFacts:
    """Per-SM figures of one architecture (the same for every product built on it)."""

    name: str
    sub_partitions_per_sm: int  # processing blocks, each with its own warp scheduler
    fp32_lanes_per_sm: int  # "CUDA cores" doing FP32 FMA
    tensor_cores_per_sm: int
    sfus_per_sm: int
    ld_st_units_per_sm: int
    registers_per_sm: int  # 32-bit registers
    max_registers_per_thread: int
    l1_shared_per_sm_kb: int  # one SRAM, split between L1 and shared memory
    max_shared_per_sm_kb: int
    max_shared_per_block_kb: int
    max_threads_per_sm: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    max_threads_per_block: int
    warp_size: int
    full_chip: str  # die name
    full_chip_gpcs: int
    full_chip_tpcs: int
    full_chip_sms: int
    sms_per_tpc: int
    max_cluster_blocks: int  # thread block cluster size guaranteed portable (0: no clusters)
    source: str

    @property
    def register_file_kb(self) -> int:
        return self.registers_per_sm * 4 // 1024

    @property
    def warps_per_sub_partition(self) -> int:
        return self.max_warps_per_sm // self.sub_partitions_per_sm

    @property
    def lanes_per_sub_partition(self) -> int:
        return self.fp32_lanes_per_sm // self.sub_partitions_per_sm


ARCH: dict[str, ArchFacts] = {
    "Hopper": ArchFacts("Hopper", 4, 128, 4, 16, 32, 65536, 255, 256, 228, 227, 2048, 64, 32, 1024, 32,
                        "GH100", 8, 72, 144, 2, 8, _HOPPER_SRC),
    "Ampere": ArchFacts("Ampere", 4, 64, 4, 16, 32, 65536, 255, 192, 164, 163, 2048, 64, 32, 1024, 32,
                        "GA100", 8, 64, 128, 2, 0, _AMPERE_SRC),
    "Ada Lovelace": ArchFacts("Ada Lovelace", 4, 128, 4, 16, 16, 65536, 255, 128, 100, 99, 1536, 48, 24, 1024, 32,
                              "AD102", 12, 72, 144, 2, 0, _ADA_SRC),
}


@dataclass(frozen=True)
class Fact:
    value: float
    unit: str
    source: str


_TMEM_SRC = "NVIDIA PTX ISA, Tensor Memory and the tcgen05 instructions (sm_100a, Blackwell)"
_PCIE_SRC = ("PCI-SIG PCI Express base specifications: 32 GT/s (5.0) and 16 GT/s (4.0) per lane, x16, one "
             "direction, after the 128b/130b line code (64 and 32 GB/s before it)")
_NVLINK_SRC = "NVIDIA H100, H200 and A100 datasheets (NVLink bandwidth per GPU, both directions together)"
FACTS: dict[str, Fact] = {
    "nvlink4_gbps": Fact(900, "GB/s", _NVLINK_SRC),  # H100 SXM and H200 SXM
    "nvlink4_links": Fact(18, "links", "NVIDIA Hopper architecture whitepaper"),
    "nvlink3_gbps": Fact(600, "GB/s", _NVLINK_SRC),  # A100 SXM
    "nvlink3_links": Fact(12, "links", "NVIDIA A100 architecture whitepaper"),
    "pcie5_x16_gbps": Fact(63, "GB/s per direction", _PCIE_SRC),  # 32 x 16 x 128/130 / 8 = 63.0
    "pcie4_x16_gbps": Fact(31.5, "GB/s per direction", _PCIE_SRC),  # 16 x 16 x 128/130 / 8 = 31.5
    "infiniband_ndr_gbitps": Fact(400, "Gbit/s per port",
                                  "NVIDIA ConnectX-7 / Quantum-2 NDR InfiniBand product briefs"),
    "nvlink_switch_max_gpus": Fact(256, "GPUs", "NVIDIA NVLink Switch System (DGX H100 SuperPOD) documentation"),
    "dgx_h100_gpus": Fact(8, "GPUs", "NVIDIA DGX H100 system datasheet"),
    "dgx_h100_nvswitches": Fact(4, "NVSwitch chips", "NVIDIA DGX H100 system datasheet"),
    "sector_bytes": Fact(32, "bytes", "CUDA C++ Best Practices Guide (global memory accesses)"),
    "cache_line_bytes": Fact(128, "bytes", "CUDA C++ Best Practices Guide (global memory accesses)"),
    "smem_banks": Fact(32, "banks", "CUDA C++ Programming Guide (shared memory, compute capability 5.x and later)"),
    "smem_bank_bytes": Fact(4, "bytes", "CUDA C++ Programming Guide (shared memory, compute capability 5.x and later)"),
    # Blackwell's tensor memory (sm_100): 128 lanes x 512 columns of 32-bit cells per SM
    "tmem_lanes": Fact(128, "lanes", _TMEM_SRC),
    "tmem_columns": Fact(512, "columns of 32 bits", _TMEM_SRC),
    "tmem_alloc_columns": Fact(32, "columns (smallest allocation)", _TMEM_SRC),
    "tmem_per_sm_kb": Fact(256, "KB per SM (128 x 512 x 4 bytes)", _TMEM_SRC),
}


# vary with clock, load and access pattern, and are here to show orders of magnitude.
LATENCY_SOURCE = ("approximate: microbenchmarks of Hopper (Luo et al., 'Benchmarking and Dissecting the Nvidia "
                "Hopper GPU Architecture', 2024), rounded")
LATENCY_CYCLES = {"registers": 1, "shared": 30, "l1": 40, "l2": 260, "hbm": 480, "pcie": 2000,
                   "fma": 4}  # a dependent FP32 FMA
L2_OVER_HBM = 2.5  # L2 serves roughly 2-3x the HBM bandwidth (microbenchmarks); an estimate


# --------------------------------------------------------------------------------------------
# Placeholders: {{...}} -> (text, source)
# --------------------------------------------------------------------------------------------
_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
_DATASHEET = {row.name: row for row in DATASHEET}
# Per-SM facts are keyed by compute capability, not family name: A100 (8.0) and A10G (8.6) are both
# "Ampere" but their SMs differ (64 against 128 FP32 lanes), and 8.6 has no facts here.
_ARCH_OF = {"9.0": "Hopper", "8.0": "Ampere", "8.9": "Ada Lovelace"}


def _fmt(x) -> str:
    """Numbers as a person writes them: 132, 3.35, 989.4, 1.555 (no trailing zeros)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if float(x).is_integer():
        return f"{int(x):,d}" if abs(x) >= 10000 else f"{int(x):d}"
    return f"{x:g}"


def _fmt_measured(x: float) -> str:
    """A measured rate to three significant figures (686, 64.7, 4.24)."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def arch_for(sheet: Datasheet) -> Optional[ArchFacts]:
    return ARCH.get(_ARCH_OF.get(sheet.compute_capability, ""))


def boost_clock_ghz(sheet: Datasheet) -> Optional[float]:
    """The clock implied by the FP32 rate: TFLOP/s = SMs x FP32 lanes x 2 FLOP x GHz / 1000."""
    arch = arch_for(sheet)
    if arch is None:
        return None
    return sheet.fp32_tflops * 1e3 / (sheet.sm_count * arch.fp32_lanes_per_sm * 2)


def _derived(sheet: Datasheet) -> dict:
    d = {
        "ridge_fp32": round(sheet.fp32_tflops / sheet.bandwidth_tbps),
        "ridge_bf16": round(sheet.bf16_tflops / sheet.bandwidth_tbps) if sheet.bf16_tflops else None,
        "ridge_fp8": round(sheet.fp8_tflops / sheet.bandwidth_tbps) if sheet.fp8_tflops else None,
        "bf16_over_fp32": round(sheet.bf16_tflops / sheet.fp32_tflops) if sheet.bf16_tflops else None,
        "fp8_over_bf16": round(sheet.fp8_tflops / sheet.bf16_tflops) if sheet.fp8_tflops and sheet.bf16_tflops
        else None,
        "bf16_sparse_tflops": round(2 * sheet.bf16_tflops, 1) if sheet.bf16_tflops else None,
        "memory_read_ms": round(sheet.memory_gb / (sheet.bandwidth_tbps * 1e3) * 1e3, 1),
    }
    clock = boost_clock_ghz(sheet)
    if clock:
        d["clock_ghz"] = round(clock, 2)
        arch = arch_for(sheet)
        d["fp32_lanes"] = sheet.sm_count * arch.fp32_lanes_per_sm
        d["tensor_cores"] = sheet.sm_count * arch.tensor_cores_per_sm
        d["max_resident_threads"] = sheet.sm_count * arch.max_threads_per_sm
        d["max_resident_warps"] = sheet.sm_count * arch.max_warps_per_sm
    return d


def _recorded(key: str) -> Optional[dict]:
    path = RECORDED_DIR / key / "ceilings.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def resolve(name: str) -> Optional[tuple[str, str]]:
    """A placeholder's (text, source), or None if it names nothing known."""
    if name.startswith("recorded:"):
        key, _, path = name[len("recorded:"):].partition(".")
        data = _recorded(key)
        if data is None or not path:
            return None
        value = data
        for part in path.split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        if not isinstance(value, (int, float)):
            return None
        versions = data.get("versions", {})
        source = (f"recorded run of this app: calibration on an {data.get('gpu', key)}, "
                  f"{str(data.get('date', ''))[:10]}, torch {versions.get('torch', '?')}")
        return _fmt_measured(value), source
    head, dot, attr = name.rpartition(".")
    if dot and head in _DATASHEET:
        sheet = _DATASHEET[head]
        names = {f.name for f in fields(Datasheet)}
        if attr in names:
            value = getattr(sheet, attr)
        else:
            value = _derived(sheet).get(attr)
        if value is None:
            return None
        return _fmt(value), f"{sheet.name}: {sheet.source}" + (" (derived)" if attr not in names else "")
    if dot and head in ARCH:
        arch = ARCH[head]
        value = getattr(arch, attr, None)
        if value is None or attr == "source":
            return None
        return _fmt(value), f"{arch.name}: {arch.source}"
    if name in FACTS:
        fact = FACTS[name]
        return _fmt(fact.value), fact.source
    if name.startswith("latency.") and name[len("latency."):] in LATENCY_CYCLES:  # {{latency.hbm}}: cycles
        return _fmt(LATENCY_CYCLES[name[len("latency."):]]), LATENCY_SOURCE
    return None


def render_numbers(text: str) -> tuple[str, list[str], list[str]]:
    """Fill every {{placeholder}}: (text, sources used, unresolved names). Unresolved ones stay visible."""
    sources, missing = [], []

    def sub(m: re.Match) -> str:
        found = resolve(m.group(1))
        if found is None:
            missing.append(m.group(1))
            return m.group(0)
        if found[1] not in sources:
            sources.append(found[1])
        return found[0]

    return _PLACEHOLDER.sub(sub, text), sources, missing

