"""Who is asking: a stable digest of the visitor's browser, to bind server-issued tokens to it.

Streamlit gives every browser an XSRF cookie (`_streamlit_xsrf`) that the server sets once and the
browser sends with every request, the app's websocket included; its value is re-masked on each response,
but the token inside stays the same for that browser. A digest of that token names the browser without
keeping the token itself. None where there is no such cookie (AppTest, XSRF protection off).
"""

from __future__ import annotations

import hashlib

import streamlit as st

XSRF_COOKIE = "_streamlit_xsrf"


def _xsrf_token(value: str) -> bytes:
    """The token inside the cookie: version 2 is '2|mask|masked token|timestamp' (masked by XOR)."""
    value = value.strip("\"'")
    parts = value.split("|")
    if len(parts) == 4 and parts[0] == "2":
        try:
            mask, masked = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
            if mask:
                return bytes(b ^ mask[i % len(mask)] for i, b in enumerate(masked))
        except ValueError:
            pass
    return value.encode("utf-8", "replace")


def browser_id() -> str | None:
    try:
        cookie = st.context.cookies.get(XSRF_COOKIE)
    except Exception:  # no request context (a bare script run)
        return None
    if not isinstance(cookie, str) or not cookie:  # AppTest's context has no real cookies
        return None
    return hashlib.sha256(b"roofline-browser:" + _xsrf_token(cookie)).hexdigest()[:32]
