"""One result type for every lab: rows of parameters, measurement, prediction and error, plus metadata.

A row is a flat dict so that it maps onto a table, a CSV line and a chart trace without reshaping.
Column names say what they hold and carry their unit:
    parameters    any name ("dtype", "flops_per_element", "n")
    measured_*    what the GPU did ("measured_tflops", "measured_ms")
    predicted_*   what the model says ("predicted_tflops")
    error_pct     100 * (measured - predicted) / predicted, for the lab's headline metric

Recordings are Results written by the CLI on a real GPU to content/recorded/<gpu>/<lab>.json.
"""

from __future__ import annotations

import copy as _copy
import csv
import datetime as _dt
import functools
import io
import json
import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from labs.engine.gpu import RECORDED_DIR, ROOT, GpuInfo, software_versions
from labs.engine.params import ParamError

SCHEMA_VERSION = 1
KINDS = ("live", "recorded", "model")


@dataclass
class Result:
    lab: str
    params: dict
    rows: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    messages: list = field(default_factory=list)  # warnings and notes a learner should read
    complete: bool = True  # False when a sweep stopped early (out of memory, time limit)

    # --- what the rows hold ---------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        seen: dict[str, None] = {}
        for row in self.rows:
            seen.update(dict.fromkeys(row))
        return list(seen)

    @property
    def kind(self) -> str:
        return self.meta.get("kind", "model")

    @property
    def label(self) -> str:
        """How a chart legend names this result: "H100 SXM, 2026-11-21, live"."""
        gpu = self.meta.get("gpu", {}).get("name") or "model only"
        date = str(self.meta.get("date", ""))[:10]
        return ", ".join(p for p in (gpu, date, self.kind) if p)

    def max_abs_error_pct(self, rows=None) -> Optional[float]:
        errors = [abs(r["error_pct"]) for r in (rows or self.rows) if _is_number(r.get("error_pct"))]
        return max(errors) if errors else None

    # --- JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"schema": SCHEMA_VERSION, "lab": self.lab, "params": self.params, "rows": self.rows,
                "meta": self.meta, "messages": self.messages, "complete": self.complete}

    def unsteady_rows(self) -> list:
        """Measured points whose repeats stayed further apart than the timing rule allows, after re-measuring."""
        return [r for r in self.rows if r.get("unsteady")]

    def steadiness(self) -> str:
        """One sentence on the spread of the measured points ('' when nothing was timed)."""
        timed = [r for r in self.rows if r.get("spread_pct") is not None]
        if not timed:
            return ""
        unsteady = self.unsteady_rows()
        widest = max(r["spread_pct"] for r in timed)
        text = (f"{len(timed)} timed points, each the median of at least {min(r['repeats'] for r in timed)} repeats; "
                f"widest spread (p10 to p90) {widest:.1f} % of the median.")
        if unsteady:
            text += (f" {len(unsteady)} stayed unsteady after re-measuring (spread over the rule's limit): treat "
                     f"their error with care.")
        return text

    def to_json(self) -> str:
        return json.dumps(_finite(self.to_dict()), indent=1) + "\n"

    @classmethod
    def from_dict(cls, data) -> "Result":
        _require(isinstance(data, dict), "a result file holds one JSON object")
        _require(data.get("schema") == SCHEMA_VERSION, f"unknown schema {data.get('schema')!r}; expected {SCHEMA_VERSION}")
        _require(isinstance(data.get("lab"), str) and data["lab"], "'lab' must name a lab")
        _require(isinstance(data.get("params"), dict), "'params' must be an object")
        rows = data.get("rows")
        _require(isinstance(rows, list) and all(isinstance(r, dict) for r in rows), "'rows' must be a list of objects")
        for row in rows:
            for key, value in row.items():
                _require(isinstance(key, str) and (value is None or isinstance(value, (str, int, float, bool))),
                         f"row field {key!r} must be a number, text, true/false or null")
        meta = data.get("meta", {})
        _require(isinstance(meta, dict), "'meta' must be an object")
        _require(meta.get("kind", "model") in KINDS, f"meta.kind must be one of {', '.join(KINDS)}")
        messages = data.get("messages", [])
        _require(isinstance(messages, list) and all(isinstance(m, str) for m in messages), "'messages' must be a list of text")
        return cls(data["lab"], data["params"], rows, meta, messages, bool(data.get("complete", True)))

    @classmethod
    def from_json(cls, text) -> "Result":
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as exc:
            raise ParamError(f"Not a Roofline result file: the JSON does not parse ({exc}).") from None
        return cls.from_dict(data)

    # --- CSV -------------------------------------------------------------------------------
    def to_csv(self) -> str:
        """Rows as CSV; the rest (lab, params, meta, messages) rides in one leading comment line."""
        buf = io.StringIO()
        header = {k: v for k, v in self.to_dict().items() if k != "rows"}
        buf.write("# roofline " + json.dumps(_finite(header)) + "\n")
        writer = csv.DictWriter(buf, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(_finite(self.rows))
        return buf.getvalue()

    @classmethod
    def from_csv(cls, text: str) -> "Result":
        first, _, body = text.partition("\n")
        _require(first.startswith("# roofline "), "a Roofline CSV starts with its '# roofline {...}' line")
        try:
            header = json.loads(first[len("# roofline "):])
        except ValueError as exc:
            raise ParamError(f"Not a Roofline result file: its header does not parse ({exc}).") from None
        rows = [{k: _parse_cell(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(body))]
        return cls.from_dict({**header, "rows": rows})


# ------------------------------------------------------------------------------------------------
# Building results
# ------------------------------------------------------------------------------------------------
def error_pct(measured, predicted) -> Optional[float]:
    """100 * (measured - predicted) / predicted; None when either side is missing."""
    if not (_is_number(measured) and _is_number(predicted)) or predicted == 0:
        return None
    return 100.0 * (measured - predicted) / predicted


def merge_rows(measured: list, predicted: list, key: tuple, metric: str) -> list:
    """Join measured and predicted rows on the `key` columns and add the error on `metric`.

    Predicted rows with no measurement stay (the model is drawn everywhere); so do measured rows
    the model does not cover.
    """
    by_key = {tuple(r.get(k) for k in key): dict(r) for r in predicted}
    merged = []
    for row in measured:
        k = tuple(row.get(c) for c in key)
        out = {**by_key.pop(k, {}), **row}
        out["error_pct"] = error_pct(out.get(f"measured_{metric}"), out.get(f"predicted_{metric}"))
        merged.append(out)
    merged.extend(by_key.values())
    return merged


def git_commit() -> str:
    """The checkout's commit; ROOFLINE_GIT_COMMIT names it where the tree travels without .git (a GPU machine)."""
    if os.environ.get("ROOFLINE_GIT_COMMIT"):
        return os.environ["ROOFLINE_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def run_metadata(kind: str, info: Optional[GpuInfo], target=None) -> dict:
    gpu = {}
    if info is not None and info.available:
        gpu = {k: v for k, v in info.__dict__.items() if k not in ("available", "reason")}
        gpu["key"] = info.key
    elif target is not None:
        gpu = {"name": target.name, "key": target.key, "sm_count": target.sm_count, "l2_bytes": target.l2_bytes,
               "memory_bytes": target.memory_bytes}
    meta = {"kind": kind, "gpu": gpu, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "versions": software_versions(), "git_commit": git_commit()}
    if target is not None:
        meta["ceilings"] = target.ceilings.to_dict()
    return meta


# ------------------------------------------------------------------------------------------------
# Files from outside: a learner's upload, validated by a schema before anything reads it
# ------------------------------------------------------------------------------------------------
MAX_UPLOAD_BYTES = 5_000_000  # also .streamlit/config.toml's server.maxUploadSize (in MB), which the server enforces
MAX_UPLOAD_ROWS = 2_000  # per file; a recording has at most a few hundred
MAX_UPLOAD_CELLS = 50_000  # values in all rows of a file (a recording: under 10,000); bounds the validation's time
MAX_TEXT_CHARS = 4_000  # one text field (a PTX excerpt is the longest Roofline writes)
MAX_NUMBER = 2.0 ** 63  # larger numbers are no measurement; they overflow float formatting on the pages
MAX_DEPTH = 6  # nesting of objects and lists (a recording nests 5 deep)
# Text Roofline never writes: HTML, control, invisible and bidi characters, backslashes, $math$, entities,
# the shapes of Markdown links and images, autolinked web and e-mail addresses. A page may put an uploaded string into
# Markdown (a run's label in a caption), so such text is refused with a message instead of shown.
_MARKUP_CHARS = r"<>\\&\x00-\x08\x0b-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff"  # + invisible, bidi
_MARKUP_SHAPES = r"|\]\s*[(\[:]|!\[|://|www\.|@[A-Za-z0-9-]+\.|javascript:"
_MARKUP = f"[{_MARKUP_CHARS}$]" + _MARKUP_SHAPES
_TEXT = {"type": "string", "maxLength": MAX_TEXT_CHARS, "not": {"type": "string", "pattern": _MARKUP}}
# compiler output, which pages show only in a code block (st.code): PTX labels start with '$' ($L__BB0_14)
_CODE = {"type": "string", "maxLength": MAX_TEXT_CHARS,
         "not": {"type": "string", "pattern": f"[{_MARKUP_CHARS}]" + _MARKUP_SHAPES}}
_CODE_COLUMNS = ("ptx_excerpt",)
_NAME = {"type": "string", "pattern": r"^[A-Za-z0-9_. -]{1,64}$"}
_SCALAR = {"anyOf": [_TEXT, {"type": ["number", "boolean", "null"]}]}
_UNIT_COLUMN = r"_(pct|ms|us|s|tbps|gbps|tflops|flops|bytes|gb|mib)$"  # a column whose name carries a unit


def _any(depth: int) -> dict:
    """Any JSON of at most `depth` levels, its texts and names held to the rules above."""
    if depth <= 0:
        return _SCALAR
    inner = _any(depth - 1)
    return {"anyOf": [_SCALAR, {"type": "array", "maxItems": 256, "items": inner},
                      {"type": "object", "maxProperties": 64, "propertyNames": _NAME, "additionalProperties": inner}]}


UPLOAD_SCHEMA = {
    "type": "object", "required": ["schema", "lab", "params", "rows"], "additionalProperties": False,
    "properties": {
        "schema": {"const": SCHEMA_VERSION},
        "lab": {"type": "string", "pattern": r"^[a-z0-9_-]{1,64}$"},
        "params": {"type": "object", "maxProperties": 64, "propertyNames": _NAME,
                   "additionalProperties": {"anyOf": [_SCALAR, {"type": "array", "maxItems": 256, "items": _SCALAR}]}},
        "rows": {"type": "array", "maxItems": MAX_UPLOAD_ROWS, "items": {
            "type": "object", "maxProperties": 96, "propertyNames": _NAME,
            "properties": {name: {"anyOf": [_CODE, {"type": ["number", "boolean", "null"]}]} for name in _CODE_COLUMNS},
            "patternProperties": {_UNIT_COLUMN: {"type": ["number", "null"]}}, "additionalProperties": _SCALAR}},
        "meta": {"type": "object", "maxProperties": 64, "propertyNames": _NAME, "properties": {
            "kind": {"enum": list(KINDS)},
            # what pages read of a run's metadata has the type they expect (a label joins the GPU's name)
            "gpu": {"type": "object", "maxProperties": 64, "propertyNames": _NAME, "additionalProperties": _SCALAR,
                    "properties": {"name": _TEXT, "key": _TEXT}},
            "versions": {"type": "object", "maxProperties": 32, "propertyNames": _NAME,
                         "additionalProperties": _SCALAR},
            "date": _TEXT, "git_commit": {"anyOf": [_TEXT, {"type": "null"}]},
            "normalised_by": {"type": ["number", "null"]}, "repredicted": {"type": "boolean"},
            "ceilings": {"type": "object", "maxProperties": 32, "propertyNames": _NAME, "additionalProperties": _any(2),
                         "properties": {"copy_tbps": {"type": ["number", "null"]},
                                        "fma_tflops": {"type": ["number", "null"]},
                                        "matmul_tflops": {"type": "object", "maxProperties": 16, "propertyNames": _NAME,
                                                          "additionalProperties": {"type": ["number", "null"]}}}},
        }, "additionalProperties": _any(MAX_DEPTH - 2)},
        "messages": {"type": "array", "maxItems": 100, "items": _TEXT},
        "complete": {"type": "boolean"},
    },
}
_WHY = {"type": "has the wrong type", "const": "is not a version this app reads",
        "enum": "is not one of the allowed values", "required": "lacks a field every result file has",
        "additionalProperties": "has a field result files do not have",
        "maxItems": "has too many items", "maxProperties": "has too many fields", "maxLength": "is too long",
        "pattern": "is not a name this app writes", "propertyNames": "has a field name this app never writes",
        "not": "holds markup (a link, an image, HTML, a web address or control characters) this app never writes",
        "anyOf": "holds a value this app never writes there (markup, too deep, or of the wrong type)"}


def _deepest(error):
    """The most specific of a schema error's causes (anyOf reports its branches' errors as its context)."""
    while error.context:
        # the deepest branch, and of equals one whose type matched (its reason says more than "wrong type")
        error = max(error.context, key=lambda e: (len(e.absolute_path), e.validator != "type"))
    return error


def parse_untrusted(text: str, csv_format: bool) -> "Result":
    """A Result from a file of unknown origin: parsed without NaN, Infinity or overflowing numbers, its depth
    bounded, then validated against UPLOAD_SCHEMA. Every problem is one ParamError naming where it is."""
    import jsonschema

    try:
        if csv_format:
            first, _, body = text.partition("\n")
            _require(first.startswith("# roofline "), "a Roofline CSV starts with its '# roofline {...}' line")
            data = _strict_json(first[len("# roofline "):])
            _require(isinstance(data, dict), "its header line holds one JSON object")
            reader = csv.DictReader(io.StringIO(body), restkey="(extra cells)")
            rows = []
            for row in reader:
                _require(len(rows) < MAX_UPLOAD_ROWS, f"it has more than {MAX_UPLOAD_ROWS:,} rows")
                # an empty cell is a column this row does not have (as a JSON row that lacks the key)
                rows.append({k: cell for k, cell in ((k, _strict_cell(v)) for k, v in row.items()) if cell is not None})
            data = {**data, "rows": rows}
        else:
            data = _strict_json(text)
    except RecursionError:
        raise ParamError(f"Not a Roofline result file: it nests deeper than {MAX_DEPTH} levels.") from None
    except (ValueError, TypeError, csv.Error) as exc:
        if isinstance(exc, ParamError):
            raise
        raise ParamError(f"Not a Roofline result file: it does not parse ({type(exc).__name__}: "
                         f"{str(exc)[:120]}).") from None
    _require(isinstance(data, dict), "a result file holds one JSON object")
    _require(_depth(data) <= MAX_DEPTH + 2, f"it nests deeper than {MAX_DEPTH} levels")
    rows = data.get("rows")
    if isinstance(rows, list):
        _require(len(rows) <= MAX_UPLOAD_ROWS, f"it has more than {MAX_UPLOAD_ROWS:,} rows")
        cells = sum(len(r) if isinstance(r, dict) else 1 for r in rows)
        _require(cells <= MAX_UPLOAD_CELLS, f"its rows hold {cells:,} values; at most {MAX_UPLOAD_CELLS:,}")
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(UPLOAD_SCHEMA).iter_errors(data))
    if error is not None:
        deepest = _deepest(error)
        where = ".".join(str(p)[:40] for p in deepest.absolute_path) or "the file"
        raise ParamError(f"Not a Roofline result file: {where} {_WHY.get(deepest.validator, 'is not valid')}.")
    data.setdefault("meta", {}).setdefault("gpu", {})  # pages read meta["gpu"] of every run they show
    return Result.from_dict(data)


_JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "NoneType": "null"}


@functools.lru_cache(maxsize=64)
def row_contract(lab: str, key: tuple) -> tuple:
    """(required columns, ((column, JSON types), ...)) of the lab's rows as its committed recordings hold them:
    the key columns every row has, and for every column the types of its values. Pages and labs index rows by
    their key columns (r["step"]) and compare the numbers (r["last_wave_util"] < 0.75): an upload must agree."""
    required, types = None, {}
    for result in list_recorded(lab):
        for row in result.rows:
            present = {k for k in key if row.get(k) is not None}
            required = present if required is None else required & present
            for column, value in row.items():  # null only where a recording has a null there
                types.setdefault(column, set()).add(_JSON_TYPES.get(type(value).__name__, "string"))
    for column, seen in types.items():
        if "number" in seen:
            seen.discard("integer")  # an int where the recordings also hold floats is a number like them
    required = tuple(k for k in key if k in (required or ()))
    return required, tuple((c, tuple(sorted(t))) for c, t in sorted(types.items()))


def check_rows(result: "Result", contract: tuple) -> None:
    """Every row of an uploaded result has the required columns and the recordings' types (one ParamError if not)."""
    import jsonschema

    required, types = contract
    schema = {"type": "array", "items": {"type": "object", "required": list(required),
                                         "properties": {c: {"type": list(t)} for c, t in types}}}
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(result.rows))
    if error is not None:
        where = "rows." + ".".join(str(p)[:40] for p in error.absolute_path) if error.absolute_path else "rows"
        what = ("lacks a column this lab's rows all have: " + ", ".join(required)
                if error.validator == "required" else _WHY.get(error.validator, "is not valid"))
        raise ParamError(f"Not a result of this lab as Roofline writes them: {where} {what}.")


def _finite_number(text: str):
    value = float(text)
    if not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise ValueError(f"the number {text[:20]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > 20:  # 2**63 has 19 digits
        raise ValueError(f"the number {text[:20]}... is out of range")
    value = int(text)
    if abs(value) > MAX_NUMBER:
        raise ValueError(f"the number {text} is out of range")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number Roofline writes (it writes null)")


def _strict_json(text: str):
    return json.loads(text, parse_float=_finite_number, parse_int=_bounded_int, parse_constant=_no_constant)


def _strict_cell(text):
    """A CSV cell: empty is null; numbers must be finite (the writer writes NaN and Infinity as empty cells)."""
    if not isinstance(text, str):
        return text  # a list of extra cells: the schema refuses it
    value = _parse_cell(text)
    if isinstance(value, float) and not math.isfinite(value) or isinstance(value, int) and abs(value) > MAX_NUMBER:
        raise ValueError(f"the cell {text[:20]!r} is not a finite number")
    return value


def _depth(obj) -> int:
    """Nesting depth, without recursion (a hostile file may nest thousands of levels)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH + 2:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


# ------------------------------------------------------------------------------------------------
# Recordings
# ------------------------------------------------------------------------------------------------
def recording_path(gpu_key: str, lab: str) -> Path:
    return RECORDED_DIR / gpu_key / f"{lab}.json"


def save_recording(result: Result) -> Path:
    key = result.meta.get("gpu", {}).get("key")
    if result.kind != "live" or not key:
        raise ParamError("Only live runs on a GPU can be recorded.")
    path = recording_path(key, result.lab)
    path.parent.mkdir(parents=True, exist_ok=True)
    recorded = Result.from_dict(_copy.deepcopy(result.to_dict()))
    recorded.meta["kind"] = "recorded"
    path.write_text(recorded.to_json())
    return path


def list_recorded(lab: str) -> list[Result]:
    """Every committed recording of one lab, newest first (unreadable files are skipped)."""
    found = []
    for path in sorted(RECORDED_DIR.glob(f"*/{lab}.json")):
        try:
            found.append(Result.from_json(path.read_text()))
        except (OSError, ParamError):
            continue
    return sorted(found, key=lambda r: str(r.meta.get("date", "")), reverse=True)


# ------------------------------------------------------------------------------------------------
def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ParamError(f"Not a Roofline result file: {message}.")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _finite(obj):
    """JSON has no NaN or Infinity: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _parse_cell(text: str):
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def normalised(result: Result, metric: str) -> Result:
    """A copy whose measured_<metric> and predicted_<metric> are divided by the run's best measured value
    (or best predicted value, for a model), so runs of different GPUs can be compared by shape."""
    m, p = f"measured_{metric}", f"predicted_{metric}"
    values = [r[m] for r in result.rows if _is_number(r.get(m))] or [r[p] for r in result.rows if _is_number(r.get(p))]
    best = max((abs(v) for v in values), default=0)
    copy = Result.from_dict(_copy.deepcopy(result.to_dict()))
    if best > 0:
        for row in copy.rows:
            for col in (m, p):
                if _is_number(row.get(col)):
                    row[col] = row[col] / best
    copy.meta["normalised_by"] = best
    return copy


def recorded_rows(lab: str, gpu_key: str, gpus: int = 0) -> list:
    """Measured rows of the newest committed recording of `lab` on this GPU kind (and GPU count, if given)."""
    for result in list_recorded(lab):
        if result.meta.get("gpu", {}).get("key") == gpu_key:
            rows = [r for r in result.rows if r.get("measured_ms") is not None]
            return [r for r in rows if not gpus or r.get("gpus") == gpus]
    return []
