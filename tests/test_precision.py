"""The precision lab: ReLU in every dtype and the accumulation kernel against float64 (interpreter on
CPU), the byte model, the rounding model, the matmul chart's data, the page."""

import json
import math
import time
from pathlib import Path

import pytest
import torch

from labs.engine import timing
from labs.engine import gpu
from labs.engine import runner
from labs.engine.params import ParamError
from labs.precision import LAB, Params
from labs.precision.kernels import dot_accumulate, relu
from labs.precision.measure import dot_emulated, dot_reference, relu_reference
from labs.precision.model import accumulation_error, matmul_rates, predict, time_ratios

ROOT = Path(__file__).resolve().parent.parent
H200 = gpu.datasheet_target(gpu.datasheet_by_name("H200"))


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "fp8"])
@pytest.mark.parametrize("n", [1, 4097, 20011])
def test_relu_matches_float64_exactly(device, dtype, n):
    x = timing.random_tensor((n,), dtype, device)
    out = torch.full_like(x, float("nan"))
    relu(x, out)
    assert timing.check_close(out, relu_reference(x), dtype, "ReLU", tol=0.0) == 0.0


@pytest.mark.parametrize("acc", ["fp32", "bf16", "fp16"])
def test_accumulation_kernel_rounds_like_step_by_step_torch(device, acc):
    gen = torch.Generator(device=device).manual_seed(1)
    a = timing.random_tensor((131, 150), "bf16", device, gen)
    b = timing.random_tensor((150,), "bf16", device, gen)
    out = torch.full((131,), float("nan"), device=device)
    dot_accumulate(a, b, acc, out)
    assert timing.rel_error(out, dot_emulated(a, b, acc)) == 0.0  # bit for bit
    if acc == "fp32":
        timing.check_close(out, dot_reference(a, b), "fp32", "fp32 accumulation")


def test_rounding_model_by_hand():
    # bf16 keeps 8 significant bits: u = 2^-8; rms rounding 0.4247 u; K = 4096 -> 0.4247 * 2^-8 * sqrt(2048)
    assert accumulation_error(4096, "bf16") == pytest.approx(0.4247 * 2**-8 * math.sqrt(2048), rel=1e-3)
    assert accumulation_error(4096, "bf16") / accumulation_error(1024, "bf16") == pytest.approx(2.0)
    assert accumulation_error(4096, "bf16") / accumulation_error(4096, "fp32") == 2**16


def test_rounding_model_matches_simulation_for_16_bit_accumulators():
    gen = torch.Generator().manual_seed(0)
    a = timing.random_tensor((512, 1024), "bf16", "cpu", gen)
    b = timing.random_tensor((1024,), "bf16", "cpu", gen)
    for acc in ("bf16", "fp16"):
        measured = timing.rel_error(dot_emulated(a, b, acc), dot_reference(a, b))
        assert measured == pytest.approx(accumulation_error(1024, acc), rel=0.15)


def test_byte_model_halves_time_with_half_the_bytes():
    rows = {r["dtype"]: r for r in predict(Params(), H200) if r["experiment"] == "relu"}
    assert rows["fp32"]["predicted_ms"] == pytest.approx(2 * rows["bf16"]["predicted_ms"])
    assert rows["bf16"]["predicted_ms"] == pytest.approx(2 * rows["fp8"]["predicted_ms"])
    assert rows["fp32"]["bytes_per_flop"] == 8 and rows["fp8"]["bytes_per_flop"] == 2
    # 256e6 fp32 elements read and written: 2.048 GB at the calibrated bandwidth
    assert rows["fp32"]["predicted_ms"] == pytest.approx(2.048e9 / (H200.ceilings.copy_tbps * 1e12) * 1e3)


def test_fp8_is_left_out_where_unsupported():
    a100 = gpu.datasheet_target(gpu.datasheet_by_name("A100 80GB"))  # compute capability 8.0
    assert "fp8" not in {r["dtype"] for r in predict(Params(), a100) if r["experiment"] == "relu"}
    LAB.check(Params(), a100)  # the defaults run: fp8 is skipped with a note (measure_relu)
    with pytest.raises(ParamError, match="fp8"):  # fp8 alone has nothing to run
        LAB.check(Params(dtypes=("fp8",)), a100)
    from labs.precision.measure import measure_relu

    note = next(measure_relu(Params(dtypes=("fp8",)), a100, lambda f, m: None, 1))  # before any GPU work
    assert isinstance(note, str) and "fp8 skipped" in note and "8.0" in note


def test_time_ratios_compare_with_byte_ratios():
    rows = [{"experiment": "relu", "dtype": "fp32", "measured_ms": 1.0},
            {"experiment": "relu", "dtype": "bf16", "measured_ms": 0.55}]
    (r,) = time_ratios(rows)
    assert r["byte_ratio"] == 2 and r["measured_time_ratio"] == pytest.approx(1 / 0.55)


def test_matmul_rates_come_from_the_calibration():
    rows = {r["dtype"]: r for r in matmul_rates(H200)}
    assert rows["bf16"]["calibrated_tflops"] == H200.ceilings.matmul_tflops["bf16"]
    assert rows["bf16"]["datasheet_tflops"] == 989.4
    assert rows["bf16"]["speedup_vs_fp32"] > 5


def test_model_run_without_a_gpu():
    result = runner.model(LAB, Params(dtypes=("fp32",), dot_lengths=(64,)), H200)
    assert [(r["experiment"], r["dtype"]) for r in result.rows] == [("relu", "fp32"), ("accumulation", "fp32"),
                                                                    ("accumulation", "bf16")]


@pytest.mark.gpu
def test_live_run_time_follows_bytes():
    result = runner.run(LAB, Params(dtypes=("fp32", "bf16"), elements_m=128, dot_lengths=(256,)), use_cache=False)
    (ratio,) = time_ratios(result.rows)
    assert abs(ratio["error_pct"]) < 15


def test_page_renders_fast_without_a_gpu():
    AppTest = pytest.importorskip("streamlit.testing.v1").AppTest  # the GPU image has no streamlit
    pytest.importorskip("plotly")

    at = AppTest.from_file(str(ROOT / "pages" / "precision.py"), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    started = time.perf_counter()
    at.run()
    assert time.perf_counter() - started < 1.0
    assert at.title[0].value == "Lower precision"
    figures = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert figures[0]["data"][0]["x"] == ["fp32", "bf16", "fp16", "fp8"]
    matmul = figures[1]
    assert matmul["layout"]["yaxis"]["title"]["text"] == "TFLOP/s" and "bf16" in matmul["data"][0]["x"]
    at.button(key="precision.cpu_run").click().run()  # the accumulation example on the CPU
    assert not at.exception and at.dataframe
