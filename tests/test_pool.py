"""The GPU pool (labs/pool.py) on a real Dask LocalCluster of CPU-only worker processes.

Each worker offers the resources a GPU worker offers ({"GPU": 1, "gpu-kind-cpu": 1}) and two threads,
so only the GPU resource keeps it to one run at a time. The runs are of `SPIN`, a lab whose measurement
holds its worker for a set time and reports when it started and ended, in which process: enough to
prove the scheduling (real lab kernels need a GPU; scripts/pool_gpu.sh runs those through the pool).
"""

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import cpu_pool_cluster

from labs.engine import cache
from labs.engine import pool
from labs.engine import runner
from labs.engine.lab import Lab
from labs.engine.params import ParamError, param

ROOT = Path(__file__).resolve().parent.parent
SPIN_S = 1.5  # long enough that runs clearly overlap or clearly do not


@dataclass(frozen=True)
class SpinParams:
    seconds: float = param(SPIN_S, "how long the run holds its worker", unit="s", min=0.0, max=30.0)
    tag: str = param("a", "any text: different tags are different runs")
    die_once: str = param("", "a file: the first attempt creates it and kills its worker process")


def spin_predict(params, target):
    return [{"step": 0, "predicted_seconds": params.seconds}]


def spin_measure(params, target, progress):
    if params.die_once and not os.path.exists(params.die_once):
        Path(params.die_once).write_text(str(os.getpid()))
        time.sleep(0.3)
        os._exit(1)  # the worker process dies mid-run, as a crashed GPU driver would take it down
    start = time.time()
    while time.time() - start < params.seconds:
        progress((time.time() - start) / params.seconds, "spinning")
        time.sleep(0.05)
    yield {"step": 0, "measured_seconds": time.time() - start, "start_s": start, "end_s": time.time(),
           "pid": os.getpid()}


SPIN = Lab(name="spin", title="Spin", summary="holds a worker for a while", terms=(), Params=SpinParams,
           predict=spin_predict, measure=spin_measure, key=("step",), metric="seconds")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two worker processes with one fake GPU each; ROOFLINE_CLUSTER points the runner at them."""
    import dask

    folder = tmp_path_factory.mktemp("pool")
    saved = dict(os.environ)
    os.environ.update({"ROOFLINE_RUNNER_LOG": str(folder / "runner.log"), "ROOFLINE_RESULT_CACHE": str(folder / "cache"),
                       "PYTHONPATH": str(ROOT)})
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        lc = cpu_pool_cluster()
        os.environ["ROOFLINE_CLUSTER"] = lc.scheduler_address
        pool.client().run(import_engine)  # workers import torch once here, not inside the timed runs
        try:
            yield lc, folder
        finally:
            lc.close()
            os.environ.clear()
            os.environ.update(saved)


def import_engine():
    """What `dask worker --preload labs.engine.pool` does as a worker starts, and this lab's import."""
    import tests.test_pool  # noqa: F401 - the import is the point

    pool.dask_setup(None)


def run_all(params_list):
    """runner.run for each params from its own thread (as many learners), returning (results, positions)."""
    results, positions = [None] * len(params_list), []

    def one(i, params):
        results[i] = runner.run(SPIN, params, on_wait=positions.append)

    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(params_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results, positions


def intervals_by_worker(results):
    spans = {}
    for result in results:
        row = next(r for r in result.rows if "start_s" in r)
        spans.setdefault(result.meta["pool"]["worker_name"], []).append((row["start_s"], row["end_s"]))
    return spans


def overlapping(spans):
    spans = sorted(spans)
    return [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]


def lock_overlaps_per_gpu(log: Path) -> list:
    """The runner's enter/exit log, grouped by the GPU after '@' in the label: any overlap is a failure."""
    depth, bad = {}, []
    for line in log.read_text().splitlines():
        _stamp, event, label = line.split()[:3]
        gpu = label.split("@", 1)[-1]
        depth[gpu] = depth.get(gpu, 0) + (1 if event == "enter" else -1)
        if depth[gpu] not in (0, 1):
            bad.append(line)
    return bad


def test_two_workers_run_two_labs_at_once_and_one_worker_never_two(cluster):
    _lc, folder = cluster
    started = time.monotonic()
    results, positions = run_all([SpinParams(tag=f"parallel-{i}") for i in range(4)])
    wall_s = time.monotonic() - started
    assert all(r is not None and r.complete for r in results)
    spans = intervals_by_worker(results)
    assert len(spans) == 2, spans  # both workers took runs
    for worker, own in spans.items():
        assert not overlapping(own), f"{worker} ran two labs at once: {own}"
    first, second = spans.values()
    assert any(a0 < b1 and b0 < a1 for a0, a1 in first for b0, b1 in second), "the two workers never ran together"
    assert wall_s < 4 * SPIN_S + 3, wall_s  # in series it takes 4 x SPIN_S plus each run's overhead
    assert max(positions, default=0) >= 2  # the last learners heard that two runs were ahead of theirs
    assert not lock_overlaps_per_gpu(folder / "runner.log")
    assert all(pool.KIND_PREFIX not in r.meta["pool"]["kind"] and r.meta["pool"]["kind"] == "cpu" for r in results)
    assert runner.ran_on(results[0]).startswith("Ran on ")


def test_a_killed_workers_run_is_retried_and_completes(cluster, tmp_path):
    marker = tmp_path / "died"
    result = runner.run(SPIN, SpinParams(seconds=0.5, tag="retry", die_once=str(marker)))
    assert result.complete and marker.exists()
    row = next(r for r in result.rows if "pid" in r)
    assert row["pid"] != int(marker.read_text())  # another worker process ran it
    assert any("stopped during this run" in m for m in result.messages), result.messages


APP = """
import json, sys
from labs.engine import runner
from tests.test_pool import SPIN, SpinParams
result = runner.run(SPIN, SpinParams(seconds=2.0, tag="shared"))
row = next(r for r in result.rows if "pid" in r)
print(json.dumps({"start_s": row["start_s"], "pid": row["pid"], "worker": result.meta["pool"]["worker_name"]}))
"""


def app_process():
    return subprocess.Popen([sys.executable, "-c", APP], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=os.environ)


def test_cache_is_shared_between_app_processes(cluster):
    # two app processes press Run on the same parameters at once: one task, one measurement for both
    first, second = app_process(), app_process()
    outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in (first, second)]
    assert outs[0] == outs[1], outs
    # a third process, started after both ended (an app restart), is served from the shared cache
    third = app_process()
    assert json.loads(third.communicate(timeout=120)[0].strip().splitlines()[-1]) == outs[0]
    assert cache.get(cache.key("spin", {"seconds": 2.0, "tag": "shared", "die_once": ""}, "cpu")) is not None


def test_results_never_mix_gpu_kinds(cluster, monkeypatch):
    assert cache.key("spin", {"tag": "a"}, "nvidia-h100-80gb-hbm3") != cache.key("spin", {"tag": "a"}, "nvidia-h200")
    monkeypatch.setenv("ROOFLINE_GPU_KIND", "nvidia-h200")
    with pytest.raises(ParamError, match="no worker of that kind"):
        runner.run(SPIN, SpinParams(tag="kind"))
    assert not runner.live_gpu().available


def test_an_unreachable_scheduler_is_a_message_not_a_crash(monkeypatch):
    monkeypatch.setenv("ROOFLINE_CLUSTER", "tcp://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setattr(pool, "CONNECT_TIMEOUT_S", 1)
    monkeypatch.setattr(pool, "_client", None)
    monkeypatch.setattr(pool, "_unreachable", (0.0, ""))
    info = runner.live_gpu()
    assert not info.available and "cannot be reached" in info.reason
    with pytest.raises(ParamError, match="cannot be reached"):
        runner.run(SPIN, SpinParams())


def test_the_embedded_default_needs_no_dask():
    """Without ROOFLINE_CLUSTER the runner is the one-process, one-lock runner: Dask is never imported."""
    code = ("import sys; from labs.engine import runner, pool, cache; "
            "assert runner.cluster_address() is None; assert runner.waiting_message(2) == "
            "'Waiting for the GPU: 2 run(s) ahead of yours.'; print(sorted(m for m in sys.modules if m.split('.')[0] "
            "in ('dask', 'distributed')))")
    env = {k: v for k, v in os.environ.items() if k != "ROOFLINE_CLUSTER"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
