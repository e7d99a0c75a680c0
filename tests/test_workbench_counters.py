"""Measured DRAM bytes in the workbench's verdict: the counted launch runs inside the sandbox under Nsight
Compute, its CSV is parsed, the bytes go beside the model's and into the gap sentence; without ncu, or
without permission to read counters, the verdict says so.

Test fixture, not a mock of our code: this machine has no GPU and no ncu, so a stand-in `ncu` executable
(written below, put first on PATH) plays Nsight Compute's part on the command line. It writes a committed
real ncu CSV (tests/data/ncu/ncu_dram.csv, captured on an H100) to the --log-file it is given, notes the
user id it runs as and whether the loopback device is up, and runs the real worker it wraps (the harness's
count mode, in Triton's interpreter). Everything of ours (sandbox, harness, parsing, verdict) is real.
"""

import csv
import io
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from labs.engine import counters
from labs.workbench import get_exercise, sandbox
from labs.workbench import verdict as wb
from labs.workbench.exercises import tensor

ROOT = Path(__file__).resolve().parent.parent
DRAM_CSV = ROOT / "tests" / "data" / "ncu" / "ncu_dram.csv"
ADD = get_exercise("add")
TRANSPOSE = get_exercise("transpose")
LIMITS = sandbox.Limits(wall_s=90, cpu_s=90)
SMALL_POINTS = [{"label": "n=1003", "args": [tensor(1003), tensor(1003)]},
                {"label": "n=4099", "args": [tensor(4099), tensor(4099)]}]
PERMISSION_TEXT = (  # the lines ncu prints when the driver refuses counters (as in tests/test_counters.py)
    "==PROF== Connected to process 4242 (/usr/bin/python3.12)\n"
    "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on "
    "the target device 0.\n==WARNING== No kernels were profiled.\n")

FAKE_NCU = '''#!{python}
"""Stand-in for Nsight Compute in tests/test_workbench_counters.py (see its docstring)."""
import fcntl, os, socket, struct, subprocess, sys

VALUED = {{"--print-units", "--clock-control", "--metrics", "--log-file", "--target-processes", "--nvtx-include"}}
args, i, log = sys.argv[1:], 0, None
while i < len(args) and args[i].startswith("--"):
    if args[i] == "--log-file":
        log = args[i + 1]
    i += 2 if args[i] in VALUED else 1
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh22x", b"lo", 0))[:18])[1]
note = "==PROF== stand-in ncu: uid=%d loopback_up=%s options=%s\\n" % (os.getuid(), bool(flags & 1), " ".join(args[:i]))
with open(log, "w") as out:
    out.write(note + open({payload!r}).read())
sys.exit(subprocess.call(args[i:]) if {run_target!r} else 0)
'''


def fake_ncu(payload: Path, run_target: bool = True) -> Path:
    """A folder (readable by the sandbox's user) holding `ncu` and the text it writes as its log."""
    folder = Path(tempfile.mkdtemp(prefix="roofline-fake-ncu-"))
    shutil.copy(payload, folder / "payload.txt")
    script = folder / "ncu"
    script.write_text(FAKE_NCU.format(python=sys.executable, payload=str(folder / "payload.txt"),
                                      run_target=run_target))
    for path in (folder, script, folder / "payload.txt"):
        path.chmod(path.stat().st_mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH | stat.S_IXOTH | stat.S_IXGRP)
    return folder


@pytest.fixture
def ncu_on_path(monkeypatch):
    folder = fake_ncu(DRAM_CSV)
    monkeypatch.delenv("ROOFLINE_NCU", raising=False)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def fma_chain_bytes() -> list[float]:
    """Read + written DRAM bytes of each fma_chain launch in the committed CSV, read straight from it."""
    body = "\n".join(line for line in DRAM_CSV.read_text().splitlines() if not line.startswith("=="))
    per_launch: dict = {}
    for row in csv.DictReader(io.StringIO(body)):
        if row["Kernel Name"] == "fma_chain_kernel" and row["Metric Name"].startswith("dram__bytes_"):
            per_launch[row["ID"]] = per_launch.get(row["ID"], 0.0) + float(row["Metric Value"].replace(",", ""))
    return [per_launch[k] for k in sorted(per_launch, key=int)]


# ------------------------------------------------------------------------------------------------
# Parsing and the sentence
# ------------------------------------------------------------------------------------------------
def test_counted_bytes_come_from_the_csv_between_the_markers():
    run = sandbox.WorkerRun("ok", files={wb.COUNTER_LOG: DRAM_CSV.read_text()}, returncode=0)
    counted = wb.counted_points(run, ["first", "second"])
    assert [counted[k]["dram_bytes"] for k in ("first", "second")] == fma_chain_bytes()
    assert counted["first"]["dram_read_bytes"] == 67115776.0 and counted["first"]["kernels"] == 1


def test_measured_bytes_go_beside_the_model_and_into_the_gap_sentence():
    target = wb.model_target("H100 SXM")
    point = TRANSPOSE.points[0]
    model_bytes = TRANSPOSE.work(point, target)["bytes"]
    slow_ms = 4 * TRANSPOSE.work(point, target)["predicted_ms"]
    row = wb.point_rows(TRANSPOSE, target, {point.label: slow_ms})[0]
    wb.attach_counted(row, {"dram_bytes": 2.0 * model_bytes, "dram_read_bytes": model_bytes,
                            "dram_write_bytes": model_bytes, "kernels": 1}, TRANSPOSE, target)
    assert row["dram_bytes_ratio"] == 2.0 and row["counted_dram_bytes"] == 2.0 * model_bytes
    assert row["gap"].startswith("Moves 2.0x the bytes the model counts") and "not coalesced" in row["gap"]
    near = wb.gap_sentence(TRANSPOSE, slow_ms, row, None, target, 1.16)
    assert "yet moves only 1.16x the bytes it counts" in near and "elsewhere than DRAM traffic" in near
    floor = wb.gap_sentence(TRANSPOSE, row["predicted_ms"], row, None, target, 0.99)
    assert floor.startswith("At the byte floor") and "0.99x the DRAM bytes the model counts" in floor
    untouched = dict(row)
    wb.attach_counted(untouched, None, TRANSPOSE, target)  # no counters for this point: the row stays as it was
    assert untouched == row


def test_page_shows_measured_bytes_beside_the_model():
    """A verdict whose point carries counted bytes (those of the committed CSV's first launch), as saved in the
    session store: the page's table has the measured column and the caption says where it comes from."""
    from streamlit.testing.v1 import AppTest

    from labs.workbench import store

    target = wb.model_target("H100 SXM")
    point = TRANSPOSE.points[0]
    rows = wb.point_rows(TRANSPOSE, target, {point.label: 4 * TRANSPOSE.work(point, target)["predicted_ms"]})
    run = sandbox.WorkerRun("ok", files={wb.COUNTER_LOG: DRAM_CSV.read_text()}, returncode=0)
    verdict = {"exercise": "transpose", "metric": "tbps", "unit": "TB/s", "gpu": "a GPU", "model_gpu": target.name,
               "sandbox": [], "checks": [], "points": rows, "notes": [], "status": "correct", "message": "Correct."}
    wb.attach_counted(rows[0], wb.counted_points(run, [point.label])[point.label], TRANSPOSE, target)
    verdict["counters"] = {"status": "measured", "message": "DRAM bytes read + written, measured by the GPU's counters"}
    token = store.issue()  # the page adopts only a token the server issued (to this browser: none in AppTest)
    store.save(token, "transpose", TRANSPOSE.starter(), verdict)
    at = AppTest.from_file(str(ROOT / "pages" / "workbench.py"), default_timeout=120)
    at.query_params["exercise"], at.query_params["s"] = "transpose", token
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    table = next(d.value for d in at.dataframe if "DRAM bytes, measured" in d.value.columns)
    assert table["DRAM bytes, measured"][0] == fma_chain_bytes()[0]
    assert table["measured / model bytes"][0] == pytest.approx(fma_chain_bytes()[0] / rows[0]["bytes"])
    assert any("measured by the GPU's counters" in c.value for c in at.caption)
    ratio = f"{rows[0]['dram_bytes_ratio']:.2f}x the bytes it counts"  # a quarter: the gap is not DRAM traffic
    assert any(ratio in m.value for m in at.markdown)  # the gap sentence, told with the measured ratio


# ------------------------------------------------------------------------------------------------
# The counted launch: inside the sandbox, under "ncu", in the timed run's folder and as its user
# ------------------------------------------------------------------------------------------------
def test_the_count_runs_inside_the_sandbox_in_the_same_folder(ncu_on_path):
    caps = sandbox.capabilities()
    checked = sandbox.run_worker(ADD.solution(), {"entry": "add", "gpu": False, "points": []},
                                 {"cases": [list(c) for c in ADD.check_cases(False)]}, LIMITS, False, keep_dir=True)
    try:
        assert checked.status == "ok" and checked.workdir.is_dir()
        counted = wb.count_dram(ADD.solution(), ADD.entry, SMALL_POINTS, LIMITS, False, reuse=checked)
        assert [counted[p["label"]]["dram_bytes"] for p in SMALL_POINTS] == fma_chain_bytes()
        assert checked.workdir.is_dir()  # kept for the caller, who discards it
        log = (checked.workdir / wb.COUNTER_LOG).read_text()
        result = (checked.workdir / "result.json").read_text()
    finally:
        sandbox.discard(checked)
    assert checked.workdir is None
    assert '"counted": ["n=1003", "n=4099"]' in result  # the harness's count mode ran every point
    note = log.splitlines()[0]
    assert "--nvtx-include roofline_count/" in note and "--clock-control none" in note and "dram__bytes_read.sum" in note
    if caps.separate_user:
        assert f"uid={checked.uid}" in note and checked.uid >= sandbox.UID_BASE  # ncu ran as the run's own user
    if caps.network_namespace:
        assert "loopback_up=True" in note  # the namespace's own loopback, for ncu and the worker to talk


def test_a_count_that_stops_gives_no_bytes_but_the_reason(ncu_on_path):
    """ncu wrote its CSV, but the learner's function raised during the counted launch: no partial counts."""
    broken = "def add(x, y):\n    raise ValueError('only while counting')\n"
    with pytest.raises(counters.CountersUnavailable) as exc:
        wb.count_dram(broken, "add", SMALL_POINTS[:1], LIMITS, False)
    assert "The counted run stopped" in str(exc.value) and "only while counting" in str(exc.value)


# ------------------------------------------------------------------------------------------------
# No ncu, no permission, no GPU: said plainly, the verdict carries on
# ------------------------------------------------------------------------------------------------
def test_no_ncu_is_said_plainly(monkeypatch, tmp_path):
    monkeypatch.setenv("ROOFLINE_NCU", str(tmp_path / "ncu"))  # nothing there
    assert wb.counters_unavailable(True) == wb.NO_NCU
    with pytest.raises(counters.CountersUnavailable, match="was not found"):
        wb.count_dram(ADD.solution(), ADD.entry, SMALL_POINTS, LIMITS, False)


def test_no_permission_is_said_once_and_not_retried(monkeypatch):
    """The stand-in prints ncu's permission error and does not run the worker (ncu profiles nothing then)."""
    folder = Path(tempfile.mkdtemp(prefix="roofline-perm-"))
    try:
        (folder / "perm.txt").write_text(PERMISSION_TEXT)
        fake = fake_ncu(folder / "perm.txt", run_target=False)
        monkeypatch.delenv("ROOFLINE_NCU", raising=False)
        monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
        monkeypatch.setattr(wb, "_COUNTERS_REFUSED", {})
        target = wb.model_target("H100 SXM")
        verdict = {"points": wb.point_rows(ADD, target, {}), "notes": []}
        wb.add_counters(verdict, ADD, ADD.solution(), None, target, LIMITS)
        assert verdict["counters"]["status"] == "unavailable"
        assert "ERR_NVGPUCTRPERM" in verdict["notes"][0] and "NVreg_RestrictProfilingToAdminUsers=0" in verdict["notes"][0]
        assert all("counted_dram_bytes" not in r for r in verdict["points"])
        assert counters.PERMISSION_HELP in wb.counters_unavailable(True)  # the next submission does not retry
        shutil.rmtree(fake, ignore_errors=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_counters_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("ROOFLINE_WORKBENCH_COUNTERS", "0")
    assert "turned off" in wb.counters_unavailable(True)


@pytest.mark.gpu
def test_gpu_verdict_shows_measured_dram_bytes():
    if wb.counters_unavailable(True):
        pytest.skip(wb.counters_unavailable(True))
    v = wb.submit(ADD, ADD.solution())
    assert v["status"] == "correct", v.get("message")
    assert v["counters"]["status"] == "measured", v["counters"]
    row = v["points"][0]
    assert 0.9 <= row["dram_bytes_ratio"] <= 1.1 and "the DRAM bytes the model counts" in row["gap"]
