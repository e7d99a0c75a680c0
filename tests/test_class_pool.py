"""Workbench submissions on the GPU pool (labs/workbench/pooled.py through labs/engine/pool.run_named), on a real
Dask LocalCluster of two CPU-only worker processes: each offers one "GPU" (the resources a GPU worker offers)
and judges in Triton's interpreter inside the jail, as the workbench does without a GPU.

Several learners submit from threads at once: every one is answered, both workers judge some, no worker judges
two at once (the lock's enter/exit log), queued learners hear their place across the pool and an estimate over
its two GPUs, and the class store records which worker judged each. With the pool unreachable, the submission
is judged in the app's process and the verdict says so.
"""

import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import cpu_pool_cluster

from labs.classroom import queue
from labs.classroom.store import Store
from labs.engine import pool
from labs.engine.params import ParamError
from labs.workbench import get_exercise, pooled

ROOT = Path(__file__).resolve().parent.parent
LEARNERS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two worker processes with one CPU "GPU" each; ROOFLINE_CLUSTER points the app side at them."""
    folder = tmp_path_factory.mktemp("class-pool")
    saved = dict(os.environ)
    os.environ.update({"ROOFLINE_RUNNER_LOG": str(folder / "runner.log"), "PYTHONPATH": str(ROOT)})
    lc = cpu_pool_cluster()
    os.environ["ROOFLINE_CLUSTER"] = lc.scheduler_address
    try:
        pool.client().run(warm_worker)  # torch, Triton and the jail's probe once per worker, not inside the runs
        yield lc, folder
    finally:
        lc.close()
        os.environ.clear()
        os.environ.update(saved)


def warm_worker():
    from labs.workbench import sandbox, verdict  # noqa: F401 - the import is the point

    sandbox.jail.status()


def lock_overlaps(log: Path) -> tuple:
    """({GPU: judged regions}, [lines where one GPU held two]) from the runner's enter/exit log."""
    depth, regions, bad = {}, {}, []
    for line in log.read_text().splitlines():
        _stamp, event, label = line.split()[:3]
        if not label.startswith("workbench:"):
            continue
        gpu = label.split("@", 1)[-1]
        depth[gpu] = depth.get(gpu, 0) + (1 if event == "enter" else -1)
        regions[gpu] = regions.get(gpu, 0) + (event == "enter")
        if depth[gpu] not in (0, 1):
            bad.append(line)
    return regions, bad


def test_submissions_from_many_learners_spread_over_both_workers(cluster, tmp_path):
    _lc, folder = cluster
    store = Store(str(tmp_path / "class.sqlite3"))
    ex = get_exercise("add")
    code = store.create_class("pool")
    wrong = ex.solution().replace("x + y", "x - y")
    _, first_key = store.join(code, "first")
    first = queue.submit(first_key, ex, ex.solution(), store=store)  # the store's typical time, for the estimate
    assert first["status"] == "correct" and first["judged_on"] in pool_labels(first)
    results, told = {}, {}
    go = threading.Event()

    def learner(i: int) -> None:
        _, key = store.join(code, f"learner {i}")
        told[i] = []
        go.wait()
        t0 = time.time()
        v = queue.submit(key, ex, wrong if i % 4 == 0 else ex.solution(), store=store,
                         on_wait=lambda message, position: told[i].append((position, message)))
        results[i] = {"verdict": v, "seconds": time.time() - t0}

    threads = [threading.Thread(target=learner, args=(i,)) for i in range(LEARNERS)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    started = time.time()
    go.set()
    for t in threads:
        t.join(600)
    wall = time.time() - started
    assert len(results) == LEARNERS
    statuses = sorted(r["verdict"]["status"] for r in results.values())
    assert statuses == ["correct"] * (LEARNERS - LEARNERS // 4) + ["wrong"] * (LEARNERS // 4), statuses
    judged_on = {i: r["verdict"]["judged_on"] for i, r in results.items()}
    workers = {r["verdict"]["pool"]["worker_name"] for r in results.values()}
    assert len(set(judged_on.values())) == 2 and len(workers) == 2, judged_on  # both workers judged some
    assert not any("did not judge" in n for r in results.values() for n in r["verdict"]["notes"])
    # queued learners heard their place across the pool, and an estimate shared over its two GPUs
    queued = [m for messages in told.values() for _, m in messages]
    assert queued and all("ahead of yours across the pool" in m for m in queued), queued
    assert any("over 2 GPUs" in m and "Your verdict in about" in m for m in queued), queued
    assert max(p for messages in told.values() for p, _ in messages) >= 2
    # no worker judged two at once; each judged some
    regions, overlaps = lock_overlaps(folder / "runner.log")
    assert not overlaps and len(regions) == 2 and all(n >= 1 for n in regions.values()), regions
    # the store: nothing lost, every submission answered with the worker that judged it and its place
    subs = {s["name"]: s for s in store.submissions(code, "add")}
    assert len(subs) == LEARNERS + 1 and not [s for s in subs.values() if s["status"] == "queued"]
    for i, r in results.items():
        kept = subs[f"learner {i}"]
        assert kept["judged_on"] == judged_on[i] and kept["status"] == r["verdict"]["status"]
        assert (kept["queue_position"] is not None) == bool(told[i])
    assert store.integrity() == "ok"
    saved = store.submission(subs["learner 1"]["id"])["verdict"]
    assert saved["pool"]["kind"] == "cpu" and saved["judged_on"] == judged_on[1]
    waits = sorted(r["seconds"] for r in results.values())
    print(f"\n{LEARNERS} submissions at once on 2 CPU workers: all answered in {wall:.1f} s, time to verdict median "
          f"{waits[LEARNERS // 2]:.1f} s; judged per worker {regions}; deepest place {max(p for m in told.values() for p, _ in m)}")


def pool_labels(verdict: dict) -> set:
    return {verdict.get("pool", {}).get("gpu_label")}


def test_an_unreachable_pool_is_judged_here_with_a_note(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CLUSTER", "tcp://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setattr(pool, "CONNECT_TIMEOUT_S", 1)
    monkeypatch.setattr(pool, "_client", None)
    monkeypatch.setattr(pool, "_unreachable", (0.0, ""))
    store = Store(str(tmp_path / "class.sqlite3"))
    ex = get_exercise("add")
    _, key = store.join(store.create_class(), "solo")
    v = queue.submit(key, ex, ex.solution(), store=store)
    assert v["status"] == "correct" and "this app's" in v["judged_on"] and "pool" not in v
    assert any("did not judge this submission" in n and "cannot be reached" in n for n in v["notes"]), v["notes"]
    (kept,) = store.submissions(store.classes()[0]["code"])
    assert kept["judged_on"] == v["judged_on"]


def test_only_plain_data_and_roofline_functions_travel():
    with pytest.raises(TypeError):  # a callable in the payload never leaves the app
        pool.run_named("x", pooled.WORKER_FUNCTION, {"code": lambda: 1})
    with pytest.raises(ParamError, match="names no Roofline function"):
        pool.run_named("x", "os:system", {"code": "ls"})
    from labs.workbench import sandbox

    limits = sandbox.Limits(compile_s=5, run_s=None, processes=64)
    wire = pooled.to_wire({"limits": limits, "counters": False})
    assert json.loads(json.dumps(wire)) == wire and pooled.from_wire(wire) == {"limits": limits, "counters": False}
    with pytest.raises(TypeError):
        pooled.submit(get_exercise("add"), "", progress=print, callback=print)


def test_the_page_without_a_jail_still_sends_submissions_to_the_pool(monkeypatch, tmp_path):
    """The web tier may have no bubblewrap: with a pool the workers' jail judges, so Run stays on and says so."""
    from streamlit.testing.v1 import AppTest

    from labs.workbench import jail

    monkeypatch.setenv(jail.BWRAP_ENV, str(tmp_path / "no-bwrap-here"))
    monkeypatch.delenv(jail.UNJAILED_ENV, raising=False)
    monkeypatch.setenv("ROOFLINE_CLUSTER", "tcp://127.0.0.1:9")
    jail.status.cache_clear()
    try:
        at = AppTest.from_file(str(ROOT / "pages" / "workbench.py"), default_timeout=30).run()
        assert not at.exception and not at.error
        assert any("GPU pool" in i.value and "not run on this server" in i.value for i in at.info)
        assert not next(b for b in at.button if b.key == "run").disabled
    finally:
        jail.status.cache_clear()
