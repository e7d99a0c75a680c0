"""
The matmul ladder: from one thread per output to cuBLAS
=======================================================

What you will learn:
- the naive kernel (one thread per element of C) asks global memory for every input element N times;
- shared-memory tiling (TILE x TILE tiles copied once per step) cuts those requests to N / TILE, yet
  changes the time far less: the re-reads of the naive kernel already hit in the L1/L2 caches, and both
  kernels need two operand loads per multiply-add, each at least one pass (wavefront) of the SM's
  L1/shared-memory pipeline, which makes one pass per clock;
- warp tiling with register blocking: each thread keeps an 8 x 8 block of C in registers, so every
  value it reads from shared memory (16 bytes at a time) feeds 8 multiply-adds, and each block reads
  128-bit vectors from global memory: the arithmetic intensity of every level (global, shared,
  registers) rises until the FMA units, not the loads, set the pace;
- what is left between that and the library: the tensor cores (the Triton kernel of labs/matmul/kernels.py);
- each rung as a share of cuBLAS at one size and dtype.

The kernels: naive, tiled and warp-tiled CUDA C++ (matmul.cu beside this file, built with torch's load_inline,
FP32 arithmetic on the CUDA cores for every input dtype; kernels.py), the Triton kernel of the matmul lab, and
cuBLAS. model.py predicts each rung (the CUDA-core rungs' model lives in labs/matmul/ladder_model.py, since the
Matmul and Hopper lessons quote it too); measure.py checks each against float64, then times it.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.lab import Headline, Lab
from labs.engine.params import param
import labs.matmul_ladder.measure as measuring  # the module, not its function
from labs.matmul_ladder.model import CUDA_DTYPES, lesson_numbers, predict


@dataclass(frozen=True)
class Params:
    n: int = param(4096, "square size N (M = N = K)", unit="elements", min=64, max=16384)
    dtypes: tuple = param(("fp32", "bf16"), "input dtypes (the CUDA C++ kernels compute in FP32 on CUDA cores)",
                          choices=CUDA_DTYPES)
    tiles: tuple = param((8, 16, 32), "TILE sizes of the shared-memory kernel", choices=(8, 16, 32))


LAB = Lab(
    name="matmul_ladder",
    title="Matmul ladder: naive, tiled, Triton, cuBLAS",
    summary="Four rungs of matrix multiplication at one size, from one thread per output to cuBLAS, each as a "
            "share of the library, with the global-memory requests tiling saves.",
    terms=("matmul", "tiling", "shared-memory", "global-memory", "l1-cache", "coalescing", "cuda-core",
           "tensor-core", "cublas", "triton", "thread-block", "load-store-unit", "registers", "fma"),
    Params=Params,
    predict=predict,
    measure=measuring.measure,
    key=("dtype", "kernel"),
    metric="tflops",
    order=21,
    check=measuring.check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What share of cuBLAS will the shared-memory tiled kernel (TILE = 32) reach in fp32 at "
                      "N = 4096?", "% of cuBLAS", {"dtype": "fp32", "kernel": "tiled32"}, "pct_of_cublas"),
    page="matmul",
)
