"""The fusion lab: kernels against float64 (Triton's interpreter on CPU), the model by hand, the page."""

import math
import time

import pytest
import torch

from labs.fusion import LAB, Params
from labs.fusion.kernels import (A, B, affine_chain, chain_eager, online_softmax, sin2_cos2, sincos_eager,
                                 softmax_config, softmax_decomposed)
from labs.fusion.measure import check, measure, reference_chain, reference_sincos, reference_softmax, try_compile
from labs.fusion.model import (SINCOS, chain_ridge_ops, decomposed_softmax_ms, lesson_numbers, predict, repredict,
                               softmax_shape, torch_softmax_moves, with_host_floor, with_softmax_probes)
from labs.fusion.profiling import back_to_back_ms, launched_kernels, short_kernel_name, summarize_kernels
from labs.engine import timing
from labs.engine import runner
from labs.engine.gpu import MiB, Ceilings, Target, live_target
from labs.engine.lab import noop_progress
from labs.engine.params import ParamError, from_strings

# A made-up GPU with round numbers, so the model can be checked by hand.
ROUND = Target("round GPU", "round-gpu", 100, 50_000_000, 80 * 10**9, "9.0",
               Ceilings(copy_tbps=4.0, fma_tflops=64.0), None, live=False)


# --- kernels (interpreter on CPU, the real thing on a GPU) -------------------------------------------
@pytest.mark.parametrize("b", [1.0, -1.0])  # b = -1 gives -cos 2x: a kernel that just wrote 1.0 would fail
def test_sin2_cos2_kernel_matches_float64(device, b):
    x = torch.randn(5003, device=device) * 3
    out = torch.full_like(x, float("nan"))
    sin2_cos2(x, b, out)
    timing.check_close(out, reference_sincos(x, b), "fp32", "fused sin^2 + b cos^2")


def test_sincos_identity_holds_in_every_version(device):
    x = torch.randn(1001, device=device)
    ones = torch.ones(1001, dtype=torch.float64)
    timing.check_close(sin2_cos2(x), ones, "fp32", "triton")
    timing.check_close(sincos_eager(x), ones, "fp32", "eager")


@pytest.mark.parametrize("ops", [1, 2, 7, 8, 19])  # below, at and across the unroll factor of 8
def test_chain_kernel_and_eager_match_float64(device, ops):
    x = torch.randn(4097, device=device)
    ref = reference_chain(x, ops)
    out = torch.full_like(x, float("nan"))
    timing.check_close(affine_chain(x, ops, out), ref, "fp32", f"fused chain of {ops}")
    timing.check_close(chain_eager(x, ops), ref, "fp32", f"eager chain of {ops}")


def test_chain_reference_is_the_recurrence():
    x = torch.randn(11, dtype=torch.float64)
    y = x.clone()
    for _ in range(5):
        y = A * y + B
    assert torch.allclose(reference_chain(x, 5), y)


@pytest.mark.parametrize("n_cols", [1, 7, 100, 1025])
def test_online_softmax_rows_in_registers(device, n_cols):
    x = torch.randn(3, n_cols, device=device) * 4
    out = torch.full_like(x, float("nan"))
    online_softmax(x, out)
    timing.check_close(out, reference_softmax(x), "fp32", f"softmax, {n_cols} columns")


@pytest.mark.parametrize("n_cols", [65, 100, 257])
def test_online_softmax_streams_long_rows(device, n_cols):
    # chunks of 32 columns: the online max and sum, the rescaling and the masked last chunk all run
    assert softmax_config(n_cols, row_max=64, chunk=32)[1] > 1
    x = torch.randn(4, n_cols, device=device) * 6
    x[1, -1] = 40.0  # the row's max in the last, partly masked chunk: earlier sums must be rescaled
    x[2, 0] = 40.0  # ... and in the first
    out = torch.full_like(x, float("nan"))
    online_softmax(x, out, row_max=64, chunk=32)
    timing.check_close(out, reference_softmax(x), "fp32", f"streamed softmax, {n_cols} columns")


def test_decomposed_softmax_matches_float64(device):
    x = torch.randn(5, 333, device=device)
    timing.check_close(softmax_decomposed(x), reference_softmax(x), "fp32", "decomposed")


# --- counting kernels ----------------------------------------------------------------------------
def test_profiler_counts_the_models_eager_kernels(device):
    x = torch.randn(1001, device=device)
    kernels = launched_kernels(lambda: sincos_eager(x))
    assert len(kernels) == SINCOS["eager"][0] == 5
    names = [short_kernel_name(name) for name, _ in kernels]
    assert "sin" in names[0] and "pow" in names[1] and "cos" in names[2] and "add" in names[4], names
    assert all(us > 0 for _, us in kernels)
    assert len(launched_kernels(lambda: chain_eager(x, 6))) == 6


# kernel names as torch.profiler reported them on an H200 (torch 2.11), shortened for the tables
GPU_NAMES = {
    "void at::native::vectorized_elementwise_kernel<4, at::native::sin_kernel_cuda(at::TensorIteratorBase&)::"
    "{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >"
    "(int, at::native::sin_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2})": "vectorized_elementwise_kernel[sin]",
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::pow_tensor_scalar_kernel_impl"
    "<float, float>(at::TensorIteratorBase&, float)::{lambda(float)#1}, std::array<char*, 2ul> >(int)":
        "vectorized_elementwise_kernel[pow_tensor_scalar]",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
    "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)": "vectorized_elementwise_kernel[add]",
    "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
    "at::native::binary_internal::CUDAFunctorOnOther_add<float> >, std::array<char*, 2ul> >(int)":
        "vectorized_elementwise_kernel[add]",
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, float const*)":
        "softmax_warp_forward",
    "triton_poi_fused_add_cos_pow_sin_0": "triton_poi_fused_add_cos_pow_sin_0",
    "Memcpy DtoD (Device -> Device)": "Memcpy DtoD",
}


@pytest.mark.parametrize("full", list(GPU_NAMES))
def test_short_kernel_names(full):
    assert short_kernel_name(full) == GPU_NAMES[full]


def test_kernel_summary_folds_repeats():
    kernels = [("aten::add", 1.0)] * 3 + [("aten::sin", 1500.0)]
    assert summarize_kernels(kernels) == "aten::add x3 (3.0 us), aten::sin 1.50 ms"


def test_torch_compile_failure_becomes_a_reason():
    def data_dependent(x):  # fullgraph=True cannot trace a branch on a tensor's value
        if x.sum() > 0:
            return x * 2
        return x

    start = time.time()
    compiled, reason = try_compile(data_dependent, torch.randn(8))
    assert compiled is None and reason.startswith("torch.compile failed here (")
    assert time.time() - start < 60


# --- the model, checked by hand ----------------------------------------------------------------
def _row(rows, **where):
    (row,) = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    return row


def test_sincos_model_by_hand():
    rows = predict(Params(experiments=("sincos",), sizes_mib=(1024,)), ROUND)
    gib = 2**30
    eager = _row(rows, variant="eager")
    assert eager["bytes_moved"] == 11 * gib and eager["predicted_kernels"] == 5
    assert eager["predicted_ms"] == pytest.approx(11 * gib / 4e12 * 1e3 + 5 * 0.003)  # 2.9528 + 0.015 ms
    for variant in ("triton", "compiled", "copy"):
        assert _row(rows, variant=variant)["predicted_ms"] == pytest.approx(2 * gib / 4e12 * 1e3 + 0.003)
    assert _row(rows, variant="copy")["size_over_l2"] == pytest.approx(gib / 50e6)


def test_chain_model_by_hand():
    rows = predict(Params(experiments=("chain",), chain_ops=(16, 128), chain_mib=256), ROUND)
    n = 256 * MiB // 4
    memory_ms = 8 * n / 4e12 * 1e3  # 0.1342 ms
    # ridge: 64 TFLOP/s / 4 TB/s = 16 FLOP/byte; x 8 bytes per element / 2 FLOPs per op = 64 ops
    assert chain_ridge_ops(ROUND) == pytest.approx(64)
    assert _row(rows, variant="triton", ops=16)["predicted_ms"] == pytest.approx(memory_ms + 0.003)
    assert _row(rows, variant="triton", ops=128)["predicted_ms"] == pytest.approx(2 * n * 128 / 64e12 * 1e3 + 0.003)
    assert _row(rows, variant="triton", ops=128)["bound"] == "compute"
    assert _row(rows, variant="eager", ops=16)["predicted_ms"] == pytest.approx(16 * (memory_ms + 0.003))


def test_softmax_model_by_hand():
    rows = predict(Params(experiments=("softmax",), softmax_cols=(4096,), softmax_mib=256), ROUND)
    size = 256 * MiB
    assert softmax_shape(Params(softmax_mib=256), 4096) == (16384, 4096)
    assert _row(rows, variant="eager_decomposed")["predicted_ms"] == pytest.approx(8 * size / 4e12 * 1e3 + 0.015)
    assert _row(rows, variant="triton_online")["predicted_ms"] == pytest.approx(2 * size / 4e12 * 1e3 + 0.003)


def test_torch_softmax_charges_three_reads_past_the_shared_memory_limit():
    # (48 KiB - 32 warps x 4 bytes of reduction scratch) / 4 bytes = 12256 fp32 columns fit on chip
    assert torch_softmax_moves(12255) == 2
    assert torch_softmax_moves(12256) == 4
    assert torch_softmax_moves(16384, element_bytes=2) == 2  # 32 KiB of bf16 still fits
    rows = predict(Params(experiments=("softmax",), softmax_cols=(4096, 65536), softmax_mib=256), ROUND)
    size = 256 * MiB  # 0.0671 ms per trip at 4 TB/s, + 3 us launch
    on_chip = [r for r in rows if r["variant"] == "torch_softmax" and r["n_cols"] == 4096][0]
    streamed = [r for r in rows if r["variant"] == "torch_softmax" and r["n_cols"] == 65536][0]
    assert on_chip["predicted_ms"] == pytest.approx(2 * size / 4e12 * 1e3 + 0.003)
    assert streamed["predicted_ms"] == pytest.approx(4 * size / 4e12 * 1e3 + 0.003)
    assert streamed["bytes_moved"] == 4 * size


def test_default_prediction_rows_have_unique_keys():
    rows = predict(Params(), ROUND)
    keys = [tuple(r[k] for k in LAB.key) for r in rows]
    assert len(keys) == len(set(keys)) == 6 * 4 + 2 * 9 + 5 * 3
    assert all(math.isfinite(r["predicted_ms"]) and r["predicted_ms"] > 0 for r in rows)
    headline = runner.model(LAB, Params(), ROUND)
    assert LAB.headline.answer(headline.rows)[1] == pytest.approx(11 * 2**30 / 4e12 * 1e3 + 0.015)


def test_bad_input_is_refused_in_words():
    with pytest.raises(ParamError, match="chain_ops"):
        from_strings(Params, {"chain_ops": "0"})
    with pytest.raises(ParamError, match="experiments"):
        from_strings(Params, {"experiments": "sincos,matmul"})
    small = Target("small", "small", 10, 4 * MiB, 4 * 10**9, "8.0", Ceilings(1.0, 10.0), None, live=False)
    with pytest.raises(ParamError, match="GB free"):
        check(Params(sizes_mib=(1024,)), small)
    check(Params(experiments=("softmax",), softmax_mib=64), small)  # fits


def test_lesson_numbers_fill_the_lesson():
    import re
    from pathlib import Path

    numbers = lesson_numbers(ROUND)
    text = (Path(__file__).resolve().parent.parent / "content" / "labs" / "fusion.md").read_text()
    wanted = set(re.findall(r"\{\{(\w+)\}\}", text))
    assert wanted and wanted <= set(numbers)
    assert numbers["ridge_ops"] == "64"


def test_host_floor_takes_the_larger_of_gpu_and_cpu_time():
    row = {"experiment": "sincos", "variant": "compiled", "size_mib": 64}
    slow_host = with_host_floor(row, 2e8, 2e8, 1, gpu_ms=0.05, host_ms=0.07, target=ROUND)
    assert slow_host["predicted_ms"] == 0.07 and slow_host["limited_by"] == "host"
    assert slow_host["gpu_model_ms"] == 0.05 and slow_host["host_ms"] == 0.07
    slow_gpu = with_host_floor(row, 2e8, 2e8, 1, gpu_ms=0.5, host_ms=0.07, target=ROUND)
    assert slow_gpu["predicted_ms"] == 0.5 and slow_gpu["limited_by"] == "GPU"
    assert slow_gpu["predicted_tbps"] == pytest.approx(2e8 / 0.5e-3 / 1e12)


def test_back_to_back_times_wall_and_cpu_in_the_same_calls():
    calls = []

    def slow_call():  # a call whose CPU side is 1 ms: the loop's time is the CPU's, and both see it
        calls.append(None)
        time.sleep(0.001)

    wall_ms, host_ms = back_to_back_ms(slow_call, budget_ms=10, batches=3, warmup_ms=0)
    assert 1.0 <= host_ms <= wall_ms < 3.0
    # a 10 ms budget over 3 batches would leave one call per batch; the floor of min_reps keeps a loop's rate
    assert len(calls) >= 1 + 3 + 3 * 8
    import gc

    assert gc.isenabled()  # paused only while the batches run


# --- on a GPU: the whole lab on small sizes -------------------------------------------------------
@pytest.mark.gpu
def test_measure_small_run_on_gpu():
    params = Params(sizes_mib=(1, 64), compile=False, chain_ops=(1, 3), chain_mib=8,
                           softmax_cols=(1000, 20000), softmax_mib=16)
    rows = list(measure(params, live_target(), noop_progress))
    assert len(rows) == 2 * 3 + 2 * 2 + 2 * 3
    assert all(r["measured_ms"] > 0 for r in rows)
    eager = [r for r in rows if r["experiment"] == "sincos" and r["variant"] == "eager"]
    assert all(r["measured_kernels"] == 5 for r in eager)
    chain = [r for r in rows if r["experiment"] == "chain" and r["variant"] == "eager"]
    assert [r["measured_kernels"] for r in chain] == [1, 3]
    # the CPU's share is measured for every point, and a launch-bound 1 MiB point is limited by it
    sincos = [r for r in rows if r["experiment"] == "sincos"]
    assert all(r["host_ms"] > 0 and r["limited_by"] in ("host", "GPU") for r in sincos)
    small = [r for r in sincos if r["size_mib"] == 1]
    assert any(r["limited_by"] == "host" for r in small)
    # the written-out softmax is predicted from its kernels' rates, probed in the run
    written_out = [r for r in rows if r["variant"] == "eager_decomposed"]
    assert all(0 < r["broadcast_probe_tbps"] and 0 < r["reduce_probe_tbps"] for r in written_out)


# --- the page -------------------------------------------------------------------------------------
def _open_page():
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "pages" / "fusion.py"), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_page_renders_fast_and_shows_every_experiment():
    at = _open_page()
    started = time.perf_counter()
    at.run()
    assert time.perf_counter() - started < 1.0
    assert not at.exception
    assert at.title[0].value == "Kernel fusion"
    spec = at.get("plotly_chart")[0].proto.spec
    assert "model, eager" in spec and "model, triton" in spec and "L2" in spec
    assert any("The CPU's share" in m.value or "launch" in m.value for m in at.markdown)
    for view, expected in (("A chain of k operations", "ridge: k ="), ("Online softmax", "copy bandwidth")):
        at.radio(key="fusion_view").set_value(view).run()
        assert not at.exception
        assert expected in at.get("plotly_chart")[0].proto.spec
    assert any("Where the softmax models miss" in m.value or "broadcast" in m.value for m in at.markdown)


def test_page_reports_bad_parameters_in_words():
    at = _open_page()
    at.text_input(key="fusion.chain_ops").set_value("1,0").run()
    assert not at.exception
    assert any("chain_ops" in e.value.replace("\\", "") and "out of range" in e.value for e in at.error)


def test_repredict_keeps_the_recorded_host_time_and_re_predicts_the_rest():
    """Offline, a sin^2 + cos^2 point is the larger of the model's GPU time and the host time its run measured."""
    recording = {"params": {"experiments": ["sincos"], "sizes_mib": [1, 1024], "compile": False},
                 "rows": [{"experiment": "sincos", "variant": "eager", "size_mib": 1, "host_ms": 0.5},
                          {"experiment": "sincos", "variant": "eager", "size_mib": 1024, "host_ms": 0.01}]}
    rows = {(r["variant"], r["size_mib"]): r for r in repredict(recording, ROUND)}
    model = {(r["variant"], r["size_mib"]): r for r in predict(
        Params(experiments=("sincos",), sizes_mib=(1, 1024), compile=False), ROUND)}
    assert rows[("eager", 1)]["predicted_ms"] == 0.5 and rows[("eager", 1)]["limited_by"] == "host"
    assert rows[("eager", 1024)]["predicted_ms"] == pytest.approx(model[("eager", 1024)]["predicted_ms"])
    assert rows[("eager", 1024)]["limited_by"] == "GPU"
    assert rows[("triton", 1)]["predicted_ms"] == model[("triton", 1)]["predicted_ms"]  # no host time recorded


def test_written_out_softmax_charges_each_pass_at_its_probed_rate_by_hand():
    size = 256 * MiB  # ROUND copies at 4 TB/s
    # reductions at 2 TB/s (2 reads), broadcasts at 1 TB/s (2 x (read + write)), exp at the copy rate (read + write)
    expected = 2 * size / 2e12 * 1e3 + 4 * size / 1e12 * 1e3 + 2 * size / 4e12 * 1e3 + 5 * 0.003
    assert decomposed_softmax_ms(size, ROUND, reduce_tbps=2.0, broadcast_tbps=1.0) == pytest.approx(expected)
    # at the copy rate everywhere it is the bytes model of predict()
    rows = predict(Params(experiments=("softmax",), softmax_cols=(4096,), softmax_mib=256), ROUND)
    assert decomposed_softmax_ms(size, ROUND, 4.0, 4.0) == pytest.approx(
        _row(rows, variant="eager_decomposed")["predicted_ms"])
    row = with_softmax_probes({"variant": "eager_decomposed"}, size,
                                     {"reduce_probe_tbps": 2.0, "broadcast_probe_tbps": 1.0}, ROUND)
    assert row["predicted_ms"] == pytest.approx(expected) and row["broadcast_probe_tbps"] == 1.0
    assert row["bytes_moved"] == 8 * size and row["predicted_kernels"] == 5


def test_repredict_uses_the_recorded_softmax_probes():
    params = {"experiments": ["softmax"], "softmax_cols": [4096, 16384], "softmax_mib": 256}
    recording = {"params": params,
                 "rows": [{"experiment": "softmax", "variant": "eager_decomposed", "size_mib": 256, "n_cols": 4096,
                           "reduce_probe_tbps": 2.0, "broadcast_probe_tbps": 1.0}]}  # 16384: no probes recorded
    rows = {(r["variant"], r["n_cols"]): r for r in repredict(recording, ROUND)}
    assert rows[("eager_decomposed", 4096)]["predicted_ms"] == pytest.approx(
        decomposed_softmax_ms(256 * MiB, ROUND, 2.0, 1.0))
    bytes_only = 8 * 256 * MiB / 4e12 * 1e3 + 0.015
    assert rows[("eager_decomposed", 16384)]["predicted_ms"] == pytest.approx(bytes_only)
    assert rows[("torch_softmax", 4096)]["predicted_ms"] == pytest.approx(2 * 256 * MiB / 4e12 * 1e3 + 0.003)
