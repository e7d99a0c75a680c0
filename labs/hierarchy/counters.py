"""How Nsight Compute counts this lab (DRAM reads and the L2's hit rate for buffers below, at and above the L2's size): the counter spec the engine asks for.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

from labs.engine import gpu, timing
from labs.engine.counters import Adapter
from labs.hierarchy.kernels import read_passes
from labs.hierarchy.model import launches_for, passes_for, sizes


def points(params) -> list[dict]:
    l2 = (gpu.live_target() or gpu.datasheet_target(gpu.DATASHEET[0])).l2_bytes
    ws = sizes(params)
    picks = [max((w for w in ws if w <= l2 / 4), default=ws[0]),
             min(ws, key=lambda w: abs(w - l2)),
             min((w for w in ws if w >= 4 * l2), default=ws[-1])]
    variant = "loop" if "loop" in params.variants else params.variants[0]
    return [{"variant": variant, "size_bytes": w} for w in dict.fromkeys(picks)]


def prepare(params, point):
    w = point["size_bytes"]
    x = timing.random_tensor((w // 4,), "fp32")
    out = read_passes(x, 1)
    if point["variant"] == "loop":
        passes = passes_for(w)
        return lambda: read_passes(x, passes, out)
    launches = launches_for(w)

    def repeated():
        for _ in range(launches):
            read_passes(x, 1, out)
    return repeated


def model(params, point, predicted, target) -> dict:
    """One cold pass from HBM (ncu empties the caches before each kernel), then, if the buffer fits in the
    L2, every later pass hits there; if it does not, every pass goes to HBM (no reuse at all)."""
    w = point["size_bytes"]
    passes = passes_for(w) if point["variant"] == "loop" else launches_for(w)
    fits = w <= target.l2_bytes
    return {"dram_read_bytes": w if fits else w * passes,
            "l2_hit_rate_pct": 100.0 * (passes - 1) / passes if fits else 0.0,
            "kernels": 1 if point["variant"] == "loop" else passes}


COUNTERS = Adapter(("dram", "l2"), points, prepare, model,
                   ("dram_read_bytes", "l2_hit_rate_pct", "kernels"))
