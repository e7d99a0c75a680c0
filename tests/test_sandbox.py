"""The jail refuses what a learner's code must not do: each escape is tried for real, by submissions that step
around the static import check (which stays on: it is the friendly first message, not the wall), and the
operating system's jail (bubblewrap) is what answers. The CLI and the app take their submissions with them
when they die. Without bubblewrap, learner code is refused with a message that says what to do."""

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from labs.workbench import get_exercise, jail, sandbox
from labs.workbench import verdict as wb

ADD = get_exercise("add")
STATUS = jail.status()
FAST = sandbox.Limits(compile_s=60, cpu_s=60)
# in CI (.ci/run installs bubblewrap) a missing jail fails these tests instead of skipping them
needs_jail = pytest.mark.skipif(not jail.status().jailed and not os.environ.get("CI"),
                                reason=f"no bubblewrap jail here: {jail.status().reason}")

# A submission that passes the static check (it imports only torch) and takes __import__ and open from
# the builtins torch hands out: every module and file of the machine is then one call away.
ESCAPE = '''import torch


def add(x, y):
    b = torch.__builtins__
    get = b.get if isinstance(b, dict) else lambda name: getattr(b, name)
    imp, read = get("__import__"), get("open")
    os, socket, json = imp("os"), imp("socket"), imp("json")
    report = {{}}
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=3)
        report["network"] = "open"
    except OSError as exc:
        report["network"] = "refused: " + type(exc).__name__
    try:
        socket.create_connection(("127.0.0.1", 8501), timeout=3)
        report["app_port"] = "open"
    except OSError as exc:
        report["app_port"] = "refused: " + type(exc).__name__
    for name, path in {paths!r}.items():
        try:
            report[name] = read(path).read()[:40]
        except OSError as exc:
            report[name] = "unreadable: " + type(exc).__name__
    for name, path in {dirs!r}.items():
        try:
            report[name] = sorted(os.listdir(path))
        except OSError as exc:
            report[name] = "unlistable: " + type(exc).__name__
    environ = dict(os.environ)
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            environ.update(dict(kv.split("=", 1) for kv in read("/proc/" + pid + "/environ").read().split("\\0") if "=" in kv))
        except OSError:
            pass
    report["secret_seen"] = {secret!r} in str(environ)
    report["uid"] = os.getuid()
    raise RuntimeError("REPORT" + json.dumps(report))
'''


@pytest.fixture(scope="module")
def escape(tmp_path_factory):
    """One jailed submission tries every escape and reports what it found (one jail start instead of many)."""
    secret = "s3cret-" + secrets.token_hex(8)
    home_file = Path.home() / f".roofline-jail-test-{secrets.token_hex(4)}"  # in /root when run as root
    home_file.write_text(secret)
    other_run = sandbox._new_workdir(None)  # another learner's run folder, present on the host
    (other_run / "solution.py").write_text(secret)
    paths = {"repo_file": str(sandbox.REPO / "labs" / "engine" / "runner.py"), "home_file": str(home_file),
             "other_run": str(other_run / "solution.py"), "shadow": "/etc/shadow"}
    dirs = {"repo_dir": str(sandbox.REPO), "root_dir": "/root", "home_dir": "/home", "runs_dir": str(sandbox.SANDBOX_BASE)}
    os.environ["ROOFLINE_TEST_SECRET"] = secret  # the app's environment holds a secret
    try:
        v = wb.submit(ADD, ESCAPE.format(paths=paths, dirs=dirs, secret=secret), limits=FAST)
    finally:
        del os.environ["ROOFLINE_TEST_SECRET"]
        home_file.unlink()
        sandbox.discard(sandbox.WorkerRun("ok", workdir=other_run))
    assert v["status"] == "error" and "REPORT" in v["message"], v
    return json.loads(v["message"].rsplit("REPORT", 1)[1])


def test_the_escape_passes_the_static_check():
    """The static check is not the wall: this submission gets past it."""
    assert sandbox.static_problems(ESCAPE.format(paths={}, dirs={}, secret="")) == []


@needs_jail
def test_no_network(escape):
    assert escape["network"].startswith("refused") and escape["app_port"].startswith("refused")


@needs_jail
def test_no_repository_no_home_no_other_runs(escape):
    assert escape["repo_file"].startswith("unreadable")
    assert escape["home_file"].startswith("unreadable") and escape["other_run"].startswith("unreadable")
    assert escape["shadow"].startswith("unreadable")
    assert escape["repo_dir"] == "unlistable: FileNotFoundError" or set(escape["repo_dir"]) <= {".venv"}
    assert escape["home_dir"] == "unlistable: FileNotFoundError" or escape["home_dir"] == []
    assert escape["runs_dir"].startswith("unlistable")
    # /root: empty, or only the path down to the Python installation the app runs on (read-only)
    visible = {str(p).split("/")[2] for p in jail.python_paths() if str(p).startswith("/root/")}
    assert escape["root_dir"] == "unlistable: FileNotFoundError" or set(escape["root_dir"]) <= visible


@needs_jail
def test_no_app_environment_and_own_uid(escape):
    assert escape["secret_seen"] is False
    assert escape["uid"] >= sandbox.UID_BASE and escape["uid"] != os.getuid()


def test_static_check_names_the_refused_import_and_call():
    problems = sandbox.static_problems("import subprocess\nfrom os import path\nx = eval('1')\n")
    assert any("line 1" in p and "subprocess" in p for p in problems)
    assert any("line 2" in p and "'os'" in p for p in problems)
    assert any("line 3" in p and "eval()" in p for p in problems)
    assert sandbox.static_problems(ADD.solution()) == []
    assert "syntax error" in sandbox.static_problems("def f(:\n")[0]


def _alive(pids) -> list:
    return [p for p in pids if sandbox._alive(p)]


@needs_jail
def test_an_endless_submission_is_killed_and_leaves_no_process():
    seen, done = set(), threading.Event()
    # processes other tests left running under this pytest process (a served app, a database) are not the run's
    before = set(sandbox.descendants(os.getpid())[1:])

    def watch():  # every process this test process starts while the submission runs
        while not done.is_set():
            seen.update(set(sandbox.descendants(os.getpid())[1:]) - before)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        v = wb.submit(ADD, "import torch\n\n\ndef add(x, y):\n    while True:\n        pass\n",
                      limits=sandbox.Limits(compile_s=6, cpu_s=60))
    finally:
        done.set()
        watcher.join()
    assert v["status"] == "killed" and "compile budget of 6 s" in v["message"], v
    assert time.monotonic() - started < 6 + 30
    assert len(seen) >= 2  # bwrap and the jailed worker were seen ...
    assert _alive(seen) == []  # ... and none is left


@needs_jail
def test_a_fifo_in_place_of_the_phase_file_does_not_stall_the_watch():
    """The app reads the worker's `phase` file to pick the budget: a FIFO there must not block the app."""
    code = ("import torch\n\n\ndef add(x, y):\n    b = torch.__builtins__\n"
            "    os = (b['__import__'] if isinstance(b, dict) else b.__import__)('os')\n"
            "    if os.path.exists('/run/learner/phase'):\n        os.remove('/run/learner/phase')\n"
            "    os.mkfifo('/run/learner/phase')\n    while True:\n        pass\n")
    started = time.monotonic()
    v = wb.submit(ADD, code, limits=sandbox.Limits(compile_s=6, cpu_s=60))
    assert v["status"] == "killed" and "compile budget of 6 s" in v["message"], v
    assert time.monotonic() - started < 40


def test_the_run_budget_starts_once_the_code_runs():
    """After the first call returned (the code compiled and ran), the shorter run budget applies: the second
    check case never returns and is stopped at the run budget, long before the compile budget."""
    code = ("import torch\n\nCALLS = []\n\n\ndef add(x, y):\n    CALLS.append(1)\n    while len(CALLS) > 1:\n"
            "        pass\n    return x + y\n")
    started = time.monotonic()
    v = wb.submit(ADD, code, limits=sandbox.Limits(compile_s=60, run_s=3, cpu_s=60))
    assert v["status"] == "killed" and "run budget of 3 s" in v["message"], v
    assert time.monotonic() - started < 40 and "The GPU was free again" in v["message"]


@needs_jail
def test_a_cli_killed_mid_run_leaves_nothing_behind_within_5_s(tmp_path):
    endless = tmp_path / "endless.py"
    endless.write_text("import torch\n\n\ndef add(x, y):\n    while True:\n        pass\n")
    cli = subprocess.Popen([sys.executable, "-m", "labs", "workbench", "run", "add", str(endless)], cwd=sandbox.REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        tree = []
        while time.monotonic() < deadline:  # until the jailed worker runs the learner's code
            tree = sandbox.descendants(cli.pid)
            if any("harness.py" in _cmdline(p) for p in tree[1:]):
                break
            time.sleep(0.2)
        assert any("harness.py" in _cmdline(p) for p in tree[1:]), "the worker never started"
        time.sleep(1.0)
        tree = sandbox.descendants(cli.pid)
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait()
        killed_at = time.monotonic()
        while _alive(tree[1:]) and time.monotonic() - killed_at < 5:
            time.sleep(0.1)
        assert _alive(tree[1:]) == [], [(p, _cmdline(p)) for p in _alive(tree[1:])]
    finally:
        if cli.poll() is None:
            cli.kill()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_without_bubblewrap_learner_code_is_refused_clearly(tmp_path):
    env = {**os.environ, jail.BWRAP_ENV: str(tmp_path / "no-bwrap-here")}
    env.pop(jail.UNJAILED_ENV, None)
    ran = subprocess.run([sys.executable, "-m", "labs", "workbench", "run", "add", str(ADD.path("solution")), "--json"],
                         cwd=sandbox.REPO, env=env, capture_output=True, text=True, timeout=120)
    verdict = json.loads(ran.stdout)
    assert ran.returncode != 0 and verdict["status"] == "refused"
    assert "bubblewrap" in verdict["message"] and jail.UNJAILED_ENV in verdict["message"]
    assert "apt-get install bubblewrap" in verdict["message"] and "not run on this server" in ran.stderr


def test_the_operator_can_opt_out_of_the_jail_for_a_laptop(tmp_path):
    env = {**os.environ, jail.BWRAP_ENV: str(tmp_path / "no-bwrap-here"), jail.UNJAILED_ENV: "1"}
    ran = subprocess.run([sys.executable, "-m", "labs", "workbench", "run", "add", str(ADD.path("solution")), "--json"],
                         cwd=sandbox.REPO, env=env, capture_output=True, text=True, timeout=300)
    verdict = json.loads(ran.stdout)
    assert ran.returncode == 0 and verdict["status"] == "correct"
    assert verdict["jail"].startswith("no jail") and "bubblewrap jail" not in verdict["sandbox"]


def test_the_page_refuses_without_bubblewrap(monkeypatch, tmp_path):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv(jail.BWRAP_ENV, str(tmp_path / "no-bwrap-here"))
    monkeypatch.delenv(jail.UNJAILED_ENV, raising=False)
    jail.status.cache_clear()
    try:
        at = AppTest.from_file(str(sandbox.REPO / "pages" / "workbench.py"), default_timeout=30).run()
        assert not at.exception
        assert any("bubblewrap" in e.value and "not run on this server" in e.value for e in at.error)
        assert next(b for b in at.button if b.key == "run").disabled
    finally:
        jail.status.cache_clear()


@needs_jail
def test_a_crash_is_reported_and_the_next_submission_still_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "SANDBOX_BASE", tmp_path / "runs")  # this test's runs only
    crash = ("import torch\n\n\ndef add(x, y):\n    b = torch.__builtins__\n"
             "    imp = b['__import__'] if isinstance(b, dict) else b.__import__\n"
             "    imp('ctypes').string_at(0)\n")
    v = wb.submit(ADD, crash, limits=FAST)
    assert v["status"] == "crashed" and "segmentation fault" in v["message"], v
    assert wb.submit(ADD, ADD.solution(), limits=FAST)["status"] == "correct"
    assert os.listdir(sandbox.SANDBOX_BASE) == []  # every run's folder is gone afterwards


def test_every_protection_is_listed_with_its_state():
    lines = sandbox.protection_lines()
    assert {name for name, _, _ in lines} >= {"bubblewrap jail", "no network", "dies with the app"}
    assert all(isinstance(active, bool) for _, active, _ in lines)
