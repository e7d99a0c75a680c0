"""The class board: per exercise, each learner's best verdict ranked; its CSV; the class's points for the chart;
the prediction poll's summary. Pure functions of what the store returns (no streamlit, no GPU).

Ranking: a correct verdict whose time the trusted side measured (see labs/workbench: `measured_by`) ranks
above a correct self-timed one, which ranks above a correct one that was not timed (no GPU), which ranks
above any wrong, refused or not credible one. Within a group, the higher rate wins, then the earlier.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import statistics
from typing import Optional

UNITS = {"tbps": "TB/s", "tflops": "TFLOP/s"}
CSV_COLUMNS = ["rank", "learner", "status", "rate", "unit", "share_of_model", "trusted", "measured_by", "gpu",
               "attempts", "best_submission", "best_at", "last_at", "judged_on"]


def _standing(sub: dict) -> tuple:
    correct = sub["status"] == "correct"
    timed = correct and sub.get("rate") is not None
    return (correct and timed and bool(sub.get("trusted")), timed, correct, sub.get("rate") or 0.0,
            -sub["id"])


def ranked(subs: list[dict], hide_names: bool = False) -> list[dict]:
    """One row per learner who submitted (answered submissions only), best first, ranks 1.. for correct ones."""
    best: dict = {}
    attempts: dict = {}
    last: dict = {}
    for sub in subs:
        if sub["status"] == "queued":
            continue
        who = sub["learner_id"]
        attempts[who] = attempts.get(who, 0) + 1
        last[who] = max(last.get(who, 0), sub["created_at"])
        if who not in best or _standing(sub) > _standing(best[who]):
            best[who] = sub
    rows = sorted(best.values(), key=_standing, reverse=True)
    out = []
    for i, sub in enumerate(rows):
        metric = sub.get("metric") or ""
        out.append({"rank": i + 1 if sub["status"] == "correct" else None,
                    "learner": f"learner {i + 1}" if hide_names else sub["name"],
                    "learner_id": sub["learner_id"], "status": sub["status"], "rate": sub.get("rate"),
                    "unit": UNITS.get(metric, metric), "share_of_model": sub.get("share_of_model"),
                    "trusted": bool(sub.get("trusted")), "measured_by": sub.get("measured_by") or "",
                    "gpu": sub.get("gpu") or "", "judged_on": sub.get("judged_on") or "",
                    "attempts": attempts[sub["learner_id"]],
                    "best_submission": sub["id"], "best_at": sub["created_at"], "last_at": last[sub["learner_id"]]})
    return out


def to_csv(rows: list[dict]) -> str:
    """The board as CSV (spreadsheet formulas defused: a cell never starts with = + - @)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k), k) for k in CSV_COLUMNS})
    return buf.getvalue()


def _cell(value, key: str = ""):
    if key.endswith("_at") and isinstance(value, (int, float)):  # times as the spreadsheet reads them
        return dt.datetime.fromtimestamp(value).isoformat(timespec="seconds")
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return "" if value is None else value


def class_points(best_subs: list[dict], names: dict) -> list[dict]:
    """Each ranked learner's measured points (from the kept verdicts): who, point, intensity, FLOP/s and bytes/s."""
    points = []
    for sub in best_subs:
        verdict = sub.get("verdict")
        verdict = json.loads(verdict) if isinstance(verdict, str) else (verdict or {})
        for row in verdict.get("points", []):
            ms = row.get("measured_ms")
            if not ms or verdict.get("status") != "correct":
                continue
            points.append({"who": names.get(sub["learner_id"], "?"), "point": row.get("point"),
                           "intensity": row.get("intensity_flop_per_byte"),
                           "tflops": row.get("flops", 0) / (ms * 1e-3) / 1e12,
                           "tbps": row.get("bytes", 0) / (ms * 1e-3) / 1e12})
    return points


def reference_points(verdict: Optional[dict]) -> list[dict]:
    """Model, our kernel and the library at each point of a verdict (any learner's: they share the points)."""
    if not verdict:
        return []
    metric = verdict.get("metric")
    out = []
    for row in verdict.get("points", []):
        intensity = row.get("intensity_flop_per_byte")
        for who, col in (("model", f"predicted_{metric}"), ("our kernel", f"ours_{metric}"),
                         ("library", f"library_{metric}")):
            value = row.get(col)
            if value is None:
                continue
            tflops = value * intensity if metric == "tbps" and intensity else (value if metric == "tflops" else None)
            tbps = value if metric == "tbps" else (value / intensity if intensity else None)
            out.append({"who": who, "point": row.get("point"), "intensity": intensity, "tflops": tflops,
                        "tbps": tbps})
    return out


def poll_summary(answers: list[dict]) -> list[dict]:
    """The poll per question (lab + params): answers, their median, the model's and the measured answer."""
    groups: dict = {}
    for a in answers:
        groups.setdefault((a["lab"], a["params"]), []).append(a)
    out = []
    for (lab, params), group in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        models = [a["model"] for a in group if a.get("model") is not None]
        measured = [a for a in group if a.get("measured") is not None]
        out.append({"lab": lab, "params": params, "question": group[-1]["question"], "unit": group[-1]["unit"],
                    "answers": len(group), "guesses": [a["guess"] for a in group],
                    "names": [a["name"] for a in group], "median_guess": statistics.median(a["guess"] for a in group),
                    "model": statistics.median(models) if models else None,
                    "measured": measured[-1]["measured"] if measured else None,
                    "measured_on": measured[-1]["measured_on"] if measured else ""})
    return out
