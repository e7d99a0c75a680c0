"""
Warp divergence: what a branch costs when the threads of a warp disagree
=========================================================================

What you will learn:
- a warp is 32 threads that issue one instruction at a time together (SIMT); when its threads take
  different sides of a branch, the warp runs every side that any of them takes, one after the other,
  with the lanes that did not take it masked off;
- so divergence costs nothing when whole warps agree (groups of g >= 32 threads) and doubles the time
  of an if/else when they do not (g < 32), whatever the two sides cost;
- Triton has no per-thread branches: a per-element condition is a `tl.where` that computes both
  sides for every element, while a condition uniform across a program is a real branch;
- with data-dependent work (element i needs k_i loop trips) a warp costs the max of k over its lanes,
  so the order of the data matters: sorting puts equal k in the same warp and recovers the loss.

Three experiments, all compute-bound on purpose (thousands of FMAs per 8 bytes moved, so memory and
launch costs stay out of the way), each with a no-divergence baseline measured in the same run:
1. branches (CUDA C++): thread i takes branch B if (i / g) is odd, else branch A; g sweeps 1..256;
   branch B costs `cost_ratio` times branch A.
2. triton: the same two chains as `tl.where` (per element) and as a per-program `if`.
3. data-dependent (CUDA C++): k_i trips per element, in random order and sorted.

kernels.py holds the Triton kernel and loads the CUDA C++ ones (divergence.cu), model.py the warp counting,
measure.py the checks and the timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.divergence.counters import COUNTERS
from labs.divergence.measure import check, measure
from labs.divergence.model import (DEFAULT_FMAS, DEFAULT_K_MAX, DEFAULT_THREADS, DISTRIBUTIONS, EXPERIMENTS,
                                   lesson_numbers, predict)
from labs.engine.lab import Headline, Lab
from labs.engine.params import param


@dataclass(frozen=True)
class Params:
    experiments: tuple = param(EXPERIMENTS, "which experiments to run", choices=EXPERIMENTS)
    g: tuple = param(tuple(2**i for i in range(9)), "branches: threads per group taking the same side "
                     "(groups alternate between the two branches)", unit="threads", min=1, max=1024)
    cost_ratios: tuple = param((1.0, 2.0, 4.0), "cost of branch B / cost of branch A", min=0.25, max=8.0)
    fmas: int = param(DEFAULT_FMAS, "FMAs per thread on branch A (a multiple of 32)", unit="FMA", min=32, max=16384,
                      step=32)
    threads: int = param(DEFAULT_THREADS, "threads launched (one element each)", unit="threads", min=4096,
                         max=67_108_864, log=True)
    k_max: int = param(DEFAULT_K_MAX, "data-dependent: most loop trips an element can need (32 FMAs per trip)",
                       unit="trips", min=2, max=512)
    distributions: tuple = param(DISTRIBUTIONS, "data-dependent: how k is distributed", choices=DISTRIBUTIONS)


LAB = Lab(
    name="divergence",
    title="Warp divergence",
    summary="Threads of a warp that take different branches run one after the other: sweep the branch "
            "granularity across the warp size, compare Triton's tl.where with a real branch, and watch "
            "data-dependent loops lose (and sorting win back) half the GPU.",
    terms=("warp", "warp-divergence", "branch-efficiency", "thread", "thread-block", "warp-scheduler", "cuda-core",
           "fma", "compute-bound", "triton", "sass"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("experiment", "case", "cost_ratio", "g"),
    metric="slowdown",
    order=40,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("Groups of 16 threads take one branch and the next 16 the other (both branches cost the "
                      "same). How many times longer does the kernel take than with groups of 32?", "x",
                      {"experiment": "branches", "g": 16, "cost_ratio": 1.0}, "slowdown"),
    counters=COUNTERS,
)
