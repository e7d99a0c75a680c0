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

This is the template lab: copy the package to start a new one.
- kernels.py  the Triton kernel and its launcher (read it first, like a Triton tutorial);
- model.py    predict(): the napkin math, pure arithmetic on Params and the GPU's ceilings;
- measure.py  measure(): check against float64, then time with labs.engine.timing; check(): refuse early;
- counters.py how Nsight Compute counts the kernel (the engine asks for it through LAB.counters);
- this file   the contract: Params and the LAB the engine registers.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.lab import Headline, Lab
from labs.engine.params import param
from labs.roofline.counters import COUNTERS
from labs.roofline.kernels import fma_chain  # noqa: F401  (the workbench's roofline exercise runs it)
from labs.roofline.measure import check, measure
from labs.roofline.model import lesson_numbers, predict


@dataclass(frozen=True)
class Params:
    dtypes: tuple = param(("fp32", "bf16"), "storage dtypes (arithmetic is FP32 in registers)",
                          choices=("fp32", "bf16", "fp16"))
    flops_per_element: tuple = param(tuple(2**k for k in range(14)), "FLOPs per element (1 = one multiply; "
                                     "2 per FMA)", unit="FLOP", min=1, max=65536)
    size_mib: int = param(1024, "input buffer size (the output is as large)", unit="MiB", min=1, max=65536)


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
