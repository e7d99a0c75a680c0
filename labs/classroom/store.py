"""The class store: classes, learners and their keys, every submission with its whole verdict, drafts, predictions.

    store = get_store()                         # ROOFLINE_DB (labs/classroom/db.py); one per process and URL
    code = store.create_class("Tuesday lab")    # the code the instructor shows
    learner, key = store.join(code, "Ada")      # the key is shown once; it is the learner's only proof
    ticket = store.admit(key, "add", source)    # size and rate limits; the submission is recorded as queued
    store.finish(ticket, verdict)               # ... and answered: its whole verdict kept
    store.load_work(key, "add")                 # {'code': ..., 'verdict': ...}: the latest, on any browser

A learner is known only by the key the server issued (kept as its SHA-256): typing someone's name gets you
nothing of theirs, and a submission is written under the key that sent it, never under a name. A page
session that never joined a class has a token of its own (?s=...) that works the same way, without a name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import statistics
import sys
import threading
import time
import unicodedata
from typing import Optional

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from labs.classroom import db
from labs.classroom.db import classes, drafts, learners, predictions, settings, submissions
from labs.engine.params import ParamError

MAX_CODE_CHARS = 100_000  # far more than any exercise needs; keeps one learner from filling the store
MAX_NAME_CHARS = 40
PER_MINUTE = int(os.environ.get("ROOFLINE_SUBMISSIONS_PER_MINUTE", "6"))  # submissions per learner per minute
CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: read off a projector
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
log = logging.getLogger("roofline.classroom")


@dataclasses.dataclass(frozen=True)
class Learner:
    id: int
    class_code: str
    name: str


def new_token() -> str:
    return secrets.token_urlsafe(24)


def valid_token(token) -> bool:
    return isinstance(token, str) and bool(_TOKEN.match(token))


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def clean_name(name: str) -> str:
    """The display name as it will be shown (whitespace collapsed); refuses empty, long and control characters."""
    name = " ".join(str(name or "").split())
    if not name:
        raise ParamError("Type a display name (what the class board will show).")
    if len(name) > MAX_NAME_CHARS:
        raise ParamError(f"A display name has at most {MAX_NAME_CHARS} characters; this one has {len(name)}.")
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs") for ch in name):
        raise ParamError("A display name cannot hold control or invisible characters.")
    return name


def clean_code(code: str) -> str:
    return "".join(str(code or "").split()).upper()


def is_trusted(verdict: dict) -> bool:
    """Whether the verdict says its time was measured by the trusted side (issue 31's judge), not self-timed."""
    if verdict.get("trusted") is True:
        return True
    how = verdict.get("measured_by")
    if isinstance(how, dict):
        return how.get("trusted") is True or str(how.get("how", "")).lower().startswith("trusted")
    return isinstance(how, str) and how.lower().startswith("trusted")


def measured_by_text(verdict: dict) -> str:
    how = verdict.get("measured_by")
    if how is None:
        return "self-timed in the sandbox" if verdict.get("gpu") else "checked only (no GPU)"
    return how if isinstance(how, str) else json.dumps(how, sort_keys=True, default=str)


def summarize(verdict: dict) -> dict:
    """The columns the board sorts on, from a verdict: geometric means over its timing points."""
    metric = verdict.get("metric") or ""
    rows = verdict.get("points") or []
    measured = [r.get(f"measured_{metric}") for r in rows]
    predicted = [r.get(f"predicted_{metric}") for r in rows]
    rate = share = None
    if rows and all(isinstance(m, (int, float)) and m > 0 and math.isfinite(m) for m in measured):
        rate = math.exp(sum(math.log(m) for m in measured) / len(measured))
        if all(isinstance(p, (int, float)) and p > 0 for p in predicted):
            share = math.exp(sum(math.log(m / p) for m, p in zip(measured, predicted)) / len(measured))
    seconds = verdict.get("queue_s") or verdict.get("seconds")  # how long it kept the next one waiting (pooled.py)
    return {"status": str(verdict.get("status") or "error")[:24], "metric": metric[:16], "rate": rate,
            "share_of_model": share, "trusted": is_trusted(verdict), "measured_by": measured_by_text(verdict),
            "gpu": str(verdict.get("gpu") or "")[:120], "judged_on": str(verdict.get("judged_on") or "")[:120] or None,
            "seconds": float(seconds) if isinstance(seconds, (int, float)) else None}


def _upsert(conn, table, values: dict, keys: tuple, changes: dict):
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table).values(**values)
    conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=changes))


class Store:
    """One class store (a SQLite file or a PostgreSQL database). Thread-safe; every method is one transaction."""

    def __init__(self, url: Optional[str] = None):
        self.url = db.url_from(url)
        self.engine = db.engine_for(self.url)

    def __repr__(self) -> str:
        return f"Store({db.safe_url(self.url)!r})"

    def _tx(self, write: bool = False):
        return db.transaction(self.engine, write)

    # --- classes and learners ------------------------------------------------------------------------
    def create_class(self, title: str = "") -> str:
        for _ in range(20):
            code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(6))
            try:
                with self._tx(write=True) as conn:
                    conn.execute(classes.insert().values(code=code, title=str(title)[:200], created_at=time.time()))
                return code
            except IntegrityError:
                continue
        raise ParamError("could not find a free class code")  # 32^6 codes: never in practice

    def classes(self) -> list[dict]:
        with self._tx() as conn:
            count = (select(learners.c.class_code, func.count().label("n")).group_by(learners.c.class_code)
                     .subquery())
            rows = conn.execute(select(classes, count.c.n).outerjoin(count, count.c.class_code == classes.c.code)
                                .order_by(classes.c.created_at.desc())).mappings().all()
        return [dict(r, learners=r["n"] or 0) for r in rows]

    def class_exists(self, code: str) -> bool:
        with self._tx() as conn:
            return conn.execute(select(classes.c.code).where(classes.c.code == clean_code(code))).first() is not None

    def join(self, class_code: str, name: str) -> tuple[Learner, str]:
        """A new learner in the class; returns it and its key (shown once: the store keeps only its hash)."""
        code, name = clean_code(class_code), clean_name(name)
        if not self.class_exists(code):
            raise ParamError(f"There is no class {code!r}: check the code your instructor shows.")
        key = new_token()
        try:
            with self._tx(write=True) as conn:
                new_id = conn.execute(learners.insert().values(
                    class_code=code, name=name, name_key=name.casefold(), secret_hash=hash_token(key),
                    created_at=time.time())).inserted_primary_key[0]
        except IntegrityError:
            raise ParamError(f"The name {name!r} is taken in this class. If it is yours, rejoin with the key you "
                             "were given when you joined; otherwise choose another name.") from None
        return Learner(int(new_id), code, name), key

    def learner(self, key) -> Optional[Learner]:
        """The learner whose key this is (None for a page token, an unknown or a malformed key)."""
        if not valid_token(key):
            return None
        with self._tx() as conn:
            row = conn.execute(select(learners.c.id, learners.c.class_code, learners.c.name)
                               .where(learners.c.secret_hash == hash_token(key))).first()
        return Learner(int(row.id), row.class_code, row.name) if row else None

    def learners(self, class_code: str) -> list[dict]:
        with self._tx() as conn:
            return [dict(r) for r in conn.execute(
                select(learners.c.id, learners.c.name, learners.c.created_at)
                .where(learners.c.class_code == clean_code(class_code)).order_by(learners.c.id)).mappings()]

    # --- submissions ---------------------------------------------------------------------------------
    def admit(self, token: str, exercise: str, code: str) -> int:
        """Record a submission as queued (the ticket), after the size and per-minute limits; raises ParamError."""
        if not valid_token(token):
            raise ParamError("This page has no valid session key: reload the page.")
        if len(code) > MAX_CODE_CHARS:
            raise ParamError(f"Your code has {len(code):,} characters; a submission has at most {MAX_CODE_CHARS:,}.")
        owner, now = hash_token(token), time.time()
        learner = self.learner(token)
        with self._tx(write=True) as conn:
            if learner is not None and conn.dialect.name == "postgresql":  # one learner's admissions in turn
                conn.execute(select(learners.c.id).where(learners.c.id == learner.id).with_for_update())
            recent = conn.execute(select(submissions.c.created_at).where(
                submissions.c.owner_hash == owner, submissions.c.created_at > now - 60)
                .order_by(submissions.c.created_at)).scalars().all()
            if len(recent) >= PER_MINUTE:
                wait = max(1, math.ceil(recent[0] + 60 - now))
                raise ParamError(f"You have run {len(recent)} submissions in the last minute (at most {PER_MINUTE} a "
                                 f"minute, so the GPU stays free for the class): run again in {wait} s.")
            return int(conn.execute(submissions.insert().values(
                owner_hash=owner, learner_id=learner.id if learner else None,
                class_code=learner.class_code if learner else None, exercise=exercise[:40], code=code,
                status="queued", trusted=False, created_at=now)).inserted_primary_key[0])

    def set_queue_position(self, ticket: int, position: int) -> None:
        with self._tx(write=True) as conn:
            conn.execute(update(submissions).where(submissions.c.id == ticket).values(queue_position=int(position)))

    def finish(self, ticket: int, verdict: dict) -> None:
        """The answered submission: its whole verdict (as JSON) and the columns the board sorts on."""
        text = json.dumps(verdict, default=str)
        with self._tx(write=True) as conn:
            done = conn.execute(update(submissions).where(submissions.c.id == ticket).values(
                verdict=text, finished_at=time.time(), **summarize(verdict)))
            if done.rowcount != 1:
                raise ParamError(f"submission {ticket} is not in the store (was the class reset?)")

    def save_work(self, token: str, exercise: str, code: str, verdict: Optional[dict] = None,
                  ticket: Optional[int] = None) -> None:
        """The page's draft (always) and, with a verdict, the submission (`ticket` from admit, else a new one)."""
        if not valid_token(token):
            return
        code = code[:MAX_CODE_CHARS]
        owner, now = hash_token(token), time.time()
        if verdict is None:  # a page saves its draft at every rerun: write only what changed
            with self._tx() as conn:
                if conn.execute(select(drafts.c.code).where(drafts.c.owner_hash == owner,
                                                            drafts.c.exercise == exercise)).scalar() == code:
                    return
        if verdict is not None and ticket is None:
            learner = self.learner(token)
            with self._tx(write=True) as conn:
                ticket = conn.execute(submissions.insert().values(
                    owner_hash=owner, learner_id=learner.id if learner else None,
                    class_code=learner.class_code if learner else None, exercise=exercise[:40], code=code,
                    status="queued", trusted=False, created_at=now)).inserted_primary_key[0]
        if verdict is not None:
            self.finish(ticket, verdict)
        with self._tx(write=True) as conn:
            _upsert(conn, drafts, {"owner_hash": owner, "exercise": exercise[:40], "code": code, "updated_at": now},
                    ("owner_hash", "exercise"), {"code": code, "updated_at": now})

    def load_work(self, token, exercise: str) -> dict:
        """{'code': the latest draft, 'verdict': the latest answered submission's verdict} ({} if none)."""
        if not valid_token(token):
            return {}
        owner = hash_token(token)
        with self._tx() as conn:
            draft = conn.execute(select(drafts.c.code).where(drafts.c.owner_hash == owner,
                                                             drafts.c.exercise == exercise)).scalar()
            last = conn.execute(select(submissions.c.code, submissions.c.verdict).where(
                submissions.c.owner_hash == owner, submissions.c.exercise == exercise,
                submissions.c.verdict.is_not(None)).order_by(submissions.c.id.desc()).limit(1)).first()
        found = {}
        if draft is not None or last is not None:
            found["code"] = draft if draft is not None else last.code
        if last is not None:
            found["verdict"] = json.loads(last.verdict)
        return found

    def submissions(self, class_code: str, exercise: Optional[str] = None, with_code: bool = False) -> list[dict]:
        """The class's submissions, oldest first, each with its learner's name (code only when asked)."""
        cols = [submissions.c[c] for c in ("id", "learner_id", "exercise", "status", "metric", "rate",
                                           "share_of_model", "trusted", "measured_by", "gpu", "judged_on",
                                           "queue_position",
                                           "seconds", "created_at", "finished_at")]
        if with_code:
            cols += [submissions.c.code, submissions.c.verdict]
        query = (select(*cols, learners.c.name).join(learners, learners.c.id == submissions.c.learner_id)
                 .where(submissions.c.class_code == clean_code(class_code)))
        if exercise:
            query = query.where(submissions.c.exercise == exercise)
        with self._tx() as conn:
            return [dict(r) for r in conn.execute(query.order_by(submissions.c.id)).mappings()]

    def submission(self, submission_id: int) -> Optional[dict]:
        """One submission with its code and whole verdict (for the instructor)."""
        with self._tx() as conn:
            row = conn.execute(select(submissions, learners.c.name)
                               .outerjoin(learners, learners.c.id == submissions.c.learner_id)
                               .where(submissions.c.id == int(submission_id))).mappings().first()
        if row is None:
            return None
        found = dict(row)
        found["verdict"] = json.loads(found["verdict"]) if found["verdict"] else None
        return found

    def typical_seconds(self, exercise: Optional[str] = None, last: int = 20) -> Optional[float]:
        """The median time the last answered submissions kept the queue busy (of this exercise, if it has any)."""
        with self._tx() as conn:
            for which in ([exercise] if exercise else []) + [None]:
                query = select(submissions.c.seconds).where(submissions.c.seconds.is_not(None))
                if which:
                    query = query.where(submissions.c.exercise == which)
                found = conn.execute(query.order_by(submissions.c.id.desc()).limit(last)).scalars().all()
                if found:
                    return statistics.median(found)
        return None

    def counts(self) -> dict:
        with self._tx() as conn:
            return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                    for t in (classes, learners, submissions, drafts, predictions)}

    # --- predictions -----------------------------------------------------------------------------------
    def record_prediction(self, key: str, lab: str, params: dict, question: str, unit: str, guess: float,
                          model: Optional[float] = None, measured: Optional[float] = None,
                          measured_on: str = "") -> bool:
        """A learner's answer to a lab's headline question (their latest answer counts); False if not in a class."""
        learner = self.learner(key)
        if learner is None or not isinstance(guess, (int, float)) or not math.isfinite(guess):
            return False
        values = {"guess": float(guess), "model": model, "measured": measured, "measured_on": measured_on[:200],
                  "question": question, "unit": unit[:24], "created_at": time.time()}
        with self._tx(write=True) as conn:
            _upsert(conn, predictions, {"learner_id": learner.id, "class_code": learner.class_code, "lab": lab[:40],
                                        "params": json.dumps(params, sort_keys=True, default=str), **values},
                    ("learner_id", "lab", "params"), values)
        return True

    def note_measured(self, key: str, lab: str, params: dict, measured: float, measured_on: str) -> None:
        """The measured answer, once the learner's page shows one (a recorded or live run)."""
        learner = self.learner(key)
        if learner is None:
            return
        with self._tx(write=True) as conn:
            conn.execute(update(predictions).where(
                predictions.c.learner_id == learner.id, predictions.c.lab == lab,
                predictions.c.params == json.dumps(params, sort_keys=True, default=str))
                .values(measured=measured, measured_on=measured_on[:200]))

    def poll(self, class_code: str, lab: Optional[str] = None) -> list[dict]:
        query = (select(predictions, learners.c.name).join(learners, learners.c.id == predictions.c.learner_id)
                 .where(predictions.c.class_code == clean_code(class_code)))
        if lab:
            query = query.where(predictions.c.lab == lab)
        with self._tx() as conn:
            return [dict(r) for r in conn.execute(query.order_by(predictions.c.id)).mappings()]

    # --- the instructor's --------------------------------------------------------------------------------
    def reset(self, class_code: str, learners_too: bool = False) -> dict:
        """Delete the class's submissions and predictions (and its learners, with their drafts, if asked)."""
        code = clean_code(class_code)
        with self._tx(write=True) as conn:
            ids = select(learners.c.id).where(learners.c.class_code == code)
            hashes = select(learners.c.secret_hash).where(learners.c.class_code == code)
            gone = {"submissions": conn.execute(delete(submissions).where(submissions.c.class_code == code)).rowcount,
                    "predictions": conn.execute(delete(predictions).where(predictions.c.learner_id.in_(ids))).rowcount}
            if learners_too:
                conn.execute(delete(drafts).where(drafts.c.owner_hash.in_(hashes)))
                gone["learners"] = conn.execute(delete(learners).where(learners.c.class_code == code)).rowcount
        return gone

    def setting(self, name: str, make) -> str:
        """A stored setting, created once by `make()` (the first of several replicas wins)."""
        with self._tx() as conn:
            found = conn.execute(select(settings.c.value).where(settings.c.name == name)).scalar()
        if found is not None:
            return found
        try:
            with self._tx(write=True) as conn:
                conn.execute(settings.insert().values(name=name, value=make()))
        except IntegrityError:
            pass
        with self._tx() as conn:
            return conn.execute(select(settings.c.value).where(settings.c.name == name)).scalar_one()

    def integrity(self) -> str:
        return db.integrity(self.engine)


_STORES: dict[str, Store] = {}
_LOCK = threading.Lock()
_ANNOUNCED: set = set()


def get_store() -> Store:
    """The store ROOFLINE_DB names (one per URL per process)."""
    url = db.url_from()
    with _LOCK:
        if url not in _STORES:
            _STORES[url] = Store(url)
        return _STORES[url]


def instructor_key(store: Optional[Store] = None) -> str:
    """ROOFLINE_INSTRUCTOR_KEY, or one generated once and kept in the store (so every replica agrees), printed
    to the log the first time this process asks for it."""
    key = os.environ.get("ROOFLINE_INSTRUCTOR_KEY", "").strip()
    if key:
        _ANNOUNCED.add("env")
        return key
    store = store or get_store()
    key = store.setting("instructor_key", lambda: secrets.token_urlsafe(18))
    if store.url not in _ANNOUNCED:
        _ANNOUNCED.add(store.url)
        print(f"Roofline class board: instructor key {key} (open /class?key=...; set ROOFLINE_INSTRUCTOR_KEY to "
              f"choose it). Store: {db.safe_url(store.url)}", file=sys.stderr, flush=True)
    return key


def announce() -> None:
    """At the app's start: print the instructor key to the log (once per process; a store that is down is
    reported, never raised: the labs serve without it)."""
    if _ANNOUNCED:
        return
    try:
        instructor_key()
    except Exception as exc:  # noqa: BLE001
        _ANNOUNCED.add("failed")
        print(f"Roofline class store not available: {exc}", file=sys.stderr, flush=True)


def is_instructor(key, store: Optional[Store] = None) -> bool:
    return isinstance(key, str) and bool(key) and hmac.compare_digest(key.encode(), instructor_key(store).encode())
