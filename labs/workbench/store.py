"""The workbench's memory, kept in the class store (labs/classroom): the draft per exercise and every submission
with its whole verdict, under the page's key (?s=...: a learner's class key, or a token of its own). A reload,
another browser with the same key, or a restart of the app finds them again.
"""

from __future__ import annotations

from typing import Optional

from labs.classroom import queue
from labs.classroom.store import MAX_CODE_CHARS, get_store, new_token, valid_token  # noqa: F401


def save(token: str, exercise: str, code: str, verdict: Optional[dict] = None) -> None:
    get_store().save_work(token, exercise, code, verdict)


def load(token: str, exercise: str) -> dict:
    """{'code': ..., 'verdict': ...} of this key's last draft and answered submission of the exercise ({} if none)."""
    return get_store().load_work(token, exercise)


def submit(token: str, ex, code: str, progress, on_wait) -> dict:
    """Judge and keep one submission (labs/classroom/queue.py); on_wait(message) hears the place in the queue.
    Raises ParamError past the size or per-minute limit."""
    return queue.submit(token, ex, code, progress=progress, on_wait=lambda message, _pos: on_wait(message))
