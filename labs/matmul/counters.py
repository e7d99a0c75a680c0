"""How Nsight Compute counts this lab (DRAM bytes, the tensor pipe's share, occupancy and registers per thread): the counter spec the engine asks for.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import torch

from labs.engine.counters import Adapter, tensor_pipe_share


def points(params) -> list[dict]:
    n = 4096 if 4096 in params.sizes else max(params.sizes)
    kernels = [k for k in ("triton", "cublas") if k in params.kernels]
    return [{"kernel": k, "dtype": params.dtypes[0], "n": n} for k in kernels]


def prepare(params, point):
    from labs.matmul.configs import config_for
    from labs.matmul.kernels import cublas_matmul, operands, out_dtype, triton_matmul

    n, dtype = point["n"], point["dtype"]
    a, b = operands(n, n, n, dtype)
    out = torch.empty((n, n), device=a.device, dtype=out_dtype(dtype))
    if point["kernel"] == "cublas":
        return lambda: cublas_matmul(a, b, dtype, None if dtype == "fp8" else out)
    config = config_for(params, dtype)
    return lambda: triton_matmul(a, b, dtype, out, config, params.tma, params.autotune)


def model(params, point, predicted, target) -> dict:
    """The tile model's DRAM bytes (Triton's row); for cuBLAS, whose tiles the lab does not model, each
    matrix moved once. Tensor-pipe share: the model's TFLOP/s over the datasheet's dense peak."""
    from labs.engine import timing
    from labs.matmul.configs import out_bytes

    n, dtype = point["n"], point["dtype"]
    once = 2 * n * n * timing.element_bytes(dtype) + n * n * out_bytes(dtype)
    rate = predicted.get("predicted_tflops") if point["kernel"] == "triton" else None
    return {"dram_bytes": predicted.get("dram_bytes") if point["kernel"] == "triton" else once,
            "tensor_pipe_pct": tensor_pipe_share(rate, target, dtype)}


COUNTERS = Adapter(("dram", "pipes", "occupancy"), points, prepare, model,
                   ("dram_bytes", "tensor_pipe_pct", "sm_clock_mhz", "achieved_occupancy_pct", "registers_per_thread"))
