"""A class on a GPU pool, driven headless: 30 learners press Run on different labs, served by N GPU workers.

    python3 scripts/pool_load.py --workers 2 --plan warm      compile every kernel once (untimed)
    python3 scripts/pool_load.py --workers 1                  the load test on one GPU
    python3 scripts/pool_load.py --workers 2                  ... and on two
    python3 scripts/pool_load.py compare OUT/pool-load-1.json OUT/pool-load-2.json

Each run starts the pool's scheduler and N workers (`python -m labs.engine.pool`), then the app processes: by
default one per session (streamlit's AppTest keeps one global runtime per process, so two AppTests
cannot run at once in one process; a real server's sessions are threads of one process). A session is the
real app (app.py's navigation, then the lab's page) in AppTest, with its parameters in the URL's query;
the app processes see no GPU (CUDA_VISIBLE_DEVICES=""), as a web tier in front of a pool would not.
Every session first renders its page; once all are ready they press Run together, and the wall time runs
from that moment until the last learner holds a result. Every result must come from the pool and name
its GPU; the result cache is one folder shared by all the app processes.

The audit reads the runner's enter/exit log that every worker writes (ROOFLINE_RUNNER_LOG): per GPU, no
two timed regions may overlap. `compare` prints the ratio of the two wall times and both audits and
exits 1 if the ratio is above 0.6 or any GPU ran two timings at once.
Needs streamlit and dask/distributed importable (on the device: the .whl folder, see scripts/pool_gpu.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (lab, parameters as the URL gives them, the parameter each session varies, its base value, its step):
# small sweeps that take seconds each, so 30 of them show the queue without taking minutes per GPU
PLAN = [
    ("roofline", {"dtypes": "fp32,bf16"}, "size_mib", 512, 16),
    ("hierarchy", {"min_kib": "256", "points_per_octave": "2", "variants": "loop,launches"}, "max_mib", 1024, 16),
    ("coalescing", {"matrix_n": "8192"}, "size_mib", 512, 16),
    ("precision", {"accumulators": "fp32,bf16,fp16", "dot_lengths": "256,1024,4096,16384"}, "elements_m", 256, 16),
    ("divergence", {"cost_ratios": "1.0,2.0"}, "threads", 4194304, 65536),
    ("launch", {"experiments": "chain", "variants": "eager,graph,fused"}, "elements", 4096, 32),
    ("recompute", {"dtypes": "fp32"}, "sizes_mib", 256, 16),
    ("matmul", {"kernels": "cublas,triton", "dtypes": "bf16"}, "sizes", 2048, 256),
    ("fusion", {"experiments": "chain", "chain_ops": "1,8,64"}, "chain_mib", 256, 16),
]


def session_params(i: int) -> tuple:
    """Session i's lab and URL parameters: the plan round-robin, each session a different run."""
    lab, fixed, vary, base, step = PLAN[i % len(PLAN)]
    value = base + step * (i // len(PLAN))
    if lab == "matmul":  # a small ladder of sizes ending at this session's own
        return lab, {**fixed, vary: f"1024,1536,{value},{value + 1024},6144,8192"}
    return lab, {**fixed, vary: str(value)}


# ---------------------------------------------------------------------------------------------
# One app process: its sessions in threads
# ---------------------------------------------------------------------------------------------
def one_session(i: int, go: threading.Event, ready: list, out: list) -> None:
    from streamlit.testing.v1 import AppTest

    lab, params = session_params(i)
    record = {"session": i, "lab": lab, "params": params, "pid": os.getpid()}
    try:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900)
        for key, value in params.items():
            at.query_params[key] = value
        at.run()
        at.switch_page(f"pages/{lab}.py")
        at.run()
        buttons = [b for b in at.button if b.key == f"run:{lab}"]
        if not buttons:
            raise RuntimeError(f"no Run button; errors: {[e.value for e in at.error][:2]} "
                               f"{[e.value for e in at.exception][:1]}")
        ready.append(i)
        go.wait()
        record["pressed_s"] = time.time()
        buttons[0].click().run()
        record["done_s"] = time.time()
        result = at.session_state[f"live:{lab}"] if f"live:{lab}" in at.session_state else None
        problems = [e.value[:300] for e in at.exception] + [e.value[:300] for e in at.error]
        if result is None or problems:
            # what the page said besides errors (e.g. "Live runs are off: ...") tells a silent miss from a failure
            notes = [e.value[:200] for e in at.info] + [e.value[:200] for e in at.warning]
            raise RuntimeError(f"no result: {problems}" + (f"; the page said: {notes[:3]}" if not problems else ""))
        pool = result.meta.get("pool", {})
        record.update(ok=True, worker=pool.get("worker_name"), gpu=pool.get("gpu_label"),
                      run_s=result.meta.get("duration_s"), complete=result.complete,
                      messages=result.messages[:3], gpu_name=result.meta.get("gpu", {}).get("name"))
    except Exception as exc:  # noqa: BLE001 - the report says which session failed and why
        import traceback

        where = traceback.extract_tb(exc.__traceback__)[-1]
        record.update(ok=False, error=f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"[:600])
        ready.append(i)
    out.append(record)


def app_process(args) -> int:
    """Serve sessions first..first+count-1; say 'ready' when all rendered; press Run when GO exists."""
    go, ready, out = threading.Event(), [], []
    sessions = range(args.first, args.first + args.count)
    threads = [threading.Thread(target=one_session, args=(i, go, ready, out)) for i in sessions]
    for t in threads:
        t.start()
    while len(ready) < len(threads):
        time.sleep(0.2)
    print("ready", flush=True)
    while not Path(args.go).exists():
        time.sleep(0.05)
    go.set()
    for t in threads:
        t.join()
    Path(args.result).write_text(json.dumps(out))
    return 0


# ---------------------------------------------------------------------------------------------
# The driver: pool up, apps up, go, wait, audit
# ---------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list, env: dict, log: Path) -> subprocess.Popen:
    """A child in its own process group (so that it and its children are stopped together)."""
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def audit(log: Path) -> dict:
    """Per GPU (the label after '@'): timed regions, overlaps (must be 0) and busy seconds."""
    per_gpu: dict = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        stamp, event, label = line.split()[:3]
        gpu = label.split("@", 1)[-1]
        g = per_gpu.setdefault(gpu, {"runs": 0, "overlaps": 0, "busy_s": 0.0, "_depth": 0, "_since": 0.0})
        if event == "enter":
            g["_depth"] += 1
            g["runs"] += 1
            g["_since"] = float(stamp)
            g["overlaps"] += g["_depth"] > 1
        else:
            g["_depth"] -= 1
            g["busy_s"] += float(stamp) - g["_since"]
    return {gpu: {k: (round(v, 1) if isinstance(v, float) else v) for k, v in g.items() if not k.startswith("_")}
            for gpu, g in per_gpu.items()}


def drive(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{args.plan}-{args.workers}"
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    runner_log = out / f"runner-{tag}.log"
    runner_log.unlink(missing_ok=True)
    env = {**os.environ, "ROOFLINE_RUNNER_LOG": str(runner_log), "ROOFLINE_RESULT_CACHE": str(out / f"cache-{tag}")}
    env.pop("ROOFLINE_CLUSTER", None)
    procs = [start([sys.executable, "-m", "labs.engine.pool", "scheduler", "--host", "127.0.0.1", "--port", str(port)], env, out / f"scheduler-{tag}.log")]
    try:
        which = (["--cpu-workers", str(args.workers)] if args.cpu
                 else ["--gpus", ",".join(str(i) for i in range(args.workers))])
        procs.append(start([sys.executable, "-m", "labs.engine.pool", "worker", address, *which], env,
                           out / f"workers-{tag}.log"))
        from distributed import Client

        t_pool = time.time()
        with Client(address, timeout=60) as client:
            client.wait_for_workers(args.workers, timeout=180)
        print(f"[{tag}] pool up: {args.workers} worker(s) in {time.time() - t_pool:.1f} s", flush=True)
        return run_sessions(args, tag, address, env, out, runner_log, procs)
    finally:
        for proc in reversed(procs):
            stop(proc)


def run_sessions(args, tag, address, env, out, runner_log, procs) -> int:
    sessions = len(PLAN) if args.plan == "warm" else args.sessions
    go = out / f"go-{tag}"
    go.unlink(missing_ok=True)
    app_env = {**env, "ROOFLINE_CLUSTER": address, "CUDA_VISIBLE_DEVICES": "", "STREAMLIT_LOGGER_LEVEL": "error"}
    n_apps = args.apps or sessions
    apps, per_app = [], -(-sessions // n_apps)
    for a in range(n_apps):
        first, count = a * per_app, min(per_app, sessions - a * per_app)
        if count <= 0:
            continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "app", "--first", str(first), "--count", str(count),
               "--go", str(go), "--result", str(out / f"sessions-{tag}-{a}.json")]
        apps.append(subprocess.Popen(cmd, env=app_env, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                     stderr=open(out / f"app-{tag}-{a}.log", "w")))
    t_apps = time.time()
    for app in apps:
        line = app.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"an app process did not get ready: {line!r}")
    print(f"[{tag}] {sessions} sessions rendered their pages in {len(apps)} app processes "
          f"({time.time() - t_apps:.1f} s); pressing Run", flush=True)
    pressed = time.time()
    go.write_text("go")
    for app in apps:
        app.wait()
    records = []
    for a in range(len(apps)):
        records += json.loads((out / f"sessions-{tag}-{a}.json").read_text())
    done = max((r.get("done_s", pressed) for r in records), default=pressed)
    summary = {"tag": tag, "workers": args.workers, "sessions": sessions, "apps": len(apps),
               "wall_s": round(done - pressed, 2), "failed": [r for r in records if not r.get("ok")],
               "by_gpu": audit(runner_log), "host": socket.gethostname()}
    (out / f"pool-load-{tag}.json").write_text(json.dumps({**summary, "records": records}, indent=1))
    print_summary(summary, records)
    return 1 if summary["failed"] else 0


def print_summary(summary: dict, records: list) -> None:
    print(f"[{summary['tag']}] {summary['sessions']} sessions, {summary['workers']} GPU worker(s): "
          f"wall {summary['wall_s']:.1f} s from Run to the last result; failed: {len(summary['failed'])}")
    for r in sorted(records, key=lambda r: r["session"]):
        waited = (r.get("done_s", 0) - r.get("pressed_s", 0)) if r.get("ok") else 0
        print(f"  {r['session']:2d} {r['lab']:11s} {'ok' if r.get('ok') else 'FAILED':6s} "
              f"gpu {str(r.get('gpu')):20s} run {r.get('run_s') or 0:6.2f} s  press-to-result {waited:6.1f} s  "
              f"{r.get('error', '') or '; '.join(r.get('messages') or [])}"[:170])
    for gpu, g in summary["by_gpu"].items():
        print(f"  audit {gpu}: {g['runs']} timed regions, {g['overlaps']} overlapping, busy {g['busy_s']} s")


def compare(paths: list) -> int:
    one, two = (json.loads(Path(p).read_text()) for p in paths)
    ratio = two["wall_s"] / one["wall_s"]
    overlaps = sum(g["overlaps"] for s in (one, two) for g in s["by_gpu"].values())
    failed = len(one["failed"]) + len(two["failed"])
    print(f"pool load test: {one['sessions']} sessions; 1 GPU {one['wall_s']:.1f} s, "
          f"{two['workers']} GPUs {two['wall_s']:.1f} s; ratio {ratio:.2f} (target <= 0.60)")
    for s in (one, two):
        for gpu, g in s["by_gpu"].items():
            print(f"  {s['workers']} worker(s), {gpu}: {g['runs']} timed regions, {g['overlaps']} overlapping, "
                  f"busy {g['busy_s']} s")
    print(f"overlapping timings: {overlaps}; failed sessions: {failed}")
    return 0 if ratio <= 0.6 and overlaps == 0 and failed == 0 else 1


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["compare"]:
        return compare(argv[1:3])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    if argv[:1] == ["app"]:
        parser.add_argument("app")
        for flag in ("--first", "--count"):
            parser.add_argument(flag, type=int, required=True)
        parser.add_argument("--go", required=True)
        parser.add_argument("--result", required=True)
        return app_process(parser.parse_args(argv))
    parser.add_argument("--workers", type=int, default=1, help="GPU workers (GPUs 0..N-1)")
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--apps", type=int, default=0,
                        help="app processes sharing the sessions (0: one per session; see the docstring)")
    parser.add_argument("--plan", choices=("load", "warm"), default="load",
                        help="warm: one session per lab (compiles the kernels, untimed)")
    parser.add_argument("--cpu", action="store_true", help="GPU-less workers: a dry run of the driver itself")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/pool-load"))
    return drive(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
