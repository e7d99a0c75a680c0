"""How Nsight Compute counts this lab (HBM bytes, kernel counts and the tensor pipe's utilisation: naive attention,
ours, the Gluon FlashAttention-3 rung and cuDNN's kernel behind SDPA): the counter spec the engine asks for.

The rung's story is in the tensor pipe: `sm__pipe_tensor_cycles_active` (% of peak while the SMs were active)
rises from our Triton kernel to the rung where the exponentials stop holding the tensor cores up. The model says
how far: its TFLOP/s over the datasheet's dense peak is the share of the call the tensor cores would be busy, so a
counted share near it checks what the model says the overlap buys. cuDNN is counted beside them, unmodelled.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import torch

from labs.engine.counters import Adapter

LIBRARY = "sdpa-cudnn"  # the vendor's kernel the rung is held against


def _runs_here(impl: str, dtype: str, d: int, causal: bool) -> bool:
    """The rung and cuDNN are counted where they run: this GPU and Triton, and their case (dtype, head dim)."""
    from labs.attention.gluon_rung import gluon_case_reason, gluon_rung_note
    from labs.attention.measure import unavailable_reason
    from labs.attention.model import GLUON_IMPL
    from labs.hopper.gluon_support import device_capability

    if not torch.cuda.is_available():
        return False
    if impl == GLUON_IMPL:
        return not gluon_rung_note(device_capability(torch.device("cuda"))) and gluon_case_reason(dtype, d) is None
    return unavailable_reason(impl, dtype, d, causal) is None


def points(params) -> list[dict]:
    from labs.attention.model import GLUON_IMPL

    n = 4096 if 4096 in params.seq_lens else params.seq_lens[0]
    d = 128 if 128 in params.head_dims else params.head_dims[0]
    mask = "full" if "full" in params.masks else params.masks[0]
    dtype, causal = params.dtypes[0], mask == "causal"
    impls = [i for i in ("naive", "ours", GLUON_IMPL, LIBRARY) if i in params.impls]
    impls = [i for i in impls if i in ("naive", "ours") or _runs_here(i, dtype, d, causal)]
    return [{"impl": impl, "mode": "fwd", "causal": causal, "dtype": dtype, "head_dim": d, "seq_len": n}
            for impl in impls]


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
    """The lab's HBM bytes; naive attention is one kernel per PyTorch op, ours and the rung one kernel (forward).
    Tensor-pipe share: the model's TFLOP/s over the datasheet's dense peak. cuDNN's kernels are not modelled."""
    from labs.attention.model import Shape, naive_ops

    if point["impl"] == LIBRARY:
        return {}
    shape = Shape(params.batch, params.heads, point["seq_len"], point["seq_len"], point["head_dim"],
                  point["causal"], point["dtype"])
    kernels = len(naive_ops(shape, point["mode"])) if point["impl"] == "naive" else 1
    peak = target.datasheet.matmul_tflops(point["dtype"]) if target.datasheet else None
    rate = predicted.get("predicted_tflops")
    return {"dram_bytes": predicted.get("predicted_hbm_bytes"), "kernels": kernels,
            "tensor_pipe_pct": 100.0 * rate / peak if rate and peak else None}


COUNTERS = Adapter(("dram", "pipes"), points, prepare, model,
                   ("dram_bytes", "tensor_pipe_pct", "sm_clock_mhz", "kernels"))
