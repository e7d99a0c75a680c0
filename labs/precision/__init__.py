"""
Lower precision: fewer bytes per number is more numbers per second
==================================================================

What you will learn:
- a memory-bound kernel's time is its bytes over the bandwidth, so halving the bytes per element
  (fp32 -> bf16 or fp16) halves the time, and fp8 halves it again;
- tensor cores turn lower precision into more matmul FLOP/s as well (the calibration's rates);
- mixed precision: 16-bit inputs are fine, but the running sum of a long dot product must be kept
  in fp32, or rounding errors pile up with every addition.

Three experiments:
1. elementwise: ReLU over the same N elements stored in fp32, bf16, fp16 and fp8 (e4m3); the model
   is time = bytes / copy bandwidth, with 1 FLOP per element, so bytes per FLOP = 2 x element size;
2. matmul by dtype: the rates the calibration measured with cuBLAS (no kernel run here);
3. accumulation: M dot products of length K of bf16 vectors, summed one term at a time in an fp32
   or a bf16 accumulator, compared with float64. Model: every addition rounds the running sum to
   the accumulator's precision, a random walk whose error grows like sqrt(K).

kernels.py holds the two Triton kernels, model.py the napkin math, measure.py the checks and timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.lab import Headline, Lab
from labs.engine.params import param
from labs.precision.measure import check, measure
from labs.precision.model import ACCUMULATORS, DEFAULT_ELEMENTS_M, ELEMENTWISE_DTYPES, lesson_numbers, predict


@dataclass(frozen=True)
class Params:
    dtypes: tuple = param(ELEMENTWISE_DTYPES, "storage dtypes of the ReLU", choices=ELEMENTWISE_DTYPES)
    elements_m: int = param(DEFAULT_ELEMENTS_M, "elements of the ReLU (the same count in every dtype)",
                            unit="million", min=1, max=4096)
    accumulators: tuple = param(("fp32", "bf16"), "accumulator precisions of the dot products",
                                choices=ACCUMULATORS)
    dot_lengths: tuple = param((256, 1024, 4096, 16384), "terms per dot product (K)", unit="terms", min=1,
                               max=65536)
    dot_count: int = param(4096, "dot products per length (M), for a steady error estimate", min=16, max=65536)


LAB = Lab(
    name="precision",
    title="Lower precision",
    summary="The same ReLU in fp32, bf16, fp16 and fp8: half the bytes, half the time. Matmul rates by dtype, "
            "and why long sums are kept in fp32.",
    terms=("fp32", "bf16", "fp16", "fp8", "mixed-precision", "accumulation", "tensor-core", "memory-bound",
           "memory-bandwidth", "quantization", "tf32"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("experiment", "dtype", "k"),
    metric="ms",
    order=30,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("How long will ReLU over 256 million bf16 elements take?", "ms",
                      {"experiment": "relu", "dtype": "bf16"}, "ms"),
)
