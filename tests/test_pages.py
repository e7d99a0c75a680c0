"""Every page renders under AppTest without a GPU: no exception, its key elements present, fast."""

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from labs import all_labs, gpu

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["pages/home.py", "pages/gpu.py"] + [f"pages/{lab.name}.py" for lab in all_labs()
                                              if (ROOT / "pages" / f"{lab.name}.py").exists()]
PAGES += [p for p in ("pages/glossary.py", "pages/scorecard.py") if (ROOT / p).exists()]


def open_page(page: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.run()
    at.switch_page(page)
    at.run()
    return at


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_without_exception_in_under_a_second(page):
    at = open_page(page)  # the first render imports and warms caches
    assert not at.exception, [e.value for e in at.exception]
    started = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - started
    assert not at.exception
    assert at.title, f"{page} shows no title"
    assert elapsed < 1.0, f"{page} took {elapsed:.2f} s to render"


def test_home_lists_every_lab_and_the_gpu_status():
    at = open_page("pages/home.py")
    shown = " ".join(c.value for c in at.caption)
    for lab in all_labs():
        assert lab.summary in shown
    assert any("GPU" in i.value for i in at.info)


def test_gpu_page_shows_the_datasheet_and_recorded_ceilings():
    at = open_page("pages/gpu.py")
    headers = [h.value for h in at.header]
    assert "Datasheet table" in headers and "Recorded GPUs" in headers
    assert any(s.value == "NVIDIA H200" for s in at.subheader)


def test_roofline_page_draws_model_and_recorded_runs():
    at = open_page("pages/roofline.py")
    charts = at.get("plotly_chart")
    assert len(charts) >= 2  # the roofline and the model error of the recorded run
    figure = charts[0].proto.spec
    assert "model, fp32" in figure and "roof:" in figure and "recorded, fp32" in figure
    if not gpu.detect().available:
        assert any("Live runs are off" in i.value for i in at.info)
    else:
        assert any(b.key == "run:roofline" for b in at.button)


def test_roofline_page_reports_bad_parameters():
    at = open_page("pages/roofline.py")
    at.number_input(key="roofline.size_mib").set_value(10**6).run()
    assert not at.exception
    assert any("out of range" in e.value for e in at.error)


def test_roofline_page_models_another_gpu():
    at = open_page("pages/roofline.py")
    at.sidebar.selectbox(key="target").set_value("T4").run()
    assert not at.exception
    assert "Roofline of T4" in at.get("plotly_chart")[0].proto.spec


def test_query_parameters_preset_the_lab_and_bad_ones_warn():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params["size_mib"] = "-3"
    at.run()
    at.switch_page("pages/roofline.py")
    at.run()
    assert not at.exception


def test_scorecard_scores_every_recorded_lab_and_lists_a_labs_misses():
    from labs.repredict import misses, scorecard

    at = open_page("pages/scorecard.py")
    assert not at.exception, [e.value for e in at.exception]
    expected = scorecard(all_labs())
    assert expected, "the repository holds recordings"
    table = at.dataframe[0].value
    assert len(table) == len(expected)
    assert set(table["lab"]) == {r["title"] for r in expected}
    shares = {(r["title"], r["gpu"]): r["within_15_pct"] for r in expected}
    for _, row in table.iterrows():
        assert row["within 15 % (%)"] == pytest.approx(shares[(row["lab"], row["GPU"])])
    at.selectbox(key="scorecard:lab").set_value("Coalescing").run()
    lab = next(lab for lab in all_labs() if lab.title == "Coalescing")
    listed = at.dataframe[1].value if misses(lab) else None
    if listed is not None:
        assert len(listed) == len(misses(lab)) and (listed["error_pct"].abs() > 15).all()


def test_scorecard_shows_our_kernels_against_the_libraries():
    from labs.repredict import kernels_against_libraries, library_summary

    at = open_page("pages/scorecard.py")
    assert not at.exception, [e.value for e in at.exception]
    assert "Our kernels against the libraries" in [h.value for h in at.header]
    summary = library_summary(kernels_against_libraries(all_labs()))
    assert summary, "the repository holds recordings of matmul and attention beside their libraries"
    shown = next(d.value for d in at.dataframe if "against" in d.value.columns)
    assert len(shown) == len(summary)
    at.selectbox(key="scorecard:kernel-lab").set_value("FlashAttention").run()
    at.selectbox(key="scorecard:library").set_value("cuDNN (SDPA)").run()
    assert not at.exception
    caption = " ".join(c.value for c in at.caption)
    cudnn = [r for r in summary if r["lab"] == "FlashAttention" and r["against"] == "cuDNN (SDPA)"]
    assert f"{sum(r['meet it'] for r in cudnn)} of {sum(r['cases'] for r in cudnn)} cases with a target" in caption


def test_a_lab_page_states_how_its_model_holds_on_the_recorded_runs():
    from labs.repredict import score, with_current_model
    from labs.results import list_recorded

    at = open_page("pages/coalescing.py")
    lab = next(lab for lab in all_labs() if lab.name == "coalescing")
    shown = " ".join(c.value for c in at.caption)
    for result in list_recorded("coalescing"):
        s = score([r.get("error_pct") for r in with_current_model(lab, result).rows])
        assert f"{result.meta['gpu']['name']} {s['within_15_pct']:.0f} % of {s['points']} points" in shown


@pytest.mark.parametrize("page", [p for p in PAGES if p.removeprefix("pages/").removesuffix(".py") in
                                  {lab.name for lab in all_labs()}])
def test_a_lab_page_serves_every_gpu_of_the_datasheet(page):
    """Choosing any GPU to model never takes a page down, even where a default (bf16 on a T4, the Hopper lab on
    an A100) is beyond it: the page says so and serves the rest."""
    at = open_page(page)
    for sheet in gpu.DATASHEET:
        at.selectbox(key="target").set_value(sheet.name).run()
        assert not at.exception, (sheet.name, [e.value for e in at.exception])


def _log_axis_labels(spec: dict) -> list:
    """(chart title, axis, coordinate) of every annotation placed on a log axis of a plotly chart's spec."""
    layout, found = spec.get("layout", {}), []
    title = (layout.get("title") or {}).get("text", "")
    for note in layout.get("annotations", []):
        for axis in ("x", "y"):
            ref = note.get(f"{axis}ref", "")
            if ref in (axis, f"{axis}1") and layout.get(f"{axis}axis", {}).get("type") == "log":
                found.append((title, axis, note.get(axis)))
    return found


@pytest.mark.parametrize("page", PAGES)
def test_labels_on_log_axes_sit_at_their_exponent(page):
    """Plotly places an annotation on a log axis by log10 of its value: a label given the value itself (what
    add_hline's annotation_text does) lands at 10^value and stretches the axis (a 57 GB/s line once took a chart's
    y axis to 1e57). Every such label on every page must be an exponent a chart of this app can show."""
    import json

    at = open_page(page)
    for chart in at.get("plotly_chart"):
        for title, axis, where in _log_axis_labels(json.loads(chart.proto.spec)):
            assert where is not None and -12 < where < 15, f"{page}, {title}: a label on the log {axis} axis at {where}"


def test_reference_line_labels_by_exponent_on_log_axes_only():
    from ui import charts

    log = charts.figure("t", "x", "y", log_x=True, log_y=True)
    charts.reference_line(log, 57.2, "link", "y", line_dash="dash")
    charts.reference_line(log, 5e7, "L2", "x", annotation_position="top left")
    assert log.layout.annotations[0].y == pytest.approx(1.7574, abs=1e-4)
    assert log.layout.annotations[1].x == pytest.approx(7.699, abs=1e-3)
    assert log.layout.shapes[0].y0 == 57.2 and log.layout.shapes[1].x0 == 5e7  # lines take the value itself
    linear = charts.figure("t", "x", "y")
    charts.reference_line(linear, 0.9, "target")
    assert linear.layout.annotations[0].y == 0.9
