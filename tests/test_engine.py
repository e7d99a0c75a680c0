"""The engine: parameters, results, the runner, GPU detection and the datasheet."""

import threading
import time
from dataclasses import dataclass

import pytest

from labs import all_labs, get_lab
from labs.engine import gpu
from labs.engine import runner
from labs.engine.params import ParamError, from_strings, param, to_dict, validate
from labs.engine.results import Result, error_pct, list_recorded, merge_rows


@dataclass(frozen=True)
class Knobs:
    n: int = param(64, "size", unit="elements", min=1, max=1024)
    ratio: float = param(0.5, "ratio", min=0.0, max=1.0)
    dtypes: tuple = param(("fp32",), "dtypes", choices=("fp32", "bf16"))
    sizes: tuple = param((1, 2), "sizes", min=1, max=8)
    fused: bool = param(False, "fuse?")


def test_params_parse_and_validate():
    p = from_strings(Knobs, {"n": "128", "ratio": "1/4", "dtypes": "fp32,bf16", "sizes": "3", "fused": "yes"})
    assert p == Knobs(128, 0.25, ("fp32", "bf16"), (3,), True)
    assert to_dict(p)["dtypes"] == ["fp32", "bf16"]


@pytest.mark.parametrize("values, fragment", [
    ({"n": "0"}, "out of range"), ({"n": "2000"}, "allowed 1 to 1024"), ({"n": "abc"}, "not a int"),
    ({"dtypes": "fp64"}, "choose from fp32, bf16"), ({"sizes": "9"}, "out of range"), ({"bogus": "1"}, "unknown parameter"),
    ({"dtypes": ""}, "at least one"), ({"ratio": "nan"}, "out of range"), ({"fused": "maybe"}, "not a bool"),
])
def test_params_reject_with_a_message(values, fragment):
    with pytest.raises(ParamError, match=fragment):
        from_strings(Knobs, values)


def test_validate_rejects_wrong_types():
    with pytest.raises(ParamError):
        validate(Knobs(n="12"))


def test_result_round_trips_through_json_and_csv():
    rows = [{"dtype": "fp32", "x": 1, "measured_ms": 0.5, "predicted_ms": 0.4, "error_pct": 25.0, "ok": True},
            {"dtype": "bf16", "x": 2, "measured_ms": None, "predicted_ms": 0.2, "error_pct": None, "ok": False}]
    r = Result("roofline", {"n": [1, 2]}, rows, {"kind": "live", "gpu": {"name": "X", "key": "x"}}, ["note"], False)
    assert Result.from_json(r.to_json()).to_dict() == r.to_dict()
    assert Result.from_csv(r.to_csv()).to_dict() == r.to_dict()


@pytest.mark.parametrize("text", ["", "[]", "{", '{"schema": 1}', '{"schema": 1, "lab": "x", "params": {}, "rows": [1]}',
                                  '{"schema": 1, "lab": "x", "params": {}, "rows": [{"a": [1]}]}',
                                  '{"schema": 1, "lab": "x", "params": {}, "rows": [], "meta": {"kind": "evil"}}'])
def test_bad_result_files_give_a_message(text):
    with pytest.raises(ParamError, match="Roofline result"):
        Result.from_json(text)


def test_merge_adds_error_on_the_metric():
    measured = [{"k": 1, "measured_tflops": 9.0}, {"k": 3, "measured_tflops": 1.0}]
    predicted = [{"k": 1, "predicted_tflops": 10.0}, {"k": 2, "predicted_tflops": 5.0}]
    rows = merge_rows(measured, predicted, ("k",), "tflops")
    assert rows[0]["error_pct"] == pytest.approx(-10.0)
    assert rows[1]["error_pct"] is None and rows[2] == {"k": 2, "predicted_tflops": 5.0}
    assert error_pct(1.0, 0) is None


def test_datasheet_covers_the_required_gpus_with_sources():
    names = {r.name for r in gpu.DATASHEET}
    for required in ["H100 SXM", "H100 PCIe", "H200", "A100 40GB", "A100 80GB", "L4", "L40S", "T4", "A10G",
                     "RTX 4090", "B200"]:
        assert required in names
    for row in gpu.DATASHEET:
        assert row.source and row.sm_count > 0 and row.bandwidth_tbps > 0 and row.fp32_tflops > 0


@pytest.mark.parametrize("reported, expected", [("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
                                                ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
                                                ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("Tesla T4", "T4"),
                                                ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA A10G", "A10G")])
def test_reported_names_find_their_datasheet_row(reported, expected):
    assert gpu.datasheet_for(reported).name == expected


def test_datasheet_targets_use_recorded_ceilings_when_committed():
    target = gpu.datasheet_target(gpu.datasheet_by_name("H200"))
    assert target.ceilings.source == "recorded" and target.ceilings.gpu == "NVIDIA H200"
    assert gpu.datasheet_target(gpu.datasheet_by_name("T4")).ceilings.source == "datasheet"


def test_recorded_runs_load_and_carry_their_metadata():
    for lab in all_labs():
        for rec in list_recorded(lab.name):
            assert rec.kind == "recorded" and rec.meta["gpu"]["name"] and rec.meta["date"]
            assert rec.meta["versions"]["torch"] and rec.rows


def test_unknown_lab_is_a_param_error():
    with pytest.raises(ParamError, match="unknown lab"):
        get_lab("nope")


def test_gpu_session_serialises_work_and_reports_queue_position():
    inside, overlaps, positions = [], [], []

    def work(i):
        with runner.gpu_session(f"t{i}", on_wait=positions.append):
            inside.append(i)
            if len(inside) > 1:
                overlaps.append(i)
            time.sleep(0.02)
            inside.remove(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not overlaps and positions and runner.queue_length() == 0
    enters = [e for e in runner.EVENT_LOG if e[2].startswith("t")]
    depth = 0
    for _, what, _ in enters:
        depth += 1 if what == "enter" else -1
        assert depth in (0, 1)


@pytest.mark.skipif(gpu.detect().available, reason="checks the no-GPU path")
def test_live_run_without_a_gpu_says_why():
    with pytest.raises(ParamError, match="No CUDA GPU"):
        runner.run(get_lab("roofline"), get_lab("roofline").Params())


def _sweep_that_fails(exc):
    def measure(params, target, progress):
        for i in range(5):
            progress(i / 5, f"point {i}")
            if i == 2:
                raise exc
            yield {"i": i, "measured_ms": 1.0}
    return measure


def _toy_lab(measure):
    from labs.engine.lab import Lab

    return Lab("toy", "Toy", "a toy", (), Knobs, lambda p, t: [], measure, ("i",), "ms")


def test_out_of_memory_keeps_the_measured_points_and_says_so():
    import torch

    rows, messages, complete = runner._measure_rows(_toy_lab(_sweep_that_fails(torch.cuda.OutOfMemoryError("boom"))),
                                                    Knobs(), None, lambda f, m: None, 60)
    assert [r["i"] for r in rows] == [0, 1] and not complete
    assert "ran out of memory after 2 measured points" in messages[0]


def test_time_limit_stops_a_sweep_and_keeps_the_measured_points():
    def slow(params, target, progress):
        for i in range(100):
            progress(i / 100, "slow point")
            time.sleep(0.03)
            yield {"i": i}

    rows, messages, complete = runner._measure_rows(_toy_lab(slow), Knobs(), None, lambda f, m: None, 0.1)
    assert 1 <= len(rows) < 100 and not complete and "time limit" in messages[0]


def test_runner_log_records_enter_and_exit(tmp_path, monkeypatch):
    log = tmp_path / "runner.log"
    monkeypatch.setenv("ROOFLINE_RUNNER_LOG", str(log))
    with runner.gpu_session("logged"):
        pass
    events = [line.split()[1:3] for line in log.read_text().splitlines()]
    assert events == [["enter", "logged"], ["exit", "logged"]]


def test_measure_may_yield_notes_for_the_learner():
    def measure(params, target, progress):
        yield {"i": 0}
        yield "torch.compile was not available: shown without it"
        yield {"i": 1}

    rows, messages, complete = runner._measure_rows(_toy_lab(measure), Knobs(), None, lambda f, m: None, 60)
    assert [r["i"] for r in rows] == [0, 1] and complete
    assert messages == ["torch.compile was not available: shown without it"]
