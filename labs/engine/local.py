"""The embedded backend: this process's GPU, its one lock, and runs of a lab on it.

Every kernel the app times runs inside `gpu_session()`, so two learners' runs never overlap on the
GPU (their timings would be wrong, and torch's memory counters are per process). `run_on` is one run
of a lab on this process's GPU: its sweep measured in passes, merged by labs/engine/passes.py; the runner calls it for the embedded default, and a GPU pool's worker
calls it for the GPU it owns (labs/engine/pool.py), so both share this lock and this in-memory cache.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Optional

from labs.engine import gpu as gpu_mod
from labs.engine import passes, timing
from labs.engine.lab import Lab, Progress, noop_progress
from labs.engine.params import to_dict
from labs.engine.results import Result, merge_rows, run_metadata

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
    """Measure the lab's sweep in passes (timing.PASSES of them, one timing of each point per pass; more while a
    point is unsteady and time allows) and merge them (labs/engine/passes.py). Running out of GPU memory or time
    stops the sweep but keeps what the passes measured."""
    import torch

    sweep = passes.Sweep(lab.key)
    notes: list = []  # a lab's measure() may yield a string: a note for the learner, kept (first pass) with the result
    memo: dict = {}  # what the first pass checked once for the whole run (timing.once_per_run)
    planned = timing.PASSES if lab.timed_in_passes else 1
    started = time.monotonic()
    longest_pass_s = 0.0
    while True:
        index, pass_started, measured = sweep.passes, time.monotonic(), []
        label = _pass_label(index, planned) if lab.timed_in_passes else ""
        total = max(planned, index + 1)

        def guarded(fraction: float, message: str) -> None:
            if time.monotonic() - started > time_limit_s:
                raise RunTimedOut
            progress((index + fraction) / total, label + message)

        pass_mode = timing.in_pass(index, memo) if lab.timed_in_passes else contextlib.nullcontext()
        try:
            with timing.collecting() as timed, pass_mode:  # what each row's measurement timed gives it its spread
                for row in lab.measure(params, target, guarded):
                    if isinstance(row, str):
                        if index == 0:
                            notes.append(row)
                    else:
                        measured.append((row, timed.take()))
        except RunTimedOut:
            sweep.add(measured)
            return sweep.rows(), notes + [f"The run passed its time limit of {time_limit_s:.0f} s {_where(index, measured)}; "
                                          "what was measured is kept. Try fewer or smaller points."], False
        except torch.cuda.OutOfMemoryError:
            sweep.add(measured)
            _release_gpu_memory()
            free_gb = gpu_mod.free_memory_bytes() / 1e9
            return sweep.rows(), notes + [f"The GPU ran out of memory {_where(index, measured)}; the sweep stopped "
                                          f"there and what was measured is kept ({free_gb:.1f} GB free now). "
                                          "Try a smaller size."], False
        sweep.add(measured)
        longest_pass_s = max(longest_pass_s, time.monotonic() - pass_started)
        if not _another_pass(lab, sweep, planned):
            return sweep.rows(), notes, True
        if time.monotonic() - started + longest_pass_s > time_limit_s:  # the next pass would not finish in time
            return sweep.rows(), notes + [_short_of_time(sweep, planned, time_limit_s)], True


def _pass_label(index: int, planned: int) -> str:
    if index < planned:
        return f"pass {index + 1} of {planned}: "
    return f"extra pass {index - planned + 1} (unsteady points): "


def _where(index: int, measured: list) -> str:
    return f"after {len(measured)} measured points" + (f" of pass {index + 1}" if index else "")


def _another_pass(lab: Lab, sweep: passes.Sweep, planned: int) -> bool:
    """Whether the run wants another pass: its planned ones, then extra ones (bounded) while a point is unsteady.
    A sweep that timed nothing (memory readings) gains nothing from a second pass."""
    if not lab.timed_in_passes or not sweep.timed():
        return False
    if sweep.passes < planned:
        return True
    return sweep.passes < planned + timing.MAX_EXTRA_PASSES and sweep.unsteady() > 0


def _short_of_time(sweep: passes.Sweep, planned: int, time_limit_s: float) -> str:
    if sweep.passes < planned:
        return (f"Each point is the median of {sweep.passes} passes, not {planned}: another pass would have passed "
                f"the run's time limit of {time_limit_s:.0f} s. Try fewer or smaller points for steadier numbers.")
    return (f"{sweep.unsteady()} unsteady points were not measured again: another pass would have passed the "
            f"run's time limit of {time_limit_s:.0f} s.")


def queue_length() -> int:
    """Runs holding or waiting for this process's GPU lock."""
    return _waiting + (1 if _LOCK.locked() else 0)


def cached(lab: Lab, params, target_key: str) -> Optional[Result]:
    """This process's cached result of the same run on the same GPU kind, if any."""
    return _CACHE.get(_cache_key(lab, params, target_key))


def clear_cache() -> None:
    _CACHE.clear()
