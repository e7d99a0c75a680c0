"""How Nsight Compute counts this lab (DRAM bytes, FP32 FLOPs and the FMA pipe's share for the roofline's
kernel): the counter spec the engine asks for.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import torch

from labs.engine import timing
from labs.engine.counters import Adapter
from labs.roofline.kernels import fma_chain
from labs.roofline.model import bytes_per_element, elements


def points(params) -> list[dict]:
    flops = [f for f in (1, 64, 1024) if f in params.flops_per_element] or list(params.flops_per_element[:1])
    return [{"dtype": params.dtypes[0], "flops_per_element": f} for f in flops]


def prepare(params, point):
    n = elements(params, point["dtype"])
    x = timing.random_tensor((n,), point["dtype"])
    y = torch.empty_like(x)
    return lambda: fma_chain(x, point["flops_per_element"], y)


def model(params, point, predicted, target) -> dict:
    n, flops = elements(params, point["dtype"]), point["flops_per_element"]
    instructions = n * (flops // 2 + flops % 2)  # FMAs, and one multiply when F is odd
    peak_per_s = target.ceilings.fma_tflops * 1e12 / 2  # FMA-pipe instructions per second at the FP32 ceiling
    ms = predicted.get("predicted_ms")
    return {"dram_bytes": n * bytes_per_element(point["dtype"]), "fp32_flops": n * flops,
            "fma_pipe_pct": 100.0 * instructions / (ms * 1e-3) / peak_per_s if ms else None, "kernels": 1}


COUNTERS = Adapter(("dram", "flops", "pipes"), points, prepare, model,
                   ("dram_bytes", "fp32_flops", "fma_pipe_pct", "kernels"))
