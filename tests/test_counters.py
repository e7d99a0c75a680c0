"""Hardware counters beside the model (labs/counters.py, ui/counters.py).

The CSV files under tests/data/ncu/ are real `ncu --csv` output captured on an H100 (ncu 2025.3.1) with
`python3 scripts/counters_gpu.py capture` and `... permission`: the roofline lab's FMA-chain kernel at
64 MiB (fp32, F = 1 and F = 64), one file per metric set, the counted kernels between marker kernels.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labs import all_labs, get_lab
from labs.engine import counters
from labs.engine import gpu
from labs.engine import params as params_mod
from labs.engine.results import Result
from labs.coalescing import counters as coalescing_counters

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "ncu"
N_64MIB = 64 * 2**20 // 4  # fp32 elements of the captured runs
POINTS = ["F=1", "F=64"]


def captured(name: str) -> list:
    return counters.parse_csv((DATA / f"ncu_{name}.csv").read_text())


def point_totals(name: str) -> dict:
    return {label: counters.totals(ks) for label, ks in counters.split_points(captured(name), POINTS).items()}


# ------------------------------------------------------------------------------------------------
# Parsing real ncu output
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("metric_set", list(counters.METRIC_SETS))
def test_every_metric_set_parses_with_all_its_metrics(metric_set):
    kernels = captured(metric_set)
    names = [k.name for k in kernels]
    assert names == [counters.MARK_BEGIN, "fma_chain_kernel", counters.MARK_END] * 2  # the NVTX filter kept only these
    for k in kernels:
        assert set(k.metrics) == set(counters.METRIC_SETS[metric_set]), (metric_set, k.name)
        assert all(v is not None for v in k.metrics.values())


def test_values_with_thousands_separators_and_units():
    dram = point_totals("dram")
    assert dram["F=1"]["dram__bytes_read.sum"] == 67115776.0  # written as "67,115,776" byte
    assert counters.parse_value("1,234.5", "Kbyte") == 1234500.0
    assert counters.parse_value("n/a") is None and counters.parse_value("") is None
    assert counters.parse_value("1,954,194,742.65", "hz") == pytest.approx(1.954e9, rel=1e-3)  # ncu's base unit


def test_the_pipes_set_reads_the_clock_the_sms_ran_at():
    for label, t in point_totals("pipes").items():
        clock = counters.counted_quantities(t, 1)["sm_clock_mhz"]
        assert 1000 < clock < 2100, (label, clock)  # a Hopper SM's clock, in MHz, under ncu's clocks left alone


def test_fp32_flops_counted_match_the_roofline_model_exactly():
    flops = point_totals("flops")
    for label, per_element in (("F=1", 1), ("F=64", 64)):
        counted = counters.counted_quantities(flops[label], 1)["fp32_flops"]
        assert counted == N_64MIB * per_element, label


def test_dram_bytes_read_are_the_input_once():
    dram = point_totals("dram")
    for label in POINTS:
        read = dram[label]["dram__bytes_read.sum"]
        assert abs(read / (4 * N_64MIB) - 1) < 0.01, (label, read)
        # the L2 is write-back: part of the 64 MiB written is still in it when the kernel ends
        assert 0.5 < dram[label]["dram__bytes_write.sum"] / (4 * N_64MIB) <= 1.0


def test_sectors_and_branch_sets_give_the_expected_ratios():
    sectors = counters.counted_quantities(point_totals("sectors")["F=1"], 1)
    assert sectors["sectors_per_request"] == 16.0  # 16-byte vector loads: 512 bytes per warp request
    branch = counters.counted_quantities(point_totals("branch")["F=1"], 1)
    assert branch["threads_per_warp_instruction"] == 32.0  # no divergence in the FMA chain


def test_unfiltered_output_splits_at_the_markers_and_ignores_setup_kernels():
    kernels = captured("dram_unfiltered")
    assert len(kernels) > 6  # random-number and warm-up kernels were profiled too
    points = counters.split_points(kernels, POINTS)
    assert list(points) == POINTS
    assert all([k.name for k in ks] == ["fma_chain_kernel"] for ks in points.values())


def test_kernel_names_with_commas_and_quotes_parse():
    text = (DATA / "ncu_nonroot.txt").read_text()
    kernels = counters.parse_csv(text)
    assert len(kernels) == 2 and "CUDAGeneratorImpl" in kernels[0].name
    assert kernels[1].metrics["dram__bytes_read.sum"] == 4199936.0
    assert counters.ncu_failure(0, text) is None  # counters are allowed for non-root users on that machine


def test_totals_sum_counts_and_weight_rates_by_duration():
    a = counters.Kernel(0, "a", {"dram__bytes_read.sum": 10.0, "gpu__time_duration.sum": 1.0,
                                 "lts__t_sector_op_read_hit_rate.pct": 100.0, "launch__registers_per_thread": 32.0})
    b = counters.Kernel(1, "b", {"dram__bytes_read.sum": 30.0, "gpu__time_duration.sum": 3.0,
                                 "lts__t_sector_op_read_hit_rate.pct": 0.0, "launch__registers_per_thread": 64.0})
    t = counters.totals([a, b])
    assert t["dram__bytes_read.sum"] == 40.0
    assert t["lts__t_sector_op_read_hit_rate.pct"] == 25.0
    assert t["launch__registers_per_thread"] == 56.0  # per-launch figures are averaged, not summed


# ------------------------------------------------------------------------------------------------
# No permission, no ncu, no GPU: a plain reason, no crash
# ------------------------------------------------------------------------------------------------
PERMISSION_OUTPUT = """==PROF== Connected to process 4242 (/usr/bin/python3.12)
==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on the target device 0. For instructions on enabling permissions and to get more information see https://developer.nvidia.com/ERR_NVGPUCTRPERM
==PROF== Disconnected from process 4242
==WARNING== No kernels were profiled.
"""


def test_no_permission_says_how_to_get_it():
    reason = counters.ncu_failure(0, PERMISSION_OUTPUT)
    assert "ERR_NVGPUCTRPERM" in reason and "NVreg_RestrictProfilingToAdminUsers=0" in reason
    assert counters.parse_csv(PERMISSION_OUTPUT) == []


def test_a_real_ncu_error_is_reported_in_its_own_words():
    text = (DATA / "ncu_nonroot_no_home.txt").read_text()  # ncu as another user with root's HOME
    reason = counters.ncu_failure(1, text)
    assert reason.startswith("Nsight Compute failed: Failed to parse options")


def test_no_ncu_is_said_plainly(monkeypatch, tmp_path):
    monkeypatch.setenv("ROOFLINE_NCU", str(tmp_path / "ncu"))  # a path with nothing there
    assert counters.ncu_path() is None
    with pytest.raises(counters.CountersUnavailable) as exc:
        counters.profile_command(["true"])
    assert "was not found" in str(exc.value) or "needs a GPU" in str(exc.value)


@pytest.mark.skipif(gpu.detect().available, reason="checks the no-GPU path")
def test_count_without_a_gpu_says_why():
    with pytest.raises(counters.CountersUnavailable, match="needs a GPU"):
        counters.count("roofline")


def test_ncu_command_leaves_clocks_alone_and_writes_csv():
    cmd = counters.ncu_command("/x/ncu", ["dram__bytes_read.sum"], "/tmp/log.csv", ["python3", "a.py"], "r")
    assert cmd[:1] == ["/x/ncu"] and cmd[-2:] == ["python3", "a.py"]
    joined = " ".join(cmd)
    assert "--csv" in cmd and "--clock-control none" in joined and "--nvtx-include r/" in joined
    with pytest.raises(params_mod.ParamError, match="unknown metric set"):
        counters.metric_names(["dram", "nope"])


def test_cli_count_exits_with_a_reason():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    unknown = subprocess.run([sys.executable, "-m", "labs", "count", "launch"], capture_output=True, text=True,
                             cwd=ROOT, env=env, timeout=120)
    assert unknown.returncode == 2 and "no counter spec" in unknown.stderr
    if not gpu.detect().available:
        done = subprocess.run([sys.executable, "-m", "labs", "count", "roofline"], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=120)
        assert done.returncode == 3 and "no counters: Counting needs a GPU" in done.stderr


# ------------------------------------------------------------------------------------------------
# Adapters: points keyed like the lab's rows, a model for each
# ------------------------------------------------------------------------------------------------
COVERED = ("roofline", "coalescing", "hierarchy", "fusion", "matmul", "attention", "divergence", "hopper")


def test_the_issue_s_labs_are_covered():
    assert set(COVERED) <= set(counters.counted_labs())
    assert {lab.name for lab in all_labs()} >= set(counters.counted_labs())


@pytest.mark.parametrize("name", COVERED)
def test_points_are_keyed_like_the_lab_rows_and_modelled(name):
    lab, adapter = get_lab(name), counters.adapter_for(name)
    params = lab.default_params()
    target = gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM"))
    points = adapter.points(params)
    assert points
    predicted = lab.predict(params, target)
    for point in points:
        assert set(point) == set(lab.key), point
        library = point.get("kernel") == "cublas" or str(point.get("impl", "")).startswith("sdpa-")
        if not library:  # the labs model their own kernels, not cuBLAS's or cuDNN's (counted where a GPU runs them)
            assert any(all(r.get(k) == v for k, v in point.items()) for r in predicted), point
    modelled = counters.model_values(lab, adapter, params, points, target)
    assert all(isinstance(v.get(adapter.shown[0]), (int, float)) for v in modelled.values()), modelled


def test_stride_model_in_hand_checked_numbers():
    assert [coalescing_counters.stride_sectors_per_request(s) for s in (1, 2, 8)] == [16.0, 32.0, 32.0]
    # 1024 outputs at stride 1: 8 warp requests of 16 sectors; at stride 2: 32 requests of 32 sectors
    assert coalescing_counters.stride_load_sectors(1024, 1) == 128 and coalescing_counters.stride_load_sectors(1024, 2) == 1024


def test_compare_rows_give_the_ratio():
    rows = counters.compare_rows([{"n": 1}], {"n=1": {"dram_bytes": 90.0}}, {"n=1": {"dram_bytes": 100}},
                                 ("dram_bytes",))
    assert rows[0]["ratio"] == pytest.approx(0.9) and rows[0]["unit"] == "bytes"
    assert "0.9" in counters.format_table(rows)


# ------------------------------------------------------------------------------------------------
# Recorded counter runs: made by `python -m labs count LAB --record` on a GPU
# ------------------------------------------------------------------------------------------------
# where the lab claims a byte model: counted / modelled DRAM bytes within 10 %; the points outside it
# are explained in content/counters.md (strided and partial-sector traffic the model leaves out)
BYTE_MODEL_EXCEPTIONS = {("coalescing", "stride 8"), ("coalescing", "row walk"), ("coalescing", "naive"),
                         ("matmul", "cublas"), ("hopper", "cuBLAS")}


@pytest.mark.parametrize("name", COVERED)
def test_recorded_counts_load_and_bytes_match_the_model(name):
    recorded = counters.list_recordings(name)
    assert recorded, f"no recorded counter run of {name}"
    for result in recorded:
        assert result.meta["kind"] == "recorded" and result.meta["gpu"]["name"]
        for row in result.rows:
            if row["quantity"] not in ("dram_bytes", "dram_read_bytes") or row["ratio"] is None:
                continue
            where = (name, row.get("variant") or row.get("kernel") or row.get("step"))
            if where not in BYTE_MODEL_EXCEPTIONS:
                assert 0.9 <= row["ratio"] <= 1.1, (where, row)


def test_recording_round_trip(tmp_path, monkeypatch):
    result = counters.list_recordings("roofline")[0]
    live = Result.from_dict(json.loads(result.to_json()))
    live.meta["kind"] = "live"
    from labs.engine import results

    monkeypatch.setattr(gpu, "RECORDED_DIR", tmp_path)
    monkeypatch.setattr(results, "RECORDED_DIR", tmp_path)
    assert counters.list_recordings("roofline") == []
    path = counters.save_recording(live)
    assert path == tmp_path / result.meta["gpu"]["key"] / "counters" / "roofline.json"
    assert [r.rows for r in counters.list_recordings("roofline")] == [result.rows]
    with pytest.raises(params_mod.ParamError):
        counters.save_recording(result)  # already a recording: only live counts are recorded


# ------------------------------------------------------------------------------------------------
# The panel
# ------------------------------------------------------------------------------------------------
def test_panel_shows_recorded_counts_without_a_gpu():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / "coalescing.py"), default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    headers = [h.value for h in at.subheader]
    assert any(h.startswith("Count it") for h in headers)
    assert any(s.label == "Recorded counter runs of real GPUs" for s in at.selectbox)
    started = time.perf_counter()
    at.run()
    assert time.perf_counter() - started < 1.0 and not at.exception
    if not gpu.detect().available:
        assert any("Live counting" in i.value for i in at.info)  # needs a GPU (said once per page) or is off


def test_comparison_figure_has_model_and_counted_bars():
    from ui.counters import comparison_figure

    rows = counters.list_recordings("fusion")[0].rows
    fig = comparison_figure(rows, "dram_bytes", "t")
    assert [t.name for t in fig.data] == ["model", "counted by the GPU"]
    assert len(fig.data[0].x) == len([r for r in rows if r["quantity"] == "dram_bytes"])


@pytest.mark.gpu
def test_count_roofline_on_the_gpu():
    if counters.why_unavailable():
        pytest.skip(counters.why_unavailable())
    lab = get_lab("roofline")
    params = params_mod.from_strings(lab.Params, {"dtypes": "fp32", "flops_per_element": "1,64", "size_mib": "256"})
    result = counters.count("roofline", params)
    by = {(r["flops_per_element"], r["quantity"]): r for r in result.rows}
    for flops in (1, 64):
        assert by[(flops, "fp32_flops")]["ratio"] == 1.0
        assert 0.9 <= by[(flops, "dram_bytes")]["ratio"] <= 1.02
        assert by[(flops, "kernels")]["counted"] == 1


@pytest.mark.gpu
def test_count_the_training_call_with_its_backward_kernels():
    """The backward runs on autograd's own thread unless the count keeps it on the counting one: then its kernels
    would fall outside the NVTX range and the training call would count as its forward alone."""
    if counters.why_unavailable():
        pytest.skip(counters.why_unavailable())
    lab = get_lab("attention")
    params = params_mod.from_strings(lab.Params, {"seq_lens": "1024", "head_dims": "64", "masks": "full",
                                                  "impls": "ours", "modes": "fwd,fwd+bwd", "batch": "2", "heads": "4"})
    result = counters.count("attention", params)
    kernels = {r["mode"]: r["counted"] for r in result.rows if r["quantity"] == "kernels"}
    assert kernels == {"fwd": 1, "fwd+bwd": 3}  # the forward; then the forward, the dK/dV and the dQ kernels
    clocks = [r["counted"] for r in result.rows if r["quantity"] == "sm_clock_mhz"]
    assert clocks and all(500 < c < 2500 for c in clocks)  # MHz, read with the tensor pipe
