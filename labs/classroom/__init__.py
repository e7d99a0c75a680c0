"""A class: learners' work kept for good, the instructor's board, and the class's predictions polled.

    db.py      where it lives: SQLite (one file, WAL) by default, PostgreSQL by URL (ROOFLINE_DB); schema, migrations
    store.py   classes, learners and their keys, submissions with their whole verdicts, drafts, predictions
    queue.py   one submission from page, CLI or load test: limits, place in the queue and an estimate, verdict kept
    board.py   the board (best verdict per learner, ranked), its CSV, the class's points, the poll's summary
    cli.py     python -m labs class ...; the workbench CLI's --learner/--class

Nothing here imports streamlit; pages/class.py is the page.
"""

from labs.classroom.db import StoreError
from labs.classroom.store import Learner, Store, get_store, instructor_key, is_instructor

__all__ = ["Learner", "Store", "StoreError", "get_store", "instructor_key", "is_instructor"]
