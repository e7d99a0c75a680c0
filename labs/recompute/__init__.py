"""
Recomputation: spend arithmetic to save memory traffic
=====================================================

What you will learn:
- what a backward pass reads: the activations the forward pass stored, from device memory;
- recomputation: store less in the forward pass and recompute it in the backward pass, from the
  input, in registers. When the kernels are memory-bound the arithmetic is free and the pass is
  faster: memory accesses, not FLOPs, set the time;
- that this is the same trick as activation checkpointing, there used to save memory, here for speed.

The experiment: out = sigmoid(sigmoid(sigmoid(x))), forward and backward, three ways:
- autograd: three eager sigmoids; autograd saves each one's output for its backward (6 kernels,
  15 accesses of an element-sized tensor per element);
- stored: one fused forward kernel that writes s1, s2 and out, one fused backward kernel that reads
  dout, s1 and s2 and writes dx (the lecture's count: 1 + 3 + 3 + 1 = 8 accesses);
- recomputed: the forward kernel writes only out; the backward kernel reads dout and x and
  recomputes s1, s2 and out on the fly (1 + 1 + 2 + 1 = 5 accesses).
Model: time = accesses x bytes per element x elements / bandwidth + kernels x launch cost, so
recomputing should be 8/5 = 1.6x faster than storing. At small sizes a step's Python outlasts its kernels:
the run reads the CPU's clock at each launch of the timed steps, and the model feeds the kernels to the GPU
at those times (step_ms).

The package: kernels.py (the Triton kernels, the three versions and the float64 reference), model.py (the
accesses, the special function units and the step: pure), measure.py (the checks, the timer and the rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.lab import Headline, Lab
from labs.engine.params import param
from labs.recompute import measure, model
from labs.recompute.model import NAME
from labs.recompute.measure import time_with_host_ms  # noqa: F401 - the attention lab's timer


@dataclass(frozen=True)
class Params:
    dtypes: tuple = param(("fp32", "bf16"), "storage dtype of x, the activations and the gradients "
                          "(arithmetic in fp32)", choices=("fp32", "bf16", "fp16"))
    sizes_mib: tuple = param((16, 64, 256, 1024), "size of x (each activation and gradient is as large)",
                             unit="MiB", min=1, max=8192, log=True)


LAB = Lab(
    name=NAME,
    title="Recomputation",
    summary="Three stacked sigmoids, forward and backward: a backward pass that recomputes the activations "
            "from x instead of reading them back moves 5/8 of the bytes and runs 1.6x faster.",
    terms=("recomputation", "activation-checkpointing", "kernel-fusion", "memory-bound", "hbm",
           "memory-bandwidth", "training-memory", "triton", "kernel", "arithmetic-intensity", "registers", "sfu"),
    Params=Params,
    predict=model.predict,
    measure=measure.measure,
    key=("dtype", "size_mib", "variant"),
    metric="ms",
    order=55,
    check=measure.check,
    lesson_numbers=model.lesson_numbers,
    headline=Headline("How many times faster is forward + backward (fp32, 1 GiB) when the backward pass "
                      "recomputes the sigmoids instead of reading stored activations?", "x",
                      {"dtype": "fp32", "size_mib": 1024, "variant": "recomputed"}, "speedup"),
)
