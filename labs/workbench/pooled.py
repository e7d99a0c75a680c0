"""A workbench submission judged on a GPU of the pool (labs/engine/pool.py), or on this machine without one.

    verdict = pooled.submit(exercise, code, progress, on_wait=lambda position: ..., counters=True)

With a pool (ROOFLINE_CLUSTER) the submission goes to the least busy GPU worker of the pool, queued with the
labs' runs, as plain data: the exercise's name, the code as text and the judge's options (booleans, a GPU's
name, the budgets as numbers). There the same `labs.workbench.verdict.submit` judges it: the jail, the
budgets and the trusted judge run on the worker's machine under that worker's GPU lock, and the jail's
CUDA_VISIBLE_DEVICES names that worker's GPU only (`python -m labs.engine.pool worker` starts one worker per
GPU with it; a worker that sees several GPUs refuses to judge). The verdict comes back as JSON and says
which GPU judged it: `judged_on` ("gpu1.host") and `pool` (worker, host, GPU index, the workers that started it).

The pool unreachable, without workers, or failing mid-run: the submission is judged here, the embedded way
(this process's GPU lock, or Triton's interpreter without a GPU), and a note in the verdict says why.

Killing the app: a submission still waiting in the pool is dropped with the app's connection (the scheduler
releases a task nobody wants); one being judged goes on until it ends or its own budgets stop it on the
worker (compiling, then 50x the model's time, at least 10 s; the judge's timed calls likewise; a CPU-time
rlimit), and its verdict is then dropped. Never forever: the worker's budgets bound it, not the app.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from typing import Callable, Optional

from labs.engine import runner
from labs.engine.lab import noop_progress
from labs.engine.params import ParamError
from labs.workbench.exercises import Exercise

WORKER_FUNCTION = "labs.workbench.pooled:judge_here"
OPTIONS = ("static_check", "counters", "model_gpu", "limits")  # what may travel besides the code


Waiting = Callable[[int, int, str], None]  # (runs ahead of yours, GPUs serving the queue, the sentence to show)


def submit(ex: Exercise, code: str, progress: Callable[[float, str], None] = noop_progress,
           on_wait: Optional[Waiting] = None, **options) -> dict:
    """The verdict of one submission: from a GPU of the pool when one is configured, else judged here.
    on_wait(position, gpus, words) hears the runs ahead of it while it waits (across the pool, or for this
    process's GPU lock), how many GPUs serve that queue, and the sentence that says so."""
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise TypeError(f"unknown judge options: {', '.join(sorted(unknown))}")
    tell = on_wait or (lambda position, gpus, words: None)
    if not runner.cluster_address():
        return embedded(ex, code, progress, lambda p: tell(p, 1, runner.waiting_message(p)), **options)
    from labs.engine import pool

    payload = {"exercise": ex.name, "code": str(code), "options": to_wire(options)}
    try:
        verdict, where = pool.run_named(f"workbench-{ex.name}", WORKER_FUNCTION, payload, progress,
                                        lambda p: tell(p, pool.gpu_count(), pool.waiting_message(p)))
    except Exception as exc:  # noqa: BLE001 - the pool's trouble, never the learner's: judged here instead
        why = str(exc) if isinstance(exc, ParamError) else f"{type(exc).__name__}: {exc}"
        progress(0.05, "the GPU pool could not judge it; judging it on this machine")
        verdict = embedded(ex, code, progress, lambda p: tell(p, 1, f"The GPU pool could not take your submission, "
                                                                    f"so this machine judges it: {p} run(s) ahead of "
                                                                    "yours for its GPU."), **options)
        verdict.setdefault("notes", []).append(
            f"The GPU pool did not judge this submission ({why[:400]}); it was judged on this app's machine instead "
            f"({verdict['judged_on']}).")
        return verdict
    verdict["judged_on"] = where.get("gpu_label") or where.get("worker_name") or "a worker of the pool"
    verdict["queue_s"] = verdict.get("judge_s")  # the worker is busy for the whole judging: the pool's estimates
    verdict["pool"] = {k: where.get(k) for k in ("worker_name", "host", "gpu_index", "gpu_label", "kind", "scheduler",
                                                 "attempts")}
    if len(where.get("attempts") or ()) > 1:
        verdict.setdefault("notes", []).append(
            f"The GPU worker {', '.join(where['attempts'][:-1])} stopped while judging this submission; the pool "
            f"judged it again on {verdict['judged_on']}, whose verdict this is.")
    return verdict


def embedded(ex: Exercise, code: str, progress, on_wait, **options) -> dict:
    """Judged in this process, under its GPU lock (the workbench's own path)."""
    from labs.workbench import verdict as judge

    verdict = judge.submit(ex, code, progress=progress, on_wait=on_wait, **options)
    verdict["queue_s"] = verdict.get("held_s")  # the next one waits for the lock only: the estimates' unit
    verdict["judged_on"] = f"{socket.gethostname()} (this app's {'GPU' if verdict.get('gpu') else 'CPU: no GPU'})"
    return verdict


# ---------------------------------------------------------------------------------------------
# Plain data both ways
# ---------------------------------------------------------------------------------------------
def to_wire(options: dict) -> dict:
    """The judge's options as JSON-ready data (the budgets, a sandbox.Limits, as its numbers)."""
    wire = {k: v for k, v in options.items() if k != "limits"}
    if options.get("limits") is not None:
        wire["limits"] = dataclasses.asdict(options["limits"])
    json.dumps(wire)  # anything else (a function, an object) fails here, in the app
    return wire


def from_wire(wire: dict) -> dict:
    """The worker's side of to_wire: only the known options, each of its type."""
    from labs.workbench import sandbox

    options = {}
    for name in ("static_check", "counters"):
        if name in wire:
            options[name] = bool(wire[name])
    if wire.get("model_gpu") is not None:
        options["model_gpu"] = str(wire["model_gpu"])
    if isinstance(wire.get("limits"), dict):
        fields = {f.name: f.type for f in dataclasses.fields(sandbox.Limits)}
        options["limits"] = sandbox.Limits(**{k: (None if v is None else float(v) if "float" in str(fields[k])
                                                  else int(v)) for k, v in wire["limits"].items() if k in fields})
    return options


# ---------------------------------------------------------------------------------------------
# The worker's side: run by labs.engine.pool.execute_named on the GPU worker
# ---------------------------------------------------------------------------------------------
def several_gpus_visible() -> str:
    """Why this worker must not judge (it would hand the learner's jail more than its own GPU), or ''."""
    from labs.engine import gpu as gpu_mod

    if not gpu_mod.detect().available:
        return ""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and "," not in visible:
        return ""
    import torch

    count = torch.cuda.device_count()
    if count <= 1:
        return ""
    return (f"This pool worker sees {count} GPUs (CUDA_VISIBLE_DEVICES={visible or 'unset'}), so a submission's jail "
            "would see them all while only one is this worker's: start the pool's workers with `python -m "
            "labs.engine.pool worker ADDRESS` (one per GPU, each with CUDA_VISIBLE_DEVICES of its own).")


def judge_here(payload: dict, progress: Callable[[float, str], None]) -> dict:
    """One submission judged on this worker, under its GPU lock: verdict.submit on plain data, JSON back."""
    from labs.engine.pool import gpu_label
    from labs.workbench import get_exercise
    from labs.workbench import verdict as judge

    from distributed import get_worker

    ex = get_exercise(str(payload["exercise"]))
    refused = several_gpus_visible()
    if refused:  # the app then judges it itself and the verdict's note carries this
        raise ParamError(refused)
    verdict = judge.submit(ex, str(payload["code"]), progress=progress, where=gpu_label(get_worker()),
                           **from_wire(payload.get("options") or {}))
    verdict["visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return json.loads(json.dumps(verdict, default=str))
