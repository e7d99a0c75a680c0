"""Classroom features: predict-then-run, progress, uploads to compare, normalised overlays, instructor mode."""

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from labs import all_labs
from labs.engine.params import ParamError
from labs.engine.results import Result, list_recorded, normalised
from ui.classroom import parse_upload

ROOT = Path(__file__).resolve().parent.parent


def open_page(page: str, **query) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_every_lab_asks_a_headline_question():
    for lab in all_labs():
        assert lab.headline is not None, f"{lab.name} has no headline question for predict-then-run"
        assert lab.headline.unit and lab.headline.question.endswith("?")


def test_predict_first_hides_results_until_a_guess_is_locked_in():
    at = open_page("pages/roofline.py", predict="1")
    assert not at.get("plotly_chart"), "charts are shown before the learner predicted"
    assert any("Write down your prediction" in i.value for i in at.info)
    at.number_input(key=next(n.key for n in at.number_input if n.key.startswith("input:guess:roofline"))).set_value(0.4).run()
    at.button(key=next(b.key for b in at.button if b.key.startswith("lock:"))).click().run()
    assert not at.exception
    assert at.get("plotly_chart"), "charts stay hidden after the guess"
    shown = " ".join(m.value for m in at.markdown)
    assert "you: **0.4 TFLOP/s**" in shown and "model:" in shown
    if list_recorded("roofline"):
        assert "measured (" in shown  # scored against the recorded run of a real GPU
        assert any("from the measurement" in c.value for c in at.caption)
    progress = at.session_state["progress"]
    assert progress["visited"] == ["roofline"] and progress["predictions"][0]["guess"] == 0.4


LAB_PAGES = [lab.name for lab in all_labs() if (ROOT / "pages" / f"{lab.name}.py").exists()]


@pytest.mark.parametrize("name", LAB_PAGES)
def test_every_lab_page_asks_first_and_reveals_after_skip(name):
    at = open_page(f"pages/{name}.py", predict="1")
    before = len(at.get("plotly_chart"))  # tools above the results (e.g. attention's stepper) may be charts
    assert any("Predict, then run" in m.value for m in at.markdown)
    assert not any(b.key.startswith("csv:") for b in at.get("download_button")), f"{name}: results shown early"
    at.button(key=next(b.key for b in at.button if b.key.startswith(f"skip:guess:{name}:"))).click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("plotly_chart")) > before, f"{name}: result charts stay hidden after skipping"


def test_without_predict_first_results_show_and_the_question_waits():
    at = open_page("pages/roofline.py")
    assert at.get("plotly_chart")
    assert any("Predict, then run" in m.value for m in at.markdown)


def test_instructor_mode_from_the_url_shows_the_warm_up():
    at = open_page("pages/home.py", mode="instructor")
    assert at.sidebar.toggle(key="instructor").value is True
    assert "Instructor warm-up" in [h.value for h in at.header]


def test_normalised_overlays_divide_by_the_runs_best():
    rec = list_recorded("roofline")[0]
    norm = normalised(rec, "tflops")
    values = [r["measured_tflops"] for r in norm.rows if r.get("measured_tflops") is not None]
    assert max(values) == pytest.approx(1.0) and norm.meta["normalised_by"] > 1
    assert rec.rows[0]["measured_tflops"] != norm.rows[0]["measured_tflops"]  # the original is untouched


def test_normalised_scale_keeps_the_table_absolute():
    at = open_page("pages/roofline.py")
    at.sidebar.radio(key="scale").set_value("normalised").run()
    assert not at.exception and any("Normalised" in c.value for c in at.caption)


def test_uploads_are_validated_with_clear_messages():
    good = list_recorded("roofline")[0]
    assert parse_upload("mine.json", good.to_json().encode(), "roofline").rows == good.rows
    assert parse_upload("mine.csv", good.to_csv().encode(), "roofline").lab == "roofline"
    cases = [(b"\xff\xfe\x00", "not a text file"), (b"{not json", "does not parse"), (b"[1, 2]", "one JSON object"),
             (json.dumps({"schema": 1, "lab": "matmul", "params": {}, "rows": []}).encode(), "not of 'roofline'"),
             (b"x" * 6_000_000, "at most 5 MB")]
    for data, says in cases:
        with pytest.raises(ParamError, match=says):
            parse_upload("bad.json", data, "roofline")
    with pytest.raises(ParamError, match="starts with its"):
        parse_upload("bad.csv", b"a,b\n1,2\n", "roofline")


def test_results_round_trip_as_the_download_buttons_write_them():
    rec = list_recorded("roofline")[0]
    assert Result.from_json(rec.to_json()).rows == rec.rows


def test_a_headline_asked_in_gb_is_answered_in_gb():
    """The training-memory question asks for GB; its metric is in bytes: the answers come back divided by the
    headline's scale, so a learner who types 11 is compared with about 11, not with 11e9."""
    lab = next(lab for lab in all_labs() if lab.name == "trainmem")
    assert lab.headline.unit == "GB" and lab.headline.scale == 1e9
    row = {**lab.headline.row, "measured_peak_bytes": 11.5e9, "predicted_peak_bytes": 11e9}
    assert lab.headline.answer([row]) == (11.5, 11.0)
    assert lab.headline.answer([{**lab.headline.row, "predicted_peak_bytes": 11e9}]) == (None, 11.0)
    for other in all_labs():  # a question that says "How many <unit>" is scored in that unit
        q = other.headline.question
        if q.startswith("How many ") and " will " in q:
            assert q[len("How many "):q.index(" will ")] == other.headline.unit, other.name
