"""Recorded runs compared with the model of this version of Roofline, not the one they were recorded with.

A recording keeps what the GPU measured and what the model predicted at the time. Models improve between
recordings, so the app and scripts/repredict.py re-predict each recorded point: they rebuild the Target the run
had (its GPU's shape and the ceilings it used), call the lab's predict() for the run's params, and join the
model's rows with the recorded ones on the lab's key.

A prediction that measure() makes from a figure probed in the same run (a CPU time, a probed rate) needs that
figure. A lab whose model uses such probes offers `repredict(recording, target) -> rows` in its module, which
reads them back from the recording; without it, rows that carry a CPU time measured per call (a `host_ms` or
`gpu_model_ms` column) keep their recorded prediction.
"""
from __future__ import annotations

import copy
import dataclasses
import sys

from labs import gpu
from labs.params import ParamError, from_dict
from labs.results import Result, error_pct

IN_RUN_MARKS = ("host_ms", "gpu_model_ms")  # columns a measure() writes when it predicted a row from a probe


def recorded_target(meta: dict) -> gpu.Target:
    """The Target a recorded run predicted for: its GPU's shape and the ceilings it used."""
    g = meta.get("gpu", {})
    ceilings = gpu.Ceilings.from_dict(meta["ceilings"])
    name = g.get("name", ceilings.gpu)
    return gpu.Target(name, g.get("key", gpu.slug(name)), int(g["sm_count"]), int(g["l2_bytes"]),
                      int(g["memory_bytes"]), str(g.get("compute_capability", "9.0")), ceilings,
                      gpu.datasheet_for(name), live=False)


def recorded_params(lab, data: dict):
    """The run's params; keys this version of the lab no longer has are dropped (older recordings)."""
    known = {f.name for f in dataclasses.fields(lab.Params)}
    return from_dict(lab.Params, {k: v for k, v in data.items() if k in known})


def _key(row: dict, key: tuple) -> tuple:
    return tuple(row.get(k) for k in key)


def current_model(lab, recording: dict) -> dict:
    """The current model's rows for a recorded run, by the lab's key; None for a row whose recorded prediction
    stands (one made in the run from a probe that only the lab's own repredict hook could read back)."""
    target = recorded_target(recording["meta"])
    hook = getattr(sys.modules[lab.predict.__module__], "repredict", None)
    model = hook(recording, target) if hook else lab.predict(recorded_params(lab, recording["params"]), target)
    predicted = {_key(r, lab.key): r for r in model}
    out = {}
    for row in recording["rows"]:
        k = _key(row, lab.key)
        out[k] = None if not hook and any(row.get(m) is not None for m in IN_RUN_MARKS) else predicted.get(k, {})
    return out


def repredicted_rows(lab, recording: dict) -> list[dict]:
    """The recorded rows that have an error, each with `after_pct`: the current model's error against it."""
    model = current_model(lab, recording)
    out = []
    for row in recording["rows"]:
        measured = row.get(f"measured_{lab.metric}")
        if row.get("error_pct") is None or measured is None:
            continue
        new = model.get(_key(row, lab.key))
        new = row if new is None else new
        out.append({**row, "after_pct": error_pct(measured, new.get(f"predicted_{lab.metric}"))})
    return out


_CACHE: dict = {}


def with_current_model(lab, result: Result) -> Result:
    """A copy of a recorded Result whose predictions are the current model's: every predicted_* column of a
    matched row is replaced and error_pct recomputed; the error the run showed when it was recorded stays in
    `recorded_error_pct`. Rows the model has no match for keep their recorded columns. Cached per recording."""
    meta = result.meta
    key = (lab.name, meta.get("gpu", {}).get("key"), str(meta.get("date")), meta.get("git_commit"), len(result.rows))
    if key not in _CACHE:
        model = current_model(lab, result.to_dict())
        rows = []
        for row in result.rows:
            new = model.get(_key(row, lab.key))
            row = dict(row)
            if new:
                row.update({k: v for k, v in new.items() if k.startswith("predicted_")})
                if "error_pct" in row:
                    row["recorded_error_pct"] = row["error_pct"]
                    row["error_pct"] = error_pct(row.get(f"measured_{lab.metric}"),
                                                 row.get(f"predicted_{lab.metric}"))
            rows.append(row)
        _CACHE[key] = Result(result.lab, result.params, rows, {**meta, "repredicted": True}, list(result.messages),
                             result.complete)
    return copy.deepcopy(_CACHE[key])


def with_current_model_or_recorded(lab, result: Result) -> Result:
    """with_current_model, or the recording as it is where this version's model cannot read it (a recording
    older than the lab's parameters or probes)."""
    try:
        return with_current_model(lab, result)
    except (ParamError, KeyError, TypeError, ValueError):
        return result
