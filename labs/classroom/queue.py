"""One submission, the same way from the page, the CLI and the load test: admitted (limits), queued for a GPU
with the learner told their place and an estimate, judged by the workbench (on a GPU of the pool when there is
one: labs/workbench/pooled.py), kept in the store with the GPU that judged it.

    verdict = submit(key, exercise, code, progress, on_wait=lambda message, position: ...)
"""

from __future__ import annotations

from typing import Callable, Optional

from labs.classroom.store import Store, get_store
from labs.engine.lab import noop_progress


def about(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def estimate_seconds(position: int, gpus: int, typical: float) -> float:
    """Seconds until the verdict with `position` runs ahead, shared by `gpus` GPUs that take `typical` s a run:
    the runs ahead over the GPUs (those running now half done on average), then yours."""
    gpus = max(1, gpus)
    return typical * (1 + max(0.0, position - gpus / 2) / gpus)


def waiting_message(position: int, exercise: str, store: Optional[Store] = None, gpus: int = 1,
                    words: Optional[str] = None) -> str:
    """'Waiting for the GPU: 3 run(s) ahead of yours. Your verdict in about 8 s (a run takes about 2 s here
    lately).' With a pool of G GPUs the estimate shares the runs ahead among them."""
    if words is None:
        from labs.engine import runner

        words = runner.waiting_message(position)
    typical = (store or get_store()).typical_seconds(exercise)
    if typical:
        over = f" over {gpus} GPUs" if gpus > 1 else ""
        words += (f" Your verdict in about {about(estimate_seconds(position, gpus, typical))} (the runs ahead{over}; "
                  f"a run takes about {about(typical)} here lately).")
    return words


def submit(key: str, exercise, code: str, progress: Callable[[float, str], None] = noop_progress,
           on_wait: Optional[Callable[[str, int], None]] = None, store: Optional[Store] = None,
           **judge_options) -> dict:
    """Admit (raises ParamError past a limit), judge in the workbench's jail (here or on the pool's least busy
    GPU), keep the verdict with where it was judged; returns it."""
    from labs.workbench import pooled

    store = store or get_store()
    ticket = store.admit(key, exercise.name, code)

    def waiting(position: int, gpus: int, words: str) -> None:
        store.set_queue_position(ticket, position)
        if on_wait:
            on_wait(waiting_message(position, exercise.name, store, gpus, words), position)

    try:
        verdict = pooled.submit(exercise, code, progress=progress, on_wait=waiting, **judge_options)
    except BaseException as exc:  # the ticket is answered even when the judge fails (or the page is stopped)
        store.finish(ticket, {"exercise": exercise.name, "status": "error",
                              "message": f"the judge stopped: {type(exc).__name__}: {exc}"})
        raise
    store.save_work(key, exercise.name, code, verdict, ticket=ticket)
    return verdict
