"""How Nsight Compute counts this lab (HBM bytes and kernel counts: naive attention against ours): the counter spec the engine asks for.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import torch

from labs.engine.counters import Adapter


def points(params) -> list[dict]:
    n = 4096 if 4096 in params.seq_lens else params.seq_lens[0]
    d = 128 if 128 in params.head_dims else params.head_dims[0]
    mask = "full" if "full" in params.masks else params.masks[0]
    return [{"impl": impl, "mode": "fwd", "causal": mask == "causal", "dtype": params.dtypes[0], "head_dim": d,
             "seq_len": n} for impl in ("naive", "ours") if impl in params.impls]


def prepare(params, point):
    from labs.attention.measure import impl_fn
    from labs.engine import timing

    shape = (params.batch, params.heads, point["seq_len"], point["head_dim"])
    q, k, v = (timing.random_tensor(shape, point["dtype"]) for _ in range(3))
    fn = impl_fn(point["impl"], point["causal"])

    def forward():
        with torch.no_grad():
            return fn(q, k, v)
    return forward


def model(params, point, predicted, target) -> dict:
    """The lab's HBM bytes; naive attention is one kernel per PyTorch op, ours one kernel (forward)."""
    from labs.attention.model import Shape, naive_ops

    shape = Shape(params.batch, params.heads, point["seq_len"], point["seq_len"], point["head_dim"],
                            point["causal"], point["dtype"])
    kernels = len(naive_ops(shape, point["mode"])) if point["impl"] == "naive" else 1
    return {"dram_bytes": predicted.get("predicted_hbm_bytes"), "kernels": kernels}


COUNTERS = Adapter(("dram", "pipes"), points, prepare, model,
                         ("dram_bytes", "tensor_pipe_pct", "kernels"))
