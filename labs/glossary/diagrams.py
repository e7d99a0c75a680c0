"""The data behind the glossary's two diagrams, drawn by the page with plotly: the thread hierarchy mapped onto
the hardware, and the memory hierarchy with sizes, latencies and bandwidths."""

from __future__ import annotations

from typing import Optional

from labs.glossary.facts import (_DATASHEET, _PCIE_SRC, ARCH, FACTS, L2_OVER_HBM, LATENCY_CYCLES, LATENCY_SOURCE,
                                 _fmt, arch_for, boost_clock_ghz)

# --------------------------------------------------------------------------------------------
# Diagram data (drawn by the page with plotly)
# --------------------------------------------------------------------------------------------
def thread_hierarchy(gpu: str = "H100 SXM") -> dict:
    """The CUDA thread hierarchy beside the hardware each level runs on, with this GPU's counts."""
    sheet = _DATASHEET[gpu]
    a = arch_for(sheet)
    if a is None:
        raise KeyError(f"no architecture facts for {gpu} ({sheet.arch}); known: {', '.join(ARCH)}")
    levels = [
        {"software": "Grid", "software_slug": "grid", "hardware": "GPU", "hardware_slug": "sm",
         "software_detail": "every block of one kernel launch",
         "hardware_detail": f"{sheet.sm_count} SMs, {_fmt(sheet.l2_mb)} MB L2, {_fmt(sheet.memory_gb)} GB "
                            f"{sheet.memory_type}",
         "rule": "blocks go to whichever SM has room, in no promised order"},
    ]
    if a.max_cluster_blocks:
        levels.append(
            {"software": "Cluster", "software_slug": "thread-block-cluster", "hardware": "GPC",
             "hardware_slug": "gpc",
             "software_detail": f"up to {a.max_cluster_blocks} blocks scheduled together (optional)",
             "hardware_detail": f"a group of SMs ({a.full_chip} has {a.full_chip_gpcs} GPCs)",
             "rule": "a cluster's blocks run at the same time on SMs of one GPC and can read each "
                     "other's shared memory"})
    levels += [
        {"software": "Block (CTA)", "software_slug": "thread-block", "hardware": "SM", "hardware_slug": "sm",
         "software_detail": f"up to {a.max_threads_per_block} threads sharing shared memory",
         "hardware_detail": f"{a.fp32_lanes_per_sm} FP32 lanes, {a.tensor_cores_per_sm} tensor cores, "
                            f"{a.l1_shared_per_sm_kb} KB L1/shared, {a.register_file_kb} KB registers",
         "rule": f"a block stays on one SM; up to {a.max_blocks_per_sm} blocks and "
                 f"{a.max_threads_per_sm} threads live on an SM at once"},
        {"software": "Warp", "software_slug": "warp", "hardware": "SM sub-partition",
         "hardware_slug": "warp-scheduler",
         "software_detail": f"{a.warp_size} consecutive threads of a block",
         "hardware_detail": f"1 of {a.sub_partitions_per_sm} per SM: a warp scheduler, "
                            f"{a.lanes_per_sub_partition} FP32 lanes, 1 tensor core, "
                            f"{a.register_file_kb // a.sub_partitions_per_sm} KB registers",
         "rule": f"a warp stays on one sub-partition; up to {a.warps_per_sub_partition} warps share it "
                 "and its scheduler issues one of them per clock"},
        {"software": "Thread", "software_slug": "thread", "hardware": "Lane", "hardware_slug": "cuda-core",
         "software_detail": f"its own registers (up to {a.max_registers_per_thread}) and program counter",
         "hardware_detail": "one slot of a 32-wide SIMT instruction (an FP32 unit, a CUDA core)",
         "rule": "thread i of a warp always runs in lane i"},
    ]
    return {"gpu": sheet.name, "arch": a.name, "levels": levels,
            "counts": {"sms": sheet.sm_count, "sub_partitions": sheet.sm_count * a.sub_partitions_per_sm,
                       "lanes": sheet.sm_count * a.fp32_lanes_per_sm,
                       "resident_threads": sheet.sm_count * a.max_threads_per_sm},
            "sources": [sheet.source, a.source]}





def memory_hierarchy(gpu: str = "H100 SXM") -> list[dict]:
    """Levels of the memory hierarchy, fastest first: size (per unit and whole GPU), latency, bandwidth.

    Bandwidths are whole-GPU aggregates. Registers and shared memory are computed from per-SM widths at
    the clock implied by the FP32 rate; L2 is an estimate; HBM is the datasheet figure."""
    sheet = _DATASHEET[gpu]
    a = arch_for(sheet)
    if a is None:
        raise KeyError(f"no architecture facts for {gpu} ({sheet.arch}); known: {', '.join(ARCH)}")
    ghz = boost_clock_ghz(sheet)
    sms = sheet.sm_count
    kb = 1024
    return [
        {"level": "Registers", "slug": "registers", "scope": "per thread (file per SM)",
         "unit_bytes": a.register_file_kb * kb, "total_bytes": sms * a.register_file_kb * kb,
         "latency_cycles": LATENCY_CYCLES["registers"],
         "bandwidth_tbps": sms * a.fp32_lanes_per_sm * 3 * 4 * ghz / 1e3,
         "note": "operands of one FMA per lane per clock; latency is part of the instruction",
         "sources": [a.source, "bandwidth: computed (3 operands x 4 bytes per lane per clock)"]},
        {"level": "L1 / shared memory", "slug": "shared-memory", "scope": "per SM (per block)",
         "unit_bytes": a.l1_shared_per_sm_kb * kb, "total_bytes": sms * a.l1_shared_per_sm_kb * kb,
         "latency_cycles": LATENCY_CYCLES["shared"],
         "bandwidth_tbps": sms * FACTS["smem_banks"].value * FACTS["smem_bank_bytes"].value * ghz / 1e3,
         "note": f"up to {a.max_shared_per_sm_kb} KB of it as shared memory; an L1 hit takes about "
                 f"{LATENCY_CYCLES['l1']} cycles",
         "sources": [a.source, "bandwidth: computed (32 banks x 4 bytes per SM per clock)", LATENCY_SOURCE]},
        {"level": "L2 cache", "slug": "l2-cache", "scope": "whole GPU",
         "unit_bytes": sheet.l2_mb * 1e6, "total_bytes": sheet.l2_mb * 1e6,
         "latency_cycles": LATENCY_CYCLES["l2"],
         "bandwidth_tbps": L2_OVER_HBM * sheet.bandwidth_tbps,
         "note": "bandwidth is an estimate (about 2-3x HBM in microbenchmarks)",
         "sources": [sheet.source, LATENCY_SOURCE]},
        {"level": f"{'HBM' if sheet.memory_type.startswith('HBM') else 'DRAM'} ({sheet.memory_type})", "slug": "hbm",
         "scope": "whole GPU (global memory)",
         "unit_bytes": sheet.memory_gb * 1e9, "total_bytes": sheet.memory_gb * 1e9,
         "latency_cycles": LATENCY_CYCLES["hbm"], "bandwidth_tbps": sheet.bandwidth_tbps,
         "note": "the datasheet bandwidth; a copy kernel reaches roughly 85-90 % of it",
         "sources": [sheet.source, LATENCY_SOURCE]},
        {"level": "Host memory over PCIe", "slug": "pcie", "scope": "the CPU's RAM",
         "unit_bytes": None, "total_bytes": None,
         "latency_cycles": LATENCY_CYCLES["pcie"],
         "bandwidth_tbps": FACTS["pcie5_x16_gbps"].value / 1e3 if a.name == "Hopper"
         else FACTS["pcie4_x16_gbps"].value / 1e3,
         "note": "one direction of a x16 link; latency of order a microsecond",
         "sources": [_PCIE_SRC]},
    ]


def human_bytes(n: float) -> str:
    """Bytes as datasheets write them: decimal MB and GB (34.6 MB, 80 GB); on-chip SRAM in KB of 1024."""
    if n < 1e6 and n % 1024 == 0:
        return f"{n / 1024:g} KB"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} bytes"


# Entries that show a diagram under their text.
DIAGRAMS = {
    "threads": ("thread", "warp", "thread-block", "grid", "thread-block-cluster", "sm", "gpc", "tpc",
                "warp-scheduler", "cuda-core", "simt", "kernel", "warpgroup", "thread-hierarchy",
                "cuda-programming-model", "launch-configuration", "core", "cuda-device-architecture"),
    "memory": ("memory-hierarchy", "registers", "register-file", "shared-memory", "l1-cache", "l2-cache", "hbm",
               "global-memory", "local-memory", "memory-bandwidth"),
}


def diagram_for(slug: str) -> Optional[str]:
    """'threads', 'memory' or None: which diagram belongs under this entry."""
    for name, slugs in DIAGRAMS.items():
        if slug in slugs:
            return name
    return None

