"""How Nsight Compute counts this lab (DRAM reads and the L2's hit rate for buffers below, at and above the L2's size): the counter spec the engine asks for.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import torch

from labs.engine.counters import Adapter


def points(params) -> list[dict]:
    from labs import hierarchy
    from labs.engine import gpu

    l2 = (gpu.live_target() or gpu.datasheet_target(gpu.DATASHEET[0])).l2_bytes
    sizes = hierarchy.sizes(params)
    picks = [max((w for w in sizes if w <= l2 / 4), default=sizes[0]),
             min(sizes, key=lambda w: abs(w - l2)),
             min((w for w in sizes if w >= 4 * l2), default=sizes[-1])]
    variant = "loop" if "loop" in params.variants else params.variants[0]
    return [{"variant": variant, "size_bytes": w} for w in dict.fromkeys(picks)]


def prepare(params, point):
    from labs import hierarchy
    from labs.engine import timing

    w = point["size_bytes"]
    x = timing.random_tensor((w // 4,), "fp32")
    out = hierarchy.read_passes(x, 1)
    if point["variant"] == "loop":
        passes = hierarchy.passes_for(w)
        return lambda: hierarchy.read_passes(x, passes, out)
    launches = hierarchy.launches_for(w)

    def repeated():
        for _ in range(launches):
            hierarchy.read_passes(x, 1, out)
    return repeated


def model(params, point, predicted, target) -> dict:
    """One cold pass from HBM (ncu empties the caches before each kernel), then, if the buffer fits in the
    L2, every later pass hits there; if it does not, every pass goes to HBM (no reuse at all)."""
    from labs import hierarchy

    w = point["size_bytes"]
    passes = hierarchy.passes_for(w) if point["variant"] == "loop" else hierarchy.launches_for(w)
    fits = w <= target.l2_bytes
    return {"dram_read_bytes": w if fits else w * passes,
            "l2_hit_rate_pct": 100.0 * (passes - 1) / passes if fits else 0.0,
            "kernels": 1 if point["variant"] == "loop" else passes}


COUNTERS = Adapter(("dram", "l2"), points, prepare, model,
                         ("dram_read_bytes", "l2_hit_rate_pct", "kernels"))
