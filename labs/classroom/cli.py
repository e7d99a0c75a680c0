"""The class from the command line (labs/__main__.py hands these its parsed arguments).

    python -m labs class new [TITLE]                      a new class: prints its code
    python -m labs class list                             the classes in the store
    python -m labs class key                              the instructor key of the board (/class?key=...)
    python -m labs class board EXERCISE [--class C] [--csv] [--hide-names]
    python -m labs workbench run EXERCISE FILE --learner NAME --class CODE [--key KEY]

A learner on the command line is known by the key the store issued when they joined: the first run with a
new name joins the class and keeps the key in a file only this user can read (it is printed once too);
a name that is taken needs its key (--key, or ROOFLINE_LEARNER_KEY).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import sys
from pathlib import Path

from labs.classroom import board, db
from labs.classroom.store import Store, clean_code, clean_name, get_store, instructor_key
from labs.engine.params import ParamError


def key_file(store: Store, class_code: str, name: str) -> Path:
    ident = hashlib.sha256(f"{store.url}\n{clean_code(class_code)}\n{clean_name(name).casefold()}".encode())
    return db.default_path().parent / "learner-keys" / f"{ident.hexdigest()[:32]}.key"


def learner_key(class_code: str, name: str, key: str = "", store: Store | None = None) -> str:
    """The key to submit with: given, kept from an earlier run, or issued now by joining the class."""
    store = store or get_store()
    key = key or os.environ.get("ROOFLINE_LEARNER_KEY", "")
    if key:
        learner = store.learner(key)
        if learner is None or learner.class_code != clean_code(class_code):
            raise ParamError(f"that key belongs to no learner of class {clean_code(class_code)!r}")
        return key
    path = key_file(store, class_code, name)
    if path.exists():
        kept = path.read_text().strip()
        if store.learner(kept) is not None:
            return kept
    learner, key = store.join(class_code, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key)
    print(f"joined class {learner.class_code} as {learner.name}; your key (also kept in {path}): {key}",
          file=sys.stderr)
    return key


def _when(t) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S") if t else ""


def board_text(rows: list[dict]) -> str:
    if not rows:
        return "(no answered submissions yet)"
    lines = [f"{'rank':>4}  {'learner':24s} {'status':12s} {'rate':>10s} {'unit':8s} {'vs model':>8s}  "
             f"{'tries':>5s}  measured by"]
    for r in rows:
        rate = f"{r['rate']:.3g}" if r["rate"] is not None else "-"
        share = f"{100 * r['share_of_model']:.0f}%" if r["share_of_model"] is not None else "-"
        lines.append(f"{r['rank'] or '-':>4}  {r['learner'][:24]:24s} {r['status']:12s} {rate:>10s} {r['unit']:8s} "
                     f"{share:>8s}  {r['attempts']:5d}  {r['measured_by']}")
    return "\n".join(lines)


def cmd_class(args) -> int:
    store = get_store()
    if args.action == "new":
        code = store.create_class(" ".join(args.rest))
        print(code)
        return 0
    if args.action == "key":
        print(instructor_key(store))
        return 0
    if args.action == "list":
        for c in store.classes():
            print(f"{c['code']}  {c['learners']:3d} learners  created {dt.datetime.fromtimestamp(c['created_at'])}"
                  f"  {c['title']}")
        return 0
    if not args.rest:
        raise ParamError("usage: python -m labs class board EXERCISE [--class CODE] [--csv]")
    exercise = args.rest[0]
    code = clean_code(args.class_code) if args.class_code else next((c["code"] for c in store.classes()), "")
    if not code or not store.class_exists(code):
        raise ParamError(f"no class {code!r} in the store {db.safe_url(store.url)} (python -m labs class list)")
    rows = board.ranked(store.submissions(code, exercise), hide_names=args.hide_names)
    if args.csv:
        sys.stdout.write(board.to_csv(rows))
    else:
        print(f"class {code}, exercise {exercise}: {len(rows)} learner(s)", file=sys.stderr)
        print(board_text(rows))
    return 0


def add_parser(sub) -> None:
    cls = sub.add_parser("class", help="a class's store: python -m labs class new [TITLE] | list | board EXERCISE | key")
    cls.add_argument("action", choices=("new", "list", "board", "key"))
    cls.add_argument("rest", nargs="*", metavar="ARG", help="new: the class's title; board: the exercise")
    cls.add_argument("--class", dest="class_code", help="the class code (default: the newest class)")
    cls.add_argument("--csv", action="store_true", help="board: print CSV")
    cls.add_argument("--hide-names", action="store_true", help="board: learners by number (projector)")
    cls.set_defaults(func=cmd_class)


def submit_as_learner(ex, code: str, learner: str, class_code: str, key: str, progress, on_wait_print,
                      **judge_options) -> dict:
    """The workbench CLI's run with --learner/--class: the same path as the page (admitted, queued, kept)."""
    from labs.classroom import queue

    token = learner_key(class_code, learner, key)
    return queue.submit(token, ex, code, progress=progress, on_wait=lambda message, _pos: on_wait_print(message),
                        **judge_options)
