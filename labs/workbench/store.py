"""The last submission (code and verdict) per exercise of each browser session, kept in this process.

A session is named by a random token the page keeps in its URL (`?s=...`), so a page reload, which
starts a new Streamlit session, finds the learner's code and verdict again. Bounded: the oldest
sessions are forgotten first. Nothing is written to disk: a restart of the app forgets everything.

Tokens are issued by this process (`issue`), never adopted from a link: a `?s=` that this process did not
issue, or issued to another browser, names nothing (`owns` is False) and the page issues a fresh one. So
a link with someone else's token (`/workbench?s=...` sent by whoever wants to read what you write: session
fixation) cannot make the victim's code land where the sender can read it. `browser` is whatever the
page knows of the browser (a digest of its cookie; None where there is none, as in tests).
"""

from __future__ import annotations

import collections
import re
import secrets
import threading
from typing import Optional

MAX_SESSIONS = 5000
MAX_CODE_CHARS = 200_000  # far more than any exercise needs; keeps one learner from filling the memory
_SESSIONS: "collections.OrderedDict[str, dict]" = collections.OrderedDict()
_LOCK = threading.Lock()
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
_ISSUED: "collections.OrderedDict[str, Optional[str]]" = collections.OrderedDict()  # token -> its browser


def new_token() -> str:
    return secrets.token_urlsafe(12)


def valid_token(token) -> bool:
    return isinstance(token, str) and bool(_TOKEN.match(token))


def issue(browser: Optional[str] = None) -> str:
    """A fresh token for this browser, remembered as issued by this process."""
    token = new_token()
    with _LOCK:
        _ISSUED[token] = browser
        while len(_ISSUED) > MAX_SESSIONS:
            _ISSUED.popitem(last=False)
    return token


def owns(token, browser: Optional[str] = None) -> bool:
    """True if this process issued `token` to this browser: only then may a page adopt it from its URL."""
    if not valid_token(token):
        return False
    with _LOCK:
        return token in _ISSUED and _ISSUED[token] == browser


def save(token: str, exercise: str, code: str, verdict: Optional[dict] = None) -> None:
    if not valid_token(token):
        return
    with _LOCK:
        session = _SESSIONS.pop(token, {})
        entry = session.get(exercise, {})
        entry["code"] = code[:MAX_CODE_CHARS]
        if verdict is not None:
            entry["verdict"] = verdict
        session[exercise] = entry
        _SESSIONS[token] = session
        while len(_SESSIONS) > MAX_SESSIONS:
            _SESSIONS.popitem(last=False)


def load(token: str, exercise: str) -> dict:
    """{'code': ..., 'verdict': ...} of this session's last submission of the exercise ({} if none)."""
    with _LOCK:
        return dict(_SESSIONS.get(token, {}).get(exercise, {}))
