"""Transfers lab: the PCIe model by hand, the datasheet links, refusals, the page, and (on a GPU) the real copies."""

import pytest

from tests.conftest import render_page
from labs.engine import gpu, links
from labs import transfers as t
from labs.transfers import measure, model
from labs.engine.params import ParamError

H100 = gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM"))


def test_pcie_bandwidth_from_generation_and_lanes():
    assert model.pcie_gbps(5, 16) == pytest.approx(32 * 16 * 128 / 130 / 8)  # 63.0 GB/s per direction
    assert model.pcie_gbps(4, 16) == pytest.approx(31.51, rel=1e-3)
    assert model.pcie_gbps(3, 8) == pytest.approx(7.877, rel=1e-3)
    assert model.pcie_gbps(2, 16) == pytest.approx(8.0)  # 8b/10b
    with pytest.raises(ParamError):
        model.pcie_gbps(9, 16)


def test_every_datasheet_gpu_names_its_links_and_source():
    for sheet in gpu.DATASHEET:
        row_links = links.links_for(sheet)
        assert row_links is not None and row_links.source and row_links.pcie_gen in model.PCIE_GTPS \
            and row_links.pcie_lanes == 16
    assert links.links_for(gpu.datasheet_by_name("H100 SXM")).nvlink_per_direction_gbps == 450
    assert links.links_for(gpu.datasheet_by_name("L4")).nvlink_gbps is None


def test_alpha_beta_copy_by_hand():
    # 1 GiB at 63.015 GB/s plus 10 us
    assert model.copy_ms(2**30, 10, 63.015) == pytest.approx(0.010 + 2**30 / 63.015e9 * 1e3)
    rows = model.predict(t.Params(experiments=("copies",), sizes_kib=(4, 1048576)), H100)
    small = [r for r in rows if r["size_bytes"] == 4096][0]
    big = [r for r in rows if r["size_bytes"] == 2**30 and r["memory"] == "pinned"][0]
    assert small["predicted_gbps"] < 1 and big["predicted_gbps"] == pytest.approx(63.0 * 256 / 282, rel=1e-2)


def test_packet_overhead_by_hand():
    assert model.pcie_packet_efficiency(256) == pytest.approx(256 / (256 + 26))  # 90.8 % of the bytes are data
    link = model.link_for(H100)
    assert link["pcie_gbps"] == pytest.approx(link["pcie_line_gbps"] * 256 / 282)


def test_pageable_is_limited_by_the_slower_stage():
    assert model.effective_gbps("pageable", 63.0, 20.0) == 20.0
    assert model.effective_gbps("pageable", 31.5, 50.0) == 31.5
    assert model.effective_gbps("pinned", 63.0, 20.0) == 63.0


def test_overlap_model_is_the_max_of_copy_and_compute():
    rows = {r["schedule"]: r["predicted_ms"] for r in model.predict(t.Params(experiments=("overlap",)), H100)}
    assert rows["one stream"] == pytest.approx(rows["copy alone"] + rows["compute alone"])
    assert rows["two streams"] == pytest.approx(max(rows["copy alone"], rows["compute alone"]))


def test_measured_latency_is_the_smallest_copy():
    rows = [{"experiment": "copies", "direction": "h2d", "memory": "pinned", "size_bytes": s, "measured_ms": ms}
            for s, ms in ((65536, 0.01), (4096, 0.004), (2**20, 0.03))]
    assert model.measured_latency_us(rows) == {("h2d", "pinned"): pytest.approx(4.0)}


def test_fitted_latency_is_what_the_small_copies_leave_after_their_bytes():
    """Alpha is the median over the copies up to 256 KiB of (measured time - the model's byte terms): made-up
    copies of exactly 12 us + bytes over the link give 12 us back, and one disturbed small copy (26 us at
    4 KiB, as on the H100 host) moves it less than taking the smallest copy's time would."""
    link = model.link_for(H100)["pcie_gbps"]
    sizes = (4096, 16384, 65536, 262144, 2**20)

    def run(extra_us_at_4k=0.0):
        return [{"experiment": "copies", "direction": "d2h", "memory": "pinned", "size_bytes": s,
                 "measured_ms": model.copy_ms(s, 12.0 + (extra_us_at_4k if s == 4096 else 0.0), link)} for s in sizes]

    assert model.fitted_latency_us(H100, run(), {})[("d2h", "pinned")] == pytest.approx(12.0)
    disturbed = run(extra_us_at_4k=14.0)
    assert model.measured_latency_us(disturbed)[("d2h", "pinned")] == pytest.approx(26.0, rel=0.01)
    assert model.fitted_latency_us(H100, disturbed, {})[("d2h", "pinned")] == pytest.approx(12.0)
    # the 1 MiB copy is not part of the fit: a slow one does not move alpha
    slow_big = run()
    slow_big[-1]["measured_ms"] *= 3
    assert model.fitted_latency_us(H100, slow_big, {})[("d2h", "pinned")] == pytest.approx(12.0)


def test_all_sizes_are_timed_in_turns_each_keeping_its_fastest_round():
    order, times = [], {4: iter([3.0, 2.0]), 16: iter([5.0, 6.0])}

    def timer(fn, budget_ms, min_reps):
        order.append(fn())
        return next(times[order[-1]])

    got = measure.timed_in_turns({4: (lambda: 4, None), 16: (lambda: 16, lambda: {"cpu_read_gbps": 1.0})},
                           rounds=2, timer=timer)
    assert order == [4, 16, 4, 16]  # round by round over all sizes, not one size after the other
    assert got == {4: (2.0, {}), 16: (5.0, {"cpu_read_gbps": 1.0})}


def test_sizes_that_do_not_fit_are_refused():
    with pytest.raises(ParamError, match="does not fit"):
        small = gpu.Target("4 GB GPU", "small", 40, 0, 4 * 10**9, "7.5", H100.ceilings, None, live=False)
        measure.check(t.Params(sizes_kib=(4 * 1048576,), experiments=("copies",)), small)


def test_staging_rates_are_measured_on_the_buffer_itself():
    import torch

    buf = torch.arange(1, 3 * 2**20 // 4 + 1, dtype=torch.float32)  # 3 MiB: a whole staging ring and a part
    before = buf.clone()
    probe = measure.staging_probe(buf)
    rates = measure.fastest([probe() for _ in range(measure.ROUNDS)])
    assert all(rates[k] > 0.1 for k in ("cpu_read_gbps", "cpu_copy_out_gbps", "cpu_write_gbps"))
    # the write (zeros) comes before the copy-out, and the copy-out reaches every byte: no zero is left, and
    # every value is one of the buffer's own, carried through the ring by the read pass
    assert torch.count_nonzero(buf) == buf.numel()
    assert bool(torch.isin(buf, before).all())


def test_copy_and_probe_are_timed_in_turns_and_the_fastest_kept():
    calls, copy_ms, probes = [], iter([5.0, 3.0, 4.0]), iter([
        {"cpu_read_gbps": 9.0, "pin_ms": 2.0}, {"cpu_read_gbps": 12.0, "pin_ms": 3.0},
        {"cpu_read_gbps": 10.0, "pin_ms": 1.5}])

    def timer(fn, budget_ms, min_reps):
        calls.append("copy")
        assert budget_ms == pytest.approx(measure.WALL_BUDGET_MS / 3) and min_reps == measure.MIN_CALLS_PER_ROUND
        return next(copy_ms)

    def probe():
        calls.append("probe")
        return next(probes)

    ((ms, rates),) = measure.timed_in_turns({0: (lambda: None, probe)}, rounds=3, timer=timer).values()
    assert calls == ["copy", "probe"] * 3
    assert ms == 3.0 and rates == {"cpu_read_gbps": 12.0, "pin_ms": 1.5}  # the highest rate, the least time
    assert measure.timed_in_turns({0: (lambda: None, None)}, rounds=2, timer=lambda *a, **k: 7.0) == {0: (7.0, {})}


def test_pageable_model_uses_the_rate_measured_at_each_size():
    rates = {("h2d", 2**20): {"cpu_read_gbps": 20.0}, ("d2h", 2**20): {"cpu_copy_out_gbps": 5.0},
             "host_copy_gbps": 8.0}
    p = t.Params(experiments=("copies",), memories=("pageable",), sizes_kib=(1024, 4096))
    rows = {(r["direction"], r["size_bytes"]): r for r in model.predict_with(p, H100, {}, rates)}
    assert rows[("h2d", 2**20)]["model_bandwidth_gbps"] == 20.0
    assert rows[("d2h", 2**20)]["model_bandwidth_gbps"] == 5.0
    assert rows[("h2d", 4 * 2**20)]["model_bandwidth_gbps"] == 8.0  # not measured at this size: the one rate
    link = model.link_for(H100)["pcie_gbps"]
    # d2h: latency, the whole 1 MiB over the link into the staging buffer, then the CPU's copy out
    assert rows[("d2h", 2**20)]["predicted_ms"] == pytest.approx(
        model.ASSUMED_LATENCY_US * 1e-3 + 2**20 / (link * 1e9) * 1e3 + 2**20 / 5e9 * 1e3)
    assert rows[("h2d", 2**20)]["model_first_piece_us"] == 0


def test_staging_never_runs_faster_than_out_of_the_cores_cache():
    # 1 MiB fits one core's 2 MiB L2 and the probe reads it at 30 GB/s; at 4 MiB (beyond it) 12 GB/s: the
    # driver's staging buffers are never in the core's cache, so 1 MiB stages at 12 GB/s too
    rates = {("h2d", 2**20): {"cpu_read_gbps": 30.0, "cpu_l2_bytes": 2**21},
             ("h2d", 2**22): {"cpu_read_gbps": 12.0, "cpu_l2_bytes": 2**21},
             ("h2d", 2**24): {"cpu_read_gbps": 14.0, "cpu_l2_bytes": 2**21},
             ("d2h", 2**22): {"cpu_copy_out_gbps": 10.0, "cpu_l2_bytes": 2**21},
             ("d2h", 2**24): {"cpu_copy_out_gbps": 8.0, "cpu_l2_bytes": 2**21}}
    p = t.Params(experiments=("copies",), memories=("pageable",), sizes_kib=(1024, 4096, 16384))
    rows = {(r["direction"], r["size_bytes"]): r for r in model.predict_with(p, H100, {}, rates)}
    assert rows[("h2d", 2**20)]["model_bandwidth_gbps"] == 12.0
    assert rows[("h2d", 2**24)]["model_bandwidth_gbps"] == 12.0  # the slower of its own 14 and 12
    assert rows[("d2h", 2**24)]["model_bandwidth_gbps"] == 8.0  # its own rate is slower: kept
    # a core with a 32 MiB cache: 4 MiB and 16 MiB fit it, no probe beyond it, every size its own rate
    big = {k: v | {"cpu_l2_bytes": 2**25} for k, v in rates.items()}
    rows = {(r["direction"], r["size_bytes"]): r for r in model.predict_with(p, H100, {}, big)}
    assert rows[("h2d", 2**20)]["model_bandwidth_gbps"] == 30.0


def test_d2h_staging_writes_the_buffer_without_reading_it():
    # 16 MiB is beyond the caches: the probe's memcpy out (7.3 GB/s) reads each line before writing it, the
    # plain write goes at 10; the driver writes at 10, still no faster than the out-of-cache copy-out (4 MiB)
    rates = {("d2h", 2**22): {"cpu_copy_out_gbps": 10.6, "cpu_write_gbps": 20.0, "cpu_l2_bytes": 2**21},
             ("d2h", 2**24): {"cpu_copy_out_gbps": 7.3, "cpu_write_gbps": 10.0, "cpu_l2_bytes": 2**21},
             ("h2d", 2**24): {"cpu_read_gbps": 7.0, "cpu_write_gbps": 10.0, "cpu_l2_bytes": 2**21}}
    p = t.Params(experiments=("copies",), memories=("pageable",), sizes_kib=(4096, 16384))
    rows = {(r["direction"], r["size_bytes"]): r for r in model.predict_with(p, H100, {}, rates)}
    assert rows[("d2h", 2**24)]["model_bandwidth_gbps"] == 10.0
    assert rows[("d2h", 2**22)]["model_bandwidth_gbps"] == 10.6  # the write's 20 capped by the copy-out's 10.6
    assert rows[("h2d", 2**24)]["model_bandwidth_gbps"] == 7.0  # h2d reads the buffer: its write rate is no term


def test_h2d_staging_goes_no_faster_than_the_probes_slower_copy():
    # 256 MiB, as on the H100 host: the probe reads the buffer at 7.6 GB/s but copies out into it at 6.5
    # (each line fetched before it is overwritten). The staging buffer the engine just read is outside the
    # core's cache too, so the copy stages at 6.5; at 4 MiB the read (9) is the slower and is kept.
    rates = {("h2d", 2**22): {"cpu_read_gbps": 9.0, "cpu_copy_out_gbps": 10.0, "cpu_l2_bytes": 2**21},
             ("h2d", 2**28): {"cpu_read_gbps": 7.6, "cpu_copy_out_gbps": 6.5, "cpu_l2_bytes": 2**21},
             ("hand", 2**28): {"cpu_read_gbps": 7.6, "cpu_copy_out_gbps": 6.5, "cpu_l2_bytes": 2**21}}
    p = t.Params(experiments=("copies", "staging"), directions=("h2d",), memories=("pageable",),
                 sizes_kib=(4096, 262144), staging_mib=(256,))
    no_latency = {("h2d", "pinned"): 0.0}  # the hand-made copy's pinned pieces: bytes over the link alone
    rows = {(r["experiment"], r["size_bytes"]): r for r in model.predict_with(p, H100, no_latency, rates)}
    assert rows[("copies", 2**22)]["model_bandwidth_gbps"] == 9.0
    assert rows[("copies", 2**28)]["model_bandwidth_gbps"] == 6.5
    latency_ms = model.ASSUMED_LATENCY_US * 1e-3
    assert rows[("copies", 2**28)]["predicted_ms"] == pytest.approx(latency_ms + 2**28 / 6.5e9 * 1e3)
    # by hand: 128 pieces of 2 MiB at 6.5 GB/s (each slower than the link's), then the last piece over the link
    link = model.link_for(H100)["pcie_gbps"]
    hand_ms = 128 * 2**21 / 6.5e9 * 1e3 + 2**21 / (link * 1e9) * 1e3
    assert rows[("staging", 2**28)]["predicted_ms"] == pytest.approx(hand_ms)


def test_only_the_first_staging_buffer_of_a_d2h_copy_is_exposed():
    link = 50.0
    assert model.first_piece_ms("d2h", 2**20, link) == pytest.approx(2**20 / 50e9 * 1e3)
    assert model.first_piece_ms("d2h", 2**30, link) == pytest.approx(model.STAGING_BYTES / 50e9 * 1e3)
    assert model.first_piece_ms("h2d", 2**30, link) == 0.0


def test_cpu_l2_is_read_from_the_os():
    l2 = measure.cpu_l2_bytes()
    assert l2 is None or 64 * 1024 <= l2 <= 1024 * 2**20


def test_pageable_d2h_pinned_on_the_fly_by_hand():
    # lock the pages (10 ms), a pinned copy (20 us + 256 MiB at the link), unlock them (5 ms)
    rates = {("d2h", 2**28): {"pin_ms": 10.0, "unpin_ms": 5.0, "cpu_copy_out_gbps": 9.0}}
    p = t.Params(experiments=("copies",), memories=("pageable",), directions=("d2h",), sizes_kib=(2**18,))
    row = model.predict_with(p, H100, {("d2h", "pinned"): 20.0}, rates)[0]
    link = model.link_for(H100)["pcie_gbps"]
    assert row["model_route"] == "pinned on the fly"
    assert row["predicted_ms"] == pytest.approx(10.0 + 0.020 + 2**28 / (link * 1e9) * 1e3 + 5.0)
    small = t.Params(experiments=("copies",), memories=("pageable",), directions=("d2h",), sizes_kib=(4,))
    rates[("d2h", 4096)] = {"pin_ms": 0.1, "unpin_ms": 0.05, "cpu_copy_out_gbps": 9.0}
    row = model.predict_with(small, H100, {("d2h", "pinned"): 20.0, ("d2h", "pageable"): 25.0}, rates)[0]
    assert row["model_route"] == "staged"  # 4 KiB: locking alone costs more than staging the whole copy
    assert row["predicted_ms"] == pytest.approx(0.025 + 4096 / (link * 1e9) * 1e3 + 4096 / 9e9 * 1e3)
    del rates[("d2h", 2**28)]["pin_ms"]  # not measured (no CUDA): the staged route at the copy-out rate
    row = model.predict_with(p, H100, {("d2h", "pinned"): 20.0}, rates)[0]
    assert row["model_route"] == "staged" and row["model_bandwidth_gbps"] == 9.0


def test_hand_staging_is_a_two_stage_pipeline_by_hand():
    mib = 2**20
    # 5 MiB in 2 MiB pieces (2, 2, 1 MiB): CPU 10 GB/s, link 50 GB/s, 10 us per engine copy
    cpu = [b / 10e9 * 1e3 for b in (2 * mib, 2 * mib, mib)]
    engine = [0.010 + b / 50e9 * 1e3 for b in (2 * mib, 2 * mib, mib)]
    expected = cpu[0] + max(cpu[1], engine[0]) + max(cpu[2], engine[1]) + engine[2]
    assert model.hand_staging_ms(5 * mib, 10.0, 50.0, 10.0, piece=2 * mib) == pytest.approx(expected)
    # one piece: nothing overlaps; a slow link instead of a slow CPU sets the steps
    assert model.hand_staging_ms(mib, 10.0, 50.0, 10.0) == pytest.approx(mib / 10e9 * 1e3 + 0.010 + mib / 50e9 * 1e3)
    slow_link = model.hand_staging_ms(8 * mib, 100.0, 5.0, 0.0, piece=2 * mib)
    assert slow_link == pytest.approx(2 * mib / 100e9 * 1e3 + 4 * (2 * mib / 5e9 * 1e3))
    # queueing each piece costs the CPU 25 us: every CPU step grows by it, the engine's do not
    queued = [c + 0.025 for c in cpu]
    expected = queued[0] + max(queued[1], engine[0]) + max(queued[2], engine[1]) + engine[2]
    assert model.hand_staging_ms(5 * mib, 10.0, 50.0, 10.0, piece=2 * mib, queue_us=25.0) == pytest.approx(expected)


def test_hand_staging_model_uses_the_probe_measured_beside_it():
    rows = [{"experiment": "staging", "direction": "h2d", "memory": "pageable", "size_bytes": 16 * 2**20,
             "schedule": "by hand", "measured_ms": 1.5, "cpu_read_gbps": 11.0, "cpu_l2_bytes": 2**21,
             "queue_us": 20.0},
            {"experiment": "staging", "direction": "h2d", "memory": "pageable", "size_bytes": 16 * 2**20,
             "schedule": "driver", "driver_ms": 1.2}]
    rates = model.measured_host_rates(rows)
    assert list(rates) == [("hand", 16 * 2**20)] and rates[("hand", 16 * 2**20)]["cpu_read_gbps"] == 11.0
    p = t.Params(experiments=("staging",), staging_mib=(16,))
    (row,) = model.predict_with(p, H100, {("h2d", "pinned"): 12.0}, {"host_copy_gbps": 9.0, **rates})
    assert row["schedule"] == "by hand" and row["model_bandwidth_gbps"] == 11.0
    link = model.link_for(H100)["pcie_gbps"]
    assert row["model_queue_us"] == 20.0
    assert row["predicted_ms"] == pytest.approx(model.hand_staging_ms(16 * 2**20, 11.0, link, 12.0, queue_us=20.0))
    # before any run of this size: the one host memcpy rate, and no queueing cost measured
    (row,) = model.predict_with(p, H100, {}, {"host_copy_gbps": 9.0})
    assert row["model_bandwidth_gbps"] == 9.0 and row["model_queue_us"] == 0.0


def test_staging_sizes_that_do_not_fit_are_refused():
    small = gpu.Target("4 GB GPU", "small", 40, 0, 4 * 10**9, "7.5", H100.ceilings, None, live=False)
    with pytest.raises(ParamError, match="does not fit"):
        measure.check(t.Params(experiments=("staging",), staging_mib=(4096,)), small)


def test_host_memcpy_rate_is_measured():
    assert measure.host_copy_gbps(8 * 2**20) > 0.1


def test_page_renders_without_a_gpu():
    at = render_page("transfers.py")
    assert "PCIe" in at.title[0].value
    assert any("GB/s" in m.value for m in at.markdown)


@pytest.mark.gpu
def test_real_copies_are_checked_and_timed():
    from labs.engine import runner

    p = t.Params(sizes_kib=(4, 1024), overlap_mib=16, staging_mib=(3, 5))
    result = runner.run(t.LAB, p, use_cache=False)
    rows = [r for r in result.rows if r.get("measured_ms")]
    assert len(rows) == 2 * 2 * 2 + 4 + 2
    assert all(r["check_rel_error"] == 0 for r in rows if r["experiment"] in ("copies", "staging"))
    assert all(r["check_rel_error"] <= 2e-2 for r in rows)
    hand = [r for r in rows if r["experiment"] == "staging"]
    assert all(r["predicted_ms"] > 0 and r["cpu_read_gbps"] > 0 and 0 < r["queue_us"] < 1e3 for r in hand)
    assert all(r["model_queue_us"] == r["queue_us"] for r in hand)  # the model uses the run's own probe
    drivers = [r for r in result.rows if r["experiment"] == "staging" and r["schedule"] == "driver"]
    assert len(drivers) == 2 and all(r["driver_gbps"] > 0 for r in drivers)


def test_lesson_latency_is_fitted_to_the_recorded_run_or_said_to_be_assumed():
    from labs.transfers.model import recorded_rows

    rows = recorded_rows(t.LAB.name, H100.key)
    assert rows, "an H100 run of this lab is recorded"
    fitted = model.fitted_latency_us(H100, rows, model.measured_host_rates(rows))[("h2d", "pinned")]
    numbers = model.lesson_numbers(H100)
    assert numbers["latency_us"] == f"{fitted:.0f}" and "fitted" in numbers["latency_source"]
    t4 = gpu.datasheet_target(next(s for s in gpu.DATASHEET if s.name == "T4"))
    assert not recorded_rows(t.LAB.name, t4.key)
    numbers = model.lesson_numbers(t4)
    assert numbers["latency_us"] == f"{model.ASSUMED_LATENCY_US:.0f}" and "assumed" in numbers["latency_source"]


def _planned_run_s(p) -> float:
    """Seconds a run of `p` spends copying and probing on an H100, from the model's own copy times: every point
    timed ROUNDS times a pass (at least MIN_CALLS_PER_ROUND calls, more while the round's budget lasts), each
    pageable one followed by its CPU probe (three passes over the buffer, at least 16 MiB, at the assumed rate)."""
    from labs.engine import timing

    budget_ms = measure.WALL_BUDGET_MS / timing.PASSES / measure.ROUNDS
    per_round_ms = 0.0
    for r in model.predict(p, H100):
        if r["experiment"] == "overlap":
            continue
        ms = r["predicted_ms"]
        calls = max(measure.MIN_CALLS_PER_ROUND, min(200, int(budget_ms / ms)))
        per_round_ms += calls * ms * (2 if r["experiment"] == "staging" else 1)  # by hand and the driver's
        if r["memory"] == "pageable":
            per_round_ms += 3 * max(r["size_bytes"], 16 * 2**20) / (model.ASSUMED_HOST_COPY_GBPS * 1e9) * 1e3
    return timing.PASSES * measure.ROUNDS * per_round_ms / 1e3


def test_a_default_run_copies_for_well_under_a_minute():
    # 191 s on an H100 (2026-11-27): seven passes (two extra for a spread that was not a point's), each checking
    # every copy again with fresh random numbers, three calls of every 1 GiB copy a round
    assert _planned_run_s(t.Params()) < 20
    assert _planned_run_s(t.Params(sizes_kib=t.Params().sizes_kib + (1048576,))) > 20  # the bound means something


def test_each_row_records_its_own_time_and_nothing_else():
    from labs.engine import timing

    def timer(fn, budget_ms, min_reps):  # a timer that records its samples, as wall_ms does
        timing.record_samples([1.0, 1.5, 9.0])
        return 1.0

    with timing.collecting() as timed, timing.in_pass(0, {}):
        got = measure.timed_in_turns({4: (lambda: None, None), 16: (lambda: None, None)}, rounds=3, timer=timer)
        assert timed.take() == []  # the rounds' timings do not fall on whichever row is yielded next
        for size, (ms, _) in got.items():
            row = measure.own_timing({"size_bytes": size, "measured_ms": ms})
            (own,) = timed.take()
            assert own.samples_ms == [row["measured_ms"]]
        measure.own_timing({"schedule": "driver", "driver_ms": 2.5})  # the driver's copy beside a hand-staged one
        assert [t_.samples_ms for t_ in timed.take()] == [[2.5]]


def test_buffers_and_checks_are_made_once_a_run():
    from labs.engine import timing

    made, memo = [], {}
    for index in range(3):
        with timing.in_pass(index, memo):
            buffer = measure.run_buffer(("copies", "pinned", 4096), lambda: made.append(1) or object())
            assert buffer is memo[("transfers buffer", "copies", "pinned", 4096)]
    assert made == [1]


def test_overlap_matmuls_run_at_the_recorded_cublas_rate_else_the_ceiling():
    from labs.transfers.model import recorded_rows

    t4 = gpu.datasheet_target(next(s for s in gpu.DATASHEET if s.name == "T4"))
    assert not recorded_rows("matmul", t4.key)
    assert model.matmul_tflops(t4) == (t4.ceilings.matmul_tflops.get("bf16") or t4.ceilings.fma_tflops)
