"""The one timing rule (labs/engine/timing.py): repeats, spread, re-measuring, flags that reach rows and output."""

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


def test_the_runner_puts_each_rows_spread_on_that_row():
    def measure(params, target, progress):
        for size in params.sizes:
            samples = [1.0] * 5 if size == 1 else [1.0, 1.0, 2.0, 2.0, 1.0] * timing.MAX_ROUNDS
            t = timing.repeated(sequence(samples))
            yield {"size": size, "measured_ms": t.median_ms}

    rows, notes, complete = local._measure_rows(_lab(measure), Knobs(), None, lambda f, m: None, 60)
    assert complete and [r["unsteady"] for r in rows] == [False, True]
    assert rows[0]["repeats"] == 5 and rows[0]["spread_pct"] == 0.0
    result = Result("toy", {}, rows, {})
    assert "2 timed points" in result.steadiness() and "1 stayed unsteady" in result.steadiness()
    header = [line for line in result.to_csv().splitlines() if not line.startswith("#")][0]
    assert "spread_pct" in header and "unsteady" in header  # the CSV keeps them too


def test_a_timer_of_its_own_hands_its_samples_to_the_rule():
    def measure(params, target, progress):
        timing.record_samples([2.0, 2.1, 1.9, 2.0, 2.0])  # e.g. host copies timed by the CPU's clock
        yield {"size": 1, "measured_ms": 2.0}

    rows, _, _ = local._measure_rows(_lab(measure), Knobs(sizes=(1,)), None, lambda f, m: None, 60)
    assert rows[0]["repeats"] == 5 and 0 < rows[0]["spread_pct"] < timing.STEADY_PCT


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
