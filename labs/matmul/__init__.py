"""
Matmul: why throughput waves with the matrix size
=================================================

What you will learn:
- a tiled matmul kernel: each program computes one BLOCK_M x BLOCK_N tile of C, walking K in steps
  of BLOCK_K, with tensor cores doing the multiply-adds (fp16, bf16, tf32, fp8);
- tile quantization: ceil(N / BLOCK) tiles per side, so the edge tiles are partly padding;
- wave quantization: the tiles run in waves of (SMs x blocks per SM); one tile past a full wave costs
  a whole extra wave;
- the row tail: when the big tiles leave a last wave mostly empty, the rows that wave would cover go to a
  second launch of small tiles, started early (programmatic dependent launch) so that they fill the idle SMs;
- alignment: when a row of the matrix is not a multiple of 16 bytes, neither the TMA copy engine nor
  16-byte vector loads can be used, and the kernel falls back to narrow loads;
- the wavy plot of the lecture: TFLOP/s against N, points coloured by the largest power of two dividing
  N, for cuBLAS and for our Triton kernel, with the model's curve over the measured points.

The experiment: square matmuls C = A @ B (M = N = K) for a sweep of sizes from 256 to 8192, with N/N+1
pairs such as 2048/2049. Each kernel is checked against float64 before it is timed.

The package, top to bottom: kernels.py (the Triton kernels and their launchers, cuBLAS), configs.py (tile shapes
and the per-size choice), model.py (the prediction, pure arithmetic), measure.py (checks, then timing), lesson.py
(the lesson's numbers), ladder_model.py (the CUDA-core rungs of the ladder, modelled; labs/matmul_ladder runs them).
The ladder (naive -> shared-memory tiled -> warp-tiled -> Triton -> cuBLAS) and the Hopper lab import these
downward; nothing here imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from labs.engine.gpu import Target
from labs.engine.lab import Headline, Lab
from labs.engine.params import from_dict, param
import labs.matmul.model as model
from labs.matmul.configs import DEFAULT_CONFIGS, DTYPES, KERNELS  # noqa: F401  (DEFAULT_CONFIGS: the workbench)
from labs.matmul.counters import COUNTERS
from labs.matmul.kernels import cublas_matmul, triton_matmul  # noqa: F401  (the workbench's matmul exercise)
from labs.matmul.lesson import lesson_numbers
import labs.matmul.measure as measuring  # the module (labs.matmul.measure stays the submodule, not the function)
from labs.matmul.measure import library_ratios  # noqa: F401  (the scorecard's hook, found beside predict)
from labs.matmul.model import predict_point, roofline_tflops  # noqa: F401  (the workbench's matmul exercise)

DEFAULT_SIZES = (256, 512, 768, 1024, 1280, 1536, 1792, 1793, 2048, 2049, 2050, 2052, 2056, 2064, 2304, 2560,
                 3072, 3584, 4096, 4097, 4608, 5120, 6144, 7168, 8192)


@dataclass(frozen=True)
class Params:
    dtypes: tuple = param(("bf16",), "input dtypes (FP32 accumulation; tf32 = fp32 storage on tensor cores)",
                          choices=DTYPES)
    sizes: tuple = param(DEFAULT_SIZES, "square sizes N (M = N = K)", unit="elements", min=16, max=32768)
    kernels: tuple = param(KERNELS, "kernels to time", choices=KERNELS)
    block_m: int = param(0, "Triton BLOCK_M: tile rows per program (0 = the tuned default)",
                         choices=(0, 16, 32, 64, 128, 256))
    block_n: int = param(0, "Triton BLOCK_N: tile columns per program (0 = default)", choices=(0, 16, 32, 64, 128, 256))
    block_k: int = param(0, "Triton BLOCK_K: depth of one K step (0 = default)", choices=(0, 16, 32, 64, 128, 256))
    group_m: int = param(8, "GROUP_M: tile rows per band of the launch order (1 = row by row)", min=1, max=64)
    num_warps: int = param(0, "warps per program (0 = default)", choices=(0, 2, 4, 8, 16))
    num_stages: int = param(0, "tiles in flight in shared memory (0 = default)", choices=(0, 1, 2, 3, 4, 5, 6))
    tma: str = param("auto", "use the TMA copy engine where the GPU (Hopper+) and the strides allow it",
                     choices=("auto", "off"))
    streamk: str = param("off", "stream-K: share out the K steps of the partial last wave among all SMs (TMA path, "
                                "the big tile unless set)", choices=("off", "on"))
    autotune: bool = param(False, "let Triton time a handful of configs at each size and keep the best (slower)")


def predict(params: Params, target: Target) -> list[dict]:
    """The model's rows (labs/matmul/model.py). Defined here so that the engine finds this lab's hooks
    (repredict, library_ratios) in the module of LAB.predict."""
    return model.predict(params, target)


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run with the floor, load latency and tile configs that run used (model.repredict)."""
    names = {f.name for f in fields(Params)}
    params = from_dict(Params, {k: v for k, v in recording["params"].items() if k in names})
    return model.repredict(recording, target, params)


LAB = Lab(
    name="matmul",
    title="Matmul: tiles, waves and alignment",
    summary="Sweep square matmuls from 256 to 8192 and watch throughput climb the roofline, split into lines "
            "by divisibility and dip at wave boundaries, for cuBLAS and a Triton kernel, against a model.",
    terms=("matmul", "tiling", "tile-quantization", "wave-quantization", "tensor-core", "sm", "cublas", "triton",
           "tma", "coalescing", "shared-memory", "l2-cache", "bf16", "fp16", "tf32", "fp8", "roofline",
           "arithmetic-intensity", "occupancy"),
    Params=Params,
    predict=predict,
    measure=measuring.measure,
    key=("kernel", "dtype", "n"),
    metric="tflops",
    order=20,
    check=measuring.check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What TFLOP/s will the Triton kernel reach in bf16 at N = 2304, just 12% above N = 2048?",
                      "TFLOP/s", {"kernel": "triton", "dtype": "bf16", "n": 2304}, "tflops"),
    counters=COUNTERS,
)
