"""The recomputation lab: forward and backward against float64 autograd, the model by hand, the page."""

import pytest
import torch

from labs import recompute
from labs.recompute import kernels, measure, model
from labs.engine import timing
from labs.engine import runner
from labs.engine.gpu import MiB, Ceilings, Target, live_target
from labs.engine.lab import noop_progress
from labs.engine.params import ParamError

ROUND = Target("round GPU", "round-gpu", 100, 50_000_000, 80 * 10**9, "9.0",
               Ceilings(copy_tbps=4.0, fma_tflops=64.0), None, live=False)


# --- kernels and gradients ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp64", "fp32", "bf16"])
def test_every_kernel_and_version_matches_float64_autograd(device, dtype):
    # forward and backward kernels with NaN-poisoned outputs, stored s1/s2, and all three versions
    # end to end, each against autograd in float64, at the dtype's tolerance (1e-12 in fp64)
    assert measure.check_kernels(dtype, device, n=4099) <= timing.TOLERANCE[dtype]


@pytest.mark.parametrize("recompute_in_backward", [False, True])
def test_gradcheck_against_finite_differences(device, recompute_in_backward):
    x = torch.randn(13, dtype=torch.float64, device=device, requires_grad=True)
    fn = lambda t: kernels.StackedSigmoids.apply(t, recompute_in_backward)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-8)


def _saved_for_backward(variant: str, x: torch.Tensor) -> list:
    """The tensors autograd packs for the backward pass during one forward call of a version."""
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        kernels.VARIANTS[variant](x)
    return packed


def test_what_each_version_saves_for_backward(device):
    x = torch.randn(1001, device=device, requires_grad=True)
    stored = _saved_for_backward("stored", x)
    assert len(stored) == 2 and all(t.data_ptr() != x.data_ptr() for t in stored)  # s1 and s2: new memory
    (kept,) = _saved_for_backward("recomputed", x)
    assert kept.data_ptr() == x.data_ptr()  # only the input, which exists anyway
    assert len(_saved_for_backward("autograd", x)) == 3  # each sigmoid keeps its output: s1, s2 and out


def test_each_version_marks_its_launches_in_the_order_the_model_reads_them(device):
    # ours: after the forward launch, at the forward pass's end, after the backward launch (+ the step's own
    # last mark: 4, as launch_times_ms unpacks them); autograd's launches happen inside PyTorch: 1 (+ 1)
    x = torch.randn(4099, device=device, requires_grad=True)
    for variant, marks in (("stored", 3), ("recomputed", 3), ("autograd", 1)):
        calls = []
        out, dx = kernels.forward_backward(kernels.VARIANTS[variant], x, torch.ones_like(x),
                                             lambda: calls.append(len(calls)))
        assert len(calls) == marks and dx.shape == x.shape
        launches, _, _ = model.launch_times_ms(variant, [float(i) for i in range(marks + 1)])
        assert len(launches) == len(model.KERNELS[variant])


def test_gradient_does_not_accumulate_into_x(device):
    x = torch.randn(100, device=device, requires_grad=True)
    kernels.forward_backward(kernels.VARIANTS["recomputed"], x, torch.ones_like(x))
    assert x.grad is None


# --- the model, by hand ------------------------------------------------------------------------------
def test_model_by_hand():
    rows = model.predict(recompute.Params(dtypes=("fp32",), sizes_mib=(1024,)), ROUND)
    by = {r["variant"]: r for r in rows}
    access_ms = 2**30 / 4e12 * 1e3  # one pass over 1 GiB at 4 TB/s: 0.2684 ms
    assert by["stored"]["accesses"] == 8 and by["recomputed"]["accesses"] == 5 and by["autograd"]["accesses"] == 15
    assert by["stored"]["predicted_ms"] == pytest.approx(8 * access_ms + 2 * 0.003)
    assert by["recomputed"]["predicted_ms"] == pytest.approx(5 * access_ms + 2 * 0.003)
    assert by["autograd"]["predicted_ms"] == pytest.approx(15 * access_ms + 6 * 0.003)
    assert by["recomputed"]["predicted_speedup"] == pytest.approx((8 * access_ms + 0.006) / (5 * access_ms + 0.006))
    assert by["recomputed"]["predicted_speedup"] == pytest.approx(8 / 5, rel=0.01)
    assert by["stored"]["predicted_activation_bytes"] == 2 * 2**30
    assert by["recomputed"]["predicted_activation_bytes"] == 0
    assert {r["bound"] for r in rows} == {"memory"}


def test_model_by_hand_bf16_meets_the_special_function_units():
    # 64 TFLOP/s = 32e12 FMA/s on 128 FP32 lanes per SM -> 16 SFU lanes: 4e12 exp or reciprocal per second
    assert model.sfu_ops_per_s(ROUND) == pytest.approx(4e12)
    rows = model.predict(recompute.Params(dtypes=("bf16",), sizes_mib=(1024,)), ROUND)
    by = {r["variant"]: r for r in rows}
    n = 2**30 // 2  # bf16 elements in 1 GiB
    access_ms = 2**30 / 4e12 * 1e3  # 0.2684 ms
    sfu_ms = 3 * 2 * n / 4e12 * 1e3  # three sigmoids, two SFU operations each: 0.8053 ms
    # forward: max(2 accesses = 0.537, 0.805); backward: max(3 accesses = 0.805, 0.805)
    assert by["recomputed"]["predicted_ms"] == pytest.approx(sfu_ms + max(3 * access_ms, sfu_ms) + 0.006)
    assert by["stored"]["predicted_ms"] == pytest.approx(8 * access_ms + 0.006)  # 4 accesses beat 3 or 1 sigmoids
    assert by["recomputed"]["predicted_speedup"] == pytest.approx((8 * access_ms + 0.006) / (2 * sfu_ms + 0.006))
    assert "special functions" in by["recomputed"]["bound"]


def test_headline_and_keys():
    result = runner.model(recompute.LAB, recompute.Params(), ROUND)
    keys = [tuple(r[k] for k in recompute.LAB.key) for r in result.rows]
    assert len(keys) == len(set(keys)) == 2 * 4 * 3
    measured, predicted = recompute.LAB.headline.answer(result.rows)
    assert measured is None and predicted == pytest.approx(1.6, rel=0.01)


def test_too_large_is_refused():
    small = Target("small", "small", 10, 4 * MiB, 8 * 10**9, "8.0", Ceilings(1.0, 10.0), None, live=False)
    with pytest.raises(ParamError, match="Choose sizes <="):
        measure.check(recompute.Params(sizes_mib=(2048,)), small)
    measure.check(recompute.Params(sizes_mib=(512,)), small)


def test_lesson_numbers_fill_the_lesson():
    import re
    from pathlib import Path

    numbers = model.lesson_numbers(ROUND)
    text = (Path(__file__).resolve().parent.parent / "content" / "labs" / "recompute.md").read_text()
    wanted = set(re.findall(r"\{\{(\w+)\}\}", text))
    assert wanted and wanted <= set(numbers)
    assert numbers["speedup"] == "1.60"


# --- on a GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_activation_memory_on_gpu():
    x = timing.random_tensor((64 * MiB // 4,), "fp32").requires_grad_(True)
    stored = measure.activation_bytes(kernels.VARIANTS["stored"], x)
    assert stored == pytest.approx(2 * 64 * MiB, rel=0.01)
    assert measure.activation_bytes(kernels.VARIANTS["recomputed"], x) < MiB


@pytest.mark.gpu
def test_measure_small_run_on_gpu():
    rows = list(measure.measure(recompute.Params(sizes_mib=(8,)), live_target(), noop_progress))
    assert len(rows) == 2 * 3
    assert all(r["measured_ms"] > 0 for r in rows)
    assert [r["measured_speedup"] for r in rows if r["variant"] == "stored"] == [1.0, 1.0]


@pytest.mark.gpu
def test_gpu_and_cpu_times_come_from_the_same_calls():
    import time

    x = timing.random_tensor((MiB,), "fp32")
    ms, host_ms = measure.time_with_host_ms(lambda: x * 2)
    assert 0 < ms < 1 and 0 < host_ms < 1
    # a call whose CPU side sleeps 2 ms: the CPU is the floor, and the events see (most of) it
    ms, host_ms = measure.time_with_host_ms(lambda: (time.sleep(0.002), x * 2), rep_ms=40)
    assert host_ms >= 2.0 and ms > 1.5
    # waiting for the L2-clearing write before the clock starts: a CPU-bound call is timed at its CPU time
    # (without the wait, the CPU may prepare it while the write runs: up to 0.09 ms on an H100)
    ms, host_ms = measure.time_with_host_ms(lambda: (time.sleep(0.0002), x * 2), rep_ms=40, wait_for_flush=True)
    assert host_ms >= 0.2 and abs(ms - host_ms) <= 0.02 + 0.05 * host_ms


@pytest.mark.gpu
def test_step_timer_reads_the_marks_and_its_cpu_window_holds_the_events():
    import time

    x = timing.random_tensor((MiB,), "fp32")

    def step(mark):
        time.sleep(0.0003)  # a CPU-bound "forward pass"
        x.mul_(1.0)
        mark()
        x.add_(0.0)  # the "backward pass": one tiny kernel, whose tail is all the GPU adds after the CPU
        mark()

    timed = measure.time_step(step, rep_ms=40)
    forward_ms, backward_ms = timed["marks_ms"]
    assert 0.3 <= forward_ms < backward_ms < timed["host_ms"]
    assert timed["gpu_ms"] <= timed["host_ms"] + 0.01  # the CPU's window covers what the events see
    assert timed["cycle_ms"] >= timed["host_ms"]  # a cycle of the timer's loop holds the call and the timer's work
    kernels_ms = [0.002, 0.002]  # each tiny kernel a few microseconds: the model is the CPU's time
    step_ms = model.step_ms(kernels_ms, [forward_ms, backward_ms], timed["host_ms"])
    assert step_ms == pytest.approx(timed["host_ms"], rel=0.05) and timed["gpu_ms"] == pytest.approx(step_ms, rel=0.15)


@pytest.mark.gpu
def test_our_versions_read_the_clock_at_each_launch():
    x = timing.random_tensor((MiB,), "fp32").requires_grad_(True)
    dout = timing.random_tensor((MiB,), "fp32")
    for variant, marks in (("stored", 4), ("autograd", 2)):
        timed = measure.time_step(lambda mark, v=variant: (kernels.forward_backward(
            kernels.VARIANTS[v], x, dout, mark), mark()), rep_ms=20)
        assert len(timed["marks_ms"]) == marks and timed["marks_ms"] == sorted(timed["marks_ms"])
        launches, forward_end, backward_end = model.launch_times_ms(variant, timed["marks_ms"])
        assert len(launches) == len(model.KERNELS[variant]) and launches[-1] <= backward_end < timed["host_ms"]


# --- the page -------------------------------------------------------------------------------------
def test_page_renders_fast_without_a_gpu():
    import time
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "pages" / "recompute.py"), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    started = time.perf_counter()
    at.run()
    assert time.perf_counter() - started < 1.0
    assert at.title[0].value == "Recomputation"
    specs = " ".join(c.proto.spec for c in at.get("plotly_chart"))
    assert "model, recomputed" in specs and "Activation memory" in specs
    assert '"y0":1.6' in specs.replace(" ", "")  # the memory-bound model's 8/5 line, named in the caption below
    assert any("memory-bound model" in c.value for c in at.caption)
    at.radio(key="recompute_dtype").set_value("bf16").run()
    assert not at.exception
    assert "(bf16)" in at.get("plotly_chart")[0].proto.spec


def test_step_model_by_hand():
    # kernels launched at 0.1 ms and 0.25 ms of CPU time; the step's last record at 0.32 ms
    assert model.step_ms([0.05, 0.05], [0.1, 0.25], 0.32) == pytest.approx(0.32)  # the CPU's time
    assert model.step_ms([0.05, 0.1], [0.1, 0.25], 0.32) == pytest.approx(0.35)  # last kernel after its launch
    assert model.step_ms([0.5, 0.5], [0.1, 0.25], 0.32) == pytest.approx(1.1)  # GPU-bound after the lead-in


def test_launch_times_are_read_for_ours_and_spread_for_autograd():
    launches, forward_end, backward_end = model.launch_times_ms("recomputed", [0.09, 0.1, 0.25, 0.3])
    assert launches == [0.09, 0.25] and (forward_end, backward_end) == (0.1, 0.3)
    # autograd's three forward and three backward launches: each at the end of its third of its pass
    launches, _, _ = model.launch_times_ms("autograd", [0.3, 0.6])
    assert launches == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    row = model.with_step_model({}, "stored", 64 * MiB, "fp32", 0.5, [0.15, 0.2, 0.4, 0.45], ROUND)
    kernels_ms = [model.kernel_ms(a, s, 64 * MiB, "fp32", ROUND)[0] for a, s in model.KERNELS["stored"]]
    assert row["predicted_ms"] == pytest.approx(max(0.5, max(0.15 + kernels_ms[0], 0.4) + kernels_ms[1]))
    assert row["host_forward_launch_ms"] == 0.15 and row["gpu_model_ms"] == pytest.approx(sum(kernels_ms))
    # what a recording keeps is enough to predict it again offline (scripts/repredict.py)
    recording = {"params": {"dtypes": ["fp32"], "sizes_mib": [64]}, "rows": [
        {**row, "dtype": "fp32", "size_mib": 64, "variant": "stored"},
        {**model.with_step_model({}, "autograd", 64 * MiB, "fp32", 0.3, [0.1, 0.25], ROUND), "dtype": "fp32",
         "size_mib": 64, "variant": "autograd"}]}
    again = {r["variant"]: r for r in model.repredict(recording, ROUND)}
    assert again["stored"]["predicted_ms"] == pytest.approx(row["predicted_ms"])
    assert again["autograd"]["host_forward_ms"] == 0.1 and again["recomputed"].get("host_ms") is None


def test_host_floor_is_the_cpus_time_and_the_slower_side_wins():
    from labs.engine import gpu as gpu_mod

    t = gpu_mod.datasheet_target(gpu_mod.datasheet_by_name("H100 SXM"))
    assert model.timer_host_floor_ms(0.25, t) == 0.25  # no credit for the timer's L2 flush (see its docstring)
    row = model.with_host_floor({"variant": "stored"}, gpu_ms=0.04, host_ms=0.2, nbytes_moved=8e6, target=t)
    assert row["predicted_ms"] == pytest.approx(0.2) and row["limited_by"] == "CPU"
    assert row["predicted_tbps"] == pytest.approx(8e6 / 0.2e-3 / 1e12)
    big = model.with_host_floor({}, gpu_ms=1.5, host_ms=0.3, nbytes_moved=1e9, target=t)
    assert big["predicted_ms"] == 1.5 and big["limited_by"] == "GPU"
