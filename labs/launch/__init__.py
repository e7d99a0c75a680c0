"""
Launch overhead: the fixed price of asking the GPU to do anything
=================================================================

What you will learn:
- every kernel launched from Python costs a few microseconds of CPU work (the interpreter, PyTorch's
  dispatcher, the CUDA driver) before the GPU sees it; for a tiny tensor that fixed price is larger
  than the work itself, and a chain of K tiny ops costs about K times it;
- launches are queued: the CPU runs ahead of the GPU, so back-to-back launches cost the enqueue time,
  not a round trip; a `.item()` or a synchronize in the loop makes every op wait for the GPU and back;
- a CUDA graph records the chain once and replays it with one launch, leaving only the GPU's own
  per-kernel cost; fusing the chain into one kernel removes even that;
- Horace He's three regimes: for a given op, small tensors are overhead-bound, large ones memory- or
  compute-bound, and the boundaries are where the launch cost equals the bytes or FLOPs term.

The model's launch figures are measured on this machine by probes at the start of every run (and
kept with the recording), never assumed: per-launch cost of a PyTorch op and of a Triton kernel,
graph replay, the GPU's per-kernel cost inside a graph, and a launch + `.item()` round trip. The CPU-side
figures drift on a shared host, so every point is also timed in turns with the one figure it depends on,
and its prediction uses that figure (kept in the row as `probe_us`; `repredict` re-predicts offline).

The package: kernels.py (the chain four ways, and its float64 reference), model.py (the launch figures and the
model: pure), measure.py (the probes, the checks and the timing).
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.lab import Headline, Lab
from labs.engine.params import param
from labs.launch import measure, model
from labs.launch.model import NAME, OPS, VARIANTS


@dataclass(frozen=True)
class Params:
    experiments: tuple = param(("chain", "regimes"), "which experiments to run", choices=("chain", "regimes"))
    ks: tuple = param(tuple(2**i for i in range(9)), "chain: number of tiny ops K", unit="ops", min=1, max=4096)
    variants: tuple = param(VARIANTS, "chain: how the K ops are run", choices=VARIANTS)
    elements: int = param(4096, "chain: elements of the small fp32 tensor", unit="elements", min=1,
                          max=1_048_576, log=True)
    ops: tuple = param(OPS, "regimes: which ops to sweep over tensor sizes", choices=OPS)
    add_max_mib: int = param(256, "regimes: largest tensor for the add (sizes x2 from 1 element)", unit="MiB",
                             min=1, max=4096, log=True)
    matmul_max_n: int = param(4096, "regimes: largest bf16 matmul n x n (sizes x2 from 16)", unit="n", min=16,
                              max=16384, log=True)


LAB = Lab(
    name=NAME,
    title="Launch overhead",
    summary="Every kernel launch costs microseconds before any work starts: time a chain of tiny ops eager, "
            "as a CUDA graph and fused, and find where each op leaves the overhead-bound regime.",
    terms=("launch-overhead", "overhead-bound", "kernel", "cuda-graph", "kernel-fusion", "memory-bound",
           "compute-bound", "cuda-runtime-api", "triton", "torch-compile", "roofline"),
    Params=Params,
    predict=model.predict,
    measure=measure.measure,
    key=("experiment", "variant", "k", "size"),
    metric="us",
    order=45,
    check=measure.check,
    lesson_numbers=model.lesson_numbers,
    headline=Headline("A loop of 64 tiny element-wise PyTorch ops on a 4096-element tensor: how many microseconds "
                      "does it take, launched one after another?", "us",
                      {"experiment": "chain", "variant": "eager", "k": 64}, "us"),
)
