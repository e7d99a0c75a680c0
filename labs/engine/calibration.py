"""Measuring a GPU's ceilings: the roofs every model in Roofline stands on.

Three probes, each the simplest thing that runs at the hardware's limit:
- copy bandwidth: a large device-to-device copy (bytes read + bytes written over the time);
- FP32 FMA rate: a Triton kernel whose threads run long chains of fused multiply-adds on values
  held in registers, so memory traffic is negligible;
- matmul rates: `torch.matmul` (cuBLAS) on large square random matrices, per dtype.
"""

from __future__ import annotations

import datetime
from typing import Callable

import torch
import triton
import triton.language as tl

from labs.engine import gpu, timing
from labs.engine.gpu import Ceilings, GiB, free_memory_bytes
from labs.engine.params import ParamError


# ---------------------------------------------------------------------------------------------
# FMA probe: 2 FLOPs per step, no memory traffic to speak of
# ---------------------------------------------------------------------------------------------
@triton.jit
def fma_probe_kernel(out_ptr, a, b, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    # Four independent accumulators per thread give the scheduler independent FMAs to issue
    # while earlier ones are still in the pipeline.
    y0 = offs.to(tl.float32) * 1e-9
    y1 = y0 + 1.0
    y2 = y0 + 2.0
    y3 = y0 + 3.0
    for _ in range(STEPS // 8):
        for _u in tl.static_range(8):  # unrolled: the loop counter costs nothing per FMA
            y0 = y0 * a + b
            y1 = y1 * a + b
            y2 = y2 * a + b
            y3 = y3 * a + b
    # one store keeps the arithmetic alive (the compiler may not drop work whose result is used)
    tl.store(out_ptr + offs, y0 + y1 + y2 + y3)


def fma_rate_tflops(steps: int = 4096, programs: int = 132 * 64, block: int = 256) -> tuple[float, dict]:
    out = torch.empty(programs * block, device="cuda", dtype=torch.float32)
    chains = 4
    # a = -1, b = 0.5: y -> 0.5 - y keeps every value bounded for any number of steps, and since a
    # and b are run-time arguments the compiler must emit a real FMA for each step.
    launch = lambda: fma_probe_kernel[(programs,)](out, -1.0, 0.5, STEPS=steps, BLOCK=block, num_warps=4)
    launch()
    # an even number of steps returns each chain to its start: the sum is 4 y0 + 6
    y0 = torch.arange(out.numel(), device="cuda", dtype=torch.float64) * 1e-9
    timing.check_close(out, 4 * y0 + 6, "fp32", "FMA probe")
    ms = timing.time_ms(launch)
    flops = 2.0 * steps * chains * programs * block
    return timing.tflops(flops, ms), {"ms": ms, "flops": flops, "threads": programs * block}


def copy_bandwidth_tbps(nbytes: int) -> tuple[float, dict]:
    n = nbytes // 4
    src = torch.randn(n, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = timing.time_ms(lambda: dst.copy_(src))
    timing.check_close(dst, src, "fp32", "device copy")
    moved = 2 * src.numel() * src.element_size()
    return timing.tbps(moved, ms), {"ms": ms, "bytes_moved": moved, "buffer_bytes": src.numel() * 4}


def matmul_tflops(dtype: str, n: int) -> tuple[float, dict]:
    """cuBLAS through torch.matmul on random n x n inputs; checked against float64 first."""
    a, b = timing.random_tensor((n, n), dtype), timing.random_tensor((n, n), dtype)
    if dtype == "fp8":
        scale = torch.ones((), device="cuda")
        bt = b.t().contiguous().t()  # _scaled_mm wants the second operand column-major
        run = lambda: torch._scaled_mm(a, bt, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    else:
        run = lambda: torch.matmul(a, b)
    with timing.tf32(dtype == "tf32"):
        out = run()
        ref = a.double() @ b.double() if dtype != "fp8" else a.double() @ bt.double()
        timing.check_close(out, ref, dtype, f"{dtype} matmul")
        ms = timing.time_ms(run)
    return timing.tflops(2.0 * n**3, ms), {"ms": ms, "n": n}


def supported_matmul_dtypes() -> list[str]:
    major, minor = torch.cuda.get_device_capability()
    dtypes = ["fp32", "fp16"]
    if major >= 8:
        dtypes[1:1] = ["tf32"]
        dtypes.append("bf16")
    if (major, minor) >= (8, 9) and hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
        dtypes.append("fp8")
    return dtypes


def measure_ceilings(progress) -> Ceilings:
    free = free_memory_bytes()
    copy_bytes = int(min(1 * GiB, free / 4))  # source + destination must fit with room to spare
    progress(0.0, "copy bandwidth")
    copy, copy_info = copy_bandwidth_tbps(copy_bytes)
    progress(0.15, "FP32 FMA rate")
    fma, fma_info = fma_rate_tflops()
    dtypes = supported_matmul_dtypes()
    rates, details = {}, {"copy": copy_info, "fma": fma_info}
    for i, dtype in enumerate(dtypes):
        n = 8192 if free > 2 * GiB else 4096
        progress(0.3 + 0.7 * i / len(dtypes), f"{dtype} matmul {n}x{n}")
        rates[dtype], details[f"matmul_{dtype}"] = matmul_tflops(dtype, n)
        torch.cuda.empty_cache()
    progress(1.0, "done")
    return Ceilings(copy_tbps=copy, fma_tflops=fma, matmul_tflops=rates, details=details)


def calibrate(progress: Callable[[float, str], None] = lambda f, m: None, record: bool = False) -> Ceilings:
    """Measure this GPU's ceilings and cache them. Takes 20-60 s; needs a GPU."""
    info = gpu.detect()
    if not info.available:
        raise ParamError(info.reason)
    ceilings = measure_ceilings(progress)
    ceilings.gpu = info.name
    ceilings.date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    ceilings.versions = gpu.software_versions() | {"driver": info.driver}
    ceilings.source = "measured"
    gpu.save_ceilings(ceilings, info.key)
    if record:
        gpu.save_ceilings(ceilings, info.key, record=True)
    return ceilings
