"""Running labs: validation, the backend that runs them, and the result cache; the one door to the GPU.

Every kernel the app times runs inside `gpu_session()` (labs/engine/local.py), so two learners' runs
never overlap on the GPU. Identical runs are computed once and then served from the cache.

Two backends behind the same functions:
- embedded (the default): this process's GPU, one lock, an in-memory cache; no other service;
- a GPU pool, when ROOFLINE_CLUSTER names a Dask scheduler (or `python -m labs --cluster ADDRESS`):
  `run` sends the lab to a worker that owns one GPU and its lock, and the cache is a folder shared by
  every app process (labs/engine/pool.py, labs/engine/cache.py). `gpu_session` stays this process's lock either way.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from labs.engine import calibration, local
from labs.engine import gpu as gpu_mod
from labs.engine.lab import Lab, Progress, noop_progress
from labs.engine.local import (EVENT_LOG, RUN_TIME_LIMIT_S, RunTimedOut, _measure_rows, cluster_address,  # noqa: F401
                               gpu_session, run_on)
from labs.engine.params import ParamError, to_dict, validate
from labs.engine.results import Result, merge_rows, run_metadata

__all__ = ["ParamError", "run", "model", "cached", "warmup", "calibrate", "gpu_session", "queue_length", "clear_cache",
           "cluster_address", "live_gpu", "waiting_message", "ran_on"]


def _pool():
    from labs.engine import pool  # imported only when a pool is used: the embedded default needs no Dask

    return pool


def queue_length() -> int:
    """How many runs are waiting for the GPU now (0 when it is free); with a pool, its unfinished runs."""
    if cluster_address():
        return _pool().queue_length()
    return local.queue_length()


def live_gpu() -> gpu_mod.GpuInfo:
    """What live runs run on: this process's GPU, or (with a pool) the pool's GPUs; `.reason` if none."""
    return _pool().gpu_info() if cluster_address() else gpu_mod.detect()


def waiting_message(position: int) -> str:
    """What a queued learner reads; `position` is what `on_wait` was called with."""
    if cluster_address():
        return _pool().waiting_message(position)
    return f"Waiting for the GPU: {position} run(s) ahead of yours."


def ran_on(result: Result) -> str:
    """Which GPU of the pool ran a result ('' for embedded runs: it was this machine's GPU)."""
    where = result.meta.get("pool") or {}
    if not where:
        return ""
    return (f"Ran on {where.get('worker_name')} ({result.meta.get('gpu', {}).get('name', where.get('kind'))}) "
            f"of the GPU pool at {where.get('scheduler', 'the scheduler')}.")


def clear_cache() -> None:
    """Forget cached results (with a pool, also the shared folder every app process reads)."""
    local.clear_cache()
    if cluster_address():
        from labs.engine import cache

        cache.clear()


def model(lab: Lab, params, target: gpu_mod.Target) -> Result:
    """The lab's prediction alone: works anywhere, GPU or not."""
    params = validate(params)
    rows = merge_rows([], lab.predict(params, target), lab.key, lab.metric)
    meta = run_metadata("model", None, target)
    return Result(lab.name, to_dict(params), rows, meta)


def cached(lab: Lab, params) -> Optional[Result]:
    """The cached live result of this exact run on this GPU, if any (no GPU work)."""
    if cluster_address():
        return _pool().cached(lab, validate(params))
    target = gpu_mod.live_target()
    return local.cached(lab, validate(params), target.key) if target else None


def run(lab: Lab, params, progress: Progress = noop_progress,
        on_wait: Optional[Callable[[int], None]] = None, use_cache: bool = True,
        time_limit_s: Optional[float] = None) -> Result:
    """Validate, take the GPU, measure, merge with the model. Raises ParamError for bad input.

    With a pool (ROOFLINE_CLUSTER) the run goes to a worker's GPU; `on_wait` then hears the position in
    the pool's queue each time it changes, and the result's meta["pool"] says which GPU ran it.
    """
    params = validate(params)
    if cluster_address():
        return _pool().run(lab, params, progress, on_wait, use_cache, time_limit_s or RUN_TIME_LIMIT_S)
    info = gpu_mod.detect()
    if not info.available:
        raise ParamError(info.reason)
    return run_on(lab, params, info, gpu_mod.live_target(), progress, on_wait, use_cache, time_limit_s)


def calibrate(progress: Progress = noop_progress, on_wait: Optional[Callable[[int], None]] = None):
    """Measure this GPU's ceilings under the GPU lock (see labs.engine.calibration.calibrate)."""
    with gpu_session("calibrate", on_wait):
        return calibration.calibrate(progress)


def warmup(labs, on_lab: Callable[[int, Lab, str], None] = lambda i, lab, status: None,
           on_result: Callable[[Result], None] = lambda result: None) -> list:
    """Run every lab's default parameters once, in order, so that kernels are compiled and results cached.

    `on_lab(index, lab, status)` reports "running", "done in 12.3 s", "cached" or the error. Returns
    (lab name, seconds, status) per lab. A failing lab is reported and the others still run.
    """
    report = []
    for i, lab in enumerate(labs):
        params = lab.default_params()
        if cached(lab, params) is not None:
            on_lab(i, lab, "cached")
            report.append((lab.name, 0.0, "cached"))
            continue
        on_lab(i, lab, "running")
        started = time.monotonic()
        try:
            result = run(lab, params)
            status = f"done in {time.monotonic() - started:.1f} s" + ("" if result.complete else " (partial)")
            on_result(result)
        except Exception as exc:  # noqa: BLE001 - every lab gets its turn; the error is the report
            status = f"failed: {type(exc).__name__}: {exc}"
        on_lab(i, lab, status)
        report.append((lab.name, time.monotonic() - started, status))
    return report
