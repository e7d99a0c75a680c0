"""Running labs: the one GPU lock, validation, out-of-memory handling and the result cache.

Every kernel the app times runs inside `gpu_session()`, so two learners' runs never overlap on the
GPU (their timings would be wrong, and torch's memory counters are per process). Identical runs
are computed once and then served from the cache.

Two backends behind the same functions:
- embedded (the default): this process's GPU, one lock, an in-memory cache; no other service;
- a GPU pool, when ROOFLINE_CLUSTER names a Dask scheduler (or `python -m labs --cluster ADDRESS`):
  `run` sends the lab to a worker that owns one GPU and its lock, and the cache is a folder shared by
  every app process (labs/pool.py, labs/cache.py). `gpu_session` stays this process's lock either way.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Optional

from labs import gpu as gpu_mod
from labs.lab import Lab, Progress, noop_progress
from labs.params import ParamError, to_dict, validate
from labs.results import Result, merge_rows, run_metadata

__all__ = ["ParamError", "run", "model", "cached", "warmup", "calibrate", "gpu_session", "queue_length", "clear_cache",
           "cluster_address", "live_gpu", "waiting_message", "ran_on"]

_LOCK = threading.Lock()
_STATE = threading.Condition()
_waiting = 0  # sessions queued for the GPU right now
_CACHE: "collections.OrderedDict[str, Result]" = collections.OrderedDict()
_CACHE_SIZE = 64
EVENT_LOG: collections.deque = collections.deque(maxlen=1000)  # (time, "enter"/"exit", lab) for audits
# a run that takes longer than this stops at its next progress report and keeps what it measured
RUN_TIME_LIMIT_S = float(os.environ.get("ROOFLINE_RUN_TIME_LIMIT_S", "300"))


class RunTimedOut(Exception):
    """Raised inside a lab's measurement when the run passes its time limit."""


def _log(event: str, label: str) -> None:
    """Record GPU-lock entries and exits; ROOFLINE_RUNNER_LOG=file also appends them there (load tests)."""
    stamp = time.monotonic()
    EVENT_LOG.append((stamp, event, label))
    path = os.environ.get("ROOFLINE_RUNNER_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{time.time():.6f} {event} {label} {os.getpid()} {threading.get_ident()}\n")


def cluster_address() -> Optional[str]:
    """The GPU pool's scheduler address (ROOFLINE_CLUSTER), or None for the embedded default."""
    return os.environ.get("ROOFLINE_CLUSTER", "").strip() or None


def _pool():
    from labs import pool  # imported only when a pool is used: the embedded default needs no Dask

    return pool


def queue_length() -> int:
    """How many runs are waiting for the GPU now (0 when it is free); with a pool, its unfinished runs."""
    if cluster_address():
        return _pool().queue_length()
    return _waiting + (1 if _LOCK.locked() else 0)


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


@contextmanager
def gpu_session(label: str, on_wait: Optional[Callable[[int], None]] = None):
    """Hold the process-wide GPU lock; `on_wait(position)` is called while queued."""
    global _waiting
    if not _LOCK.acquire(blocking=False):
        with _STATE:
            _waiting += 1
            position = _waiting
        try:
            if on_wait:
                on_wait(position)
            _LOCK.acquire()
        finally:
            with _STATE:
                _waiting -= 1
    _log("enter", label)
    try:
        yield
    finally:
        _log("exit", label)
        _release_gpu_memory()
        _LOCK.release()


def _release_gpu_memory() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    except Exception:  # a poisoned context must not keep the lock held
        pass


def _cache_key(lab: Lab, params, target_key: str) -> str:
    return json.dumps([lab.name, to_dict(params), target_key], sort_keys=True)


def clear_cache() -> None:
    """Forget cached results (with a pool, also the shared folder every app process reads)."""
    _CACHE.clear()
    if cluster_address():
        from labs import cache

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
    return _CACHE.get(_cache_key(lab, validate(params), target.key)) if target else None


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


def run_on(lab: Lab, params, info: Optional[gpu_mod.GpuInfo], target: gpu_mod.Target,
           progress: Progress = noop_progress, on_wait: Optional[Callable[[int], None]] = None,
           use_cache: bool = True, time_limit_s: Optional[float] = None, label: str = "") -> Result:
    """The embedded run on this process's GPU under its lock (a pool's worker calls this for its GPU;
    its `label`, "lab@gpu1.host", names the GPU in the lock's enter/exit log)."""
    if lab.check:
        lab.check(params, target)
    key = _cache_key(lab, params, target.key)
    if use_cache and key in _CACHE:
        return _CACHE[key]
    with gpu_session(label or lab.name, on_wait):
        if use_cache and key in _CACHE:  # someone ran the same thing while we waited
            return _CACHE[key]
        started = time.monotonic()
        measured, messages, complete = _measure_rows(lab, params, target, progress,
                                                     time_limit_s or RUN_TIME_LIMIT_S)
    rows = merge_rows(measured, lab.predict(params, target), lab.key, lab.metric)
    meta = run_metadata("live", info, target) | {"duration_s": round(time.monotonic() - started, 2)}
    result = Result(lab.name, to_dict(params), rows, meta, messages, complete)
    if complete:
        _CACHE[key] = result
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return result


def _measure_rows(lab: Lab, params, target, progress: Progress, time_limit_s: float):
    """Collect measured rows; running out of GPU memory or time stops the sweep but keeps what was measured."""
    import torch

    rows: list = []
    notes: list = []  # a lab's measure() may yield a string: a note for the learner, kept with the result
    started = time.monotonic()

    def guarded(fraction: float, message: str) -> None:
        if time.monotonic() - started > time_limit_s:
            raise RunTimedOut
        progress(fraction, message)

    try:
        for row in lab.measure(params, target, guarded):
            (notes if isinstance(row, str) else rows).append(row)
    except RunTimedOut:
        return rows, notes + [f"The run passed its time limit of {time_limit_s:.0f} s after {len(rows)} measured points; "
                      "what was measured is kept. Try fewer or smaller points."], False
    except torch.cuda.OutOfMemoryError:
        _release_gpu_memory()
        free_gb = gpu_mod.free_memory_bytes() / 1e9
        return rows, notes + [f"The GPU ran out of memory after {len(rows)} measured points; the sweep stopped there "
                      f"and what was measured is kept ({free_gb:.1f} GB free now). Try a smaller size."], False
    return rows, notes, True


def calibrate(progress: Progress = noop_progress, on_wait: Optional[Callable[[int], None]] = None):
    """Measure this GPU's ceilings under the GPU lock (see labs.gpu.calibrate)."""
    with gpu_session("calibrate", on_wait):
        return gpu_mod.calibrate(progress)


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
