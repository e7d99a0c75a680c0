"""
Roofline: when is a kernel limited by memory, and when by arithmetic?
=====================================================================

What you will learn:
- arithmetic intensity: the FLOPs a kernel does per byte it moves to and from device memory;
- the roofline model: attainable FLOP/s = min(peak FLOP/s, intensity x memory bandwidth);
- the ridge point, the intensity where a kernel stops waiting on memory and starts waiting on math.

The experiment: one kernel reads each element of a large buffer once, runs a chain of F
floating-point operations on it in registers, and writes one result. Bytes moved stay fixed
(one read + one write per element) while F sweeps over powers of two, so the intensity sweeps
from 1/8 FLOP/byte (fp32, F = 1) to beyond 1000, across the ridge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

UNROLL = 8  # FMAs per loop trip: the loop counter's cost is paid once per eight FMAs


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def fma_chain_kernel(x_ptr, y_ptr, n, a, b,
                     FMAS: tl.constexpr, EXTRA_MUL: tl.constexpr, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # this program's BLOCK consecutive elements
    mask = offs < n  # the last program may run past the end of the buffer
    y = tl.load(x_ptr + offs, mask=mask).to(tl.float32)  # the only read: each element once
    if EXTRA_MUL:  # an odd FLOP count starts with one multiply (1 FLOP)
        y = y * a
    for _ in range(FMAS // UNROLL):  # the FMA chain lives in registers: no memory traffic
        for _u in tl.static_range(UNROLL):
            y = y * a + b  # one fused multiply-add = 2 FLOPs
    for _r in tl.static_range(FMAS % UNROLL):
        y = y * a + b
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)  # the only write


# a = -1, b = 0.5 maps y -> 0.5 - y: values stay bounded for any chain length, the output still
# depends on the input, and because a and b arrive at run time every step is a real FMA.
A, B = -1.0, 0.5
BLOCK, NUM_WARPS = 1024, 4  # 8 elements per thread: two 16-byte fp32 loads, 8 independent chains


def fma_chain(x: torch.Tensor, flops_per_element: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = F-FLOP chain applied to every element of x (same dtype as x)."""
    out = torch.empty_like(x) if out is None else out
    fmas, extra_mul = divmod(flops_per_element, 2)
    grid = (triton.cdiv(x.numel(), BLOCK),)
    fma_chain_kernel[grid](x, out, x.numel(), A, B, FMAS=fmas, EXTRA_MUL=bool(extra_mul), BLOCK=BLOCK,
                           UNROLL=UNROLL, num_warps=NUM_WARPS)
    return out


# ---------------------------------------------------------------------------------------------
# The reference (float64, closed form)
# ---------------------------------------------------------------------------------------------
def reference(x: torch.Tensor, flops_per_element: int) -> torch.Tensor:
    """The chain in float64: after an optional y = a*x, F FMAs give y_F = a^F y_0 + b (1 - a^F) / (1 - a)."""
    fmas, extra_mul = divmod(flops_per_element, 2)
    y0 = x.to(torch.float64) * (A if extra_mul else 1.0)
    a_f = A**fmas
    return a_f * y0 + B * (1 - a_f) / (1 - A)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    dtypes: tuple = param(("fp32", "bf16"), "storage dtypes (arithmetic is FP32 in registers)",
                          choices=("fp32", "bf16", "fp16"))
    flops_per_element: tuple = param(tuple(2**k for k in range(14)), "FLOPs per element (1 = one multiply; "
                                     "2 per FMA)", unit="FLOP", min=1, max=65536)
    size_mib: int = param(1024, "input buffer size (the output is as large)", unit="MiB", min=1, max=65536)


def bytes_per_element(dtype: str) -> int:
    """One read and one write of the element."""
    return 2 * timing.element_bytes(dtype)


def intensity(dtype: str, flops: int) -> float:
    return flops / bytes_per_element(dtype)


def attainable_tflops(intensity_flop_per_byte: float, target: Target) -> float:
    """The roofline: min(compute roof, intensity x bandwidth). TB/s x FLOP/byte = TFLOP/s."""
    return min(target.ceilings.fma_tflops, intensity_flop_per_byte * target.ceilings.copy_tbps)


def roof_curve(target: Target, lo: float = 1 / 32, hi: float = 4096, points: int = 200) -> list[dict]:
    """Points along the roof for drawing it (log-spaced intensities)."""
    step = (math.log(hi) - math.log(lo)) / (points - 1)
    xs = [math.exp(math.log(lo) + i * step) for i in range(points)] + [target.ridge_flop_per_byte]
    return [{"intensity_flop_per_byte": x, "tflops": attainable_tflops(x, target)} for x in sorted(xs)]


def elements(params: Params, dtype: str) -> int:
    return params.size_mib * MiB // timing.element_bytes(dtype)


def predict(params: Params, target: Target) -> list[dict]:
    rows = []
    for dtype in params.dtypes:
        n = elements(params, dtype)
        for flops in params.flops_per_element:
            i = intensity(dtype, flops)
            rate = attainable_tflops(i, target)
            memory_ms = n * bytes_per_element(dtype) / (target.ceilings.copy_tbps * 1e12) * 1e3
            compute_ms = n * flops / (target.ceilings.fma_tflops * 1e12) * 1e3
            rows.append({
                "dtype": dtype, "flops_per_element": flops, "intensity_flop_per_byte": i,
                "bound": "memory" if i < target.ridge_flop_per_byte else "compute",
                "distance_from_ridge": i / target.ridge_flop_per_byte,
                "predicted_tflops": rate, "predicted_ms": max(memory_ms, compute_ms),
                "predicted_tbps": rate / i,
            })
    return rows


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
CHECK_ELEMENTS = 1_000_003  # an odd size: the last program is partly masked


def check(params: Params, target: Target) -> None:
    """Refuse buffers that do not fit in free GPU memory (input + output, with 10% to spare)."""
    need = 2 * params.size_mib * MiB
    free = free_memory_bytes() if target.live else target.memory_bytes
    if need > 0.9 * free:
        raise ParamError(f"size_mib = {params.size_mib} needs {need / 1e9:.1f} GB (input and output); "
                         f"this GPU has {free / 1e9:.1f} GB free. Choose size_mib <= {int(0.9 * free / 2 / MiB)}.")


def measure(params: Params, target: Target, progress):
    total = len(params.dtypes) * len(params.flops_per_element)
    done = 0
    for dtype in params.dtypes:
        n = elements(params, dtype)
        x = timing.random_tensor((n,), dtype)
        y = torch.empty_like(x)
        probe = timing.random_tensor((CHECK_ELEMENTS,), dtype)
        for flops in params.flops_per_element:
            progress(done / total, f"{dtype}, {flops} FLOP/element: checking against float64")
            out = torch.full_like(probe, float("nan"))  # poison: an element left unwritten fails the check
            fma_chain(probe, flops, out)
            err = timing.check_close(out, reference(probe, flops), dtype, f"FMA chain ({dtype}, F={flops})")
            progress(done / total, f"{dtype}, {flops} FLOP/element: timing")
            ms = timing.time_ms(lambda: fma_chain(x, flops, y))
            i = intensity(dtype, flops)
            done += 1
            yield {"dtype": dtype, "flops_per_element": flops, "intensity_flop_per_byte": i,
                   "measured_ms": ms, "measured_tflops": timing.tflops(n * flops, ms),
                   "measured_tbps": timing.tbps(n * bytes_per_element(dtype), ms), "check_rel_error": err}
        del x, y
    progress(1.0, "done")


def lesson_numbers(target: Target) -> dict:
    c = target.ceilings
    return {
        "gpu": target.name,
        "bandwidth_tbps": f"{c.copy_tbps:.2f}",
        "fma_tflops": f"{c.fma_tflops:.1f}",
        "ridge": f"{target.ridge_flop_per_byte:.1f}",
        "ridge_fp32_flops": f"{target.ridge_flop_per_byte * 8:.0f}",
        "ceilings_source": target.describe_ceilings(),
        "relu_fp32_tflops": f"{attainable_tflops(1 / 8, target):.2f}",
        "relu_fraction_pct": f"{100 * attainable_tflops(1 / 8, target) / c.fma_tflops:.1f}",
    }


from labs.roofline.counters import COUNTERS  # noqa: E402  (how ncu counts this lab)

LAB = Lab(
    name="roofline",
    title="Roofline",
    summary="Sweep arithmetic intensity from 1/8 to 1024 FLOP/byte and watch a kernel go from memory-bound "
            "to compute-bound, point by point against the roofline of your GPU.",
    terms=("roofline", "arithmetic-intensity", "memory-bound", "compute-bound", "ridge-point",
           "memory-bandwidth", "fma", "hbm", "l2-cache"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("dtype", "flops_per_element"),
    metric="tflops",
    order=10,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What TFLOP/s will the fp32 kernel reach with 1 FLOP per element (1/8 FLOP/byte)?",
                      "TFLOP/s", {"dtype": "fp32", "flops_per_element": 1}, "tflops"),
    counters=COUNTERS,
)
