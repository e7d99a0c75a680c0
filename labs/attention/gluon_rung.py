"""The Gluon FlashAttention-3 rung in the lab's runs: where it runs, its check against float64, its launch.

The kernel (gluon_fa3.py) needs a Hopper GPU and a Triton with Gluon, and importing it needs that Triton: it is
imported here only where labs/hopper/gluon_support.py finds both, so the app starts, and the lab runs its other
implementations, on any machine. Where it cannot run the rung is left out of the run with one note that says why;
it is a forward kernel, so a run that asks for forward and backward times its forward points alone (and says so).
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


FORWARD_ONLY_NOTE = (f"{GLUON_IMPL} is a forward kernel: the run times its forward points only (it has no "
                     "fwd+bwd rows).")


def gluon_notes(params: Params, compute_capability: Optional[str]) -> tuple[Params, list[str]]:
    """(the parameters to run, notes for the run): the Gluon rung dropped where it cannot run, with why."""
    if GLUON_IMPL not in params.impls:
        return params, []
    note = gluon_rung_note(compute_capability)
    if note:
        return dataclasses.replace(params, impls=tuple(i for i in params.impls if i != GLUON_IMPL)), [note]
    return params, [FORWARD_ONLY_NOTE] if any(m != "fwd" for m in params.modes) else []


def gluon_case_reason(dtype: str, d: int) -> Optional[str]:
    """Why the kernel cannot take this case (None if it can): it is written for bf16 at d 64 and 128."""
    if dtype != FA3_DTYPE:
        return f"the Gluon kernel takes {FA3_DTYPE} inputs only"
    if d not in FA3_HEAD_DIMS:
        return f"the Gluon kernel takes head dims {' and '.join(map(str, FA3_HEAD_DIMS))} only"
    return None


def gluon_keys_ok(dtype: str, d: int, mode: str) -> bool:
    """A configuration of the rung worth checking: one it runs."""
    return mode == "fwd" and gluon_case_reason(dtype, d) is None


def gluon_attention_fn(causal: bool):
    """The call the lab times: the kernel's own launcher, output allocated per call as the libraries' are."""
    from labs.attention.gluon_fa3 import gluon_attention

    return lambda q, k, v: gluon_attention(q, k, v, causal)


def check_gluon(dtype: str, d: int, causal: bool) -> float:
    """The kernel against float64 on odd lengths, its output poisoned with NaN (a row it forgets fails): once on
    one program per SM as timed (twice), once on CHECK_PROGRAMS programs. Returns the larger relative error."""
    import torch

    from labs.attention.gluon_fa3 import gluon_attention
    from labs.attention.naive import reference
    from labs.engine import timing

    b, h, lq, lk = CHECK_SHAPE
    q = timing.random_tensor((b, h, lq, d), dtype)
    k, v = (timing.random_tensor((b, h, lk, d), dtype) for _ in range(2))
    ref = reference(q, k, v, causal)[0]
    what = f"the Gluon FlashAttention-3 ({dtype}, d={d}, {'causal' if causal else 'full'})"
    err = 0.0
    # all SMs twice: the first call goes through Triton's launcher, the second through the direct C launcher that
    # the timed calls take (labs/attention/launch.py)
    for programs in (None, None, CHECK_PROGRAMS):
        out = torch.full_like(q, float("nan"))
        gluon_attention(q, k, v, causal, out=out, programs=programs)
        err = max(err, timing.check_close(out, ref, dtype, f"{what} on {programs or 'all'} programs"))
    return err
