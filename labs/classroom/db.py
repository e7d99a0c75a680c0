"""Where a class's work lives: one SQLite file by default, or a PostgreSQL server, through the same code.

    ROOFLINE_DB unset                 $XDG_DATA_HOME/roofline/classroom.sqlite3 (~/.local/share/roofline/...)
    ROOFLINE_DB=/data/roofline.db     that SQLite file (the Docker image puts it on a volume)
    ROOFLINE_DB=postgresql://u@h/db   a PostgreSQL server, for several app replicas behind a load balancer

SQLAlchemy Core, no ORM: the tables below are the schema. Every write is one transaction. SQLite runs in WAL
mode with synchronous=FULL and takes its write lock when a transaction begins (BEGIN IMMEDIATE), so a reader
never sees half a write and a process killed with SIGKILL loses at most the transaction it had not committed.

Migrations: a one-row table `roofline_schema` holds the schema's version. A fresh store gets the newest schema
and that version; an older one is brought forward step by step by the functions in MIGRATIONS, each in the
same locked transaction as the version bump (PostgreSQL: an advisory lock, so replicas starting together
migrate once). Why not Alembic: six tables and no history yet; Alembic would add a dependency, an ini file
and a scripts folder, and a deployment step an instructor must remember. A migration here is a Python
function beside the tables it changes, run by every process that opens the store.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

from sqlalchemy import (Boolean, Column, Float, ForeignKey, Index, Integer, MetaData, String, Table, Text,
                        UniqueConstraint, create_engine, event, select, text)
from sqlalchemy.engine import Connection, Engine

SCHEMA_VERSION = 2
MIGRATIONS: dict[int, Callable[[Connection], None]] = {}  # version N -> the step from N-1 to N
_ADVISORY_LOCK = 29_0001  # PostgreSQL: serialises migrations of replicas starting at once

metadata = MetaData()
schema = Table("roofline_schema", metadata, Column("version", Integer, nullable=False))
settings = Table("settings", metadata,
                 Column("name", String(64), primary_key=True),
                 Column("value", Text, nullable=False))
classes = Table("classes", metadata,
                Column("code", String(16), primary_key=True),
                Column("title", String(200), nullable=False, default=""),
                Column("created_at", Float, nullable=False))
learners = Table("learners", metadata,
                 Column("id", Integer, primary_key=True, autoincrement=True),
                 Column("class_code", String(16), ForeignKey("classes.code", ondelete="CASCADE"), nullable=False),
                 Column("name", String(80), nullable=False),       # as typed: shown as text, never as HTML
                 Column("name_key", String(80), nullable=False),   # casefolded: "Ada" and "ada " are one name
                 Column("secret_hash", String(64), nullable=False, unique=True),  # sha256 of the learner's key
                 Column("created_at", Float, nullable=False),
                 UniqueConstraint("class_code", "name_key", name="one_name_per_class"))
submissions = Table("submissions", metadata,
                    Column("id", Integer, primary_key=True, autoincrement=True),
                    Column("owner_hash", String(64), nullable=False),  # sha256 of the learner's key or page token
                    Column("learner_id", Integer, ForeignKey("learners.id", ondelete="CASCADE")),
                    Column("class_code", String(16)),
                    Column("exercise", String(40), nullable=False),
                    Column("code", Text, nullable=False),
                    Column("status", String(24), nullable=False),   # queued (admitted, not answered), correct, ...
                    Column("verdict", Text),                        # the whole verdict, JSON
                    Column("metric", String(16)),
                    Column("rate", Float),                          # geometric mean of the measured rates
                    Column("share_of_model", Float),                # ... over the model's
                    Column("trusted", Boolean, nullable=False, default=False),
                    Column("measured_by", Text),
                    Column("gpu", String(120)),
                    Column("judged_on", String(120)),               # which GPU (pool worker) judged it (v2)
                    Column("queue_position", Integer),              # runs ahead of it when it queued
                    Column("seconds", Float),                       # how long it kept the queue (queue_s)
                    Column("created_at", Float, nullable=False),
                    Column("finished_at", Float),
                    Index("submissions_by_class", "class_code", "exercise"),
                    Index("submissions_by_owner", "owner_hash", "exercise"))
drafts = Table("drafts", metadata,
               Column("owner_hash", String(64), primary_key=True),
               Column("exercise", String(40), primary_key=True),
               Column("code", Text, nullable=False),
               Column("updated_at", Float, nullable=False))
predictions = Table("predictions", metadata,
                    Column("id", Integer, primary_key=True, autoincrement=True),
                    Column("learner_id", Integer, ForeignKey("learners.id", ondelete="CASCADE"), nullable=False),
                    Column("class_code", String(16), nullable=False),
                    Column("lab", String(40), nullable=False),
                    Column("params", Text, nullable=False),         # JSON, sorted keys
                    Column("question", Text, nullable=False),
                    Column("unit", String(24), nullable=False),
                    Column("guess", Float, nullable=False),
                    Column("model", Float),
                    Column("measured", Float),
                    Column("measured_on", String(200)),
                    Column("created_at", Float, nullable=False),
                    UniqueConstraint("learner_id", "lab", "params", name="one_answer_per_question"),
                    Index("predictions_by_class", "class_code", "lab"))


def _add_judged_on(conn: Connection) -> None:
    """Version 2: which GPU of the pool (or which app machine) judged each submission."""
    conn.execute(text("ALTER TABLE submissions ADD COLUMN judged_on VARCHAR(120)"))


MIGRATIONS[2] = _add_judged_on


class StoreError(RuntimeError):
    """The store cannot be opened or used (bad URL, server down, newer schema); the message says what to do."""


def default_path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "roofline" / "classroom.sqlite3"


def url_from(value: str | None = None) -> str:
    """The SQLAlchemy URL for ROOFLINE_DB's value (a path, sqlite:///..., or postgresql://...)."""
    value = (os.environ.get("ROOFLINE_DB", "") if value is None else value).strip()
    if not value:
        value = str(default_path())
    for prefix in ("postgresql://", "postgres://"):
        if value.startswith(prefix):
            return "postgresql+psycopg://" + value[len(prefix):]
    if value.startswith(("postgresql+", "sqlite:")):
        return value
    return "sqlite:///" + str(Path(value).expanduser().resolve())


def _sqlite_engine(url: str) -> Engine:
    path = url.split(":///", 1)[1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # we say BEGIN ourselves (below), pysqlite must not
        cur = dbapi_conn.cursor()
        for pragma in ("busy_timeout=30000", "journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON"):
            cur.execute(f"PRAGMA {pragma}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        # a write takes the lock at once: two writers never both read, then both try to upgrade and fail
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")

    return engine


_ENGINES: dict[str, Engine] = {}
_LOCK = threading.Lock()


def engine_for(url: str) -> Engine:
    """One engine per URL per process, its schema checked (and migrated) when first opened."""
    with _LOCK:
        if url not in _ENGINES:
            try:
                engine = _sqlite_engine(url) if url.startswith("sqlite") else create_engine(
                    url, pool_pre_ping=True, pool_size=5, max_overflow=10)
                migrate(engine)
            except StoreError:
                raise
            except Exception as exc:  # noqa: BLE001 - say which store failed and why, in one line
                raise StoreError(f"cannot open the class store {safe_url(url)}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
            _ENGINES[url] = engine
        return _ENGINES[url]


def safe_url(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return url


class _Tx:
    """`with transaction(engine, write=True) as conn` -- the connection, committed (or rolled back) and closed."""

    def __init__(self, engine: Engine, write: bool):
        self.engine, self.write = engine, write

    def __enter__(self) -> Connection:
        self.conn = self.engine.connect()
        if self.write:
            self.conn.execution_options(write=True)
        self.tx = self.conn.begin()
        return self.conn

    def __exit__(self, kind, exc, tb):
        try:
            if kind is None:
                self.tx.commit()
            else:
                self.tx.rollback()
        finally:
            self.conn.close()
        return False


def transaction(engine: Engine, write: bool = False) -> _Tx:
    return _Tx(engine, write)


def migrate(engine: Engine) -> int:
    """Bring the store to SCHEMA_VERSION (create it when empty); returns the version found before."""
    with transaction(engine, write=True) as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_LOCK})
        if not engine.dialect.has_table(conn, "roofline_schema"):
            metadata.create_all(conn)
            conn.execute(schema.insert().values(version=SCHEMA_VERSION))
            return 0
        found = conn.execute(select(schema.c.version)).scalar_one()
        if found > SCHEMA_VERSION:
            raise StoreError(f"the class store {safe_url(str(engine.url))} has schema version {found}, written by a "
                             f"newer Roofline than this one (version {SCHEMA_VERSION}): update Roofline")
        for version in range(found + 1, SCHEMA_VERSION + 1):
            MIGRATIONS[version](conn)
            conn.execute(schema.update().values(version=version))
        return found


def integrity(engine: Engine) -> str:
    """'ok', or what is wrong: SQLite's own integrity and foreign-key checks; PostgreSQL: every table reads."""
    with transaction(engine) as conn:
        if engine.dialect.name == "sqlite":
            problems = [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check")]
            if problems != ["ok"]:
                return "; ".join(problems)
            if conn.exec_driver_sql("PRAGMA foreign_key_check").first() is not None:
                return "foreign keys point nowhere"
        for table in metadata.sorted_tables:
            conn.execute(select(table).limit(1)).all()
    return "ok"
