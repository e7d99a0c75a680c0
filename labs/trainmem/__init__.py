"""
Training memory: what a training step keeps on the GPU, with ZeRO over many GPUs
=================================================================================

What you will learn:
- what training keeps that inference does not: gradients (one per weight), Adam's two fp32 moments and,
  under mixed precision, an fp32 master copy of the weights: 2 + 2 + 4 + 8 = 16 bytes per parameter for
  bf16 weights, before a single activation;
- the activations the backward pass needs, counted tensor by tensor for a Llama-style block, and what
  activation checkpointing leaves of them (each block's input; one block is rebuilt at a time);
- how ZeRO shards those 16 bytes over N data-parallel GPUs: stage 1 the optimizer states (12 bytes),
  stage 2 also the gradients, stage 3 also the weights;
- why the rule of thumb "training needs about 6x the memory of inference" is only a rough case.

The calculator needs no GPU. The lab checks it on the GPU: a small Llama-style model (bf16 weights,
fp32 master weights and Adam moments) takes real training steps, and torch.cuda.max_memory_allocated is
compared with the model's peak, part by part (model state, saved activations, the peak itself).

The package: model.py (the calculator and the step's peak: pure), kernels.py (the small model and its optimizer,
in PyTorch), measure.py (the check and the real steps).
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.lab import Headline, Lab
from labs.engine.params import param
from labs.trainmem import measure, model
from labs.trainmem.model import NAME


@dataclass(frozen=True)
class Params:
    batch: tuple = param((1, 4, 16), "sequences per step", min=1, max=1024)
    checkpointing: tuple = param((False, True), "activation checkpointing of every block")
    seq: int = param(1024, "tokens per sequence", unit="tokens", min=8, max=65536)
    n_layers: int = param(8, "transformer blocks", min=1, max=96)
    d_model: int = param(1024, "width", min=16, max=16384)
    n_heads: int = param(8, "attention heads", min=1, max=256)
    d_ff: int = param(4096, "MLP hidden size", min=16, max=65536)
    vocab: int = param(8192, "vocabulary", min=16, max=262144)


LAB = Lab(
    name=NAME,
    title="Training memory",
    summary="Weights, gradients, Adam and activations: a calculator with ZeRO stages over many GPUs, checked "
            "against the peak memory of real training steps on this GPU.",
    terms=("training-memory", "zero", "activation-checkpointing", "mixed-precision"),
    Params=Params,
    predict=model.predict,
    measure=measure.measure,
    key=("batch", "checkpointing"),
    metric="peak_bytes",
    order=74,
    check=measure.check,
    lesson_numbers=model.lesson_numbers,
    headline=Headline("How many GB will one training step of the 150 M-parameter model at batch 16 (no "
                      "checkpointing) peak at?", "GB", {"batch": 16, "checkpointing": False}, "peak_bytes", scale=1e9),
)
