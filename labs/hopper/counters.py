"""How Nsight Compute counts this lab: cuBLAS and each step's kernel at one size, for the share of the SMs' cycles the
tensor pipe was busy, the clock they ran at, and the bytes the L2 fetched from DRAM (the counter spec the engine
asks for).

What the counts show: the steps climb towards cuBLAS in the busy share of the cycles (the pipeline, the TMA and
warp specialization each leave the tensor cores waiting less), while the busy cycles themselves stay what the FLOPs
need at 4,096 a clock. Near the top the clock falls as the tensor pipe gets busier (the power cap), so each idle
cycle shed buys less time.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the launch to
count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import torch

from labs.engine.counters import Adapter, tensor_pipe_share
from labs.hopper.model import BEST_STEP

CUBLAS = "cuBLAS"


def _runs_here(step: str) -> bool:
    """The Gluon step is counted where it runs (a Hopper GPU and a Triton with Gluon); the others run anywhere."""
    from labs.hopper.measure import WS_STEP, gluon_step_note
    from labs.hopper.gluon_support import device_capability

    if step != WS_STEP:
        return True
    return torch.cuda.is_available() and not gluon_step_note(device_capability(torch.device("cuda")))


def points(params) -> list[dict]:
    """cuBLAS and the chosen steps at N = 4096 (or the first size); not the best-configuration step, whose kernel is
    chosen by timing the candidates."""
    n = 4096 if 4096 in params.sizes else params.sizes[0]
    steps = [s for s in params.steps if s != BEST_STEP and _runs_here(s)]
    return [{"step": step, "n": n} for step in (CUBLAS, *steps)]


def prepare(params, point):
    from labs.engine.params import ParamError
    from labs.hopper.kernels import prepare as prepare_step
    from labs.hopper.measure import usable_configs
    from labs.matmul.kernels import cublas_matmul, operands

    n, dtype = point["n"], params.dtype
    a, b = operands(n, n, n, dtype, kmajor_b=False)
    out = torch.empty((n, n), device=a.device, dtype=a.dtype)
    if point["step"] == CUBLAS:
        return lambda: cublas_matmul(a, b, dtype, out)
    usable, notes = usable_configs(point["step"], dtype)  # compiled and checked against float64 first
    if not usable:
        raise ParamError(f"step {point['step']!r} does not run here: {'; '.join(notes)}")
    return prepare_step(a, b, out, usable[0])


def model(params, point, predicted, target) -> dict:
    """Tensor-pipe share: the model's TFLOP/s (for cuBLAS its measured rate) over the datasheet's dense peak. DRAM
    bytes: the tile model's (model.dram_bytes); for cuBLAS, whose tiles the lab does not model, each matrix moved once,
    the lower bound. One kernel a point."""
    from labs.engine import timing

    n = point["n"]
    once = 3 * n * n * timing.element_bytes(params.dtype)  # A and B read, C written (the output keeps the dtype)
    return {"tensor_pipe_pct": tensor_pipe_share(predicted.get("predicted_tflops"), target, params.dtype), "kernels": 1,
            "dram_bytes": once if point["step"] == CUBLAS else predicted.get("predicted_dram_bytes")}


COUNTERS = Adapter(("dram", "pipes"), points, prepare, model,
                   ("tensor_pipe_pct", "sm_clock_mhz", "dram_bytes", "kernels"))
