"""
The memory hierarchy: how fast you can read depends on where the data lives
===========================================================================

What you will learn:
- the levels between the SMs and DRAM: registers and shared memory/L1 in each SM, one L2 shared by
  the whole chip, and HBM off the chip, each bigger and slower than the one before;
- how to see the L2 from outside: read the same buffer over and over; while it fits in the L2
  every pass after the first is served from there, and past the L2 size bandwidth falls to HBM's;
- what else limits small buffers: a pass over 256 KiB is over before the memory system is busy
  (latency: too few bytes in flight), and as one kernel launch per pass the launch costs more
  than the reading.

The experiment: a read-only kernel sums a buffer of W bytes. Its loads skip the L1 (`.cg`), so a
repeat read is served by the L2 or by HBM. Two ways to repeat:
- "loop": one kernel reads the buffer `passes` times; only the first pass starts from a cold L2
  (the timer flushes it before each call), the later ones find the buffer in the L2 if it fits;
- "launches": one kernel launch per pass, many launches replayed as one CUDA graph.
W sweeps from 256 KiB to 4 GiB, several points per octave, so the knee near the L2 size is sharp.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine import gpu as gpu_mod
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

KiB = 1024
VARIANTS = {"loop": "passes inside one kernel", "launches": "one kernel launch per pass"}


# ---------------------------------------------------------------------------------------------
# The kernel: sum a buffer `passes` times, every load straight from the L2 (or HBM behind it)
# ---------------------------------------------------------------------------------------------
@triton.jit
def read_passes_kernel(x_ptr, out_ptr, n, passes, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _p in range(passes):  # the same chunks each pass: the L2 holds them if the buffer fits
        for start in range(pid * BLOCK * UNROLL, n, nprog * BLOCK * UNROLL):  # grid-stride over the buffer
            for u in tl.static_range(UNROLL):  # UNROLL independent loads in flight per thread
                offs = start + u * BLOCK + tl.arange(0, BLOCK)
                # .cg: cache in the L2 only, so a repeat read cannot be served by this SM's L1
                acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)  # one partial sum per lane keeps the loads alive


BLOCK, UNROLL, NUM_WARPS = 2048, 4, 8  # 8 floats x 4 loads = 128 bytes in flight per thread
PROGRAMS_PER_SM = 4  # 1024 threads per SM: ~128 KiB in flight per SM, plenty for L2 and HBM latency


def programs(n: int, sm_count: int) -> int:
    return max(1, min(triton.cdiv(n, BLOCK * UNROLL), sm_count * PROGRAMS_PER_SM))


def read_passes(x: torch.Tensor, passes: int, out: torch.Tensor | None = None, sm_count: int | None = None):
    """Per-lane partial sums of `passes` reads of x, shape (programs, BLOCK)."""
    sm_count = sm_count or _sm_count(x.device)
    grid = programs(x.numel(), sm_count)
    out = torch.empty((grid, BLOCK), device=x.device, dtype=torch.float32) if out is None else out
    read_passes_kernel[(grid,)](x, out, x.numel(), passes, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=NUM_WARPS)
    return out


def _sm_count(device) -> int:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the CPU interpreter: a few programs, so the grid-stride loop is exercised


# ---------------------------------------------------------------------------------------------
# The reference (float64)
# ---------------------------------------------------------------------------------------------
def reference(x: torch.Tensor, passes: int, grid: int) -> torch.Tensor:
    """Program p, lane j sums x[(p + k * grid) * BLOCK * UNROLL + u * BLOCK + j] over k and u, times passes."""
    chunk = BLOCK * UNROLL
    k = -(-x.numel() // (grid * chunk))
    padded = torch.zeros(k * grid * chunk, dtype=torch.float64, device=x.device)
    padded[: x.numel()] = x.to(torch.float64)
    return passes * padded.reshape(k, grid, UNROLL, BLOCK).sum(dim=(0, 2))


# ---------------------------------------------------------------------------------------------
# The model: one bandwidth per level, the level picked by the buffer size
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    min_kib: int = param(256, "smallest buffer", unit="KiB", min=4, max=1048576)
    max_mib: int = param(4096, "largest buffer (4 GiB: far beyond any L2)", unit="MiB", min=1, max=4096)
    points_per_octave: int = param(3, "buffer sizes per doubling", min=1, max=8)
    variants: tuple = param(("loop", "launches"), "how the passes are repeated: inside one kernel or one "
                            "launch each", choices=tuple(VARIANTS))


@dataclass(frozen=True)
class Levels:
    """What the model needs besides the L2 size: each level's bandwidth and the fixed cost of a pass."""

    hbm_tbps: float  # the calibrated copy bandwidth (the GPU's ceilings)
    l2_tbps: Optional[float]  # the L2 plateau measured by this lab (None: never measured for this GPU)
    latency_us: Optional[float]  # shortest pass inside one kernel: the round trip no pass can beat
    launch_us: Optional[float]  # shortest pass as its own launch: what a launch costs
    source: str  # where l2_tbps, latency_us and launch_us came from


def sizes(params: Params) -> list[int]:
    """Buffer sizes in bytes: geometric from min_kib to max_mib, rounded to 4 KiB."""
    lo, hi = params.min_kib * KiB, params.max_mib * MiB
    if hi < lo:
        return [lo]
    steps = int(math.floor(params.points_per_octave * math.log2(hi / lo) + 1e-9))
    out = sorted({int(round(lo * 2 ** (i / params.points_per_octave) / 4096)) * 4096 for i in range(steps + 1)})
    return out


def passes_for(size_bytes: int) -> int:
    """Passes per timed call: about 2 GiB read per call, so the one cold pass is a small share."""
    return max(1, round(2 * 2**30 / size_bytes))


def launches_for(size_bytes: int) -> int:
    """Launches per CUDA graph: enough to make the cold first one negligible, at most 64."""
    return max(1, min(64, round(2 * 2**30 / size_bytes)))


def level_tbps(size_bytes: int, target: Target, levels: Levels) -> Optional[float]:
    return levels.l2_tbps if size_bytes <= target.l2_bytes else levels.hbm_tbps


def predict(params: Params, target: Target) -> list[dict]:
    lv = levels(target)
    rows = []
    for variant in params.variants:
        for w in sizes(params):
            bw = level_tbps(w, target, lv)
            fixed = lv.latency_us if variant == "loop" else lv.launch_us
            row = {"variant": variant, "size_bytes": w, "level": "L2" if w <= target.l2_bytes else "HBM",
                   "predicted_tbps": None, "predicted_us_per_pass": None}
            if bw is not None:
                stream_us = w / (bw * 1e12) * 1e6
                if fixed is None:
                    us = stream_us
                elif variant == "loop":
                    us = max(stream_us, fixed)  # a pass can end no sooner than one round trip
                else:
                    us = stream_us + fixed  # launches run one after the other: the gap adds up
                row["predicted_us_per_pass"] = us
                row["predicted_tbps"] = w / (us * 1e-6) / 1e12
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Level figures: measured by this lab, cached per GPU kind, or read from a committed recording
# ---------------------------------------------------------------------------------------------
def levels_cache_path(gpu_key: str) -> Path:
    base = os.environ.get("ROOFLINE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "roofline")
    return Path(base) / "hierarchy" / f"{gpu_key}.json"


def levels_from_rows(rows: list[dict], l2_bytes: int) -> dict:
    """The plateau and the fixed costs, read off measured rows.

    l2_tbps: median bandwidth of the 'loop' rows between L2/16 and L2/2 (inside the L2, past the
    latency-bound small end); latency_us / launch_us: the shortest measured pass of each variant.
    """
    loop = [r for r in rows if r.get("variant") == "loop" and _num(r.get("measured_tbps"))]
    launches = [r for r in rows if r.get("variant") == "launches" and _num(r.get("measured_us_per_pass"))]
    plateau = [r["measured_tbps"] for r in loop if l2_bytes / 16 <= r["size_bytes"] <= l2_bytes / 2]
    out = {"l2_tbps": statistics.median(plateau) if plateau else None,
           "latency_us": min((r["measured_us_per_pass"] for r in loop), default=None),
           "launch_us": min((r["measured_us_per_pass"] for r in launches), default=None)}
    return out


def save_levels(gpu_key: str, figures: dict) -> Path:
    path = levels_cache_path(gpu_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    path.write_text(json.dumps({**figures, "date": stamp}, indent=1) + "\n")
    return path


def levels(target: Target) -> Levels:
    """Level figures for `target`: this machine's last run, else a committed recording, else unknown."""
    hbm = target.ceilings.copy_tbps
    path = levels_cache_path(target.key)
    if path.exists():
        try:
            data = json.loads(path.read_text())
            return Levels(hbm, data.get("l2_tbps"), data.get("latency_us"), data.get("launch_us"),
                          f"measured by this lab on this machine ({str(data.get('date', ''))[:10]})")
        except (OSError, ValueError):
            pass
    from labs.engine.results import list_recorded

    for result in list_recorded("hierarchy"):
        if result.meta.get("gpu", {}).get("key") == target.key:
            fig = levels_from_rows(result.rows, target.l2_bytes)
            if fig["l2_tbps"] is not None:
                return Levels(hbm, fig["l2_tbps"], fig["latency_us"], fig["launch_us"],
                              f"recorded on a {result.meta['gpu'].get('name', target.name)} "
                              f"({str(result.meta.get('date', ''))[:10]})")
    return Levels(hbm, None, None, None, "not measured on this GPU yet: only the HBM level is predicted")


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
CHECK_ELEMENTS = 1_000_003  # odd: the last chunk is partly masked


def check(params: Params, target: Target) -> None:
    need = params.max_mib * MiB
    free = free_memory_bytes() if target.live else target.memory_bytes
    if need > 0.9 * free:
        raise ParamError(f"max_mib = {params.max_mib} needs {need / 1e9:.1f} GB; this GPU has {free / 1e9:.1f} GB "
                         f"free. Choose max_mib <= {int(0.9 * free / MiB)}.")
    if params.min_kib * KiB > params.max_mib * MiB:
        raise ParamError(f"min_kib = {params.min_kib} KiB is larger than max_mib = {params.max_mib} MiB.")


def _check_kernel(sm_count: int) -> float:
    probe = timing.random_tensor((CHECK_ELEMENTS,), "fp32")
    worst = 0.0
    for passes in (1, 3):
        grid = programs(probe.numel(), sm_count)
        out = torch.full((grid, BLOCK), float("nan"), device=probe.device)
        read_passes(probe, passes, out, sm_count)
        worst = max(worst, timing.check_close(out, reference(probe, passes, grid), "fp32", f"read x{passes} passes"))
    return worst


def measure(params: Params, target: Target, progress):
    sm_count = target.sm_count
    ws = sizes(params)
    total = len(ws) * len(params.variants)
    progress(0.0, "checking the read kernel against float64")
    err = _check_kernel(sm_count)
    buf = timing.random_tensor((max(ws) // 4,), "fp32")  # one buffer; each size reads a prefix of it
    rows, done = [], 0
    for variant in params.variants:
        for w in ws:
            x = buf[: w // 4]
            out = torch.empty((programs(x.numel(), sm_count), BLOCK), device=buf.device)
            if variant == "loop":
                passes = passes_for(w)
                progress(done / total, f"{w / MiB:.3g} MiB, {passes} passes in one kernel")
                ms = timing.time_ms(lambda: read_passes(x, passes, out, sm_count), warmup_ms=10, rep_ms=50)
            else:
                passes = launches_for(w)
                progress(done / total, f"{w / MiB:.3g} MiB, {passes} launches in a CUDA graph")

                def replay():
                    for _ in range(passes):
                        read_passes(x, 1, out, sm_count)

                ms = timing.graph_time_ms(replay)
            us = ms * 1e3 / passes
            row = {"variant": variant, "size_bytes": w, "passes": passes, "measured_us_per_pass": us,
                   "measured_tbps": w / (us * 1e-6) / 1e12, "check_rel_error": err}
            rows.append(row)
            done += 1
            yield row
    del buf
    save_levels(target.key, levels_from_rows(rows, target.l2_bytes))
    progress(1.0, "done")


# ---------------------------------------------------------------------------------------------
# Reading the result: where is the knee, and the picture of the hierarchy
# ---------------------------------------------------------------------------------------------
def find_knee(rows: list[dict], variant: str = "loop", kind: str = "measured") -> Optional[dict]:
    """Where bandwidth falls from its plateau towards the large-buffer floor.

    The plateau is the highest point, the floor the median of the three largest buffers; the knee
    is the first size past the plateau where bandwidth drops below their geometric mean (log-log
    interpolation between the two sizes around the crossing).
    """
    pts = sorted((r["size_bytes"], r[f"{kind}_tbps"]) for r in rows
                 if r.get("variant") == variant and _num(r.get(f"{kind}_tbps")))
    if len(pts) < 5:
        return None
    i_peak = max(range(len(pts)), key=lambda i: pts[i][1])
    plateau = pts[i_peak][1]
    floor = statistics.median(t for _, t in pts[-3:])
    if plateau < 1.2 * floor or i_peak >= len(pts) - 3:
        return None  # no drop to speak of: the sweep does not reach past the cache
    mid = math.sqrt(plateau * floor)
    for (w0, t0), (w1, t1) in zip(pts[i_peak:], pts[i_peak + 1:]):
        if t1 < mid <= t0:
            f = (math.log(t0) - math.log(mid)) / (math.log(t0) - math.log(t1))
            knee = math.exp(math.log(w0) + f * (math.log(w1) - math.log(w0)))
            return {"knee_bytes": knee, "plateau_tbps": plateau, "floor_tbps": floor, "threshold_tbps": mid}
    return None


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


def lesson_numbers(target: Target) -> dict:
    lv = levels(target)
    return {
        "gpu": target.name,
        "l2_mib": f"{target.l2_bytes / MiB:.0f}",
        "l2_mb": f"{target.l2_bytes / 1e6:.0f}",
        "hbm_tbps": f"{lv.hbm_tbps:.2f}",
        "l2_tbps": f"{lv.l2_tbps:.1f} TB/s" if lv.l2_tbps else "not yet measured on this GPU",
        "l2_ratio": f"{lv.l2_tbps / lv.hbm_tbps:.1f}x HBM's" if lv.l2_tbps else "typically a few times HBM's",
        "sm_count": str(target.sm_count),
        "l2_per_sm_kib": f"{target.l2_bytes / target.sm_count / KiB:.0f}",
        "levels_source": lv.source,
    }


from labs.hierarchy.counters import COUNTERS  # noqa: E402  (how ncu counts this lab)

LAB = Lab(
    name="hierarchy",
    title="Memory hierarchy",
    summary="Read a buffer over and over while it grows from 256 KiB to 4 GiB: the L2 plateau, the fall to HBM "
            "at the L2 size, and the latency- and launch-bound small end.",
    terms=("memory-hierarchy", "registers", "shared-memory", "l1-cache", "l2-cache", "hbm", "memory-bandwidth",
           "launch-overhead", "littles-law", "cuda-graph", "sm"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("variant", "size_bytes"),
    metric="tbps",
    order=25,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What bandwidth will repeated reads of a 16 MiB buffer reach, passes inside one kernel?",
                      "TB/s", {"variant": "loop", "size_bytes": 16 * MiB}, "tbps"),
    counters=COUNTERS,
)
