"""The roofline lab: kernel against float64 (interpreter on CPU, compiled on GPU), model, run."""

import pytest
import torch

from labs.engine import timing
from labs.engine import gpu
from labs.engine import runner
from labs.engine.params import ParamError
from labs.roofline import LAB, Params
from labs.roofline.kernels import fma_chain
from labs.roofline.measure import reference
from labs.roofline.model import attainable_tflops, intensity, predict, roof_curve


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("n", [1, 1023, 4097])
@pytest.mark.parametrize("flops", [1, 2, 3, 16, 17, 34])
def test_kernel_matches_float64_on_odd_sizes(device, dtype, n, flops):
    x = timing.random_tensor((n,), dtype, device)
    out = torch.full_like(x, float("nan"))  # any element left unwritten fails the check
    fma_chain(x, flops, out)
    timing.check_close(out, reference(x, flops), dtype, "FMA chain")


def test_kernel_check_catches_a_wrong_answer(device):
    x = timing.random_tensor((1000,), "fp32", device)
    with pytest.raises(timing.KernelMismatch):
        timing.check_close(fma_chain(x, 3), reference(x, 2), "fp32", "wrong F")


def test_intensity_counts_one_read_and_one_write():
    assert intensity("fp32", 1) == 1 / 8
    assert intensity("bf16", 1) == 1 / 4
    assert intensity("fp32", 8192) == 1024


def test_roofline_model_has_two_regimes_and_a_ridge():
    target = gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM"))
    bw, peak = target.ceilings.copy_tbps, target.ceilings.fma_tflops
    assert attainable_tflops(1 / 8, target) == pytest.approx(bw / 8)
    assert attainable_tflops(1e4, target) == pytest.approx(peak)
    assert attainable_tflops(target.ridge_flop_per_byte, target) == pytest.approx(peak)
    curve = roof_curve(target)
    assert all(a["tflops"] <= b["tflops"] for a, b in zip(curve, curve[1:]))


def test_predict_covers_every_point_and_labels_the_bound():
    target = gpu.datasheet_target(gpu.datasheet_by_name("A100 80GB"))
    rows = predict(Params(), target)
    assert len(rows) == 2 * 14
    low, high = rows[0], rows[13]
    assert low["bound"] == "memory" and high["bound"] == "compute"
    # memory-bound time is bytes / bandwidth: 1 GiB read + 1 GiB written
    assert low["predicted_ms"] == pytest.approx(2 * 2**30 / (target.ceilings.copy_tbps * 1e12) * 1e3)


def test_check_refuses_buffers_that_do_not_fit():
    target = gpu.datasheet_target(gpu.datasheet_by_name("T4"))  # 16 GB
    with pytest.raises(ParamError, match="needs 21.5 GB"):
        LAB.check(Params(size_mib=10240), target)


def test_model_run_works_without_a_gpu():
    result = runner.model(LAB, Params(dtypes=("fp32",), flops_per_element=(1, 4096)),
                          gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM")))
    assert result.kind == "model" and [r["flops_per_element"] for r in result.rows] == [1, 4096]


def test_headline_is_answered_by_the_default_sweep():
    rows = predict(Params(), gpu.datasheet_target(gpu.datasheet_by_name("H200")))
    measured, predicted = LAB.headline.answer(rows)
    assert measured is None and predicted > 0


@pytest.mark.gpu
def test_live_run_on_the_gpu_is_checked_and_close_to_the_model():
    result = runner.run(LAB, Params(dtypes=("fp32",), flops_per_element=(1, 8192), size_mib=256), use_cache=False)
    low, high = result.rows
    assert abs(low["error_pct"]) < 25 and abs(high["error_pct"]) < 25
    assert low["check_rel_error"] < 1e-5
