"""How Nsight Compute counts this lab (HBM bytes, kernel counts and the tensor pipe's utilisation: naive attention,
ours and the Gluon FlashAttention-3 rung): the counter spec the engine asks for.

The rung's story is in the tensor pipe: `sm__pipe_tensor_cycles_active` (% of peak while the SMs were active)
rises from our Triton kernel to the rung where the exponentials stop holding the tensor cores up.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import torch

from labs.engine.counters import Adapter


def _gluon_runs_here(dtype: str, d: int) -> bool:
    """The rung is counted where it runs: this GPU and Triton (gluon_support), and its case (bf16, d 64 or 128)."""
    from labs.attention.gluon_rung import gluon_case_reason, gluon_rung_note
    from labs.hopper.gluon_support import device_capability

    cc = device_capability(torch.device("cuda")) if torch.cuda.is_available() else None
    return not gluon_rung_note(cc) and gluon_case_reason(dtype, d) is None


def points(params) -> list[dict]:
    from labs.attention.model import GLUON_IMPL

    n = 4096 if 4096 in params.seq_lens else params.seq_lens[0]
    d = 128 if 128 in params.head_dims else params.head_dims[0]
    mask = "full" if "full" in params.masks else params.masks[0]
    impls = [i for i in ("naive", "ours", GLUON_IMPL) if i in params.impls]
    if GLUON_IMPL in impls and not _gluon_runs_here(params.dtypes[0], d):
        impls.remove(GLUON_IMPL)
    return [{"impl": impl, "mode": "fwd", "causal": mask == "causal", "dtype": params.dtypes[0], "head_dim": d,
             "seq_len": n} for impl in impls]


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
    """The lab's HBM bytes; naive attention is one kernel per PyTorch op, ours and the rung one kernel (forward)."""
    from labs.attention.model import Shape, naive_ops

    shape = Shape(params.batch, params.heads, point["seq_len"], point["seq_len"], point["head_dim"],
                            point["causal"], point["dtype"])
    kernels = len(naive_ops(shape, point["mode"])) if point["impl"] == "naive" else 1
    return {"dram_bytes": predicted.get("predicted_hbm_bytes"), "kernels": kernels}


COUNTERS = Adapter(("dram", "pipes"), points, prepare, model,
                         ("dram_bytes", "tensor_pipe_pct", "kernels"))
