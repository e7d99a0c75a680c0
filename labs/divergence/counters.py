"""How Nsight Compute counts this lab (threads per warp instruction and branch uniformity): the counter spec the engine asks for.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import torch

from labs.divergence.kernels import branches
from labs.divergence.measure import grid_input
from labs.divergence.model import FMAS_PER_TRIP, trips_for
from labs.engine.counters import Adapter


def points(params) -> list[dict]:
    ratio = 1.0 if 1.0 in params.cost_ratios else params.cost_ratios[0]
    return [{"experiment": "branches", "case": "g sweep", "cost_ratio": ratio, "g": g}
            for g in params.g if g in (1, 8, 16, 32, 64)] if "branches" in params.experiments else []


def prepare(params, point):
    ta, tb = trips_for(params, point["cost_ratio"], FMAS_PER_TRIP)
    x = grid_input(params.threads)
    y = torch.empty(params.threads, device="cuda")
    return lambda: branches(x, point["g"], ta, tb, y)


def model(params, point, predicted, target) -> dict:
    """A warp's instructions run with the lanes of the side they belong to: 32 x (useful / issued warp-trips)."""
    eff = predicted.get("predicted_branch_efficiency")
    return {"threads_per_warp_instruction": 32.0 * eff if eff is not None else None}


COUNTERS = Adapter(("dram", "branch"), points, prepare, model,
                   ("threads_per_warp_instruction", "branch_uniformity_pct"))
