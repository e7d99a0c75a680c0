"""Training memory: the calculator against the ZeRO paper's published figures and hand counts, the activation
count against what autograd really saves (CPU), the gradients against float64, the page, and the GPU check."""

import dataclasses

import pytest
import torch

from tests.conftest import render_page
from labs import memcalc
from labs.engine import gpu
from labs import trainmem as t
from labs.trainmem import kernels, measure, model


def test_zero_stages_reproduce_the_papers_7_5b_figures():
    # ZeRO (Rajbhandari et al., 2019), Figure 1: 7.5 B parameters, Adam in mixed precision (K = 12), 64 GPUs:
    # 120 GB, 31.4 GB, 16.6 GB and 1.88 GB of model states per GPU
    totals = [row["total_bytes"] / 1e9 for row in model.zero_table(7.5e9, "bf16", 64)]
    assert totals == pytest.approx([120, 31.4, 16.6, 1.88], abs=0.05)


def test_16_bytes_per_parameter_and_the_6x_rule():
    seven = memcalc.MemParams.from_preset("Llama 2 7B", params_b=7.0)
    e = model.estimate(dataclasses.replace(seven, batch=1, context=1))
    states = sum(v for k, v in e.parts.items() if k != "activations")
    assert states == pytest.approx(7e9 * 16)  # 2 + 2 + 4 + 8 bytes per parameter: 112 GB
    assert e.rule_bytes == pytest.approx(6 * 7e9 * 2)  # the rule: 84 GB, below even the model states


def test_sharding_divides_only_what_each_stage_shards():
    s1 = model.model_state_bytes(1e9, "bf16", 1, 4)
    assert s1["weights"] == 2e9 and s1["gradients"] == 2e9 and s1["Adam moments (fp32)"] == 2e9
    s3 = model.model_state_bytes(1e9, "bf16", 3, 4)
    assert s3["weights"] == 0.5e9 and s3["fp32 master weights"] == 1e9
    assert model.model_state_bytes(1e9, "fp32", 0, 1)["fp32 master weights"] == 0


def test_checkpointing_keeps_only_block_inputs():
    full = memcalc.activation_parts(4096, 1024, 14336, 32, 32000, 32, False)
    ckpt = memcalc.activation_parts(4096, 1024, 14336, 32, 32000, 32, True)
    assert ckpt["blocks"] == 32 * 4096 * 2
    assert full["blocks"] == 32 * ((9 * 4096 + 2 * 1024 + 4 * 14336) * 2 + 4 + 4 * 32)


def test_activation_count_is_what_autograd_saves():
    """Every tensor autograd keeps for backward, by storage, on CPU: the model's count to the byte."""
    p = t.Params(seq=40, n_layers=2, d_model=64, n_heads=4, d_ff=96, vocab=128)
    model = kernels.make_model(p, "cpu")
    params = {w.untyped_storage().data_ptr() for w in kernels.parameters(model)}
    ids, targets = measure.batch_data(p, 3, "cpu", 0)
    for ckpt in (False, True):
        saved = {}

        def pack(x):
            ptr = x.untyped_storage().data_ptr()
            if ptr not in params:
                saved[ptr] = x.untyped_storage().nbytes()
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            loss = kernels.loss_of(model, ids, targets, p.n_heads, ckpt)
        predicted = 3 * p.seq * sum(memcalc.activation_parts(64, 64, 96, 2, 128, 4, ckpt).values())
        assert sum(saved.values()) == pytest.approx(predicted, abs=16)  # the loss scalar
        del loss


def test_training_step_gradients_match_float64():
    assert measure.check_training(t.Params(), "cpu") < 5e-2


def test_adam_moves_the_weights_and_frees_the_gradients():
    p = t.Params(seq=16, n_layers=1, d_model=32, n_heads=2, d_ff=48, vocab=64)
    model = kernels.make_model(p, "cpu")
    opt = kernels.MixedPrecisionAdam(kernels.parameters(model))
    ids, targets = measure.batch_data(p, 2, "cpu", 0)
    before = model["head"].detach().clone()
    kernels.loss_of(model, ids, targets, p.n_heads, False).backward()
    opt.step()
    assert all(w.grad is None for w in kernels.parameters(model))
    assert not torch.equal(before, model["head"].detach())


def test_step_model_peak_lies_between_parts_and_sum():
    p = t.Params()
    for batch, ckpt in ((1, False), (16, False), (16, True)):
        m = model.step_model(p, batch, ckpt)
        assert m["state_bytes"] + m["activation_bytes"] <= m["peak_bytes"]
        assert m["state_bytes"] == pytest.approx(m["params"] * 14)


def test_page_renders_without_a_gpu():
    at = render_page("trainmem.py")
    assert "Training memory" in at.title[0].value
    assert len(at.metric) >= 3


@pytest.mark.gpu
def test_real_step_within_10_percent_of_the_model():
    from labs.engine import runner

    result = runner.run(t.LAB, t.Params(batch=(1, 4)), use_cache=False)
    for r in result.rows:
        assert abs(r["error_pct"]) < 10, r
