"""The roofline's napkin math: attainable FLOP/s = min(peak FLOP/s, intensity x bandwidth).

Pure arithmetic on the parameters and the GPU's ceilings (labs.engine.gpu.Target): it never touches the
GPU and launches no kernel.
Each element costs one read and one write; F FLOPs on it give an intensity of F / bytes. Below the ridge
(peak / bandwidth) the time is bytes / bandwidth; above it, FLOPs / peak.
"""

from __future__ import annotations

import math

from labs.engine import timing
from labs.engine.gpu import MiB, Target


def bytes_per_element(dtype: str) -> int:
    """One read and one write of the element."""
    return 2 * timing.element_bytes(dtype)


def intensity(dtype: str, flops: int) -> float:
    """FLOPs per byte moved to and from device memory: F / 8 for fp32, F / 4 for bf16 and fp16."""
    return flops / bytes_per_element(dtype)


def attainable_tflops(intensity_flop_per_byte: float, target: Target) -> float:
    """The roofline: min(compute roof, intensity x bandwidth). TB/s x FLOP/byte = TFLOP/s."""
    return min(target.ceilings.fma_tflops, intensity_flop_per_byte * target.ceilings.copy_tbps)


def roof_curve(target: Target, lo: float = 1 / 32, hi: float = 4096, points: int = 200) -> list[dict]:
    """Points along the roof for drawing it (log-spaced intensities, and the ridge itself)."""
    step = (math.log(hi) - math.log(lo)) / (points - 1)
    xs = [math.exp(math.log(lo) + i * step) for i in range(points)] + [target.ridge_flop_per_byte]
    return [{"intensity_flop_per_byte": x, "tflops": attainable_tflops(x, target)} for x in sorted(xs)]


def elements(params, dtype: str) -> int:
    """Elements in the input buffer of params.size_mib MiB."""
    return params.size_mib * MiB // timing.element_bytes(dtype)


def predict(params, target: Target) -> list[dict]:
    """One row per (dtype, F): the roof's rate, the time it implies, and which roof bounds the point."""
    rows = []
    for dtype in params.dtypes:
        n = elements(params, dtype)
        for flops in params.flops_per_element:
            i = intensity(dtype, flops)
            rate = attainable_tflops(i, target)
            memory_ms = n * bytes_per_element(dtype) / (target.ceilings.copy_tbps * 1e12) * 1e3  # bytes / bandwidth
            compute_ms = n * flops / (target.ceilings.fma_tflops * 1e12) * 1e3  # FLOPs / peak
            rows.append({
                "dtype": dtype, "flops_per_element": flops, "intensity_flop_per_byte": i,
                "bound": "memory" if i < target.ridge_flop_per_byte else "compute",
                "distance_from_ridge": i / target.ridge_flop_per_byte,
                "predicted_tflops": rate, "predicted_ms": max(memory_ms, compute_ms),
                "predicted_tbps": rate / i,
            })
    return rows


def lesson_numbers(target: Target) -> dict:
    """The {{placeholders}} of content/labs/roofline.md for this GPU."""
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
