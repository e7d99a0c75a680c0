"""Tests of the Gluon FlashAttention-3 backward (labs/attention/gluon_fa3_bwd.py) and of the forward's log-sum-exp.

On CPU: launching the backward without a Hopper GPU says why. On a Hopper GPU (marked `gpu`): the forward's
log-sum-exp against float64, and dQ, dK, dV through autograd against float64 autograd on odd shapes (lengths not
multiples of the tiles, Lq != Lk, causal and not, d 64 and 128), with rows that see no key (causal, Lq > Lk).
"""

import pytest
import torch

from labs.attention.naive import reference
from labs.attention.tiles import lq_pad
from labs.engine import timing
from labs.hopper import gluon_support


def _bwd():
    reason = gluon_support.attention_gluon_missing()
    if reason:
        pytest.skip(f"this Triton cannot build the kernel: {reason}")
    from labs.attention import gluon_fa3_bwd

    return gluon_fa3_bwd


def _hopper_or_skip():
    reason = gluon_support.attention_unavailable_reason(gluon_support.device_capability("cuda"))
    if reason:
        pytest.skip(f"the Gluon kernel cannot run: {reason}")
    return _bwd()


def test_launching_the_backward_without_a_hopper_gpu_says_why():
    """Where the forward cannot run (tests/test_gluon_fa3.py), the backward says why the same way."""
    bwd = _bwd()
    if gluon_support.attention_unavailable_reason(gluon_support.device_capability("cuda")) is None:
        pytest.skip("this machine runs the Gluon kernels (tested below)")
    q = torch.zeros(1, 1, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(gluon_support.GluonUnavailable, match="no CUDA GPU|compute capability"):
        bwd.gluon_attention_backward(q, q, q, q, q, torch.zeros(1, 1, lq_pad(64)), causal=False)


ODD_SHAPES = [(1, 2, 1000, 1000), (2, 1, 333, 333), (1, 2, 333, 1000), (1, 1, 1000, 333), (1, 1, 128, 128)]


def _inputs(shape, head_dim):
    batch, heads, lq, lk = shape
    q = timing.random_tensor((batch, heads, lq, head_dim), "bf16", "cuda")
    k = timing.random_tensor((batch, heads, lk, head_dim), "bf16", "cuda")
    v = timing.random_tensor((batch, heads, lk, head_dim), "bf16", "cuda")
    return q, k, v


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_forward_writes_the_log_sum_exp(shape, head_dim, causal):
    """The rows' natural-log log-sum-exp against float64 (-inf where a causal row sees no key); the padding past
    Lq is left as it was, and the output is the forward-only call's, bit for bit."""
    from labs.attention.gluon_fa3 import gluon_attention

    _hopper_or_skip()
    q, k, v = _inputs(shape, head_dim)
    batch, heads, lq, _ = q.shape
    lse = torch.full((batch, heads, lq_pad(lq)), 12345.0, device="cuda")
    out = gluon_attention(q, k, v, causal, lse=lse)
    assert torch.equal(out, gluon_attention(q, k, v, causal))
    ref = reference(q, k, v, causal)[1]
    got = lse[..., :lq].double()
    empty = torch.isinf(ref)
    assert torch.equal(torch.isinf(got), empty) and bool((got[empty] < 0).all())
    assert (got[~empty] - ref[~empty]).abs().max().item() < 2e-2  # bf16 scores: a few hundredths of a nat
    assert bool((lse[..., lq:] == 12345.0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gradients_match_float64_on_odd_shapes(shape, head_dim, causal):
    """dQ, dK and dV through autograd (the Gluon forward, then this backward) against float64 autograd of the
    reference, on fresh random inputs and a random upstream gradient."""
    bwd = _hopper_or_skip()
    q, k, v = (x.requires_grad_() for x in _inputs(shape, head_dim))
    grad = timing.random_tensor(q.shape, "bf16", "cuda")
    bwd.gluon_attention_train(q, k, v, causal).backward(grad)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    reference(q64, k64, v64, causal)[0].backward(grad.double())
    for name, ours, truth in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert torch.isfinite(ours).all(), name
        error = ((ours.double() - truth).abs().max() / truth.abs().max().clamp_min(1e-12)).item()
        assert error < 2e-2, f"{name}: relative error {error:.2e} ({shape}, d {head_dim}, causal {causal})"


# ------------------------------------------------------------------------------------------------
# The backward's model (fa3_bwd_model.py): pure arithmetic, on any machine
# ------------------------------------------------------------------------------------------------
from labs.attention import fa3_bwd_model as B, model as M  # noqa: E402
from labs.engine import gpu  # noqa: E402

H100 = gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM"))
A100 = gpu.datasheet_target(gpu.datasheet_by_name("A100 80GB"))


def test_model_constants_follow_the_kernel():
    bwd = _bwd()
    assert (B.BWD_KEYS, B.BWD_QUERIES) == (bwd.BWD_KEYS, bwd.BWD_QUERIES)


def test_a_step_costs_its_multiplies_plus_one_warps_chain():
    """Nothing hides: the warpgroups run their chains at about the same time, so a step is the sum of the phases."""
    mma, chain = B.step_seconds(128, 700e12, 1.9e9, 132)
    assert mma == pytest.approx(5 * 2 * 64 * 128 * 128 / (700e12 / 132))
    assert chain == pytest.approx(B.bwd_warp_instructions(128, False) * 4 / 1.9e9)
    assert B.bwd_warp_instructions(128, True) > B.bwd_warp_instructions(128, False)
    # d = 128 hands dQ to the writer warp (two more barriers) and issues more wgmma than d = 64
    assert B.bwd_warp_instructions(128, False) > B.bwd_warp_instructions(64, False)
    shape = M.Shape(4, 16, 8192, 8192, 128, False, "bf16")
    k = B.fa3_backward(shape, 700e12, 3e12, 132, 1.9e9)
    steps = 4 * 16 * (8192 // 128) * (8192 // 64)
    assert k["mma_s"] == pytest.approx(steps * mma / 132) and k["exp_s"] == pytest.approx(steps * chain / 132)
    assert k["hidden_s"] == 0 and k["s"] >= k["mma_s"] + k["exp_s"]


def test_the_causal_backward_walks_about_half_the_steps():
    full, causal = (B.fa3_backward(M.Shape(4, 16, 8192, 8192, 64, c, "bf16"), 700e12, 3e12, 132, 1.9e9)
                    for c in (False, True))
    assert 0.5 < causal["mma_s"] / full["mma_s"] < 0.52  # the diagonal's blocks count whole


def test_forward_and_backward_is_the_forward_then_the_backward():
    shape = M.Shape(4, 16, 4096, 4096, 128, True, "bf16")
    fwd, both = M.gluon_model(shape, H100, "fwd"), M.gluon_model(shape, H100, "fwd+bwd")
    rate, clock = M.peak_matmul_rate(H100, "bf16"), gpu.clock_hz(H100)  # the backward's multiplies at the peak
    bwd = B.fa3_backward(shape, rate, H100.ceilings.copy_tbps * 1e12, H100.sm_count, clock)
    assert both["predicted_ms"] == pytest.approx(fwd["predicted_ms"] + bwd["s"] * 1e3)
    assert rate == H100.datasheet.matmul_tflops("bf16") * 1e12 > M.matmul_rate(H100, "bf16")
    assert both["predicted_peak_bytes"] == B.peak_bytes(shape) == M.point_peak_bytes(M.GLUON_IMPL, shape, "fwd+bwd")
    assert M.point_peak_bytes(M.GLUON_IMPL, shape, "fwd") == shape.q_bytes


def test_the_rung_predicts_both_passes_on_hopper_only():
    params = M.Params(seq_lens=(2048,), head_dims=(64, 128), masks=("full",), impls=(M.GLUON_IMPL,))
    rows = M.predict(params, H100)
    assert sorted((r["head_dim"], r["mode"]) for r in rows) == [(64, "fwd"), (64, "fwd+bwd"), (128, "fwd"),
                                                                  (128, "fwd+bwd")]
    assert M.predict(params, A100) == []
