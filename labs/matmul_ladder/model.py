"""
The matmul ladder's model: each rung's time at one size, as a share of cuBLAS
=============================================================================

Pure arithmetic (no GPU): the CUDA-core rungs (naive, tiled, warp-tiled) from the L1 wavefronts they pay per
multiply-add and the levels the warp-tiled kernel reads from (labs/matmul/ladder_model.py, which the Matmul and
Hopper lessons quote too), the Triton rung from the matmul lab's tile model, cuBLAS at its measured rate. The two
tensor-core rungs take the rate cuBLAS reached at this very N on this GPU kind where the Matmul lab recorded one
(labs/matmul/rates.py: the calibration's N = 8192 runs under a lower, power-capped clock), else the ceiling.
"""

from __future__ import annotations

from labs.engine import timing
from labs.engine.gpu import Target
from labs.matmul.configs import DEFAULT_CONFIGS
from labs.matmul.ladder_model import lesson_numbers, predict_cuda, predict_warptile, requested_bytes  # noqa: F401
from labs.matmul.model import predict_point, roofline_tflops
from labs.matmul.rates import at_size

CUDA_DTYPES = ("fp32", "tf32", "fp16", "bf16")


def kernels(params) -> list[str]:
    """The rungs, bottom to top."""
    return ["naive"] + [f"tiled{t}" for t in params.tiles] + ["warptiled", "triton", "cublas"]


def predict(params, target: Target) -> list[dict]:
    rows = []
    n = params.n
    for dtype in params.dtypes:
        tensor_target, rate_source = at_size(target, dtype, n)  # the tensor cores' rate at this N
        cublas = roofline_tflops(n, dtype, tensor_target)
        for kernel in kernels(params):
            row = {"dtype": dtype, "kernel": kernel, "n": n,
                   "arithmetic": "CUDA cores, FP32" if kernel in ("naive", "warptiled") or kernel.startswith("tiled")
                   else ("CUDA cores, FP32" if dtype == "fp32" else "tensor cores"),
                   "requested_bytes": requested_bytes(kernel, n, dtype)}
            if kernel == "cublas":
                row.update({"predicted_tflops": cublas, "bound": "measured ceiling", "rate_source": rate_source})
                if cublas:
                    row["predicted_ms"] = 2.0 * n**3 / (cublas * 1e12) * 1e3
            elif kernel == "triton":
                p = predict_point(n, dtype, DEFAULT_CONFIGS[dtype], tensor_target)
                row.update({k: p.get(k) for k in ("predicted_ms", "predicted_tflops", "bound", "path", "config")})
            elif kernel == "warptiled":
                row.update(predict_warptile(n, dtype, target))
            else:
                row.update(predict_cuda(kernel, n, dtype, target))
            if row.get("predicted_tflops") and cublas:
                row["predicted_pct_of_cublas"] = 100.0 * row["predicted_tflops"] / cublas
            if row.get("predicted_ms") and row["requested_bytes"] == row["requested_bytes"]:
                row["predicted_request_tbps"] = timing.tbps(row["requested_bytes"], row["predicted_ms"])
            rows.append(row)
    return rows
