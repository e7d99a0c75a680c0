"""The trusted judge: the time of a verdict comes from Nsight Compute outside the jail, every timed call gets
fresh inputs and has its output checked here, and a time below physics or far from the learner's own reads
not credible.

Test fixture, not a mock of our code: this machine has no GPU and no ncu, so a stand-in `ncu` executable
(written below, put first on PATH) plays Nsight Compute's part on the command line: it notes where it runs
(its uid, its network namespace's loopback, the log path it was given), writes a CSV of kernels to its
--log-file and runs the real jailed worker it wraps (the harness's judge mode, in Triton's interpreter).
Everything of ours (jail, harness, judge, checks, verdict) is real.
"""

import os
import time
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from labs.engine import counters
from labs.workbench import get_exercise, jail, judge, sandbox
from labs.workbench import verdict as wb
from labs.workbench.exercises import Point, tensor

ADD = get_exercise("add")
TRANSPOSE = get_exercise("transpose")
LIMITS = sandbox.Limits(compile_s=90, run_s=60, cpu_s=90)
SMALL = Point("n=1003", (tensor(1003), tensor(1003)), {"n": 1003})
# in CI (.ci/run installs bubblewrap) a missing jail fails these tests instead of skipping them
needs_jail = pytest.mark.skipif(not jail.status().jailed and not os.environ.get("CI"),
                                reason=f"no bubblewrap jail here: {jail.status().reason}")
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def kernel_rows(kernels: list) -> str:
    """ncu's CSV for kernels given as (name, duration ns, dram bytes read, written, grid blocks, block threads)."""
    lines = [HEADER]
    for i, (name, ns, read, write, grid, block) in enumerate(kernels):
        for metric, unit, value in (("gpu__time_duration.sum", "nsecond", ns), ("dram__bytes_read.sum", "byte", read),
                                    ("dram__bytes_write.sum", "byte", write), ("launch__grid_size", "", grid),
                                    ("launch__block_size", "", block), ("launch__registers_per_thread", "register/thread", 26),
                                    ("launch__waves_per_multiprocessor", "", grid / 132 / 16)):
            lines.append(f'"{i}","7","python3","127.0.0.1","{name}","1","7","({block}, 1, 1)","({grid}, 1, 1)","0",'
                         f'"9.0","Command line profiler metrics","{metric}","{unit}","{value}"')
    return "\n".join(lines) + "\n"


FAKE_NCU = '''#!{python}
"""Stand-in for Nsight Compute in tests/test_workbench_judge.py (see its docstring)."""
import fcntl, os, socket, struct, subprocess, sys

VALUED = {{"--print-units", "--clock-control", "--metrics", "--log-file", "--target-processes", "--launch-count"}}
args, i, log = sys.argv[1:], 0, None
while i < len(args) and args[i].startswith("--"):
    if args[i] == "--log-file":
        log = args[i + 1]
    i += 2 if args[i] in VALUED else 1
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh22x", b"lo", 0))[:18])[1]
env = dict(os.environ, FAKE_NCU_LOG=log)  # as a real ncu's injection variables, it reaches the worker
code = subprocess.call(args[i:], env=env) if {run_target!r} else 0
with open(log, "w") as out:
    out.write("==PROF== stand-in ncu: uid=%d loopback_up=%s log=%s options=%s\\n"
              % (os.getuid(), bool(flags & 1), log, " ".join(args[:i])))
    out.write(open({payload!r}).read())
sys.exit(code)
'''


# the stand-ins' interpreter, by its real path: a virtual environment's link under /tmp (a checkout there) is not
# there for a profiler whose /tmp is the jail's (the shared-tmp variant)
STAND_IN_PYTHON = os.path.realpath(sys.executable)


def fake_ncu(payload: str, run_target: bool = True) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="roofline-fake-ncu-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    (folder / "payload.txt").write_text(payload)
    script = folder / "ncu"
    script.write_text(FAKE_NCU.format(python=STAND_IN_PYTHON, payload=str(folder / "payload.txt"), run_target=run_target))
    for path in (folder, script, folder / "payload.txt"):
        path.chmod(path.stat().st_mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH | stat.S_IXOTH | stat.S_IXGRP)
    return folder


@pytest.fixture
def ncu_with(monkeypatch):
    made = []

    def install(payload: str, run_target: bool = True) -> Path:
        folder = fake_ncu(payload, run_target)
        made.append(folder)
        monkeypatch.delenv("ROOFLINE_NCU", raising=False)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
        return folder

    yield install
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


ADD_KERNELS = [("add_kernel", 1000.0, 8 * 1003, 4 * 1003, 1, 128)] * judge.CALLS

# A submission that, in the judged run, looks for the profiler's log (its path is in the worker's environment,
# as ncu's own variables are) to rewrite it, and for the profiler's process to signal it.
FORGER = '''import torch


def add(x, y):
    b = torch.__builtins__
    get = b.get if isinstance(b, dict) else lambda name: getattr(b, name)
    os = get("__import__")("os")
    log = os.environ.get("FAKE_NCU_LOG")
    if log:
        try:
            get("open")(log, "w").write("forged")
            found = "log=rewritten"
        except OSError as exc:
            found = "log=unreachable:" + type(exc).__name__
        ncu = [p for p in os.listdir("/proc") if p.isdigit() and get("open")("/proc/" + p + "/comm").read().strip() == "ncu"]
        get("open")("/run/learner/forger.txt", "w").write(found + " ncu_pids=" + ",".join(ncu))
    return x + y
'''


@needs_jail
def notes_left_in_runs(monkeypatch, name: str) -> list:
    """What the learner's code wrote to `name` in each run's folder, read as each run ends (the judged run's
    folder is gone once judge_point returns)."""
    notes, finish = [], sandbox.finish_worker

    def finish_then_read(started):
        run = finish(started)
        if (started.work / name).is_file():
            notes.append((started.work / name).read_text())
        return run

    monkeypatch.setattr(sandbox, "finish_worker", finish_then_read)
    return notes


def test_the_judge_reads_its_log_outside_the_jail_and_checks_every_call(ncu_with, monkeypatch):
    ncu_with(kernel_rows(ADD_KERNELS))
    notes = notes_left_in_runs(monkeypatch, "forger.txt")
    checked = sandbox.run_worker(FORGER, {"entry": "add", "gpu": False, "mode": "check"},
                                 {"cases": [[torch.randn(5), torch.randn(5)]]}, LIMITS, False, keep_dir=True)
    try:
        assert checked.status == "ok", checked.message
        pending = judge.start(ADD, FORGER, LIMITS, False)  # started ahead, as verdict.submit does
        judged = judge.judge_point(ADD, FORGER, SMALL, LIMITS, False, reuse=checked, pending=pending)
        note = notes[-1]
    finally:
        sandbox.discard(checked)
    assert judged["status"] == "measured", judged
    assert len(judged["checks"]) == judge.CALLS and all(c["passed"] for c in judged["checks"])
    assert judged["trusted_ms"] == pytest.approx(1000.0 * judge.CALLS / 1e6 / judge.CALLS)
    assert judged["kernels"] == judge.CALLS and judged["launch"]["kernel"] == "add_kernel"
    assert judged["dram_bytes"] == pytest.approx(12 * 1003)
    assert note.startswith("log=unreachable:") and note.endswith("ncu_pids=")  # no log, no profiler in sight


@needs_jail
def test_the_profiler_runs_outside_the_jail_in_a_network_namespace_of_its_own(ncu_with, monkeypatch):
    folder = ncu_with(kernel_rows(ADD_KERNELS))
    seen = {}
    original = judge.kernels_from_log

    def keep(text):
        seen["log"] = text
        return original(text)

    monkeypatch.setattr(judge, "kernels_from_log", keep)
    judged = judge.judge_point(ADD, ADD.solution(), SMALL, LIMITS, False)
    assert judged["status"] == "measured"
    note = seen["log"].splitlines()[0]
    assert f"uid={os.getuid()}" in note and "loopback_up=True" in note  # the app's user, its own loopback
    assert "--clock-control none" in note and f"--launch-count {judge.MAX_KERNELS}" in note
    log = Path(note.split("log=")[1].split()[0])
    assert sandbox.SANDBOX_BASE in log.parents and log.parent.name.startswith("judge-")
    assert not log.parent.exists()  # removed after the run
    assert folder.exists()


CACHED = '''import torch

SEEN = {}


def add(x, y):
    """Computes once per shape and hands the same output back afterwards (a cached result)."""
    key = tuple(x.shape)
    if key not in SEEN:
        SEEN[key] = x + y
    return SEEN[key]
'''

LAZY_SHAPE = '''import torch


def add(x, y):
    """Right on the check cases' odd sizes, lazy on the timed calls' even size: returns x alone."""
    return x + y if x.numel() % 2 else x.clone()
'''


@needs_jail
@pytest.mark.parametrize("code", [CACHED, LAZY_SHAPE], ids=["cached output", "different work on timed calls"])
def test_an_output_that_is_wrong_in_a_timed_call_is_caught(ncu_with, code):
    ncu_with(kernel_rows(ADD_KERNELS))
    even = Point("n=1004", (tensor(1004), tensor(1004)), {"n": 1004})
    judged = judge.judge_point(ADD, code, even, LIMITS, False)
    assert judged["status"] == "wrong", judged
    assert not all(c["passed"] for c in judged["checks"])


@needs_jail
def test_no_permission_for_counters_is_said_plainly(ncu_with):
    ncu_with("==PROF== Connected to process 4242\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n",
             run_target=False)
    with pytest.raises(judge.JudgeUnavailable) as info:
        judge.judge_point(ADD, ADD.solution(), SMALL, LIMITS, False)
    assert counters.PERMISSION_HELP in str(info.value)
    assert counters.PERMISSION_HELP in judge.unavailable(True)  # the next submission does not ask again
    judge._REFUSED.clear()


def test_without_ncu_the_time_is_self_timed_and_said_so(monkeypatch, tmp_path):
    monkeypatch.setenv("ROOFLINE_NCU", str(tmp_path / "no-ncu"))
    why = judge.unavailable(True)
    assert "Nsight Compute (ncu) was not found" in why
    with pytest.raises(judge.JudgeUnavailable):
        judge.judge_point(ADD, ADD.solution(), SMALL, LIMITS, True)


# ------------------------------------------------------------------------------------------------
# Physics and credibility, on the numbers a judged run gives
# ------------------------------------------------------------------------------------------------
def judged_row(ex, ms: float, self_ms=None, kernels: int = judge.CALLS, dram=None):
    target = wb.model_target("H100 SXM")
    point = ex.points[0]
    work = ex.work(point, target)
    got = {"status": "measured", "trusted_ms": ms, "kernels": kernels, "kernels_per_call": kernels / judge.CALLS,
           "kernel_names": ["k"], "calls": judge.CALLS, "dram_bytes": work["bytes"] if dram is None else dram,
           "dram_read_bytes": 0, "dram_write_bytes": 0,
           "launch": {"kernel": "k", "grid_blocks": 65536.0, "block_threads": 128.0, "registers": 26.0, "waves": 30.0}}
    self_t = {} if self_ms is None else {point.label: self_ms}
    return wb.point_rows(ex, target, self_t, {point.label: got})[0], work, target


def test_a_time_below_the_physics_floor_is_not_credible():
    row, work, target = judged_row(ADD, 1e-3)
    floor, _ = judge.floor_ms(ADD, work, target)
    peak = max(target.ceilings.copy_tbps * judge.FLOOR_MARGIN, target.datasheet.bandwidth_tbps)
    assert floor == pytest.approx(work["bytes"] / (peak * 1e12) * 1e3)
    assert row["credible"] is False and "below this GPU's physics floor" in row["not_credible"][0]
    mm = get_exercise("matmul")
    mrow, mwork, _ = judged_row(mm, 0.5 * mwork_floor(mm))
    assert mrow["credible"] is False and "TFLOP/s" in mrow["not_credible"][0]
    honest, _, _ = judged_row(ADD, 1.2 * floor, self_ms=1.25 * floor)
    assert honest["credible"] is True and honest["measured_by"] == "trusted"


def test_the_floor_is_the_hardwares_peak_not_a_sustained_ceiling():
    """A matmul profiled alone can pass the calibrated cuBLAS rate (an H100: 729 against 647 TFLOP/s); the
    datasheet's peak is what no kernel beats, so an honest 729 TFLOP/s is credible and 1,200 is not."""
    mm = get_exercise("matmul")
    target = wb.model_target("H100 SXM")
    work = mm.work(mm.points[0], target)
    floor, what = judge.floor_ms(mm, work, target)
    peak = target.datasheet.matmul_tflops(mm.dtype)
    assert floor == pytest.approx(work["flops"] / (peak * 1e12) * 1e3) and "datasheet" in what
    at_729 = work["flops"] / 729e12 * 1e3
    assert judged_row(mm, at_729, self_ms=at_729 * 1.04)[0]["credible"] is True
    assert judged_row(mm, work["flops"] / 1200e12 * 1e3)[0]["credible"] is False


def mwork_floor(ex) -> float:
    target = wb.model_target("H100 SXM")
    return judge.floor_ms(ex, ex.work(ex.points[0], target), target)[0]


def test_a_self_timing_far_from_the_trusted_one_is_not_credible():
    floor = mwork_floor(ADD)
    row, _, _ = judged_row(ADD, 2 * floor, self_ms=1.5 * floor)  # its own clock says 25% faster
    assert row["credible"] is False and "timed itself" in row["not_credible"][0]
    assert row["measured_ms"] == 2 * floor and row["self_ms"] == 1.5 * floor  # the verdict's time is the trusted one


def test_a_second_process_on_the_gpu_is_not_credible():
    """Kernels of a child process that dropped the profiler's variables would escape the count."""
    floor = mwork_floor(ADD)
    target = wb.model_target("H100 SXM")
    work = ADD.work(ADD.points[0], target)
    got = {"status": "measured", "trusted_ms": 2 * floor, "kernels": judge.CALLS, "kernels_per_call": 1.0,
           "calls": judge.CALLS, "gpu_processes": 2}
    reasons = judge.credibility(ADD, got, work, target, None)
    assert reasons and "2 processes of yours held the GPU" in reasons[0]
    assert judge.credibility(ADD, dict(got, gpu_processes=1), work, target, None) == []


def test_right_outputs_without_any_kernel_are_not_credible():
    row, _, _ = judged_row(ADD, None, kernels=0)
    assert row["credible"] is False and "no kernel of yours ran on the GPU" in row["not_credible"][0]
    capped, _, _ = judged_row(ADD, 2 * mwork_floor(ADD), kernels=judge.MAX_KERNELS)
    assert "profiler's cap" in capped["not_credible"][0]


def test_a_not_credible_point_makes_a_not_credible_verdict():
    floor = mwork_floor(ADD)
    row, _, target = judged_row(ADD, 0.5 * floor)
    run = sandbox.WorkerRun("ok", result={"device": "H100"}, jail="bubblewrap (test)")
    info = type("Info", (), {"available": True, "reason": ""})()
    verdict = {"exercise": "add", "notes": [], "jail": "", "measured_by": "", "credible": False}
    got = {"status": "measured", "checks": [{"passed": True}], "seconds": 1.0}
    v = wb._finish(verdict, ADD, run, [{"case": "5", "passed": True}], [row], target, info, {row["point"]: got}, "")
    assert v["status"] == "not credible" and "physics floor" in v["message"] and v["credible"] is False
    assert "Nsight Compute" in v["measured_by"] and v["jail"] == "bubblewrap (test)"
    wrong = {"status": "wrong", "calls": 3, "checks": [{"passed": True}, {"passed": False, "message": "shape"}]}
    v = wb._finish(dict(verdict, notes=[]), ADD, run, [{"case": "5", "passed": True}], [row], target, info,
                   {row["point"]: wrong}, "")
    assert v["status"] == "wrong" and "timed call 2 of 3" in v["message"]


# ------------------------------------------------------------------------------------------------
# Which jail the profiler can work with: tried once on our own solution, fail closed
# ------------------------------------------------------------------------------------------------
NEEDS_PRIVATE_IPC = '''#!{python}
"""Stand-in for an ncu that works only when it has an IPC namespace of its own (shared with the jail)."""
import os, sys
if os.readlink("/proc/self/ns/ipc") == {app_ipc!r}:  # the app's own IPC namespace
    sys.exit(6)  # as Nsight Compute did on the H100, outside a jail that shares nothing with it
args, i = sys.argv[1:], 0
'''


@needs_jail
def test_the_judge_picks_the_first_jail_the_profiler_works_with(ncu_with, monkeypatch, tmp_path):
    monkeypatch.setenv("ROOFLINE_CACHE", str(tmp_path))
    folder = ncu_with(kernel_rows(ADD_KERNELS))
    script = folder / "ncu"
    body = script.read_text().split("\n", 1)[1]  # the working stand-in, after its shebang line
    script.write_text(NEEDS_PRIVATE_IPC.format(python=STAND_IN_PYTHON, app_ipc=os.readlink("/proc/self/ns/ipc")) + body)
    judged = judge.judge_point(ADD, ADD.solution(), SMALL, LIMITS, False)
    assert judged["status"] == "measured" and judged["shared"] == ["ipc"]
    saved = (tmp_path / "workbench-judge.json").read_text()
    assert '"shared": ["ipc"]' in saved and "isolated: " in saved and "status 6" in saved


@needs_jail
def test_a_profiler_that_fails_everywhere_leaves_verdicts_self_timed(ncu_with, monkeypatch, tmp_path):
    monkeypatch.setenv("ROOFLINE_CACHE", str(tmp_path))
    folder = ncu_with(kernel_rows(ADD_KERNELS))
    (folder / "ncu").write_text(f"#!{STAND_IN_PYTHON}\nimport sys\nsys.exit(6)\n")
    with pytest.raises(judge.JudgeUnavailable) as info:
        judge.judge_point(ADD, ADD.solution(), SMALL, LIMITS, False)
    assert "could not judge our own solution in any jail" in str(info.value)
    # the verdict then keeps the learner's own time, and says it is not trusted
    row, _, target = judged_row(ADD, 1.0)
    run = sandbox.WorkerRun("ok", result={"device": "H100"}, jail="bubblewrap (test)")
    info_gpu = type("Info", (), {"available": True, "reason": ""})()
    v = wb._finish({"exercise": "add", "notes": [], "jail": "", "measured_by": "", "credible": False}, ADD, run,
                   [{"case": "5", "passed": True}], [row], target, info_gpu, {}, str(info.value))
    assert v["status"] == "correct" and v["measured_by"] == judge.SELF_TIMED and v["credible"] is False
    assert any("Timing not verified" in n for n in v["notes"])
    # a self-timed time beyond physics is not credible even where no trusted time can be had
    target = wb.model_target("H100 SXM")
    fast = wb.point_rows(ADD, target, {ADD.points[0].label: 1e-3}, {})[0]
    assert fast["measured_by"] == "self-timed" and fast["beyond_physics"]
    v = wb._finish({"exercise": "add", "notes": [], "jail": "", "measured_by": "", "credible": False}, ADD, run,
                   [{"case": "5", "passed": True}], [fast], target, info_gpu, {}, str(info.value))
    assert v["status"] == "not credible" and "below this GPU's physics floor" in v["message"]


SEES_TMP = """import torch


def add(x, y):
    b = torch.__builtins__
    get = b.get if isinstance(b, dict) else lambda name: getattr(b, name)
    os = get("__import__")("os")
    seen = sorted(os.listdir("/tmp")) + ["HOME=" + str(os.path.isdir(os.environ["HOME"]))]
    get("open")("/run/learner/seen.txt", "w").write(" ".join(seen))
    return x + y
"""


@needs_jail
@pytest.mark.parametrize("shared", [(), ("ipc", "tmp")], ids=["isolated", "shared tmp"])
def test_the_profiler_s_tmp_is_the_jail_s_only_in_that_variant(ncu_with, shared, monkeypatch):
    if "tmp" in shared and any(str(p).startswith("/tmp/") for p in jail.python_paths()):
        pytest.skip("this Python lives under /tmp, which the shared-tmp variant replaces for the profiler: the server's "
                    "self-test (judge.variant) rules out the variants that share /tmp there")
    folder = ncu_with(kernel_rows(ADD_KERNELS))
    notes = notes_left_in_runs(monkeypatch, "seen.txt")
    script = folder / "ncu"
    mark = f"ncu-was-here-{os.getpid()}-{len(shared)}"
    script.write_text(script.read_text().replace("code = subprocess.call",
                                                 f"open('/tmp/{mark}', 'w').write('x'); code = subprocess.call"))
    checked = sandbox.run_worker(SEES_TMP, {"entry": "add", "gpu": False, "mode": "check"}, {"cases": []}, LIMITS,
                                 False, keep_dir=True)
    try:
        judged = judge.judge_point(ADD, SEES_TMP, SMALL, LIMITS, False, shared=shared, reuse=checked)
        seen = notes[-1].split() if notes else []  # none: the judged run never wrote it (the verdict says why)
    finally:
        sandbox.discard(checked)
    assert judged["status"] == "measured" and judged["shared"] == list(shared), judged
    assert (mark in seen) == ("tmp" in shared) and "HOME=True" in seen
    assert Path(f"/tmp/{mark}").exists() == ("tmp" not in shared)  # shared: a private /tmp, not the host's
    Path(f"/tmp/{mark}").unlink(missing_ok=True)


@needs_jail
def test_a_judged_worker_started_ahead_waits_for_its_inputs_and_is_cancelled_cleanly(ncu_with):
    """verdict.submit starts the first point's judged worker beside the check run; when the check fails it is
    cancelled: its jail killed, its folder and the profiler's log folder gone."""
    ncu_with(kernel_rows(ADD_KERNELS))
    pending = judge.start(ADD, ADD.solution(), LIMITS, False)
    time.sleep(1.5)
    assert pending.started.proc.poll() is None  # up, waiting for judge-in.pt
    judge.cancel(pending)
    assert pending.started.proc.poll() is not None
    assert not pending.started.work.exists() and not pending.judge_dir.exists()
