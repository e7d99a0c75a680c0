"""
The matmul ladder's measurement: every rung checked against float64, then timed beside cuBLAS
=============================================================================================

cuBLAS first (every other rung is a share of it), then the CUDA C++ kernels (each checked first on odd shapes that
make every edge block partial, and the warp-tiled one also on its 16-byte load path), the Triton kernel of the
matmul lab (checked by that lab's probe), each on a sample of the real product, then timed.
"""

from __future__ import annotations

import torch

from labs.engine import cuda, timing
from labs.engine.gpu import Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.matmul import Params as MatmulParams
from labs.matmul.configs import DEFAULT_CONFIGS, dtype_support, load_path
from labs.matmul.kernels import cublas_matmul, operands, out_dtype, triton_matmul
from labs.matmul.measure import check_sampled, probe_check, reference
from labs.matmul.model import bytes_needed
from labs.matmul_ladder.kernels import cuda_matmul, extension
from labs.matmul_ladder.model import kernels, requested_bytes


def check(params, target: Target) -> None:
    support = dtype_support(target)
    for dtype in params.dtypes:
        if support.get(dtype):
            raise ParamError(support[dtype])
    free = free_memory_bytes() if target.live else target.memory_bytes
    for dtype in params.dtypes:
        # A, B, B transposed (cuBLAS and Triton read B in their preferred layout), C, L2 flush buffer
        need = bytes_needed(params.n, dtype) + params.n**2 * timing.element_bytes(dtype)
        if need > 0.9 * free:
            raise ParamError(f"N = {params.n} in {dtype} needs {need / 1e9:.1f} GB; this GPU has {free / 1e9:.1f} GB "
                             f"free. Choose a smaller n.")



PROBE = (333, 347, 351)  # odd sizes: every edge block is partial


# Rows of K and N elements that are multiples of 8 start on 16-byte boundaries: the warp-tiled kernel then
# takes its 128-bit load path (M odd and no side a multiple of the 128 x 128 tile: the edges are partial).
VECTOR_PROBE = (197, 264, 136)


def _check_cuda_kernel(kernel: str, dtype: str, shape: tuple = PROBE, min_blocks: int = 0) -> float:
    m, n, k = shape
    a, b = timing.random_tensor((m, k), dtype), timing.random_tensor((k, n), dtype)
    out = torch.full((m, n), float("nan"), device=a.device, dtype=a.dtype)
    cuda_matmul(kernel, a, b, out, min_blocks)
    # FP32 arithmetic: fp32 tolerance for fp32/tf32 storage, the 16-bit output rounding otherwise
    err = timing.check_close(out, reference(a, b), "fp32" if dtype in ("fp32", "tf32") else dtype,
                            f"{kernel} CUDA matmul ({dtype}, {m}x{n}x{k})")
    if kernel == "warptiled" and shape == PROBE:  # the odd probe took the scalar path: check the vector one
        err = max(err, _check_cuda_kernel(kernel, dtype, VECTOR_PROBE, min_blocks))
    return err


def measure(params, target: Target, progress):
    n = params.n
    names = kernels(params)
    total = len(params.dtypes) * len(names)
    done = 0
    no_cuda = cuda.why_unavailable()
    if not no_cuda:
        progress(0.0, "building the CUDA C++ kernels (about a minute the first time, cached afterwards)")
        extension()
    for dtype in params.dtypes:
        config = DEFAULT_CONFIGS[dtype]
        a, b_kmajor = operands(n, n, n, dtype)  # B in the layout cuBLAS and Triton prefer
        b = b_kmajor.contiguous()  # the same values, row-major, for the CUDA C++ kernels
        out = torch.empty((n, n), device=a.device, dtype=out_dtype(dtype))
        cublas_tflops = None
        for kernel in ["cublas"] + [k for k in names if k != "cublas"]:  # cuBLAS first: the others are % of it
            progress(done / total, f"{dtype}, N = {n}: {kernel}")
            done += 1
            row = {"dtype": dtype, "kernel": kernel, "n": n}
            if kernel == "cublas":
                with timing.tf32(dtype == "tf32"):
                    c = cublas_matmul(a, b_kmajor, dtype, out.fill_(float("nan")))
                    err = check_sampled(c, a, b_kmajor, dtype, f"cuBLAS ({dtype}, N={n})")
                    ms = timing.time_ms(lambda: cublas_matmul(a, b_kmajor, dtype, out), 10, 50)
            elif kernel == "triton":
                params_like = MatmulParams(dtypes=(dtype,), sizes=(n,), kernels=("triton",))
                kind = "tma" if load_path(n, dtype, target.compute_capability) == "tma" else "ptr"
                probe_check(dtype, params_like, kind)
                out.fill_(float("nan"))
                _, path, _ = triton_matmul(a, b_kmajor, dtype, out, config)
                err = check_sampled(out, a, b_kmajor, dtype, f"Triton ({dtype}, N={n})")
                ms = timing.time_ms(lambda: triton_matmul(a, b_kmajor, dtype, out, config), 10, 50)
                row["path"] = path
            else:
                if no_cuda:
                    row["note"] = no_cuda
                    yield row
                    continue
                _check_cuda_kernel(kernel, dtype)
                out.fill_(float("nan"))
                cuda_matmul(kernel, a, b, out)
                err = check_sampled(out, a, b, "fp32" if dtype in ("fp32", "tf32") else dtype,
                                           f"{kernel} ({dtype}, N={n})")
                ms = timing.time_ms(lambda: cuda_matmul(kernel, a, b, out), 10, 50)
            tflops = timing.tflops(2.0 * n**3, ms)
            if kernel == "cublas":
                cublas_tflops = tflops
            row.update({"measured_ms": ms, "measured_tflops": tflops, "check_rel_error": err})
            req = requested_bytes(kernel, n, dtype)
            if req == req:
                row["measured_request_tbps"] = timing.tbps(req, ms)
            if cublas_tflops:
                row["measured_pct_of_cublas"] = 100.0 * tflops / cublas_tflops
            yield row
        del a, b, b_kmajor, out
    progress(1.0, "done")
