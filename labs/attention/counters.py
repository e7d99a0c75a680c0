"""How Nsight Compute counts this lab (HBM bytes, kernel counts and the tensor pipe's utilisation: naive attention,
ours, the Gluon FlashAttention-3 rung and cuDNN's kernel behind SDPA, the forward and the training call): the
counter spec the engine asks for.

The rung's story is in the tensor pipe: `sm__pipe_tensor_cycles_active` (% of peak while the SMs were active)
rises from our Triton kernel to the rung where the exponentials stop holding the tensor cores up. The model says
how far: its TFLOP/s over the datasheet's dense peak is the share of the call the tensor cores would be busy at the
peak's clock, so a counted share near it checks what the model says the overlap buys (content/counters.md says why a
lower clock under load lifts the counted share). cuDNN is counted beside them, unmodelled.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import functools

import torch

from labs.attention.model import GLUON_IMPL
from labs.engine.counters import Adapter, tensor_pipe_share

LIBRARY = "sdpa-cudnn"  # the vendor's kernel the rung is held against
TRAINED = ("ours", GLUON_IMPL, LIBRARY)  # counted in the training call too (naive attention's is dozens of kernels)
# kernels a call launches, as the models count them: ours trains with a forward, a dK/dV and a dQ kernel (the dQ
# kernel writes delta too: model.flash_model); the rung with a forward, the prep, the backward and the cast of dQ
# (fa3_bwd_model)
KERNELS = {("ours", "fwd"): 1, ("ours", "fwd+bwd"): 3, (GLUON_IMPL, "fwd"): 1, (GLUON_IMPL, "fwd+bwd"): 4}
# the tensor cores' work a call does, over what its FLOPs count (2 multiplies of N x N x d forward, 5 backward): our dQ
# kernel computes S and dP again, so our training call does 9 (model.flash_model charges the same 4 + 3 backward)
TENSOR_WORK = {("ours", "fwd+bwd"): 9 / 7}


@functools.lru_cache(maxsize=32)
def _runs_here(impl: str, dtype: str, d: int, causal: bool) -> bool:
    """The rung and cuDNN are counted where they run: this GPU and Triton, and their case (dtype, head dim). Kept:
    the page lists the points at every rerun, and cuDNN's answer costs a call on a tiny input."""
    from labs.attention.gluon_rung import gluon_case_reason, gluon_rung_note
    from labs.attention.measure import unavailable_reason
    from labs.hopper.gluon_support import device_capability

    if not torch.cuda.is_available():
        return False
    if impl == GLUON_IMPL:
        return not gluon_rung_note(device_capability(torch.device("cuda"))) and gluon_case_reason(dtype, d) is None
    return unavailable_reason(impl, dtype, d, causal) is None


def points(params) -> list[dict]:
    n = 4096 if 4096 in params.seq_lens else params.seq_lens[0]
    d = 128 if 128 in params.head_dims else params.head_dims[0]
    mask = "full" if "full" in params.masks else params.masks[0]
    dtype, causal = params.dtypes[0], mask == "causal"
    impls = [i for i in ("naive", "ours", GLUON_IMPL, LIBRARY) if i in params.impls]
    impls = [i for i in impls if i in ("naive", "ours") or _runs_here(i, dtype, d, causal)]
    modes = [m for m in ("fwd", "fwd+bwd") if m in params.modes]
    return [{"impl": impl, "mode": mode, "causal": causal, "dtype": dtype, "head_dim": d, "seq_len": n}
            for mode in modes for impl in impls if mode == "fwd" or impl in TRAINED]


def prepare(params, point):
    from labs.attention.measure import impl_fn
    from labs.engine import timing

    shape = (params.batch, params.heads, point["seq_len"], point["head_dim"])
    q, k, v = (timing.random_tensor(shape, point["dtype"]) for _ in range(3))
    fn = impl_fn(point["impl"], point["causal"], point["mode"])

    def forward():
        with torch.no_grad():
            return fn(q, k, v)
    if point["mode"] == "fwd":
        return forward
    do = timing.random_tensor(shape, point["dtype"])
    for x in (q, k, v):
        x.requires_grad_()

    def train():
        # autograd runs a CUDA backward on a thread of its own by default, outside the NVTX range the counts
        # keep: here it runs on this thread, between the markers
        with torch.autograd.set_multithreading_enabled(False):
            return torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    return train


def model(params, point, predicted, target) -> dict:
    """The lab's HBM bytes and kernels (naive attention: one a PyTorch op; ours and the rung: KERNELS).
    Tensor-pipe share: the model's TFLOP/s of tensor work over the datasheet's dense peak. cuDNN's kernels are not
    modelled: its bytes are compared with the rung's model, the same schedule's (Q, K, V read and O written once in
    the forward), as the matmul lab compares cuBLAS with each matrix moved once."""
    from labs.attention.model import Shape, gluon_model, naive_ops

    shape = Shape(params.batch, params.heads, point["seq_len"], point["seq_len"], point["head_dim"],
                  point["causal"], point["dtype"])
    mode = point["mode"]
    if point["impl"] == LIBRARY:
        return {"dram_bytes": gluon_model(shape, target, mode)["predicted_hbm_bytes"]}
    kernels = len(naive_ops(shape, mode)) if point["impl"] == "naive" else KERNELS[point["impl"], mode]
    rate = (predicted.get("predicted_tflops") or 0) * TENSOR_WORK.get((point["impl"], mode), 1)
    return {"dram_bytes": predicted.get("predicted_hbm_bytes"), "kernels": kernels,
            "tensor_pipe_pct": tensor_pipe_share(rate, target, point["dtype"])}


COUNTERS = Adapter(("dram", "pipes"), points, prepare, model,
                   ("dram_bytes", "tensor_pipe_pct", "sm_clock_mhz", "kernels"))
