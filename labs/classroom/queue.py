"""One submission, the same way from the page, the CLI and the load test: admitted (limits), queued for the GPU
with the learner told their place and an estimate, judged by the workbench, kept in the store.

    verdict = submit(key, exercise, code, progress, on_wait=lambda message, position: ...)
"""

from __future__ import annotations

from typing import Callable, Optional

from labs.classroom.store import Store, get_store
from labs.engine.lab import noop_progress


def about(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def waiting_message(position: int, exercise: str, store: Optional[Store] = None) -> str:
    """'Waiting for the GPU: 3 run(s) ahead of yours. Your verdict in about 8 s (runs take 2 s here lately).'"""
    from labs.engine import runner

    message = runner.waiting_message(position)
    typical = (store or get_store()).typical_seconds(exercise)
    if typical:
        # the run on the GPU is half done on average; then the ones waiting ahead, then yours
        message += (f" Your verdict in about {about((position + 0.5) * typical)} "
                    f"(a run takes about {about(typical)} here lately).")
    return message


def submit(key: str, exercise, code: str, progress: Callable[[float, str], None] = noop_progress,
           on_wait: Optional[Callable[[str, int], None]] = None, store: Optional[Store] = None,
           **judge_options) -> dict:
    """Admit (raises ParamError past a limit), judge in the workbench's sandbox, keep the verdict; returns it."""
    from labs.workbench import verdict as judge

    store = store or get_store()
    ticket = store.admit(key, exercise.name, code)

    def waiting(position: int) -> None:
        store.set_queue_position(ticket, position)
        if on_wait:
            on_wait(waiting_message(position, exercise.name, store), position)

    try:
        verdict = judge.submit(exercise, code, progress=progress, on_wait=waiting, **judge_options)
    except BaseException as exc:  # the ticket is answered even when the judge fails (or the page is stopped)
        store.finish(ticket, {"exercise": exercise.name, "status": "error",
                              "message": f"the judge stopped: {type(exc).__name__}: {exc}"})
        raise
    store.save_work(key, exercise.name, code, verdict, ticket=ticket)
    return verdict
