"""The memory-hierarchy lab: the read kernel against float64, the piecewise model, knee finding, the
diagram's data, the page."""

import json
import time
from pathlib import Path

import pytest
import torch

from labs.engine import timing
from labs.engine import gpu
from labs.engine import runner
from labs.engine.gpu import MiB
from labs.hierarchy import LAB, Params
from labs.hierarchy.diagram import hierarchy_levels
from labs.hierarchy.kernels import BLOCK, programs, read_passes
from labs.hierarchy.measure import reference
from labs.hierarchy.model import find_knee, levels, levels_cache_path, levels_from_rows, predict, save_levels, sizes

ROOT = Path(__file__).resolve().parent.parent
H200 = gpu.datasheet_target(gpu.datasheet_by_name("H200"))


@pytest.mark.parametrize("n", [1, 8191, 50001])
@pytest.mark.parametrize("passes", [1, 3])
def test_read_kernel_matches_float64_on_odd_sizes(device, n, passes):
    x = timing.random_tensor((n,), "fp32", device)
    sm = 4 if device == "cpu" else torch.cuda.get_device_properties(0).multi_processor_count
    grid = programs(n, sm)
    out = torch.full((grid, BLOCK), float("nan"), device=device)
    read_passes(x, passes, out, sm)
    timing.check_close(out, reference(x, passes, grid), "fp32", "read passes")


def test_reference_counts_every_element_passes_times():
    x = torch.ones(50001)
    assert reference(x, 3, 4).sum().item() == 3 * 50001


def test_sizes_are_geometric_and_hit_round_powers_of_two():
    ws = sizes(Params())
    assert ws[0] == 256 * 1024 and ws[-1] == 4096 * MiB
    assert 16 * MiB in ws and 64 * MiB in ws
    assert len(ws) == 3 * 14 + 1  # 14 doublings from 256 KiB to 4 GiB, 3 points each
    assert all(b > a for a, b in zip(ws, ws[1:]))


def _rows(l2_tbps=10.0, hbm_tbps=4.0, l2_bytes=60 * MiB, launch_us=2.0, latency_us=1.0):
    """Synthetic measurements from the piecewise model itself."""
    out = []
    for w in sizes(Params()):
        bw = l2_tbps if w <= l2_bytes else hbm_tbps
        t = w / (bw * 1e12) * 1e6
        out.append({"variant": "loop", "size_bytes": w, "measured_us_per_pass": max(t, latency_us),
                    "measured_tbps": w / (max(t, latency_us) * 1e-6) / 1e12})
        out.append({"variant": "launches", "size_bytes": w, "measured_us_per_pass": t + launch_us,
                    "measured_tbps": w / ((t + launch_us) * 1e-6) / 1e12})
    return out


def test_knee_of_a_step_lies_between_the_two_sizes_around_the_l2():
    knee = find_knee(_rows())
    assert 60 * MiB / 2**(1 / 3) < knee["knee_bytes"] < 60 * MiB * 2**(1 / 3)
    assert knee["plateau_tbps"] == pytest.approx(10.0) and knee["floor_tbps"] == pytest.approx(4.0)
    assert find_knee([r for r in _rows() if r["size_bytes"] < 32 * MiB]) is None  # never leaves the L2


def test_levels_read_off_the_rows():
    fig = levels_from_rows(_rows(), 60 * MiB)
    assert fig["l2_tbps"] == pytest.approx(10.0)
    assert fig["launch_us"] == pytest.approx(2.0, rel=0.05) and fig["latency_us"] == pytest.approx(1.0)


def test_model_by_hand(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE", str(tmp_path))
    save_levels(H200.key, {"l2_tbps": 10.0, "latency_us": 1.0, "launch_us": 2.0})
    assert json.loads(levels_cache_path(H200.key).read_text())["l2_tbps"] == 10.0
    rows = {(r["variant"], r["size_bytes"]): r for r in predict(Params(), H200)}
    # 16 MiB in the L2 at 10 TB/s: 1.68 us per pass; as a launch, + 2 us
    assert rows[("loop", 16 * MiB)]["predicted_us_per_pass"] == pytest.approx(16 * MiB / 10e12 * 1e6)
    assert rows[("launches", 16 * MiB)]["predicted_us_per_pass"] == pytest.approx(16 * MiB / 10e12 * 1e6 + 2)
    # 4 GiB from HBM at the calibrated copy bandwidth
    assert rows[("loop", 4096 * MiB)]["predicted_tbps"] == pytest.approx(H200.ceilings.copy_tbps)
    # 256 KiB: 0.026 us of streaming, but no pass is shorter than the 1 us round trip
    assert rows[("loop", 256 * 1024)]["predicted_us_per_pass"] == 1.0
    measured, predicted = LAB.headline.answer(list(rows.values()))
    assert predicted == pytest.approx(10.0)


def test_without_level_figures_only_hbm_is_predicted(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE", str(tmp_path))
    t4 = gpu.datasheet_target(gpu.datasheet_by_name("T4"))
    lv = levels(t4)
    assert lv.l2_tbps is None and "not measured" in lv.source
    rows = predict(Params(variants=("loop",)), t4)
    assert all((r["predicted_tbps"] is None) == (r["size_bytes"] <= t4.l2_bytes) for r in rows)


def test_diagram_data_has_four_levels_with_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE", str(tmp_path))
    levels_ = hierarchy_levels(H200, _rows(l2_tbps=9.0))
    assert [lv["level"] for lv in levels_] == ["registers", "shared memory / L1", "L2", "HBM"]
    regs, smem, l2, hbm = levels_
    assert regs["size_bytes"] == 256 * 1024 and smem["size_bytes"] == 228 * 1024  # Hopper, per SM
    assert l2["size_bytes"] == H200.l2_bytes and l2["size_source"] == "datasheet" and l2["tbps"] == pytest.approx(9.0)
    assert hbm["tbps"] == H200.ceilings.copy_tbps and hbm["datasheet_tbps"] == 4.8


def test_model_run_without_a_gpu():
    result = runner.model(LAB, Params(max_mib=1), H200)
    assert {r["variant"] for r in result.rows} == {"loop", "launches"}


@pytest.mark.gpu
def test_live_run_sees_the_l2():
    result = runner.run(LAB, Params(min_kib=4096, max_mib=1024, points_per_octave=2, variants=("loop",)),
                        use_cache=False)
    knee = find_knee(result.rows)
    target = gpu.live_target()
    assert knee is not None and 0.5 < knee["knee_bytes"] / target.l2_bytes < 2


def test_page_renders_fast_without_a_gpu():
    AppTest = pytest.importorskip("streamlit.testing.v1").AppTest  # the GPU image has no streamlit
    pytest.importorskip("plotly")

    at = AppTest.from_file(str(ROOT / "pages" / "hierarchy.py"), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    started = time.perf_counter()
    at.run()
    assert time.perf_counter() - started < 1.0
    assert at.title[0].value == "Memory hierarchy"
    figures = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    diagram = " ".join(a["text"] for a in figures[0]["layout"]["annotations"])
    assert "<b>registers</b>" in diagram and "<b>L2</b>" in diagram and "<b>HBM</b>" in diagram
    assert any(t["name"].startswith("model,") for t in figures[1]["data"])


def test_the_levels_saved_after_the_passes_come_from_their_medians():
    """The runner times the sweep in passes; the L2 and latency figures the lab saves for its model must come
    from the median of every pass, not from the last pass's single timing."""
    from labs.engine import timing
    from labs.hierarchy.measure import median_over_passes

    memo = {}
    row = {"variant": "loop", "size_bytes": 2**20, "passes": 4}
    for index, us in enumerate((10.0, 30.0, 20.0)):
        with timing.in_pass(index, memo):
            merged = median_over_passes([{**row, "measured_us_per_pass": us}])
    assert merged[0]["measured_us_per_pass"] == 20.0
    assert merged[0]["measured_tbps"] == pytest.approx(2**20 / 20e-6 / 1e12)
    assert median_over_passes([{**row, "measured_us_per_pass": 7.0}])[0]["measured_us_per_pass"] == 7.0
