"""The workbench's memory, kept in the class store (labs/classroom): the draft per exercise and every submission
with its whole verdict, under the page's key (?s=...: a learner's class key, or a token of its own). A reload,
another browser with the same key, or a restart of the app finds them again.

A token of the page's own is issued by the server (`issue`), never adopted from a link: it carries a signature
over its random part and the browser it was issued to (a digest of the browser's cookie), made with a secret
kept in the class store, so every replica and every restart recognises it. A `?s=` the server did not issue to
this browser (someone else's, or a made-up one) names nothing (`owns` is False): a link with another's token
(session fixation) cannot make the victim's code land where the link's sender can read it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Optional

from labs.classroom import queue
from labs.classroom.store import MAX_CODE_CHARS, get_store, new_token, valid_token  # noqa: F401

NONCE_CHARS = 16  # secrets.token_urlsafe(12)


def _signature(nonce: str, browser: Optional[str]) -> str:
    secret = get_store().setting("workbench_token_secret", lambda: secrets.token_urlsafe(32))
    digest = hmac.new(secret.encode(), f"{nonce}|{browser or ''}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode()[:22]


def issue(browser: Optional[str] = None) -> str:
    """A fresh token for this browser, signed by this server."""
    nonce = secrets.token_urlsafe(12)
    return nonce + _signature(nonce, browser)


def owns(token, browser: Optional[str] = None) -> bool:
    """True if this server issued `token` to this browser: only then may a page adopt it from its URL."""
    if not valid_token(token) or len(token) != NONCE_CHARS + 22:
        return False
    return hmac.compare_digest(token[NONCE_CHARS:], _signature(token[:NONCE_CHARS], browser))


def save(token: str, exercise: str, code: str, verdict: Optional[dict] = None) -> None:
    get_store().save_work(token, exercise, code, verdict)


def load(token: str, exercise: str) -> dict:
    """{'code': ..., 'verdict': ...} of this key's last draft and answered submission of the exercise ({} if none)."""
    return get_store().load_work(token, exercise)


def submit(token: str, ex, code: str, progress, on_wait, **judge_options) -> dict:
    """Judge and keep one submission (labs/classroom/queue.py); on_wait(message) hears the place in the queue.
    Raises ParamError past the size or per-minute limit."""
    return queue.submit(token, ex, code, progress=progress, on_wait=lambda message, _pos: on_wait(message),
                        **judge_options)
