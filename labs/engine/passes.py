"""A lab's sweep measured in passes, and the passes merged into one row a point.

Five timings of a point taken back to back (in one tenth of a second) agree with each other far better than
with the same point timed a minute later: on an H100 the spread inside the window was 0.3-1.5 % while the same
run repeated differed by 2-6 % (docs/steadiness/). The slow drift of clocks, temperature and allocation is only
seen by repeats that lie apart. So the runner (labs/engine/local.py) runs a lab's whole sweep PASSES times, each
timer taking one timing per call (labs/engine/timing.py, `in_pass`), and this module puts the passes together:

- rows are matched across passes by the lab's `key` (the n-th row with a key in one pass is the n-th row with
  that key in the others), in the order they first appeared;
- each field that varies between passes is the median over the passes that measured it when it is a number,
  and the first pass's value when it is not (a label, a note); fields that do not vary stay as they are;
- the row's timings are put together slot by slot (the k-th timing of the row, counted from its last, which is
  the one the row reports), so each slot holds one timing per pass: `repeats` is how many passes measured the
  point, `spread_pct` the widest p10-p90 spread of its slots, `unsteady` when that is over STEADY_PCT.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter

from labs.engine import timing


def _point_key(row: dict, key: tuple) -> str:
    return json.dumps([row.get(k) for k in key], default=str)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(values: list) -> bool:
    first = values[0]
    return all(v == first or (v != v and first != first) for v in values[1:])  # NaN == NaN here


def merge_values(values: list):
    """One field over the passes: as it is when every pass agrees, else the median of the numbers (an integer
    stays an integer), else the first pass's value."""
    if _same(values):
        return values[0]
    present = [v for v in values if v is not None]
    if not present or not all(_is_number(v) for v in present):
        return values[0]
    numbers = [v for v in present if not math.isnan(v)]  # a pass that gave NaN does not vote
    if not numbers:
        return values[0]
    if all(isinstance(v, int) for v in numbers):
        return statistics.median_low(numbers)
    return float(statistics.median(numbers))


def merge_timings(per_pass: list) -> list:
    """The timings of one point over the passes, slot by slot, aligned on each pass's last timing."""
    width = max((len(timings) for timings in per_pass), default=0)
    slots: list = [[] for _ in range(width)]
    for timings in per_pass:
        offset = width - len(timings)
        for j, t in enumerate(timings):
            slots[offset + j].extend(t.samples_ms)
    return [timing.Timing(samples) for samples in slots if samples]


def merge_point(measured: list) -> dict:
    """One point's (row, timings) of every pass that measured it, as one row with its spread."""
    rows = [row for row, _ in measured]
    fields = list(dict.fromkeys(name for row in rows for name in row))
    merged = {name: merge_values([row[name] for row in rows if name in row]) for name in fields}
    return timing.row_spread(merged, merge_timings([timings for _, timings in measured]))


class Sweep:
    """The passes of one run so far: add each pass's (row, timings) pairs, read the merged rows."""

    def __init__(self, key: tuple):
        self.key = tuple(key)
        self.points: dict = {}  # (key, occurrence) -> [(row, timings) of each pass that measured it]
        self.passes = 0

    def add(self, measured: list) -> None:
        seen: Counter = Counter()
        for row, timings in measured:
            point = _point_key(row, self.key)
            self.points.setdefault((point, seen[point]), []).append((row, timings))
            seen[point] += 1
        self.passes += 1

    def rows(self) -> list:
        return [merge_point(measured) for measured in self.points.values()]

    def timed(self) -> bool:
        """Whether anything was timed (a sweep of memory readings alone gains nothing from more passes)."""
        return any(timings for measured in self.points.values() for _, timings in measured)

    def unsteady(self) -> int:
        return sum(1 for row in self.rows() if row.get("unsteady"))
