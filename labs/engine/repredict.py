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
import math
import sys

from labs.engine import gpu
from labs.engine.params import ParamError, from_dict
from labs.engine.results import Result, error_pct

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


WITHIN_PCT = 15.0  # a model within this is doing its job (content/home.md)
FAR_PCT = 50.0  # a point off by more than this needs a sentence on its page saying why


def _percentile(values: list, q: float):
    """The q-th percentile (0-100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def score(errors: list) -> dict:
    """How well a model held on a set of points: its share within 15 %, the median and 90th-percentile size of
    its error, the worst point, and how many are off by more than 50 %."""
    known = [abs(e) for e in errors if e is not None]
    return {"points": len(known),
            "within_15_pct": 100.0 * sum(e <= WITHIN_PCT for e in known) / len(known) if known else None,
            "median_abs_error_pct": _percentile(known, 50), "p90_abs_error_pct": _percentile(known, 90),
            "worst_abs_error_pct": max(known) if known else None,
            "over_50_pct": sum(e > FAR_PCT for e in known)}


def scorecard(labs) -> list[dict]:
    """One row per lab and recorded GPU: how the model of this version holds on that recording's points (score),
    beside how the model of the recording's own version held (`recorded_within_15_pct`). A recording this version
    cannot re-predict is scored as recorded, and says so."""
    from labs.engine.results import list_recorded

    rows = []
    for lab in labs:
        for result in list_recorded(lab.name):
            shown = with_current_model_or_recorded(lab, result)
            errors = [r.get("error_pct") for r in shown.rows if r.get("error_pct") is not None]
            recorded = [r.get("recorded_error_pct", r.get("error_pct")) for r in shown.rows
                        if r.get("error_pct") is not None]
            gpu_meta = result.meta.get("gpu", {})
            rows.append({"lab": lab.name, "title": lab.title, "gpu": gpu_meta.get("name", "?"),
                         "gpu_key": gpu_meta.get("key", "?"), "date": str(result.meta.get("date", ""))[:10],
                         "commit": result.meta.get("git_commit"), "repredicted": bool(shown.meta.get("repredicted")),
                         **score(errors), "recorded_within_15_pct": score(recorded)["within_15_pct"]})
    return rows


def misses(lab, band_pct: float = WITHIN_PCT) -> list[dict]:
    """The points of every recording of `lab` that the current model misses by more than band_pct, worst first:
    the lab's key columns, the GPU, the measurement, the prediction and the error."""
    from labs.engine.results import list_recorded

    out = []
    for result in list_recorded(lab.name):
        shown = with_current_model_or_recorded(lab, result)
        gpu_name = result.meta.get("gpu", {}).get("name", "?")
        for r in shown.rows:
            e = r.get("error_pct")
            if e is not None and abs(e) > band_pct:
                out.append({"gpu": gpu_name, **{k: r.get(k) for k in lab.key},
                            f"measured_{lab.metric}": r.get(f"measured_{lab.metric}"),
                            f"predicted_{lab.metric}": r.get(f"predicted_{lab.metric}"), "error_pct": e})
    return sorted(out, key=lambda r: -abs(r["error_pct"]))


def kernels_against_libraries(labs) -> list[dict]:
    """Every recorded case where a lab timed our kernel beside a library's in the same run (a lab offers
    `library_ratios(rows)` in its module): one row per case, library and recorded GPU, with the speed ratio
    (library time / ours), the target the issue set for that case (None where it sets none) and whether the
    case meets it."""
    from labs.engine.results import list_recorded

    out = []
    for lab in labs:
        hook = getattr(sys.modules[lab.predict.__module__], "library_ratios", None)
        if hook is None:
            continue
        for result in list_recorded(lab.name):
            gpu_name = result.meta.get("gpu", {}).get("name", "?")
            for row in hook(result.rows):
                target = row.get("target")
                out.append({"lab": lab.name, "title": lab.title, "gpu": gpu_name,
                            "date": str(result.meta.get("date", ""))[:10], "commit": result.meta.get("git_commit"),
                            **row, "meets": None if target is None else row["speed_ratio"] >= target})
    return out


def library_summary(cases: list) -> list[dict]:
    """Per lab, GPU, library and target: how many of the cases the target covers meet it, and the slowest one."""
    groups = {}
    for c in cases:
        if c["target"] is not None:
            groups.setdefault((c["title"], c["gpu"], c["library"], c["target"]), []).append(c)
    out = []
    for (title, gpu_name, library, target), group in groups.items():
        worst = min(group, key=lambda c: c["speed_ratio"])
        out.append({"lab": title, "GPU": gpu_name, "against": library, "target (x)": target, "cases": len(group),
                    "meet it": sum(c["meets"] for c in group), "slowest (x)": worst["speed_ratio"],
                    "slowest case": worst["case"]})
    return out
