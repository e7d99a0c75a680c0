"""The picture of the hierarchy for the page: each level's size and bandwidth, each figure with its source
(the attached device where there is one, else the compute-capability table and the datasheet)."""

from __future__ import annotations

from typing import Optional

from labs.engine import gpu as gpu_mod
from labs.engine.gpu import Target
from labs.hierarchy.model import KiB, levels, levels_from_rows


def hierarchy_levels(target: Target, rows: Optional[list] = None, rows_label: str = "measured in this run") -> list[dict]:
    """The four levels with their sizes and bandwidths for the diagram, each figure with its source.

    Registers and shared memory/L1 come from the attached device (or the compute-capability table),
    the L2 size from the device or datasheet, the L2 bandwidth from this lab's measurement (rows, else
    the level figures), HBM from the calibration and the datasheet.
    """
    info = gpu_mod.detect() if target.live else None
    shape = gpu_mod.SM_SHAPES.get(gpu_mod.compute_capability_tuple(target.compute_capability))
    regs, smem_kib, l1_kib = (shape.registers, shape.smem_per_sm_kib, shape.l1_smem_kib) if shape else (None, None, None)
    smem = smem_kib * KiB if smem_kib else None
    per_sm_source = f"compute capability {target.compute_capability} table"
    if info is not None and info.available:
        regs = info.registers_per_sm or regs
        smem = info.shared_memory_per_sm_bytes or smem
        per_sm_source = "reported by the device"
    lv = levels(target)
    l2_tbps, l2_source = lv.l2_tbps, lv.source
    if rows:
        fig = levels_from_rows(rows, target.l2_bytes)
        if fig["l2_tbps"] is not None:
            l2_tbps, l2_source = fig["l2_tbps"], rows_label
    smem_tbps, smem_source = None, "not measured"
    if info is not None and info.available and info.sm_clock_mhz:
        # 32 banks x 4 bytes per clock per SM
        smem_tbps = 32 * 4 * target.sm_count * info.sm_clock_mhz * 1e6 / 1e12
        smem_source = f"32 banks x 4 B per clock x {target.sm_count} SMs x {info.sm_clock_mhz} MHz"
    sheet = target.datasheet
    c = target.ceilings
    return [
        {"level": "registers", "scope": "per SM", "size_bytes": regs * 4 if regs else None,
         "total_bytes": regs * 4 * target.sm_count if regs else None, "size_source": per_sm_source,
         "tbps": None, "tbps_source": "not measured (operands of every instruction)"},
        {"level": "shared memory / L1", "scope": "per SM", "size_bytes": smem,
         "l1_and_shared_bytes": l1_kib * KiB if l1_kib else None,
         "total_bytes": smem * target.sm_count if smem else None, "size_source": per_sm_source,
         "tbps": smem_tbps, "tbps_source": smem_source},
        {"level": "L2", "scope": "per GPU", "size_bytes": target.l2_bytes, "total_bytes": target.l2_bytes,
         "size_source": "reported by the device" if target.live else "datasheet",
         "tbps": l2_tbps, "tbps_source": l2_source},
        {"level": "HBM", "scope": "per GPU", "size_bytes": target.memory_bytes, "total_bytes": target.memory_bytes,
         "size_source": "reported by the device" if target.live else "datasheet",
         "tbps": c.copy_tbps, "tbps_source": f"copy bandwidth, {c.source}",
         "datasheet_tbps": sheet.bandwidth_tbps if sheet else None},
    ]
