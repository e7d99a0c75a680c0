"""The shared result cache of a GPU pool: one JSON file per run, on disk, for every app process.

With a pool (labs/pool.py) a class is served by several app processes, perhaps on several machines,
and a learner's identical run must be computed once for all of them and survive a restart. So the
cache is a folder: the file name is a hash of (lab, parameters, GPU kind), the content is the
Result's JSON. Writes go to a temporary file in the same folder and are renamed into place, which
is atomic on POSIX file systems: a reader sees the old file, the new one, or none, never half of one.

The folder is ROOFLINE_RESULT_CACHE, else <ROOFLINE_CACHE>/results (ROOFLINE_CACHE defaults to
~/.cache/roofline). Several machines share it through a network file system mounted at that path.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Optional

from labs.engine.params import ParamError
from labs.engine.results import Result


def folder() -> Path:
    explicit = os.environ.get("ROOFLINE_RESULT_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("ROOFLINE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "roofline")
    return Path(base) / "results"


def key(lab_name: str, params: dict, gpu_kind: str) -> str:
    """The same run asked for by anyone, anywhere, gives the same key (JSON with sorted keys, hashed)."""
    text = json.dumps([lab_name, params, gpu_kind], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path(cache_key: str) -> Path:
    return folder() / f"{cache_key}.json"


def get(cache_key: str) -> Optional[Result]:
    """The stored result, or None (missing, or unreadable: a damaged file is treated as a miss)."""
    try:
        return Result.from_json(_path(cache_key).read_text())
    except (OSError, ParamError):
        return None


def put(cache_key: str, result: Result) -> Path:
    """Store a result atomically: write a temporary file beside it, then rename it over the name."""
    path = _path(cache_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(handle, "w") as fh:
            fh.write(result.to_json())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def clear() -> int:
    """Remove every stored result of this folder; returns how many were removed."""
    removed = 0
    for path in folder().glob("*.json"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed
