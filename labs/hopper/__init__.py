"""
Hopper matmul anatomy: what each feature of a fast Hopper matmul buys
=====================================================================

What you will learn:
- a tensor-core matmul is a loop of "bring a BLOCK_K slice of A and B into shared memory, multiply
  it into the accumulators"; everything that follows is about keeping the tensor cores fed;
- the pipeline (num_stages): with S buffers, S - 1 slices are on their way while one is multiplied,
  so S - 1 memory latencies overlap the math (Little's law); one buffer means wait, then compute;
- TMA (tensor descriptors): one thread asks the copy engine for a whole tile instead of every
  thread issuing 16-byte loads; it frees registers and issue slots, and fills edges with zeros;
- the order tiles are visited in (row-major, grouped, Hilbert curve): it does not change the bytes
  every tile asks the L2 for, but it changes how many of them the L2 must fetch from DRAM;
- persistent kernels: one program per SM walks many tiles, so the start and end of a tile (the
  pipeline filling and the output being written) can overlap the neighbouring tiles' math;
- warp specialization: a producer warp only issues copies, consumer warpgroups only issue tensor-core
  math (wgmma), with a ring of buffers and mbarriers between them (written in Gluon: gluon_ws.py);
- what autotuners do: try a few configurations (tile shape, stages, schedule) on the real operands,
  each checked first, and keep the fastest for the size;
- the instructions behind all this, read from the compiled kernel: `wgmma.mma_async` (tensor cores
  fed from shared memory), `cp.async.bulk.tensor` (TMA), `cp.async` (Ampere-style copies).

The experiment: one Triton kernel with every feature a switch, turned on one step at a time at a few
sizes, each step checked against float64, timed beside cuBLAS, and predicted by a model built from
this GPU's measured ceilings (tensor-core rate, L2 and DRAM bandwidth) and a published memory latency.

The package: kernels.py (the kernel and its switches' launcher), gluon_ws.py (the warp-specialized Gluon kernel) and
gluon_support.py (whether this machine can run it), model.py (the prediction, pure arithmetic),
measure.py (checks, timing, the instruction counts). The shared matmul pieces (the float64 check, cuBLAS, the tile
model's figures) come from the matmul lab (labs/matmul/), imported downward.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.gpu import Target
from labs.engine.lab import Headline, Lab
from labs.engine.params import from_dict, param
import labs.hopper.model as model
import labs.hopper.measure as measuring  # the module (labs.hopper.measure stays the submodule, not the function)
from labs.hopper.counters import COUNTERS
from labs.hopper.model import DTYPES, STEP_NAMES, lesson_numbers


@dataclass(frozen=True)
class Params:
    sizes: tuple = param((4096, 8192), "square sizes N (M = N = K)", unit="elements", min=256, max=16384)
    dtype: str = param("bf16", "input dtype (FP32 accumulation on the tensor cores)", choices=DTYPES)
    steps: tuple = param(STEP_NAMES, "steps to measure (each turns on one more feature)", choices=STEP_NAMES)


def predict(params: Params, target: Target) -> list[dict]:
    """The model's rows (labs/hopper/model.py). Defined here so that the engine finds this lab's repredict hook in
    the module of LAB.predict."""
    return model.predict(params, target)


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run at the tensor-core rate of that run's own cuBLAS rows (model.repredict)."""
    return model.repredict(recording, target, from_dict(Params, recording["params"]))


LAB = Lab(
    name="hopper",
    title="Hopper matmul anatomy",
    summary="One Triton matmul with every Hopper feature a switch (pipeline stages, TMA, tile order, persistent "
            "kernel, warp specialization), step by step against cuBLAS and a model, with the PTX of each step.",
    terms=("tma", "wgmma", "swizzling", "thread-block-cluster", "distributed-shared-memory", "warp-specialization",
           "persistent-kernel", "ptx", "sass"),
    Params=Params,
    predict=predict,
    measure=measuring.measure,
    key=("step", "n"),
    metric="tflops",
    order=22,
    check=measuring.check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What share of cuBLAS will the persistent TMA kernel (step 5) reach in bf16 at N = 8192?",
                      "% of cuBLAS", {"step": "5 persistent", "n": 8192}, "pct_of_cublas"),
    counters=COUNTERS,
)
