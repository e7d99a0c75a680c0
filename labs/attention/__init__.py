"""
FlashAttention: tiling, the online softmax and recomputation in one kernel
==========================================================================

What you will learn:
- why naive attention is memory-bound and memory-hungry: it writes the N x N scores S = QK^T and
  probabilities P = softmax(S) to device memory and reads them back, so its memory grows as N^2;
- the online softmax: a row's softmax can be computed tile by tile, keeping only a running max,
  a running sum and a rescaled partial output, so S and P never leave the chip;
- recomputation: the backward pass keeps only the log-sum-exp of each row (N numbers, not N^2) and
  recomputes P tile by tile, trading cheap arithmetic for expensive memory;
- what then limits the speed: the matrix multiplies on the tensor cores *plus* the exponentials on
  the special-function units, which in this schedule do not overlap;
- how FlashAttention-3's schedule overlaps them (gluon_fa3.py, Hopper only): a producer warp on TMA copies and
  consumer warpgroups (two at d = 128, three at d = 64) taking turns on the tensor cores.


The package reads in this order: online_softmax.py (the idea, in numpy), tiles.py (how a call is cut into
programs, and the tile sizes per GPU), kernels.py (our Triton FlashAttention-2, forward then backward, with
its launchers and autograd), launch.py (launching with little CPU per call), naive.py (the references:
float64, naive PyTorch, PyTorch SDPA), model.py (the parameters and the model: FLOPs, bytes, memory, time)
and measure.py (checks against float64, probes, timing). The Gluon FlashAttention-3 forward: gluon_fa3.py (the
kernel), fa3_model.py (its model), gluon_rung.py (where it runs, its check); compare.py sets the kernels beside
the libraries. The lesson is content/labs/attention.md.
"""

from __future__ import annotations

from labs.attention import measure, model
from labs.attention.counters import COUNTERS
from labs.attention.model import Params
from labs.engine.lab import Headline, Lab

# names the workbench (labs/workbench/exercises.py) and tests/test_repredict.py use as `attention.<name>`
from labs.attention.kernels import flash_attention_forward
from labs.attention.model import Shape, attention_flops, flash_model, library_ratios
from labs.attention.naive import reference, sdpa

__all__ = ["LAB", "Params", "Shape", "attention_flops", "flash_attention_forward", "flash_model", "library_ratios",
           "reference", "sdpa"]


LAB = Lab(
    name="attention",
    title="FlashAttention",
    summary="Attention without the N x N matrix: tiles, the online softmax and recomputation, in our own "
            "Triton FlashAttention-2 (and, on Hopper, a Gluon FlashAttention-3 forward) measured against naive "
            "PyTorch and PyTorch's SDPA backends.",
    terms=("attention", "softmax", "online-softmax", "flash-attention", "tiling", "kernel-fusion", "recomputation",
           "shared-memory", "hbm", "l2-cache", "tensor-core", "sfu", "memory-bound", "compute-bound",
           "arithmetic-intensity", "bf16", "accumulation", "triton", "tma", "training-memory", "registers",
           "ridge-point", "thread-block", "warp", "cudnn", "warp-specialization",
           "warpgroup", "wgmma", "persistent-kernel"),
    Params=Params,
    predict=model.predict,
    measure=measure.measure,
    key=model.KEY,
    metric="tflops",
    order=60,
    check=measure.check,
    lesson_numbers=model.lesson_numbers,
    headline=Headline("What TFLOP/s will our FlashAttention forward reach at N = 8192 (bf16, d = 64, no mask)?",
                      "TFLOP/s", {"impl": "ours", "mode": "fwd", "causal": False, "dtype": "bf16", "head_dim": 64,
                                  "seq_len": 8192}, "tflops"),
    counters=COUNTERS,
)
