"""The one timing rule (labs/engine/timing.py, labs/engine/passes.py): repeats spread over passes, spread,
re-measuring, flags that reach rows and output."""

import dataclasses
import statistics
from dataclasses import dataclass

import pytest

from labs.engine import local, timing
from labs.engine.lab import Lab
from labs.engine.params import param
from labs.engine.results import Result


def test_spread_is_p10_to_p90_over_the_median_in_percent():
    assert timing.spread_pct([10.0] * 5) == 0.0
    # sorted 9, 10, 10, 10, 11: p10 = 9.4, p90 = 10.6 (linear interpolation), median 10 -> 12 %
    assert timing.spread_pct([10, 9, 10, 11, 10]) == pytest.approx(12.0)
    assert timing.spread_pct([5.0]) == 0.0


def sequence(values):
    it = iter(values)
    return lambda: next(it)


def test_a_steady_point_is_timed_once_with_five_repeats():
    t = timing.repeated(sequence([1.0, 1.01, 0.99, 1.0, 1.0]))
    assert t.repeats == timing.REPEATS == 5 and t.rounds == 1 and t.steady
    assert t.median_ms == pytest.approx(1.0)


def test_an_unsteady_point_is_measured_again_and_the_steady_round_kept():
    noisy = [1.0, 2.0, 1.0, 2.0, 1.0]
    calm = [1.5, 1.5, 1.51, 1.49, 1.5]
    t = timing.repeated(sequence(noisy + calm))
    assert t.rounds == 2 and t.steady and t.samples_ms == calm  # never averaged with the noisy round


def test_a_point_that_stays_unsteady_is_flagged_not_hidden():
    noisy = [1.0, 2.0, 1.0, 2.0, 1.0]
    t = timing.repeated(sequence(noisy * timing.MAX_ROUNDS))
    assert t.rounds == timing.MAX_ROUNDS and not t.steady and t.spread_pct > timing.STEADY_PCT
    row = timing.row_spread({"n": 1}, [t])
    assert row["unsteady"] is True and row["repeats"] == 5 and row["spread_pct"] > timing.STEADY_PCT


def test_a_row_takes_the_widest_spread_of_what_was_timed_for_it():
    steady, wide = timing.Timing([1.0] * 5), timing.Timing([1.0, 1.0, 1.0, 1.2, 1.3])
    row = timing.row_spread({"n": 1}, [steady, wide])
    assert row["spread_pct"] == pytest.approx(round(wide.spread_pct, 2)) and row["unsteady"] is True
    assert timing.row_spread({"n": 1}, []) == {"n": 1}  # nothing timed (a memory reading): nothing claimed


@dataclass(frozen=True)
class Knobs:
    sizes: tuple = param((1, 2), "sizes")


def _lab(measure):
    return Lab(name="toy", title="Toy", summary="", terms=(), Params=Knobs, predict=lambda p, t: [],
               measure=measure, key=("size",), metric="ms")


def _run(lab, params=Knobs(), limit_s=60):
    return local._measure_rows(lab, params, None, lambda f, m: None, limit_s)


def test_the_runner_puts_each_rows_spread_on_that_row():
    drifting = iter([1.0, 1.5] * 10)  # one timing per pass: size 2 alternates between passes, size 1 holds

    def measure(params, target, progress):
        for size in params.sizes:
            t = timing.repeated(lambda: 1.0 if size == 1 else next(drifting))
            yield {"size": size, "measured_ms": t.median_ms}

    rows, notes, complete = _run(_lab(measure))
    assert complete and [r["unsteady"] for r in rows] == [False, True]
    assert rows[0]["spread_pct"] == 0.0
    # the unsteady point got the extra passes (a pass is the whole sweep: every point gained them), then was
    # flagged, not hidden
    assert [r["repeats"] for r in rows] == [timing.PASSES + timing.MAX_EXTRA_PASSES] * 2
    assert rows[1]["spread_pct"] > timing.STEADY_PCT
    result = Result("toy", {}, rows, {})
    assert "2 timed points" in result.steadiness() and "1 stayed unsteady" in result.steadiness()
    header = [line for line in result.to_csv().splitlines() if not line.startswith("#")][0]
    assert "spread_pct" in header and "unsteady" in header  # the CSV keeps them too


def test_a_timer_of_its_own_hands_its_samples_to_the_rule():
    def measure(params, target, progress):
        samples = [2.0, 2.1, 1.9, 2.0, 2.0][: timing.repeats_now()]  # e.g. host copies timed by the CPU's clock
        timing.record_samples(samples)
        yield {"size": 1, "measured_ms": statistics.median(samples)}

    rows, _, _ = _run(_lab(measure), Knobs(sizes=(1,)))
    assert rows[0]["repeats"] == timing.PASSES and rows[0]["spread_pct"] == 0.0  # one sample a pass, 2.0 each time


class DriftingGpu:
    """A fake GPU whose speed drifts slowly: a kernel's time depends on the wall clock (one tick a point timed),
    so timings taken back to back agree exactly while timings a sweep apart do not."""

    def __init__(self):
        self.tick = 0

    def kernel_ms(self, size: int) -> float:
        return size * (1.0 + 0.01 * (self.tick % 7))  # up to 6 % slower, then back: clocks, temperature

    def measure(self, params, target, progress):
        for size in params.sizes:
            t = timing.repeated(lambda: self.kernel_ms(size))
            self.tick += 1
            yield {"size": size, "measured_ms": t.median_ms}


def test_repeats_spread_over_the_run_see_the_drift_that_back_to_back_repeats_hide():
    in_window = DriftingGpu()
    rows, _, _ = _run(dataclasses.replace(_lab(in_window.measure), timed_in_passes=False))
    assert [r["spread_pct"] for r in rows] == [0.0, 0.0]  # five equal timings in one window: "steady"
    assert in_window.tick == 2  # one pass

    over_passes = DriftingGpu()
    rows, _, complete = _run(_lab(over_passes.measure))
    assert complete and over_passes.tick == 2 * timing.PASSES and all(r["repeats"] == timing.PASSES for r in rows)
    # size 1 was timed at ticks 0, 2, 4, 6, 8: 1.00, 1.02, 1.04, 1.06, 1.01 -> p10-p90 of the median 1.02
    assert rows[0]["spread_pct"] == pytest.approx(round(timing.spread_pct([1.0, 1.02, 1.04, 1.06, 1.01]), 2))
    assert 3.0 < rows[0]["spread_pct"] < 6.0 and rows[0]["measured_ms"] == pytest.approx(1.02)


def test_rows_of_the_passes_merge_by_the_labs_key():
    passes_seen = []

    def measure(params, target, progress):
        index = len(passes_seen)
        passes_seen.append(timing.first_pass())
        if index == 0:
            yield "a note for the learner"  # notes come from the first pass only
        order = [1, 2] if index % 2 == 0 else [2, 1]  # rows in another order: matched by key, not by position
        for size in order:
            t = timing.repeated(lambda: size * (1.0 + 0.01 * index))
            yield {"size": size, "measured_ms": t.median_ms, "bytes": 100 * size,  # the same in every pass
                   "blocks": 10 + index, "config": f"config {index}"}

    rows, notes, complete = _run(_lab(measure))
    assert passes_seen == [True] + [False] * (timing.PASSES - 1)
    assert notes == ["a note for the learner"] and complete
    assert [r["size"] for r in rows] == [1, 2] and [r["bytes"] for r in rows] == [100, 200]
    assert rows[1]["measured_ms"] == pytest.approx(2 * 1.02)  # the median over the passes 1.00 .. 1.04
    assert rows[0]["blocks"] == 12 and isinstance(rows[0]["blocks"], int)  # a number: the median, still an int
    assert rows[0]["config"] == "config 0"  # not a number: the first pass's


def test_a_check_runs_once_a_run_not_once_a_pass():
    checks = []

    def measure(params, target, progress):
        err = timing.once_per_run(("check", "fp32"), lambda: checks.append(1) or 1e-7)
        yield {"size": 1, "measured_ms": timing.repeated(lambda: 1.0).median_ms, "check_rel_error": err}

    rows, _, _ = _run(_lab(measure), Knobs(sizes=(1,)))
    assert len(checks) == 1 and rows[0]["check_rel_error"] == 1e-7 and rows[0]["repeats"] == timing.PASSES
    timing.once_per_run("outside a run", lambda: checks.append(1))
    timing.once_per_run("outside a run", lambda: checks.append(1))
    assert len(checks) == 3  # outside passes nothing is remembered


class FakeClock:
    """local's clock, moved on by the measurement itself: the time limit's tests do not depend on a busy CPU."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_a_time_limited_run_keeps_the_passes_it_completed(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(local, "time", clock)
    passes_run = []

    def measure(params, target, progress):
        passes_run.append(1)
        for size in params.sizes:
            progress(0.5, f"size {size}")
            clock.now += 1.0  # each point takes a second: a pass two
            yield {"size": size, "measured_ms": timing.repeated(lambda: float(size)).median_ms}

    rows, notes, complete = _run(_lab(measure), limit_s=5.5)  # two passes (4 s) fit; a third (6 s) would not
    assert len(passes_run) == 2 and complete and all(r["repeats"] == 2 for r in rows)
    assert "median of 2 passes, not 5" in notes[0]


def test_a_pass_cut_by_the_time_limit_keeps_the_earlier_passes_and_its_own_points(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(local, "time", clock)
    passes_run = []

    def measure(params, target, progress):
        passes_run.append(1)
        for size in params.sizes:
            progress(0.5, f"size {size}")
            clock.now += 1.0 if len(passes_run) < 3 else 5.0  # the third pass is slow (the machine got busy)
            yield {"size": size, "measured_ms": timing.repeated(lambda: float(size)).median_ms}

    rows, notes, complete = _run(_lab(measure), limit_s=7.0)  # third pass starts at 4 s, cut at its second point
    assert len(passes_run) == 3 and not complete and "time limit" in notes[0] and "pass 3" in notes[0]
    assert [r["repeats"] for r in rows] == [3, 2] and [r["measured_ms"] for r in rows] == [1.0, 2.0]


def test_progress_reports_the_pass():
    seen = []

    def measure(params, target, progress):
        progress(0.5, "halfway")
        yield {"size": 1, "measured_ms": timing.repeated(lambda: 1.0).median_ms}

    local._measure_rows(_lab(measure), Knobs(sizes=(1,)), None, lambda f, m: seen.append((f, m)), 60)
    assert seen[0] == (pytest.approx(0.5 / timing.PASSES), "pass 1 of 5: halfway")
    assert seen[-1] == (pytest.approx(4.5 / timing.PASSES), "pass 5 of 5: halfway")


def test_a_sweep_that_times_nothing_runs_once():
    calls = []

    def measure(params, target, progress):
        calls.append(1)
        yield {"size": 1, "peak_bytes": 1024}  # a memory reading: nothing to repeat

    rows, _, complete = _run(_lab(measure), Knobs(sizes=(1,)))
    assert len(calls) == 1 and complete and rows == [{"size": 1, "peak_bytes": 1024}]


def test_charts_draw_each_measured_points_spread_as_error_bars():
    import plotly.graph_objects as go

    from ui import charts

    rows = [{"n": 1, "measured_ms": 2.0, "predicted_ms": 2.1, "spread_pct": 10.0, "unsteady": False},
            {"n": 2, "measured_ms": 4.0, "predicted_ms": 3.9, "spread_pct": 30.0, "unsteady": True}]
    fig = go.Figure()
    charts.add_series(fig, rows, "n", "measured_ms", "measured", {})
    bars = fig.data[0].error_y
    assert list(bars.array) == [pytest.approx(0.1), pytest.approx(0.6)] and bars.visible
    assert "unsteady" in fig.data[0].hovertemplate and "spread" in fig.data[0].hovertemplate
    charts.add_series(fig, rows, "n", "predicted_ms", "model", {})  # the model has no spread: no bars
    assert fig.data[1].error_y.array is None
