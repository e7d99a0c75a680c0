"""The Gluon FlashAttention-3 rung in the lab's runs: where it runs, its checks against float64, its launch.

The kernels (gluon_fa3.py, the forward; gluon_fa3_bwd.py, the backward) need a Hopper GPU and a Triton with Gluon,
and importing them needs that Triton: they are imported here only where labs/hopper/gluon_support.py finds both, so
the app starts, and the lab runs its other implementations, on any machine. Where they cannot run the rung is left
out of the run with one note that says why. A fwd point times the forward alone; a fwd+bwd point the training call
(gluon_fa3_bwd.gluon_attention_train: the forward writes the log-sum-exp, the backward reads it) through autograd.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from labs.attention.fa3_model import FA3_DTYPE, FA3_HEAD_DIMS
from labs.attention.model import GLUON_IMPL, Params
from labs.hopper import gluon_support

CHECK_SHAPE = (1, 2, 1000, 1000)  # (B, H, Lq, Lk): odd lengths, the last query tile and key block ragged
CHECK_PROGRAMS = 3  # the second check call: each program walks several tiles, the rings' phases run on


def gluon_rung_note(compute_capability: Optional[str]) -> str:
    """'' where this machine (its GPU's compute capability, None without one) and its Triton run the Gluon rung;
    else the note shown where it is left out."""
    reason = gluon_support.attention_unavailable_reason(compute_capability)
    if not reason:
        return ""
    return (f"The Gluon FlashAttention-3 rung ({GLUON_IMPL}) runs on a Hopper GPU with a Triton that has Gluon; it "
            f"is left out of runs here ({reason}). The model and the recorded runs still show it.")


def gluon_notes(params: Params, compute_capability: Optional[str]) -> tuple[Params, list[str]]:
    """(the parameters to run, notes for the run): the Gluon rung dropped where it cannot run, with why."""
    if GLUON_IMPL not in params.impls:
        return params, []
    note = gluon_rung_note(compute_capability)
    if note:
        return dataclasses.replace(params, impls=tuple(i for i in params.impls if i != GLUON_IMPL)), [note]
    return params, []


def gluon_case_reason(dtype: str, d: int) -> Optional[str]:
    """Why the kernel cannot take this case (None if it can): it is written for bf16 at d 64 and 128."""
    if dtype != FA3_DTYPE:
        return f"the Gluon kernel takes {FA3_DTYPE} inputs only"
    if d not in FA3_HEAD_DIMS:
        return f"the Gluon kernel takes head dims {' and '.join(map(str, FA3_HEAD_DIMS))} only"
    return None


def gluon_keys_ok(dtype: str, d: int, mode: str) -> bool:
    """A configuration of the rung worth checking: one it runs (either mode)."""
    return gluon_case_reason(dtype, d) is None


def gluon_attention_fn(causal: bool, mode: str = "fwd"):
    """The call the lab times: the forward's own launcher, output allocated per call as the libraries' are; for
    fwd+bwd the training call, which autograd differentiates."""
    if mode == "fwd":
        from labs.attention.gluon_fa3 import gluon_attention

        return lambda q, k, v: gluon_attention(q, k, v, causal)
    from labs.attention.gluon_fa3_bwd import gluon_attention_train

    return lambda q, k, v: gluon_attention_train(q, k, v, causal)


def _check_case(dtype: str, d: int, causal: bool):
    """Fresh random inputs of CHECK_SHAPE, their float64 output and log-sum-exp, and the case's name."""
    from labs.attention.naive import reference
    from labs.engine import timing

    b, h, lq, lk = CHECK_SHAPE
    q = timing.random_tensor((b, h, lq, d), dtype)
    k, v = (timing.random_tensor((b, h, lk, d), dtype) for _ in range(2))
    return (q, k, v), reference(q, k, v, causal), f"the Gluon FlashAttention-3 ({dtype}, d={d}, " \
        f"{'causal' if causal else 'full'})"


def check_gluon(dtype: str, d: int, causal: bool, mode: str = "fwd") -> float:
    """The forward against float64 on odd lengths, its output poisoned with NaN (a row it forgets fails): once on
    one program per SM as timed (twice), once on CHECK_PROGRAMS programs; for fwd+bwd the backward too
    (check_gluon_backward). Returns the largest relative error."""
    import torch

    from labs.attention.gluon_fa3 import gluon_attention
    from labs.engine import timing

    (q, k, v), (ref, _), what = _check_case(dtype, d, causal)
    err = 0.0
    # all SMs twice: the first call goes through Triton's launcher, the second through the direct C launcher that
    # the timed calls take (labs/attention/launch.py)
    for programs in (None, None, CHECK_PROGRAMS):
        out = torch.full_like(q, float("nan"))
        gluon_attention(q, k, v, causal, out=out, programs=programs)
        err = max(err, timing.check_close(out, ref, dtype, f"{what} on {programs or 'all'} programs"))
    return max(err, check_gluon_backward(dtype, d, causal)) if mode != "fwd" else err


def check_gluon_backward(dtype: str, d: int, causal: bool) -> float:
    """dQ, dK and dV against float64 autograd on odd lengths: from the backward called directly with its outputs
    poisoned with NaN (a row it forgets fails), twice (the second call's launch is the replayed one the timed calls
    take), and from the training call through autograd, as timed. Also the log-sum-exp the forward writes for it.
    Returns the largest relative error."""
    import torch

    from labs.attention.gluon_fa3 import gluon_attention
    from labs.attention.gluon_fa3_bwd import gluon_attention_backward, gluon_attention_train
    from labs.attention.naive import reference
    from labs.attention.tiles import lq_pad
    from labs.engine import timing

    (q, k, v), (_, ref_lse), what = _check_case(dtype, d, causal)
    grad = timing.random_tensor(q.shape, dtype)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    refs = torch.autograd.grad(reference(q64, k64, v64, causal)[0], (q64, k64, v64), grad.double())
    lse = torch.full((q.shape[0], q.shape[1], lq_pad(q.shape[2])), float("nan"), device=q.device)
    out = gluon_attention(q, k, v, causal, lse=lse)
    seen = torch.isfinite(ref_lse)  # rows that see no key (causal, Lq > Lk) have none
    err = timing.check_close(lse[..., :q.shape[2]][seen], ref_lse[seen], dtype, f"{what} log-sum-exp")
    poisoned = [torch.empty_like(x) for x in (q, k, v)]
    # twice on the same tensors: the second call replays the first's launch (gluon_fa3_bwd._launch_backward)
    for how in ("called directly", "called directly again"):
        for g in poisoned:
            g.fill_(float("nan"))
        grads = gluon_attention_backward(q, k, v, out, grad, lse, causal, grads=poisoned)
        for name, got, truth in zip(("dQ", "dK", "dV"), grads, refs):
            err = max(err, timing.check_close(got, truth, dtype, f"{what} {name} {how}"))
    trained = torch.autograd.grad(gluon_attention_train(*(x.requires_grad_() for x in (q, k, v)), causal),
                                  (q, k, v), grad)
    for name, got, truth in zip(("dQ", "dK", "dV"), trained, refs):
        err = max(err, timing.check_close(got, truth, dtype, f"{what} {name} through autograd"))
    return err
