"""The memory hierarchy's napkin math: one bandwidth per level, the level picked by the buffer's size (L2 when it
fits, else HBM), and a fixed cost per pass (a round trip inside one kernel, a launch for one kernel per pass).

The HBM bandwidth is the GPU's calibrated ceiling; the L2 plateau and the fixed costs are this lab's own
measurement (this machine's last run, else a committed recording). Pure: it never touches the GPU and
launches no kernel.
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

from labs.engine.gpu import MiB, Target
from labs.glossary.facts import L2_OVER_HBM

KiB = 1024
VARIANTS = {"loop": "passes inside one kernel", "launches": "one kernel launch per pass"}


@dataclass(frozen=True)
class Levels:
    """What the model needs besides the L2 size: each level's bandwidth and the fixed cost of a pass."""

    hbm_tbps: float  # the calibrated copy bandwidth (the GPU's ceilings)
    l2_tbps: Optional[float]  # the L2 plateau measured by this lab (None: never measured for this GPU)
    latency_us: Optional[float]  # shortest pass inside one kernel: the round trip no pass can beat
    launch_us: Optional[float]  # shortest pass as its own launch: what a launch costs
    source: str  # where l2_tbps, latency_us and launch_us came from


def sizes(params) -> list[int]:
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


def predict(params, target: Target) -> list[dict]:
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



def l2_tbps(target: Target) -> tuple:
    """(L2 bandwidth, where it comes from): this lab's measured plateau for this GPU, else the published
    estimate of ~2.5x the DRAM bandwidth (the coalescing lab's transposes read it here)."""
    lv = levels(target)
    if lv.l2_tbps:
        return lv.l2_tbps, f"L2 {lv.l2_tbps:.1f} TB/s ({lv.source})"
    est = L2_OVER_HBM * target.ceilings.copy_tbps
    return est, f"L2 ~{est:.1f} TB/s (estimate: {L2_OVER_HBM}x DRAM; run the Memory hierarchy lab to measure it)"

def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


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
