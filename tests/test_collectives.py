"""Collectives lab: the ring model against the textbook formula, the real launcher on CPU (torchrun, gloo,
2 processes: correct sums and a row per point), the refusal on a one-GPU or no-GPU machine, and the page."""

import pytest

from tests.conftest import HAS_CUDA, render_page
from labs import collectives as c
from labs.collectives import measure, model
from labs.engine import gpu, timing
from labs.engine.params import ParamError

H200 = gpu.datasheet_target(gpu.datasheet_by_name("H200"))


def test_ring_factors_are_the_textbook_ones():
    assert model.ring_factor("all_reduce", 2) == 1.0
    assert model.ring_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert model.ring_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert model.ring_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert model.ring_factor("broadcast", 2) == 1.0


def test_ring_all_reduce_time_by_hand():
    # 1 GB over 8 GPUs at 450 GB/s per direction: 2 * 7/8 * 1e9 / 450e9 s = 3.889 ms, plus 20 us
    assert model.collective_ms("all_reduce", 1e9, 8, 450, 20) == pytest.approx(0.020 + 3.8889, rel=1e-4)
    # bus bandwidth of that time tends to the link bandwidth as the latency term vanishes
    ms = model.collective_ms("all_reduce", 1e12, 8, 450, 20)
    assert model.bus_gbps("all_reduce", 1e12, 8, ms) == pytest.approx(450, rel=1e-4)


def test_model_uses_the_datasheet_nvlink_per_direction():
    link = model.link_for(H200)
    assert link["link_gbps"] == 450 and "NVLink" in link["link"]
    pcie_only = model.link_for(gpu.datasheet_target(gpu.datasheet_by_name("L4")))
    assert pcie_only["link"] == "PCIe Gen4 x16" and pcie_only["link_gbps"] == pytest.approx(31.5 * 256 / 282, rel=1e-3)


def test_predicted_bus_bandwidth_rises_with_size_to_the_link():
    """With no measured run, only the datasheet's link: the bus bandwidth climbs towards B."""
    terms = model.model_terms([], H200)
    assert terms["exchange_gbps"] is None and terms["link_gbps"]["all at once"] == 450
    rows = [r for r in model.predict_with(c.Params(), H200, 2, terms)
            if r["experiment"] == "collective" and r["op"] == "all_reduce"]
    bw = [r["predicted_busbw_gbps"] for r in sorted(rows, key=lambda r: r["size_bytes"])]
    assert bw == sorted(bw) and bw[0] < 1 and 400 < bw[-1] < 450


def test_bytes_nccl_kernels_move_per_byte_sent_by_hand():
    # two GPUs: all-reduce = send (2) + recv-reduce-copy-send (4) + recv (2) for 2 bytes sent -> 4
    assert model.sm_bytes_per_link_byte("all_reduce", 2) == 4
    # all-gather out of place: copy-send (3) + recv (2) per byte sent; reduce-scatter: send (2) + recv-reduce-copy (3)
    assert model.sm_bytes_per_link_byte("all_gather", 2) == 5 and model.sm_bytes_per_link_byte("reduce_scatter", 2) == 5
    assert model.sm_bytes_per_link_byte("broadcast", 2) == 2 and model.sm_bytes_per_link_byte("broadcast", 4) == 3
    # eight GPUs: all-reduce (6n - 4) / (2n - 2) = 44 / 14
    assert model.sm_bytes_per_link_byte("all_reduce", 8) == pytest.approx(44 / 14)
    assert model.sm_bytes_per_link_byte("all_gather", 8) == pytest.approx(23 / 7)


def test_bus_bandwidth_is_the_link_or_nccls_kernels_whichever_is_slower():
    # an exchange of 300 GB/s each way = 1200 GB/s of reads + writes: all-reduce 1200/4, all-gather 1200/5
    assert model.nccl_bus_gbps("all_reduce", 2, 360, 300) == pytest.approx(300)
    assert model.nccl_bus_gbps("all_gather", 2, 360, 300) == pytest.approx(240)
    assert model.nccl_bus_gbps("broadcast", 2, 360, 300) == 360  # 600 from the kernels: the link is slower
    assert model.nccl_bus_gbps("all_reduce", 2, 360, None) == 360  # nothing measured: the link


def test_a_loop_of_calls_runs_at_the_slower_of_host_and_gpus():
    # 1 MB all-reduce over 2 GPUs at 250 GB/s: GPUs 10 us + 4 us, host 30 us per call -> host-bound
    assert model.loop_ms("all_reduce", 1e6, 2, 250, 30, 10) == pytest.approx(0.030)
    # 100 MB: GPUs 10 us + 400 us
    assert model.loop_ms("all_reduce", 1e8, 2, 250, 30, 10) == pytest.approx(0.410)
    assert model.loop_ms("all_gather", 1e8, 2, 250, 30, 10) == pytest.approx(0.210)  # half the buffer crosses


def test_model_terms_come_from_the_runs_probes():
    rows = [{"experiment": "collective", "op": "all_reduce", "size_bytes": 1024, "measured_ms": 0.030},
            {"experiment": "collective", "op": "all_reduce", "size_bytes": 2**20, "measured_ms": 0.031},
            {"experiment": "collective_gpu", "op": "all_reduce", "size_bytes": 1024, "measured_ms": 0.010},
            {"experiment": "peer_copy", "op": "one direction", "size_bytes": 2**28, "measured_gbps": 375.0},
            {"experiment": "peer_copy", "op": "all at once", "size_bytes": 2**28, "measured_gbps": 363.0},
            {"experiment": "nccl_p2p", "op": "exchange", "size_bytes": 2**28, "measured_gbps": 300.0}]
    terms = model.model_terms(rows, H200)
    assert terms["host_us"] == {"all_reduce": pytest.approx(30)}
    assert terms["gpu_us"] == {"all_reduce": pytest.approx(10)}
    assert terms["exchange_gbps"] == 300
    assert terms["link_gbps"] == {"one direction": 375, "all at once": 363}
    assert model.op_bus_gbps("all_reduce", 2, terms) == pytest.approx(300)
    assert model.op_bus_gbps("broadcast", 2, terms) == 375  # one direction; the kernels could do 600
    row = model.collective_row("all_reduce", 2**30, 2, terms)
    assert row["predicted_ms"] == pytest.approx(0.010 + 2**30 / 300e9 * 1e3)
    assert row["textbook_ms"] == pytest.approx(0.030 + 2**30 / 450e9 * 1e3)


def test_simple_protocols_fixed_cost_comes_from_the_first_gpu_bound_message():
    # host 25 us per call; 1 MiB (30 us) is not GPU-bound, 16 MiB (80 us >= 2 x 25) is: at 300 GB/s its
    # 16.78 MB take 55.92 us, so Simple costs 80 - 55.92 = 24.08 us per call
    rows = [{"experiment": "collective", "op": "all_reduce", "size_bytes": s, "gpus": 2, "measured_ms": ms}
            for s, ms in ((1024, 0.025), (2**20, 0.030), (2**24, 0.080), (2**26, 0.250))]
    rows += [{"experiment": "collective_gpu", "op": "all_reduce", "size_bytes": 1024, "gpus": 2, "measured_ms": 0.010},
             {"experiment": "nccl_p2p", "op": "exchange", "size_bytes": 2**28, "measured_gbps": 300.0}]
    terms = model.model_terms(rows, H200)
    assert terms["simple_us"] == {"all_reduce": pytest.approx(80 - 2**24 / 300e3)}
    simple = terms["simple_us"]["all_reduce"]
    # 1 MiB: LL (10 us + 2 x 3.5 us) beats Simple (24 + 3.5 us); the host's 25 us is slower still
    row = model.collective_row("all_reduce", 2**20, 2, terms)
    assert row["model_protocol"] == "LL" and row["predicted_ms"] == pytest.approx(0.025)
    # 64 MiB: Simple, at the full bus bandwidth
    row = model.collective_row("all_reduce", 2**26, 2, terms)
    assert row["model_protocol"] == "Simple"
    assert row["predicted_ms"] == pytest.approx((simple + 2**26 / 300e3) * 1e-3)
    # the protocols cross where LL's extra byte time equals Simple's extra fixed cost
    cross = (simple - 10) * 300e3  # bytes
    assert model.protocol_ms("all_reduce", 0.9 * cross, 2, 300, 10, simple)[1] == "LL"
    assert model.protocol_ms("all_reduce", 1.1 * cross, 2, 300, 10, simple)[1] == "Simple"
    # nothing GPU-bound measured: one protocol, as before
    assert model.model_terms(rows[:2] + rows[4:], H200)["simple_us"] == {}


def test_overlap_model_hides_communication_behind_backward():
    assert model.overlap_ms([1.0, 3.0], [0.5, 0.5]) == 3.5  # the last gradient's all-reduce cannot hide
    assert model.overlap_ms([1.0, 1.1], [2.0, 2.0]) == 5.0  # communication-bound: back to back
    rows = {(r["experiment"], r["step"], r["tokens"]): r["predicted_ms"] for r in c.predict(c.Params(), H200)
            if r["experiment"] in ("dp", "tp")}
    big = 8192
    assert rows[("dp", "overlapped", big)] < rows[("dp", "serial", big)]
    serial, compute, comm = (rows[("tp", step, big)] for step in ("serial", "compute", "communication"))
    assert serial == pytest.approx(compute + comm)


def test_a_layer_step_runs_at_the_slower_of_the_gpus_and_the_cpu_issuing_it():
    terms = {"layer_host_ms": {("tp", "serial", 1024): 1.4}}
    host_bound = model.layer_row("tp", "serial", 0.97, 1024, 2, terms)
    assert host_bound["predicted_ms"] == 1.4 and host_bound["model_bound"] == "host"
    assert host_bound["model_gpu_ms"] == 0.97
    gpu_bound = model.layer_row("tp", "serial", 7.5, 8192, 2, terms | {"layer_host_ms": {("tp", "serial", 8192): 1.4}})
    assert gpu_bound["predicted_ms"] == 7.5 and gpu_bound["model_bound"] == "GPUs"
    unmeasured = model.layer_row("tp", "compute", 0.9, 1024, 2, terms)  # no probe for this step: the GPUs' time
    assert unmeasured["predicted_ms"] == 0.9 and unmeasured["model_host_ms"] is None


def test_children_keep_nvlink_multicast_off(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = measure.child_env()
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"


@pytest.mark.skipif(HAS_CUDA, reason="the CPU path (gloo) is what CI runs; GPUs run NCCL")
def test_launcher_runs_two_real_processes_on_gloo():
    """torchrun, two processes, gloo: every collective checked against float64 inside, then timed."""
    p = c.Params(sizes_kib=(1, 64), dtype="fp32", layer_tokens=(33,), d_model=24, d_ff=40)
    seen, spread = [], []
    with timing.collecting() as timed:  # as the runner does: each row gets what was timed for it
        for r in measure.run_rows(p, H200, 2, lambda f, m: seen.append(m)):
            spread.append(timing.row_spread(r, timed.take()) if isinstance(r, dict) else r)
    rows = [r for r in spread if isinstance(r, dict)]
    timed_rows = [r for r in rows if r["experiment"] in ("collective", "peer_copy", "exchange")]
    assert timed_rows and all(r["repeats"] == 5 and r["spread_pct"] >= 0 for r in timed_rows)
    assert all("samples_ms" not in r for r in rows)
    got = {(r["experiment"], r["op"], r["step"]) for r in rows}
    for op in model.OPS:
        assert ("collective", op, "-") in got
    assert {("dp", "-", s) for s in ("compute", "communication", "serial", "overlapped")} <= got
    assert {("tp", "-", s) for s in ("compute", "communication", "serial")} <= got
    assert all(r["check_rel_error"] <= 1e-5 and r["measured_ms"] > 0 for r in rows)
    assert all(r["gpus"] == 2 for r in rows) and seen
    # every layer step also times how long the CPU takes to issue it, and the model never goes below that
    layers = [r for r in rows if r["experiment"] in model.LAYER_STEPS]
    assert layers and all(r["host_ms"] > 0 and r["model_host_ms"] == r["host_ms"] for r in layers)
    assert all(r["predicted_ms"] == max(r["model_gpu_ms"], r["host_ms"]) for r in layers)
    # the model on every collective row uses this run's own smallest-message time as the host's cost per call
    small = [r for r in rows if r["experiment"] == "collective" and r["size_bytes"] == 1024]
    assert all(r["model_host_us"] == pytest.approx(1e3 * r["measured_ms"]) for r in small)
    assert all(r["predicted_ms"] >= r["measured_ms"] * 0.999 for r in small)  # host-bound: the model is that time


def test_launcher_reports_a_failing_worker():
    with pytest.raises(RuntimeError, match="worker processes failed"):
        list(measure.launch({"ops": ["no_such_op"], "sizes_bytes": [1024], "dtype": "fp32", "layer_steps": [],
                       "layer_tokens": [], "d_model": 8, "d_ff": 8}, 1))


def test_one_gpu_or_none_is_refused_with_a_reason():
    live_like = gpu.Target("one GPU", "x", 132, 0, 80 * 10**9, "9.0", H200.ceilings, H200.datasheet, live=True)
    if HAS_CUDA:
        import torch

        if torch.cuda.device_count() >= 2:
            pytest.skip("this machine has two GPUs")
    with pytest.raises(ParamError, match="two or more GPUs"):
        measure.check(c.Params(), live_like)
    measure.check(c.Params(), H200)  # a datasheet GPU is modelled, never refused


def test_page_shows_model_and_says_why_it_cannot_run():
    at = render_page("collectives.py")
    text = " ".join(m.value for m in at.markdown) + " ".join(i.value for i in at.info)
    assert "Collectives" in at.title[0].value
    assert "two or more GPUs" in text or "Live runs are off" in text
