"""
Coalescing: the memory system hands out 32-byte sectors, not single numbers
==========================================================================

What you will learn:
- a warp's 32 loads are served together: the hardware fetches every 32-byte sector they touch,
  so threads that read neighbouring addresses share sectors and threads that read far apart do not;
- the sector model: useful bandwidth = copy bandwidth x useful bytes / fetched bytes;
- the second limit, inside each SM: the L1/shared-memory pipeline handles one 128-byte line (or one
  access per bank) per clock, so a warp instruction spread over 32 lines or hitting one bank 32
  times costs 32 clocks even when the caches spare DRAM the traffic;
- the same work can be coalesced or not (threads walking along rows or down columns);
- the transpose ladder: naive (strided writes) -> shared-memory tiles -> tiles padded against
  bank conflicts, against `x.t().contiguous()`.

The model is the lowest of its limits: DRAM bytes (what the L2 fetches, in 64-byte granules, at the
calibrated copy bandwidth), DRAM requests (reads whose elements each need their own sector reach DRAM
as separate requests, one per 128-byte line they touch; each costs what a lone request costs in a probe
measured in the same run, and a second granule of the same line streams behind it at copy bandwidth)
and the L1 (SMs x clock x useful bytes per wavefront); the transposes add the L2's request slots. The
lecture's sector model, 32-byte sectors at copy bandwidth, is kept beside it for comparison.

Three experiments:
1. stride: y[i] = x[i * s] for s = 1, 2, 4, ... 64 floats. Writes stay contiguous; reads touch a
   new sector every 32 / (4 s) elements, until s >= 8 where every float costs its own sector.
2. walk: a square matrix summed in segments; each thread walks one row (lanes 32 rows apart: 32
   sectors per warp load) or one column (lanes side by side: 4 sectors per warp load). Same loads,
   same arithmetic, same output size.
3. transpose: the CUDA C++ ladder in transpose.cu (beside this file).

kernels.py holds the Triton kernels and loads the CUDA C++ transposes, model.py the napkin math, measure.py the
checks and the timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.coalescing.counters import COUNTERS
from labs.coalescing.kernels import transpose  # noqa: F401  (the workbench's transpose exercise runs it)
from labs.coalescing.measure import check, measure
from labs.coalescing.model import lesson_numbers, predict
from labs.engine.lab import Headline, Lab
from labs.engine.params import param


@dataclass(frozen=True)
class Params:
    strides: tuple = param((1, 2, 4, 8, 16, 32, 64), "read strides (y[i] = x[i * stride])", unit="elements",
                           min=1, max=256)
    size_mib: int = param(2048, "input span of the strided reads (the stride-1 output is as large)", unit="MiB",
                          min=1, max=65536)
    matrix_n: int = param(16384, "side of the square fp32 matrix walked and transposed", unit="elements",
                          min=64, max=65536)
    experiments: tuple = param(("stride", "walk", "transpose"), "which experiments to run",
                               choices=("stride", "walk", "transpose"))


LAB = Lab(
    name="coalescing",
    title="Coalescing",
    summary="Read with a stride, walk a matrix along rows or down columns, and climb the transpose ladder: "
            "bandwidth is decided by the 32-byte sectors a warp touches.",
    terms=("coalescing", "memory-sector", "warp", "global-memory", "shared-memory", "bank-conflict", "transpose",
           "memory-bandwidth", "l2-cache", "tiling"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("experiment", "variant"),
    metric="tbps",
    order=20,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What useful bandwidth will a read with stride 8 (one float per 32-byte sector) reach?",
                      "TB/s", {"experiment": "stride", "variant": "stride 8"}, "tbps"),
    counters=COUNTERS,
)
