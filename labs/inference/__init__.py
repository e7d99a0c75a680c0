"""
Inference: prefill vs decode, batch size, and the KV cache
==========================================================

What you will learn:
- why generating one token at a time (decode) is memory-bound: every step streams all the weights from
  memory to do one matrix-vector product, while prompt processing (prefill) multiplies the same weights by
  thousands of tokens at once and runs near the tensor cores' peak;
- why many samples are nearly free: the time of a step stays flat as the batch grows, until the
  arithmetic intensity reaches the ridge point; tokens per second grow and cost per token falls;
- what the KV cache costs: every generated token reads the keys and values of the whole context, for
  every sequence of the batch, so long contexts make decode attention the larger part of a step;
- how far a model built from these pieces (one transformer block decode step) follows the sum of them.

The experiments:
1. `gemm`: one linear layer, M x K activations times a K x N weight (8192 x 8192 bf16 by default), for
   M = 1, 2, 4, ... 4096 rows (batch x tokens): cuBLAS (what torch calls) and a weight-streaming Triton
   kernel written for small M, against the roofline: intensity = 2MKN / (bytes of A, W and C).
2. `attention`: decode attention of one new token over a KV cache, against context and batch: the
   bytes of K and V read per step over the measured copy bandwidth (SDPA and a split-KV Triton kernel).
3. `block`: one Llama-style block's decode step (attention over a KV cache + gated MLP) at batch 1..256,
   timed as a CUDA graph, against the sum of the models of its pieces plus a fixed cost per kernel.
4. `launch`: that fixed cost, measured: an empty kernel timed alone, and one kernel node in a CUDA graph.

The package: kernels.py (the Triton kernels and their launchers), launch.py (their tile shapes and slices),
block.py (the decode block and the float64 references), model.py (the parameters and the model), measure.py
(checks, probes and timing). The memory calculator (weights, KV cache, activations, training state) lives in
labs/memcalc/. The lesson is content/labs/inference.md.
"""

from __future__ import annotations

from labs.engine.lab import Headline, Lab
from labs.inference import measure, model
from labs.inference.model import Params

LAB = Lab(
    name="inference",
    title="Inference: prefill vs decode",
    summary="Sweep a linear layer from one token (decode) to 4096 (prefill), read a KV cache, time a transformer "
            "block's decode step, and work out how much GPU memory a model needs.",
    terms=("prefill", "decode", "kv-cache", "batch-size", "arithmetic-intensity", "roofline", "ridge-point",
           "memory-bound", "compute-bound", "matmul", "attention", "launch-overhead", "cuda-graph", "cublas",
           "inference-memory", "training-memory", "bf16", "tensor-core"),
    Params=Params,
    predict=model.predict,
    measure=measure.measure,
    key=("experiment", "kernel", "m", "batch", "context"),
    metric="ms",
    order=60,
    check=measure.check,
    lesson_numbers=model.lesson_numbers,
    headline=Headline("What TFLOP/s will cuBLAS reach on an 8192 x 8192 bf16 layer with M = 1 row (one decoded token)?",
                      "TFLOP/s", {"experiment": "gemm", "kernel": "cublas", "m": 1}, "tflops"),
)
