"""A class on the GPU pool, the workbench's way: 30 learners submit within a minute, judged on N GPU workers.

    python3 scripts/class_load.py --workers 2            30 learners, the pool's workers on GPUs 0 and 1
    python3 scripts/class_load.py --embedded             the same class without a pool: this process's one GPU lock
    python3 scripts/class_load.py --workers 2 --cpu      GPU-less workers (Triton's interpreter): a dry run

Starts the pool's scheduler (127.0.0.1, plain tcp) and N workers (`python -m labs.engine.pool`), a fresh class
store, then in this process (one app process: a real server's sessions are threads of one process) one
thread per learner: each joins the class and submits at a random moment of --spread-s through
labs.classroom.queue.submit, the page's path: our solution, or for every fifth learner a wrong kernel. Every
worker first judges our solution once, untimed (Triton's compilation, our kernel and the library timed once
per worker), and the class store gets one verdict, so learners are told an estimate from the start.

Prints per learner: when they arrived, the place in the queue and the estimate they were shown first, the
time to their verdict, the verdict, how it was measured and which GPU judged it; then totals: answered,
wall time, time to verdict (median, 90th percentile, max), the estimates against the actual times, and per
GPU how many it judged and its busy seconds from the workers' lock log (two at once on one GPU: a failure).
Exits 1 if a learner got no verdict, a verdict was judged outside the pool, or a GPU judged two at once.
Writes class-load-<tag>.json (every learner's record and the totals) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pool_load  # noqa: E402 - the pool's start, stop and lock-log audit, shared with the labs' load test

ROOT = pool_load.ROOT


def warm_worker(exercise: str, dask_worker=None) -> str:
    """Run on every worker (client.run) before the class: our solution judged once, untimed, under its lock."""
    from labs.engine.pool import gpu_label
    from labs.workbench import get_exercise, verdict

    ex = get_exercise(exercise)
    v = verdict.submit(ex, ex.solution(), where=gpu_label(dask_worker))
    return f"{v['status']} in {v.get('seconds')} s"


def start_pool(args, out: Path, tag: str) -> tuple:
    """(scheduler address, the started processes) with N workers connected and warmed."""
    port = pool_load.free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ}
    env.pop("ROOFLINE_CLUSTER", None)
    procs = [pool_load.start([sys.executable, "-m", "labs.engine.pool", "scheduler", "--host", "127.0.0.1", "--port",
                              str(port)], env, out / f"scheduler-{tag}.log")]
    which = (["--cpu-workers", str(args.workers)] if args.cpu
             else ["--gpus", ",".join(str(i) for i in range(args.workers))])
    procs.append(pool_load.start([sys.executable, "-m", "labs.engine.pool", "worker", address, *which], env,
                                 out / f"workers-{tag}.log"))
    from distributed import Client

    started = time.time()
    with Client(address, timeout=60) as client:
        client.wait_for_workers(args.workers, timeout=180)
        up = time.time() - started
        warmed = client.run(warm_worker, args.exercise)
    print(f"[{tag}] pool up: {args.workers} worker(s) in {up:.1f} s; warmed in {time.time() - started - up:.1f} s: "
          + "; ".join(f"{w}: {s}" for w, s in sorted(warmed.items())), flush=True)
    return address, procs


def learner(i: int, arrive_s: float, t0: float, ex, code: str, store, class_code: str, records: list) -> None:
    from labs.classroom import queue

    record = {"learner": i, "arrived_s": round(arrive_s, 2), "told": []}
    try:
        _, key = store.join(class_code, f"learner {i:02d}")
        time.sleep(max(0.0, t0 + arrive_s - time.time()))
        pressed = time.time()
        v = queue.submit(key, ex, code, store=store, on_wait=lambda message, position: record["told"].append(
            {"at_s": round(time.time() - pressed, 2), "position": position, "message": message}))
        record.update(ok=True, seconds=round(time.time() - pressed, 2), status=v.get("status"),
                      judged_on=v.get("judged_on"), measured_by=v.get("measured_by"), verdict_s=v.get("seconds"),
                      pool=v.get("pool"), notes=v.get("notes", [])[-2:])
    except Exception as exc:  # noqa: BLE001 - the report says which learner failed and why
        record.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
    records.append(record)


def shown_estimate_s(record: dict):
    """The first estimate the learner was shown, in seconds (None if none)."""
    for told in record["told"]:
        m = re.search(r"Your verdict in about (\d+) (s|min)", told["message"])
        if m:
            return int(m.group(1)) * (60 if m.group(2) == "min" else 1)
    return None


def run_class(args, tag: str, out: Path, pooled: bool) -> dict:
    from labs.classroom.store import Store
    from labs.workbench import get_exercise

    store = Store(str(out / f"class-{tag}.sqlite3"))
    ex = get_exercise(args.exercise)
    class_code = store.create_class(f"load {tag}")
    from labs.classroom import queue

    _, teacher = store.join(class_code, "our solution")
    first = queue.submit(teacher, ex, ex.solution(), store=store)  # the store's first typical time
    print(f"[{tag}] our solution: {first['status']}, {first.get('seconds')} s, judged on {first.get('judged_on')}",
          flush=True)
    wrong = ex.solution().replace("x + y", "x - y") if args.exercise == "add" else "def broken(:\n"
    rng = random.Random(30)
    arrivals = sorted(rng.uniform(0, args.spread_s) for _ in range(args.learners))
    records: list = []
    t0 = time.time() + 2.0  # every thread joined its class before the first submits
    threads = [threading.Thread(target=learner, args=(i, a, t0, ex, wrong if i % 5 == 0 else ex.solution(), store,
                                                      class_code, records)) for i, a in enumerate(arrivals)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept = [s for s in store.submissions(class_code, ex.name) if s["name"] != "our solution"]
    return {"records": sorted(records, key=lambda r: r["learner"]), "wall_s": round(time.time() - t0, 1),
            "kept": len(kept), "kept_queued": sum(1 for s in kept if s["status"] == "queued"),
            "kept_judged_on": sorted({s["judged_on"] or "" for s in kept}), "integrity": store.integrity(),
            "pooled": pooled}


def summarize(run: dict, audit: dict, args, tag: str) -> dict:
    records = run["records"]
    ok = [r for r in records if r.get("ok")]
    waits = sorted(r["seconds"] for r in ok)
    outside = [r for r in ok if run["pooled"] and not r.get("pool")]
    ratios = sorted(r["seconds"] / est for r in ok for est in [shown_estimate_s(r)] if est)
    statuses: dict = {}
    for r in ok:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {"tag": tag, "learners": args.learners, "spread_s": args.spread_s, "workers": 0 if not run["pooled"] else
            args.workers, "answered": len(ok), "failed": [r for r in records if not r.get("ok")],
            "judged_outside_the_pool": len(outside), "statuses": statuses, "wall_s": run["wall_s"],
            "to_verdict_s": {"median": statistics.median(waits) if waits else None,
                             "p90": waits[int(0.9 * (len(waits) - 1))] if waits else None,
                             "max": waits[-1] if waits else None},
            "queued": sum(1 for r in records if r["told"]),
            "deepest_place": max((t["position"] for r in records for t in r["told"]), default=0),
            "actual_over_estimate": {"count": len(ratios), "median": statistics.median(ratios) if ratios else None,
                                     "min": ratios[0] if ratios else None, "max": ratios[-1] if ratios else None},
            "store": {k: run[k] for k in ("kept", "kept_queued", "kept_judged_on", "integrity")},
            "by_gpu": audit, "host": socket.gethostname()}


def print_report(summary: dict, records: list) -> None:
    print(f"[{summary['tag']}] per learner: arrival, first place and estimate shown, time to verdict, verdict, GPU")
    for r in records:
        first = r["told"][0] if r["told"] else None
        place = f"place {first['position']:2d}" if first else "no wait "
        est = shown_estimate_s(r)
        shown = f"est {est:4d} s" if est else "est    - "
        if not r.get("ok"):
            print(f"  learner {r['learner']:02d} at {r['arrived_s']:5.1f} s  {place}  {shown}  FAILED {r['error']}")
            continue
        print(f"  learner {r['learner']:02d} at {r['arrived_s']:5.1f} s  {place}  {shown}  verdict in "
              f"{r['seconds']:6.1f} s  {r['status']:12s} on {str(r.get('judged_on')):24s} "
              f"({str(r.get('measured_by'))[:40]})")
    s = summary
    t = s["to_verdict_s"]
    where = f"{s['workers']} GPU worker(s) of the pool" if s["workers"] else "embedded (this process's GPU lock)"
    print(f"[{s['tag']}] {s['learners']} learners within {s['spread_s']:.0f} s, {where}: answered {s['answered']}/"
          f"{s['learners']} {s['statuses']}; failed {len(s['failed'])}; judged outside the pool "
          f"{s['judged_outside_the_pool']}; wall {s['wall_s']:.1f} s from the first possible arrival to the last verdict")
    if t["median"] is not None:
        print(f"  time to verdict: median {t['median']:.1f} s, p90 {t['p90']:.1f} s, max {t['max']:.1f} s; "
              f"{s['queued']} learner(s) waited, deepest place {s['deepest_place']}")
    e = s["actual_over_estimate"]
    if e["count"]:
        print(f"  actual / first estimate shown: median {e['median']:.2f} (range {e['min']:.2f}-{e['max']:.2f}, "
              f"{e['count']} learners)")
    print(f"  class store: {s['store']['kept']} submissions kept, {s['store']['kept_queued']} left unanswered, "
          f"judged on {s['store']['kept_judged_on']}, integrity {s['store']['integrity']}")
    for gpu, g in s["by_gpu"].items():
        print(f"  audit {gpu}: {g['runs']} judged (lock regions), {g['overlaps']} overlapping, busy {g['busy_s']} s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="GPU workers (GPUs 0..N-1)")
    parser.add_argument("--embedded", action="store_true", help="no pool: every submission under this process's lock")
    parser.add_argument("--cpu", action="store_true", help="GPU-less workers (Triton's interpreter): a dry run")
    parser.add_argument("--learners", type=int, default=30)
    parser.add_argument("--spread-s", type=float, default=60.0, help="learners arrive at random within this")
    parser.add_argument("--exercise", default="add")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/class-load"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "embedded" if args.embedded else f"pool-{args.workers}" + ("-cpu" if args.cpu else "")
    runner_log = out / f"runner-class-{tag}.log"
    runner_log.unlink(missing_ok=True)
    os.environ.update({"ROOFLINE_RUNNER_LOG": str(runner_log), "ROOFLINE_DB": str(out / f"class-{tag}.sqlite3")})
    os.environ.pop("ROOFLINE_CLUSTER", None)
    procs = []
    try:
        if not args.embedded:
            address, procs = start_pool(args, out, tag)
            os.environ["ROOFLINE_CLUSTER"] = address
        run = run_class(args, tag, out, pooled=not args.embedded)
    finally:
        for proc in reversed(procs):
            pool_load.stop(proc)
    summary = summarize(run, pool_load.audit(runner_log), args, tag)
    (out / f"class-load-{tag}.json").write_text(json.dumps({**summary, "records": run["records"]}, indent=1,
                                                           default=str))
    print_report(summary, run["records"])
    overlaps = sum(g["overlaps"] for g in summary["by_gpu"].values())
    bad = summary["failed"] or summary["judged_outside_the_pool"] or overlaps or summary["store"]["kept_queued"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
