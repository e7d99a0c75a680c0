"""Lab parameters: dataclass fields that carry their meaning, unit and bounds, and one error type.

A lab declares its knobs like this:

    @dataclass(frozen=True)
    class Params:
        size_mib: int = param(512, "input buffer size", unit="MiB", min=1, max=16384)
        dtypes: tuple = param(("fp32", "bf16"), "storage dtypes", choices=("fp32", "bf16"))

`validate(params)` checks every field against its bounds and choices; `from_strings` parses CLI
and URL values; pages build their widgets from the same metadata. Every problem is a `ParamError`
whose message says what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any, Optional


MAX_TEXT = 1000  # characters of one parameter's text (a list of sizes included)


class ParamError(ValueError):
    """Bad input, in words a learner can act on ("N = 70000 needs 29 GB; this GPU has 12 GB free")."""


def param(default: Any, help: str, unit: str = "", min: Optional[float] = None, max: Optional[float] = None,
          choices: Optional[tuple] = None, step: Optional[float] = None, log: bool = False):
    """A dataclass field with its meaning, unit and allowed values (used by validation and widgets)."""
    meta = {"help": help, "unit": unit, "min": min, "max": max, "choices": choices, "step": step, "log": log}
    return field(default=default, metadata=meta)


def spec(params_cls, name: str) -> dict:
    for f in dataclasses.fields(params_cls):
        if f.name == name:
            return {"name": f.name, "default": f.default, **f.metadata}
    raise ParamError(f"unknown parameter {name!r}; allowed: {', '.join(names(params_cls))}")


def names(params_cls) -> list[str]:
    return [f.name for f in dataclasses.fields(params_cls)]


def describe(params_cls) -> str:
    """One line per parameter: name, default, unit, bounds or choices, meaning."""
    lines = []
    for f in dataclasses.fields(params_cls):
        m = f.metadata
        allowed = _allowed_text(m)
        default = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
        lines.append(f"  {f.name}={default}  {m.get('help', '')}{' [' + m['unit'] + ']' if m.get('unit') else ''}"
                     f"{'  (' + allowed + ')' if allowed else ''}")
    return "\n".join(lines)


def _allowed_text(m: dict) -> str:
    if m.get("choices"):
        return "choose from " + ", ".join(map(str, m["choices"]))
    if m.get("min") is not None or m.get("max") is not None:
        return f"{_fmt(m.get('min'))} to {_fmt(m.get('max'))}"
    return ""


def _fmt(x) -> str:
    if x is None:
        return "any"
    return f"{x:g}" if isinstance(x, float) else str(x)


def _show(value) -> str:
    """A value for a message, whatever it is: 400 nines, inf and 10 kB of text included."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 15:
        return f"a {len(str(abs(value))) if value.bit_length() < 14_000 else 'many'}-digit number"
    if isinstance(value, float):
        return f"{value:g}"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_value(name: str, value, m: dict, unit: str) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        lo, hi = m.get("min"), m.get("max")
        if isinstance(value, float) and not math.isfinite(value):
            raise ParamError(f"{name} = {_show(value)} is out of range: not a finite number.")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ParamError(f"{name} = {_show(value)}{unit} is out of range: allowed {_fmt(lo)} to {_fmt(hi)}{unit}.")
    choices = m.get("choices")
    if choices and value not in choices:
        raise ParamError(f"{name} = {_show(value)} is not allowed; choose from {', '.join(map(str, choices))}.")


def validate(params) -> Any:
    """Check every field against its metadata; return the params unchanged if all is well."""
    for f in dataclasses.fields(params):
        value, m = getattr(params, f.name), f.metadata
        unit = f" {m['unit']}" if m.get("unit") else ""
        if isinstance(f.default, tuple):
            if not isinstance(value, tuple) or not value:
                raise ParamError(f"{f.name} needs at least one value.")
            for item in value:
                _check_value(f.name, item, m, unit)
        else:
            if type(value) is not type(f.default) and not (isinstance(f.default, float) and isinstance(value, int)):
                raise ParamError(f"{f.name} must be a {type(f.default).__name__}, not {_show(value)}.")
            _check_value(f.name, value, m, unit)
    return params


def _convert(text: str, like, name: str):
    text = text.strip()
    if len(text) > MAX_TEXT:  # no parameter needs this much; int() of 5000 digits alone takes a while
        raise ParamError(f"{name} is {len(text):,} characters long; no parameter needs more than {MAX_TEXT}.")
    try:
        if isinstance(like, bool):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(like, int):
            return int(float(text)) if float(text).is_integer() else int(text)
        if isinstance(like, float):
            return float(_fraction(text))
    except (ValueError, ZeroDivisionError, OverflowError):  # "abc", "1/0", "1e999" for an int
        raise ParamError(f"{name} = {_show(text)} is not a {type(like).__name__}.") from None
    return text


def _fraction(text: str) -> float:
    """Accept "1/8" as well as "0.125"."""
    if "/" in text:
        num, den = text.split("/", 1)
        return float(num) / float(den)
    return float(text)


def from_strings(params_cls, values: dict) -> Any:
    """Build and validate Params from text values ("n=4096", "dtypes=fp32,bf16")."""
    fields = {f.name: f for f in dataclasses.fields(params_cls)}
    kwargs = {}
    for name, text in values.items():
        if name not in fields:
            raise ParamError(f"unknown parameter {_show(name)}; allowed: {', '.join(fields)}.")
        default = fields[name].default
        if isinstance(default, tuple):
            like = default[0] if default else ""
            kwargs[name] = tuple(_convert(part, like, name) for part in str(text).split(",") if part.strip())
        else:
            kwargs[name] = _convert(str(text), default, name)
    return validate(params_cls(**kwargs))


def to_dict(params) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(params).items()}


def from_dict(params_cls, data: dict) -> Any:
    """Params from a result file's 'params' (lists become tuples); unknown keys are an error."""
    fields = {f.name: f for f in dataclasses.fields(params_cls)}
    kwargs = {}
    for name, value in data.items():
        if name not in fields:
            raise ParamError(f"unknown parameter {name!r}; allowed: {', '.join(fields)}.")
        kwargs[name] = tuple(value) if isinstance(value, list) else value
    return validate(params_cls(**kwargs))
