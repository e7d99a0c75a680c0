"""
Collectives: all-reduce and friends over NVLink, and one layer split over GPUs
===============================================================================

What you will learn:
- what the four collectives of distributed training do (all-reduce, all-gather, reduce-scatter, broadcast)
  and how many bytes each GPU must send for them;
- the alpha-beta model of a collective: time = latency + bytes on the busiest link / link bandwidth. For the
  ring all-reduce every GPU sends 2(n-1)/n of the buffer, so
      t = alpha + 2(n-1)/n x S / B;
- algorithm bandwidth (S / t) and bus bandwidth (algorithm bandwidth x the ring factor), which tends to the
  link bandwidth B for large messages and is comparable across GPU counts;
- why small messages are latency-bound (a 1 KiB all-reduce costs tens of microseconds whatever its size);
- data parallelism (every GPU computes the whole layer on its own tokens, then the gradients are
  all-reduced, overlapped with the backward pass) and tensor parallelism (every GPU computes a slice of
  every matmul; the partial results are all-reduced on the critical path).

How it runs: the lab starts one process per GPU with torchrun (labs/collectives/worker.py runs in each), joined
by NCCL. Each collective is checked against a float64 reference on odd sizes before it is timed.

The model's terms, each measured in the same run (before a run: read from a recorded run of this GPU kind,
else the datasheet): a loop of calls runs at the slower of the host issuing each call (the smallest message's
time) and the GPUs running it. The GPUs pay a fixed cost plus the busiest link's bytes at the bus bandwidth,
with the faster of NCCL's two protocols: LL (the smallest message replayed from a CUDA graph; half of each
store is a flag) or Simple (full rate; its larger fixed cost from the first message the GPUs clearly limit).
The bus bandwidth is the link (what the copy engines move to the next GPU) or NCCL's kernels, whichever is
slower: NCCL moves every byte with the SMs, and a collective whose kernel reads and
writes k bytes per byte sent reaches 4 / k of the rate of NCCL's own send/recv exchange (which reads and
writes 4). The textbook model with the datasheet's NVLink figure is kept beside it (textbook_* columns).

The package: model.py (the ring, NCCL's protocols and kernels, the layer steps: pure), measure.py (the torchrun
launcher and the rows), worker.py (what each GPU's process runs).
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.engine.gpu import MiB, Target
from labs.engine.lab import Headline, Lab
from labs.engine.params import from_dict, param
from labs.collectives import measure, model
from labs.collectives.model import LAYER_STEPS, NAME, OPS
from labs.collectives.model import recorded_rows  # noqa: F401 - the attention and inference labs read recordings


@dataclass(frozen=True)
class Params:
    ops: tuple = param(OPS, "collectives to time", choices=OPS)
    sizes_kib: tuple = param((1, 16, 256, 1024, 4096, 16384, 65536, 262144, 1048576),
                             "message sizes S (the whole buffer)", unit="KiB", min=1, max=4 * 1048576)
    dtype: str = param("bf16", "element type", choices=("bf16", "fp32"))
    gpus: int = param(0, "GPUs to use (0: every GPU of this machine)", min=0, max=64)
    layer_steps: tuple = param(LAYER_STEPS, "dp: data-parallel step, tp: tensor-parallel step", choices=LAYER_STEPS)
    layer_tokens: tuple = param((1024, 8192), "tokens per GPU in the layer steps", min=1, max=65536)
    d_model: int = param(4096, "layer width (the MLP of one Llama-style layer)", min=8, max=32768)
    d_ff: int = param(14336, "MLP hidden size (three d_model x d_ff matrices)", min=8, max=131072)


def predict(p: Params, target: Target) -> list:
    """The model (model.predict) for the GPUs a run here would use: all of this machine's, or p.gpus."""
    return model.predict(p, target, measure.world_size(p, target))


def repredict(recording: dict, target: Target) -> list:
    """The model of a recorded run with the terms that run measured."""
    p = from_dict(Params, recording["params"])
    rows = [r for r in recording["rows"] if r.get("measured_ms") is not None]
    n = rows[0]["gpus"] if rows else 2
    return model.predict_with(p, target, n, model.model_terms(rows, target))


LAB = Lab(
    name=NAME,
    title="Collectives and parallelism",
    summary="All-reduce, all-gather, reduce-scatter and broadcast from 1 KiB to 1 GiB over NVLink against the "
            "ring model, then one layer's data-parallel and tensor-parallel steps: compute against communication.",
    terms=("nccl", "all-reduce", "ring-all-reduce", "bus-bandwidth", "nvlink", "nvswitch",
           "data-parallelism", "tensor-parallelism", "pipeline-parallelism"),
    Params=Params,
    predict=predict,
    measure=measure.measure,
    key=("experiment", "op", "size_bytes", "gpus", "step", "tokens"),
    metric="ms",
    order=72,
    check=measure.check,
    timed_in_passes=False,  # torchrun workers time each point in one window and hand the samples back
    lesson_numbers=model.lesson_numbers,
    headline=Headline("What bus bandwidth (GB/s) will a 1 GiB bf16 all-reduce reach over two GPUs?", "GB/s",
                      {"experiment": "collective", "op": "all_reduce", "size_bytes": 1024 * MiB}, "busbw_gbps"),
)
