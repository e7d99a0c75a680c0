"""scripts/repredict.py: recorded runs re-predicted offline with the models in this checkout."""
import json

import pytest

from labs import all_labs, fusion, get_lab, transfers
from labs.engine.results import RECORDED_DIR
from labs.engine.repredict import recorded_target
from scripts import repredict

H100 = RECORDED_DIR / "nvidia-h100-80gb-hbm3"


def _recording(lab: str) -> dict:
    path = H100 / f"{lab}.json"
    if not path.exists():
        pytest.skip(f"no H100 recording of {lab}")
    return json.loads(path.read_text())


def test_shares_by_hand():
    within, far, missing = repredict.shares([0.0, -15.0, 15.1, 60.0, -51.0, None])
    assert within == pytest.approx(2 / 5) and far == 2 and missing == 1


def test_recorded_target_is_the_gpu_and_ceilings_of_the_run():
    rec = _recording("fusion")
    target = recorded_target(rec["meta"])
    assert target.sm_count == rec["meta"]["gpu"]["sm_count"] and not target.live
    assert target.ceilings.copy_tbps == rec["meta"]["ceilings"]["copy_tbps"]


def test_fusion_rows_get_the_current_model():
    rec = _recording("fusion")
    rows = repredict.repredicted_rows(get_lab("fusion"), rec)
    target = recorded_target(rec["meta"])
    row = next(r for r in rows if r["variant"] == "torch_softmax" and r["n_cols"] == 65536)
    r, c = fusion.softmax_shape(fusion.Params(softmax_mib=row["size_mib"]), 65536)
    predicted = fusion.model_ms(4 * r * c * 4, 1, target)  # three reads and a write of a 256 KiB row
    assert row["after_pct"] == pytest.approx(100 * (row["measured_ms"] - predicted) / predicted)


def test_transfers_use_the_runs_own_staging_rates():
    """Offline, a pageable copy is predicted from the CPU rates the run measured at that size: slow one
    size's recorded rate down and only that size's prediction follows it."""
    rec = _recording("transfers")
    target = recorded_target(rec["meta"])
    key = ("copies", "h2d", "pageable")
    big = [r for r in rec["rows"] if (r["experiment"], r["direction"], r["memory"]) == key
           and r["size_bytes"] >= 64 * 2**20 and r.get("cpu_read_gbps")]
    assert big, "the recording carries the staging probe's rates"
    slowed = big[-1]["size_bytes"]
    for r in rec["rows"]:
        if (r["experiment"], r["direction"], r["memory"]) == key and r["size_bytes"] == slowed:
            r["cpu_read_gbps"] = 0.5
    before = {r["size_bytes"]: r["predicted_ms"] for r in transfers.repredict(_recording("transfers"), target)
              if (r["experiment"], r["direction"], r["memory"]) == key}
    after = {r["size_bytes"]: r["predicted_ms"] for r in transfers.repredict(rec, target)
             if (r["experiment"], r["direction"], r["memory"]) == key}
    assert after[slowed] >= slowed / 0.5e9 * 1e3  # at most 0.5 GB/s now
    assert after[slowed] > 2 * before[slowed]
    assert all(after[s] == pytest.approx(before[s]) for s in before if s != slowed)


def test_a_recorded_run_shown_with_the_current_model_keeps_its_old_error_beside_the_new():
    """The app shows recordings against this version's model (labs/repredict.py): every matched point gets the
    current prediction and its error, and the error it was recorded with stays in recorded_error_pct."""
    from labs.engine.repredict import repredicted_rows, with_current_model
    from labs.engine.results import Result

    lab = get_lab("coalescing")
    raw = _recording("coalescing")
    shown = with_current_model(lab, Result.from_dict(raw))
    after = {r["variant"]: r["after_pct"] for r in repredicted_rows(lab, raw)}
    assert shown.meta["repredicted"] and len(shown.rows) == len(raw["rows"])
    for old, new in zip(raw["rows"], shown.rows):
        assert new[f"measured_{lab.metric}"] == old[f"measured_{lab.metric}"]  # the measurement is untouched
        if old.get("error_pct") is not None:
            assert new["recorded_error_pct"] == old["error_pct"]
            assert new["error_pct"] == pytest.approx(after[old["variant"]])
    shown.rows[0]["measured_gbps"] = -1.0  # a page that changes what it was given does not change the next one
    assert with_current_model(lab, Result.from_dict(raw)).rows[0].get("measured_gbps") != -1.0


def test_a_recording_the_current_model_cannot_read_is_shown_as_recorded():
    from labs.engine.repredict import with_current_model_or_recorded
    from labs.engine.results import Result

    raw = _recording("coalescing")
    raw["meta"] = {**raw["meta"], "ceilings": {}, "date": "unreadable"}  # no ceilings: no Target to predict for
    result = Result.from_dict(raw)
    assert with_current_model_or_recorded(get_lab("coalescing"), result) is result


def test_score_by_hand():
    from labs.engine.repredict import score

    s = score([1.0, -2.0, 14.0, -16.0, 30.0, 60.0, None, -3.0, 5.0, 8.0, 0.0])
    assert s["points"] == 10 and s["within_15_pct"] == pytest.approx(70.0) and s["over_50_pct"] == 1
    # |errors| sorted: 0 1 2 3 5 8 14 16 30 60 -> nearest-rank median the 5th, 90th percentile the 9th
    assert s["median_abs_error_pct"] == 5.0 and s["p90_abs_error_pct"] == 30.0 and s["worst_abs_error_pct"] == 60.0
    assert score([None])["within_15_pct"] is None


def test_scorecard_rows_are_the_current_model_on_each_recording():
    from labs.engine.repredict import scorecard

    lab = get_lab("coalescing")
    rows = {r["gpu_key"]: r for r in scorecard([lab])}
    for key, row in rows.items():
        raw = json.loads((RECORDED_DIR / key / "coalescing.json").read_text())
        after = [r["after_pct"] for r in repredict.repredicted_rows(lab, raw)]
        before = [r["error_pct"] for r in raw["rows"] if r.get("error_pct") is not None]
        assert row["repredicted"] and row["points"] == len(after)
        assert row["within_15_pct"] == pytest.approx(100 * repredict.shares(after)[0])
        assert row["recorded_within_15_pct"] == pytest.approx(100 * repredict.shares(before)[0])


def test_library_ratios_by_hand():
    from labs import attention, matmul

    rows = [{"kernel": "triton", "dtype": "bf16", "n": 2048, "path": "tma", "measured_ms": 0.025},
            {"kernel": "cublas", "dtype": "bf16", "n": 2048, "measured_ms": 0.020},
            {"kernel": "triton", "dtype": "bf16", "n": 2049, "path": "vec2", "measured_ms": 0.050},
            {"kernel": "cublas", "dtype": "bf16", "n": 2049, "measured_ms": 0.020},
            {"kernel": "triton", "dtype": "bf16", "n": 2056, "path": "tma", "measured_ms": 0.040},
            {"kernel": "cublas", "dtype": "bf16", "n": 2056, "measured_ms": 0.020},
            {"kernel": "triton", "dtype": "bf16", "n": 8320, "path": "tma", "measured_ms": 9.0},
            {"kernel": "cublas", "dtype": "bf16", "n": 8320, "measured_ms": 8.0},
            {"kernel": "triton", "dtype": "bf16", "n": 512, "path": "tma", "measured_ms": 0.010},
            {"kernel": "cublas", "dtype": "bf16", "n": 512, "measured_ms": 0.005}]
    got = {r["case"]: r for r in matmul.library_ratios(rows)}
    assert got["bf16 N = 2048"]["speed_ratio"] == pytest.approx(0.8) and got["bf16 N = 2048"]["target"] == 0.9
    assert got["bf16 N = 2049 (unaligned)"]["target"] is None  # the pointer path: no bar
    assert got["bf16 N = 512"]["target"] is None  # below 1024: no bar
    assert got["bf16 N = 2056"]["target"] is None  # just past a power of two: taught, not targeted (issue 33)
    assert got["bf16 N = 8320"]["target"] is None  # a multiple of 128, but past 8192
    key = {"mode": "fwd", "causal": False, "dtype": "bf16", "head_dim": 128}
    rows = [key | {"impl": "ours", "seq_len": 2048, "measured_ms": 1.0},
            key | {"impl": "sdpa-cudnn", "seq_len": 2048, "measured_ms": 0.8},
            key | {"impl": "sdpa-flash", "seq_len": 2048, "measured_ms": 1.5},
            key | {"impl": "ours", "seq_len": 1024, "measured_ms": 0.5},
            key | {"impl": "sdpa-flash", "seq_len": 1024, "measured_ms": 0.5},
            key | {"impl": "naive", "seq_len": 1024, "measured_ms": 2.0}]
    got = {(r["case"], r["library"]): r for r in attention.library_ratios(rows)}
    assert len(got) == 3  # naive attention is not a library
    cudnn = got[("fwd full bf16 d = 128 N = 2048", "cuDNN (SDPA)")]
    assert cudnn["speed_ratio"] == pytest.approx(0.8) and cudnn["target"] == 0.95
    assert got[("fwd full bf16 d = 128 N = 2048", "FlashAttention (SDPA)")]["target"] is None  # flash's bar is at 1024
    assert got[("fwd full bf16 d = 128 N = 1024", "FlashAttention (SDPA)")]["target"] == 0.9


def test_kernels_against_libraries_read_the_recordings_as_they_are():
    """The scorecard's ratios are the recorded times' own: cuBLAS's time over ours at one recorded point, and the
    verdict against the bar follows from it."""
    from labs.engine.repredict import kernels_against_libraries, library_summary

    cases = kernels_against_libraries(all_labs())
    rec = _recording("matmul")
    times = {r["kernel"]: r["measured_ms"] for r in rec["rows"] if r.get("n") == 2048 and r.get("dtype") == "bf16"}
    gpu_name = rec["meta"]["gpu"]["name"]
    case = next(c for c in cases if c["lab"] == "matmul" and c["gpu"] == gpu_name and c["case"] == "bf16 N = 2048")
    assert case["speed_ratio"] == pytest.approx(times["cublas"] / times["triton"])
    assert case["meets"] == (case["speed_ratio"] >= 0.9)
    summary = library_summary(cases)
    for row in summary:
        group = [c for c in cases if c["title"] == row["lab"] and c["gpu"] == row["GPU"] and c["library"] == row["against"]
                 and c["target"] == row["target (x)"]]
        assert row["cases"] == len(group) and row["meet it"] == sum(c["meets"] for c in group)
        assert row["slowest (x)"] == min(c["speed_ratio"] for c in group)


def test_transfers_overlap_is_predicted_for_the_matmuls_the_run_ran():
    """The overlap's compute is predicted for the run's own matmul count, at cuBLAS's recorded rate at N = 4096
    (not the calibration's N = 8192, which ran under a lower, power-capped clock)."""
    from labs.transfers import model as tmodel

    rec = _recording("transfers")
    target = recorded_target(rec["meta"])
    compute = next(r for r in rec["rows"] if r["experiment"] == "overlap" and r["schedule"] == "compute alone")
    rate = tmodel.matmul_tflops(target)
    cublas_4096 = [r["measured_tflops"] for r in tmodel.recorded_rows("matmul", target.key)
                   if (r.get("kernel"), r.get("dtype"), r.get("n")) == ("cublas", "bf16", 4096)]
    assert cublas_4096 and rate == pytest.approx(cublas_4096[0])
    for count in (compute["matmuls"], 2 * compute["matmuls"]):
        for r in rec["rows"]:
            if r["experiment"] == "overlap":
                r["matmuls"] = count
        row = next(r for r in transfers.repredict(rec, target) if r["schedule"] == "compute alone")
        assert row["matmuls"] == count
        assert row["predicted_ms"] == pytest.approx(count * 2 * 4096**3 / (rate * 1e12) * 1e3)
