"""The sandbox refuses what a learner's code must not do: each escape is tried for real, with the static
check off so that the operating system's limits are what answers. After every one, a normal submission
still runs (the app keeps serving)."""

import os
import shutil

import pytest

from labs.workbench import get_exercise, sandbox
from labs.workbench import verdict as wb

ADD = get_exercise("add")
CAPS = sandbox.capabilities()
FAST = sandbox.Limits(wall_s=60, cpu_s=60)


def run_add(body: str, limits=FAST, static_check: bool = False) -> dict:
    """Submit a file whose add(x, y) runs `body` (and returns x + y if it gets that far)."""
    code = "import os\nimport socket\nimport torch\n\n\ndef add(x, y):\n" + \
        "".join(f"    {line}\n" for line in body.splitlines()) + "    return x + y\n"
    return wb.submit(ADD, code, static_check=static_check, limits=limits)


def test_static_check_names_the_refused_import_and_call():
    problems = sandbox.static_problems("import subprocess\nfrom os import path\nx = eval('1')\n")
    assert any("line 1" in p and "subprocess" in p for p in problems)
    assert any("line 2" in p and "'os'" in p for p in problems)
    assert any("line 3" in p and "eval()" in p for p in problems)
    assert sandbox.static_problems(ADD.solution()) == []
    assert "syntax error" in sandbox.static_problems("def f(:\n")[0]
    assert "null" in sandbox.static_problems("x = 1\0")[0]  # a SyntaxError or a ValueError by Python version


def test_an_import_of_os_is_refused_before_running():
    v = run_add("pass", static_check=True)
    assert v["status"] == "refused" and "import of 'os' is not allowed" in v["message"]


@pytest.fixture(scope="module")
def escapes():
    """One worker tries three escapes and reports what happened (one sandbox start instead of three):
    a network connection, reading a file of the repository, listing the other runs' folders."""
    other = sandbox._new_workdir(None)  # another learner's run folder, present on the host
    repo_file = sandbox.REPO / "labs" / "engine" / "runner.py"
    assert repo_file.exists()
    body = f"""report = []
try:
    socket.create_connection(('1.1.1.1', 80), timeout=3)
    report.append('network=open')
except OSError as exc:
    report.append('network=refused:' + type(exc).__name__)
try:
    open({str(repo_file)!r}).read()
    report.append('repository=readable')
except OSError as exc:
    report.append('repository=hidden:' + type(exc).__name__)
report.append('runs=' + ','.join(os.listdir({str(sandbox.SANDBOX_BASE)!r})))
report.append(f'uid={{os.getuid()}}')
raise RuntimeError(' '.join(report))"""
    try:
        v = run_add(body)
    finally:
        shutil.rmtree(other)
    assert v["status"] == "error", v
    found = dict(item.split("=", 1) for item in v["message"].rsplit("RuntimeError: ", 1)[1].split())
    return found, other.name


@pytest.mark.skipif(not CAPS.network_namespace, reason="this machine allows no network namespace")
def test_a_network_connection_fails(escapes):
    assert escapes[0]["network"].startswith("refused")


@pytest.mark.skipif(not CAPS.mount_namespace, reason="this machine allows no mount namespace")
def test_the_repository_and_other_runs_are_hidden(escapes):
    found, other = escapes
    assert found["repository"] == "hidden:FileNotFoundError"
    assert other not in found["runs"]


@pytest.mark.skipif(not CAPS.separate_user, reason="not root: the worker runs as the app's own user")
def test_it_runs_as_an_unprivileged_user_of_its_own(escapes):
    uid = int(escapes[0]["uid"])
    assert uid >= sandbox.UID_BASE and uid != os.getuid()


def test_an_endless_loop_is_stopped_at_the_wall_clock_limit():
    v = run_add("while True:\n    pass", limits=sandbox.Limits(wall_s=8, cpu_s=60))
    assert v["status"] == "killed" and "wall-clock limit of 8 s" in v["message"]


@pytest.mark.skipif(not CAPS.rlimits, reason="prlimit is not installed")
def test_an_endless_loop_is_stopped_by_the_cpu_limit():
    v = run_add("while True:\n    pass", limits=sandbox.Limits(wall_s=90, cpu_s=4))
    assert v["status"] == "error" and "CPU-time limit" in v["message"]


def test_a_100_gb_allocation_fails_with_a_message():
    v = run_add("big = torch.empty(25 * 2**30, dtype=torch.float32)\nbig.fill_(1.0)")
    assert v["status"] in ("error", "killed")
    assert "alloc" in v["message"].lower() or "memory" in v["message"].lower()


def test_a_crash_is_reported_and_the_next_submission_still_runs():
    v = wb.submit(ADD, "import ctypes\n\n\ndef add(x, y):\n    ctypes.string_at(0)\n", static_check=False, limits=FAST)
    assert v["status"] == "crashed" and "segmentation fault" in v["message"]
    before = set(os.listdir(sandbox.SANDBOX_BASE))
    assert wb.submit(ADD, ADD.solution(), limits=FAST)["status"] == "correct"
    assert set(os.listdir(sandbox.SANDBOX_BASE)) <= before  # the run's folder is gone afterwards


def test_every_protection_is_listed_with_its_state():
    lines = CAPS.lines()
    assert {name for name, _, _ in lines} >= {"no network", "unprivileged user", "wall-clock limit and memory watch"}
    assert all(isinstance(active, bool) for _, active, _ in lines)


def test_without_namespaces_the_remaining_limits_still_run_the_code(tmp_path):
    """ROOFLINE_SANDBOX_PLAIN=1 stands for a container that allows no namespaces: the worker still runs."""
    import subprocess
    import sys

    env = {**os.environ, "ROOFLINE_SANDBOX_PLAIN": "1"}
    ran = subprocess.run([sys.executable, "-m", "labs", "workbench", "run", "add", str(ADD.path("solution")), "--json"],
                         cwd=sandbox.REPO, env=env, capture_output=True, text=True, timeout=300)
    verdict = __import__("json").loads(ran.stdout)
    assert ran.returncode == 0 and verdict["status"] == "correct"
    assert "no network" not in verdict["sandbox"] and "wall-clock limit and memory watch" in verdict["sandbox"]


OUT_OF_BOUNDS = '''import torch
import triton
import triton.language as tl


@triton.jit
def scribble(out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 1.0)  # no mask: far past the end of the output


def add(x, y):
    out = torch.empty_like(x)
    scribble[(2**20,)](out, BLOCK=1024)  # a billion floats into a vector of a thousand
    return out
'''


def test_a_kernel_that_writes_out_of_bounds_is_reported():
    v = wb.submit(ADD, OUT_OF_BOUNDS, limits=FAST)
    assert v["status"] in ("crashed", "error", "wrong"), v
    assert v["message"]
    assert wb.submit(ADD, ADD.solution(), limits=FAST)["status"] == "correct"  # the next learner is served
