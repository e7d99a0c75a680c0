"""Classroom features every page shares: instructor mode, predict-then-run, progress, uploads to compare."""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import hashlib
import json

import streamlit as st

from labs import get_lab
from labs.engine import results
from labs.engine.params import ParamError
from labs.engine.results import MAX_UPLOAD_BYTES, Result
from ui import text


# --- instructor mode ------------------------------------------------------------------------------
def instructor_mode() -> bool:
    """On with ?mode=instructor or the sidebar switch; enlarges text and charts for a projector."""
    if "instructor" not in st.session_state:
        st.session_state["instructor"] = st.query_params.get("mode") == "instructor"
    on = st.sidebar.toggle("Instructor mode", key="instructor",
                           help="Larger text and charts for a projector, and a warm-up of every lab on Home.")
    if on:
        st.markdown("<style>html, body, [class*='st-'] { font-size: 1.25rem !important; }"
                    "h1 { font-size: 3.2rem !important; } .js-plotly-plot { zoom: 1.15; }</style>",
                    unsafe_allow_html=True)
    return on


# --- the class: which learner this browser is (pages/class.py joins and rejoins) ------------------
KEY_COOKIE = "roofline_class_key"


def class_key() -> str:
    """This browser's learner key ('' when it joined no class): the session's, else the URL's ?s=, else the
    cookie pages/class.py set, once the store knows it."""
    key = st.session_state.get("class.key")
    if key is None:
        from labs.classroom import get_store

        key = ""
        try:
            for candidate in (st.query_params.get("s"), st.context.cookies.get(KEY_COOKIE)):
                if candidate and get_store().learner(candidate):
                    key = candidate
                    break
        except Exception as exc:  # noqa: BLE001 - a store that is down must not cost the lab page
            st.sidebar.warning(f"The class store is not available: {exc}")
        st.session_state["class.key"] = key
    return key


def remember_key(key: str) -> None:
    """Keep the learner's key for this session and in a cookie (a reload or another page finds it again)."""
    st.session_state["class.key"] = key
    value = json.dumps(key if key else "")  # a key is [A-Za-z0-9_-]: nothing to escape, but never trust it raw
    age = 120 * 86400 if key else 0
    script = (f"<script>document.cookie = '{KEY_COOKIE}=' + encodeURIComponent({value}) + "
              f"'; path=/; max-age={age}; SameSite=Strict' + (location.protocol === 'https:' ? '; Secure' : '');"
              "</script>")
    try:
        st.html(script, unsafe_allow_javascript=True)
    except TypeError:  # a Streamlit before 1.50: a components frame of this origin sets it
        import streamlit.components.v1 as components

        components.html(script.replace("document.cookie", "window.parent.document.cookie"), height=0)


def class_line() -> None:
    """'Class ABC234 · you are <name>' in the sidebar (the name as plain text)."""
    key = class_key()
    if key:
        from labs.classroom import get_store

        learner = get_store().learner(key)
        if learner:
            st.sidebar.text(f"Class {learner.class_code} · you are {learner.name}")


def _keep_prediction(lab, params_dict: dict, guess, model_rows: list, revealed_rows: list, revealed_label: str) -> None:
    """A learner in a class: their answer goes to the class's poll (pages/class.py), beside model and measurement."""
    key = class_key()
    if not key or not isinstance(guess, (int, float)):
        return
    from labs.classroom import get_store

    _, predicted = lab.headline.answer(model_rows)
    measured, _ = lab.headline.answer(revealed_rows) if revealed_rows else (None, None)
    try:
        get_store().record_prediction(key, lab.name, params_dict, lab.headline.question, lab.headline.unit, guess,
                                      model=predicted, measured=measured,
                                      measured_on=revealed_label if measured else "")
    except Exception as exc:  # noqa: BLE001 - the answer still counts on this page
        st.warning(f"Your answer could not reach the class's poll: {exc}")


# --- progress: labs visited and predictions made, kept for the browser session -------------------
def _progress() -> dict:
    return st.session_state.setdefault("progress", {"visited": [], "predictions": []})


def visit(lab_name: str) -> None:
    visited = _progress()["visited"]
    if lab_name not in visited:
        visited.append(lab_name)


def progress_download() -> None:
    data = _progress()
    class_line()
    st.sidebar.caption(f"Labs visited: {len(data['visited'])}; predictions made: {len(data['predictions'])}")
    st.sidebar.download_button("Download my progress (JSON)", json.dumps(data, indent=1), "roofline-progress.json",
                               "application/json", key="progress-download")


# --- predict, then run -----------------------------------------------------------------------------
def predict_first() -> bool:
    """When on, a lab's results stay hidden until the learner predicts its headline number (or skips)."""
    if "predict_first" not in st.session_state:
        st.session_state["predict_first"] = st.query_params.get("predict") in ("1", "true", "yes")
    return st.sidebar.toggle("Predict before results", key="predict_first",
                             help="Hide each lab's charts until you have written down your prediction.")


def _guess_key(lab, params_dict: dict) -> str:
    return f"guess:{lab.name}:{json.dumps(params_dict, sort_keys=True)}"


def must_predict_first(lab, params_dict: dict) -> bool:
    """True while the predict-first switch is on and this lab's question has no answer yet."""
    return (lab.headline is not None and st.session_state.get("predict_first", False)
            and _guess_key(lab, params_dict) not in st.session_state)


def prediction_panel(lab, params_dict: dict, model_rows: list, revealed_rows: list, revealed_label: str) -> None:
    """The headline question: an input for the learner's guess, or the guess scored against model and measurement."""
    headline = lab.headline
    if headline is None:
        return
    key = _guess_key(lab, params_dict)
    with st.container(border=True):
        st.markdown(f"**Predict, then run.** {headline.question}")
        guess = st.session_state.get(key)
        if guess is None:
            c1, c2, c3 = st.columns([2, 1, 1])
            value = c1.number_input(f"Your prediction ({headline.unit})", value=None, placeholder="your guess",
                                    key=f"input:{key}", min_value=-1e12, max_value=1e12)
            if c2.button("Lock in", key=f"lock:{key}", disabled=value is None):
                st.session_state[key] = value
                _progress()["predictions"].append({"lab": lab.name, "question": headline.question, "guess": value,
                                                   "unit": headline.unit, "params": params_dict,
                                                   "time": _dt.datetime.now().isoformat(timespec="seconds")})
                _keep_prediction(lab, params_dict, value, model_rows, revealed_rows, revealed_label)
                st.rerun()
            if c3.button("Skip", key=f"skip:{key}"):
                st.session_state[key] = "skipped"
                st.rerun()
            return
        _score(lab, guess, model_rows, revealed_rows, revealed_label)


def _number(value: float) -> str:
    """11,078,219,776 rather than 1.108e+10; 0.3749 and 64.7 as they are."""
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def _score(lab, guess, model_rows, revealed_rows, revealed_label) -> None:
    headline = lab.headline
    _, predicted = headline.answer(model_rows)
    measured, _ = headline.answer(revealed_rows) if revealed_rows else (None, None)
    parts = [] if guess == "skipped" else [f"you: **{_number(guess)} {headline.unit}**"]
    if predicted is not None:
        parts.append(f"model: **{_number(predicted)} {headline.unit}**")
    if measured is not None:
        parts.append(f"measured ({text.plain(revealed_label, 120)}): **{_number(measured)} {headline.unit}**")
    st.markdown(" · ".join(parts) if parts else "No answer yet.")
    if guess == "skipped":
        return
    if not measured:
        st.caption("Run the lab (or show a recorded run) to score your guess.")
        return
    yours = 100 * abs(guess - measured) / abs(measured)
    note = f"Your guess was {yours:.0f} % from the measurement"
    if predicted:
        model_err = 100 * abs(predicted - measured) / abs(measured)
        note += f"; the model was {model_err:.0f} % from it." + (" You beat the model!" if yours < model_err else "")
    st.caption(note)
    for record in _progress()["predictions"]:
        if record["lab"] == lab.name and record["guess"] == guess:
            if record.get("measured") != measured and class_key():  # the class's poll hears the answer once
                from labs.classroom import get_store

                try:
                    get_store().note_measured(class_key(), lab.name, record["params"], measured, revealed_label)
                except Exception:  # noqa: BLE001 - the poll misses one measured answer; the page goes on
                    pass
            record.update(measured=measured, measured_on=revealed_label, model=predicted)


# --- compare with an uploaded result file ----------------------------------------------------------
# The server refuses a file over server.maxUploadSize (.streamlit/config.toml) before it is in memory;
# each file is parsed once (by its content's hash), and a session holds at most this many files and rows.
MAX_SESSION_FILES = 8
MAX_SESSION_ROWS = 8_000
UPLOADS = "uploads.parsed"  # session state: {lab:sha256 of the file: its Result, or the message why not}


def parse_upload(name: str, data: bytes, lab_name: str) -> Result:
    """A learner's result file, validated: JSON or CSV written by Roofline for this lab."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise ParamError(f"This file is {len(data) / 1e6:.1f} MB; result files are at most "
                         f"{MAX_UPLOAD_BYTES / 1e6:.0f} MB.")
    try:
        body = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ParamError("This is not a text file; upload the JSON or CSV that Roofline wrote.") from None
    body = body.removeprefix("\ufeff")  # a byte-order mark, as some editors save UTF-8
    result = results.parse_untrusted(body, csv_format=name.lower().endswith(".csv"))
    if result.lab != lab_name:
        raise ParamError(f"This is a result of the '{result.lab}' lab, not of '{lab_name}'.")
    try:
        key = tuple(get_lab(lab_name).key)
    except ParamError:  # not a lab (a workbench exercise's verdicts): the generic schema alone
        key = ()
    results.check_rows(result, results.row_contract(lab_name, key))
    result.meta["uploaded_as"] = name[:80]
    return result


def _parsed(name: str, data: bytes, lab_name: str):
    """parse_upload once per file content and lab for this session; later reruns reuse the answer."""
    cache = st.session_state.setdefault(UPLOADS, {})
    key = f"{lab_name}:{hashlib.sha256(data).hexdigest()}"
    if key not in cache:
        try:
            cache[key] = parse_upload(name, data, lab_name)
        except ParamError as exc:
            cache[key] = str(exc)
    return key, cache[key]


def _release(f) -> bool:
    """Drop a file the page will not use from the server's memory: Streamlit keeps every uploaded file's bytes
    until the session ends, so without this a session could hold any number of refused files. True if this
    is the first time this file is dropped (the page then reruns once, so no widget value holds it either)."""
    gone = st.session_state.setdefault("uploads.gone", set())  # file ids dropped before: never rerun twice
    if len(gone) > 10_000:
        gone.clear()
    first = f.file_id not in gone
    gone.add(f.file_id)
    try:
        from streamlit import runtime
        from streamlit.runtime.scriptrunner import get_script_run_ctx

        ctx = get_script_run_ctx()
        if ctx is not None and runtime.exists():
            runtime.get_instance().uploaded_file_mgr.remove_file(ctx.session_id, f.file_id)
            return first
    except Exception:  # noqa: BLE001 - an internal API of Streamlit's: without it the file only stays in memory
        pass
    return False


def uploads(lab_name: str) -> list:
    files = st.file_uploader("Compare with result files (JSON or CSV from Roofline's download buttons or CLI)",
                             type=["json", "csv"], accept_multiple_files=True, key=f"upload:{lab_name}",
                             max_upload_size=max(1, MAX_UPLOAD_BYTES // 1_000_000))
    cache = st.session_state.setdefault(UPLOADS, {})
    present = st.session_state.setdefault("uploads.present", {})  # lab -> cache keys of its uploader's files
    accepted = st.session_state.setdefault("uploads.accepted", {})  # lab -> cache keys of the files it compares
    refused = st.session_state.setdefault("uploads.refused", {}).setdefault(lab_name, {})  # file_id -> message
    present[lab_name], accepted[lab_name] = [], []
    released = st.session_state.setdefault("uploads.released", {})  # lab -> this run dropped files: rerun once
    if not files and not released.pop(lab_name, False):
        refused.clear()  # the learner emptied the uploader (not this page, by dropping what it refused)
    released.pop(lab_name, None)
    found = []
    for f in files or []:
        if sum(len(keys) for keys in accepted.values()) >= MAX_SESSION_FILES:
            refused[f.file_id] = (f"{text.plain(f.name, 80)}: not read; one session compares at most "
                                  f"{MAX_SESSION_FILES} files (remove some, then upload this one again).")
            released[lab_name] = _release(f) or released.get(lab_name, False)
            continue
        key, parsed = _parsed(f.name, f.getvalue(), lab_name)
        present[lab_name].append(key)
        if isinstance(parsed, Result):
            rows = sum(len(cache[k].rows) for keys in accepted.values() for k in keys)
            if rows + len(parsed.rows) > MAX_SESSION_ROWS:
                parsed = cache[key] = (f"Not read: one session compares at most {MAX_SESSION_ROWS:,} rows (remove "
                                       "some files, then upload this one again).")
        if isinstance(parsed, str):
            refused[f.file_id] = f"{text.plain(f.name, 80)}: {text.plain(parsed, 300)}"
            released[lab_name] = _release(f) or released.get(lab_name, False)
            continue
        accepted[lab_name].append(key)
        # a copy: what a page does to it (sorting, a column added) must not reach the next rerun's
        found.append(dataclasses.replace(parsed, rows=[dict(r) for r in parsed.rows], meta=copy.deepcopy(parsed.meta)))
    for message in refused.values():
        st.error(message)
    keep = {k for keys in present.values() for k in keys}
    for key in [k for k in cache if k not in keep]:  # files no uploader holds any more
        del cache[key]
    if released.get(lab_name):
        st.rerun()  # this run's widget value still holds the dropped files' bytes; the next one does not
    return found
