"""Every page renders under AppTest without a GPU: no exception, its key elements present, fast."""

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from labs import all_labs
from labs.engine import gpu

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
    from labs.engine.repredict import misses, scorecard

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
    from labs.engine.repredict import kernels_against_libraries, library_summary

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
    from labs.engine.repredict import score, with_current_model
    from labs.engine.results import list_recorded

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


def _chart_specs(at) -> list:
    import json

    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def _numeric_strings(values) -> bool:
    try:
        return bool(values) and all(isinstance(v, str) for v in values) and all(float(v) == float(v) for v in values)
    except (TypeError, ValueError):
        return False


@pytest.mark.parametrize("page", PAGES)
def test_chart_legends_and_category_axes_keep_clear(page):
    """A legend placed below the plot in the plot's own coordinates (y < 0 on 'paper') overlaps the axis title and
    tick labels as soon as it has a few rows (the plot shrinks, the gap with it); below the plot it must sit on the
    whole figure ('container'). An axis of sizes written as strings ("16", "64", ...) is read by plotly as
    numbers, spacing the bars linearly (a 16 MiB group squashed into the corner of a 1024 MiB axis) unless the
    axis is declared categorical. And an axis of bytes labels 1e9 '1G', not '1B'."""
    at = open_page(page)
    for spec in _chart_specs(at):
        layout = spec.get("layout", {})
        title = (layout.get("title") or {}).get("text", "")
        legend = layout.get("legend", {})
        if legend.get("y", 0) < 0:
            assert legend.get("yref") == "container", f"{page}, {title}: legend below the plot on paper coordinates"
        for trace in spec.get("data", []):
            if _numeric_strings(trace.get("x")) and trace.get("xaxis", "x") == "x":
                assert layout.get("xaxis", {}).get("type") == "category", f"{page}, {title}: numbers as strings"
        for name, axis in layout.items():  # plotly's default writes 1e9 as "1B", on a bytes axis read as 1 byte
            if name.startswith(("xaxis", "yaxis")) and "bytes" in str((axis.get("title") or {}).get("text", "")):
                assert axis.get("exponentformat") == "SI", f"{page}, {title}: {name} of bytes reads 1e9 as '1B'"


def test_error_figure_draws_each_line_in_x_order():
    """A run measures its reference point first (g = 32 before g = 1, 2, ...): the error line must not zigzag."""
    from ui import charts

    rows = [{"g": g, "ratio": 1.0, "error_pct": e} for g, e in ((32, 0.0), (1, -2.0), (2, -1.9), (64, -0.2))]
    fig = charts.error_figure(rows, "g", "ratio", 10, log_x=True)
    assert list(fig.data[0].x) == [1, 2, 32, 64]
    assert list(fig.data[0].y) == [-2.0, -1.9, 0.0, -0.2]
    assert fig.layout.legend.title.text == "ratio:"  # a trace named "1.0" says nothing without its group


def test_a_lab_page_without_a_gpu_says_live_runs_are_off_once():
    at = open_page("pages/roofline.py")
    if gpu.detect().available:
        pytest.skip("this machine has a GPU")
    for box in at.info:
        assert box.value.count("Live runs are off") <= 1, box.value


def test_coalescing_probe_compares_with_the_copy_bandwidth_of_the_gpu_that_ran_it():
    """The probe sentence names a recorded run (an H200): its copy bandwidth, not the modelled GPU's (an H100)."""
    from labs.engine.results import list_recorded

    at = open_page("pages/coalescing.py")
    shown = next(r for r in list_recorded("coalescing"))  # the page shows the first recording
    probe = next(m.value for m in at.markdown if m.value.startswith("**Probe**"))
    assert shown.label in probe
    assert f"against a copy's {shown.meta['ceilings']['copy_tbps']:.2f} TB/s" in probe


def test_lessons_and_glossary_hold_no_html_markdown_cannot_show():
    """st.markdown shows <sub>/<sup> as literal text: a student read 'the all-k<sub>max</sub> run'."""
    import re

    for path in sorted((ROOT / "content").rglob("*.md")):
        found = re.findall(r"</?(?:sub|sup|b|i|em|strong|span|div)>", path.read_text())
        assert not found, f"{path.relative_to(ROOT)}: {found}"


def test_gpu_page_writes_ceilings_without_exponents():
    """1307 TFLOP/s, not 1.31e+03 TFLOP/s, on the bars of the recorded ceilings."""
    at = open_page("pages/gpu.py")
    texts = [t for spec in _chart_specs(at) for trace in spec.get("data", []) for t in trace.get("text") or []]
    assert texts and not [t for t in texts if "e+" in t], texts


def test_hierarchy_diagram_writes_its_levels_in_dark_text():
    at = open_page("pages/hierarchy.py")
    diagram = next(s for s in _chart_specs(at) if "Memory hierarchy of" in s["layout"]["title"]["text"])
    assert all(note.get("font", {}).get("color") == "#1a1a1a" for note in diagram["layout"]["annotations"])


def test_counter_bars_are_named_by_the_parameters_a_point_has():
    from ui.counters import comparison_figure

    rows = [{"experiment": "sincos", "variant": "eager", "size_mib": 256, "ops": None, "quantity": "dram_bytes",
             "what": "DRAM bytes", "unit": "bytes", "modelled": 10.0, "counted": 9.6, "ratio": 0.96}]
    fig = comparison_figure(rows, "dram_bytes", "t")
    assert list(fig.data[0].x) == ["experiment=sincos<br>variant=eager<br>size_mib=256"]
    assert fig.layout.yaxis.exponentformat == "SI" and fig.layout.legend.yref == "container"


def test_normalised_roofline_draws_the_roof_on_the_points_scale():
    """Normalised, every run is divided by its best: the roof must be too, not stay at 64.7 TFLOP/s above them."""
    at = open_page("pages/roofline.py")
    at.sidebar.radio(key="scale").set_value("normalised").run()
    assert not at.exception
    spec = _chart_specs(at)[0]
    roof = next(t for t in spec["data"] if t["name"].startswith("roof"))
    assert max(roof["y"]) == pytest.approx(1.0)
    assert "best" in spec["layout"]["yaxis"]["title"]["text"]


def test_trainmem_zero_table_in_gb_names_no_column_bytes():
    """The table says GB: a column called total_bytes holding 107.81 read as 107 bytes."""
    at = open_page("pages/trainmem.py")
    table = next(d.value for d in at.dataframe if "ZeRO stage" in d.value.columns)
    assert "total" in table.columns and not [c for c in table.columns if c.endswith("_bytes")]


def test_glossary_memory_diagram_writes_sizes_in_si():
    """Its size axis ran 100M, 1B, 10B, 100B: in bytes, '100B' reads as a hundred bytes."""
    at = open_page("pages/glossary.py")
    diagram = next(s for s in _chart_specs(at)
                   if any(a.get("text") == "size (bytes)" for a in s["layout"].get("annotations", [])))
    assert diagram["layout"]["xaxis"].get("exponentformat") == "SI"


def test_pages_draw_icons_with_streamlit_not_emoji():
    """An emoji is drawn by the learner's fonts: Chromium on a Linux box without an emoji font showed empty boxes
    for the glossary's 'Try it live' links and the workbench's sandbox list. :material/...: icons ship with Streamlit."""
    import re

    emoji = re.compile("[\U0001F300-\U0001FAFF\u2600-\u27BF]")
    for path in sorted([*(ROOT / "pages").glob("*.py"), *(ROOT / "ui").glob("*.py"), ROOT / "app.py"]):
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#")[0]
            assert not emoji.search(code), f"{path.relative_to(ROOT)}:{n}: {line.strip()}"


def test_hierarchy_normalised_keeps_its_sentences_and_diagram_in_tb_per_s():
    """Normalised, the knee read 'falls from 1.00 to 0.41 TB/s' and the diagram's L2 '0.94 TB/s': the run's best
    divided out of numbers that still carried TB/s."""
    at = open_page("pages/hierarchy.py")
    knee = [m.value for m in at.markdown if m.value.startswith("**The knee**")]
    diagram = next(s for s in _chart_specs(at) if "Memory hierarchy of" in s["layout"]["title"]["text"])
    at.sidebar.radio(key="scale").set_value("normalised").run()
    assert not at.exception
    assert knee and [m.value for m in at.markdown if m.value.startswith("**The knee**")] == knee
    normalised = next(s for s in _chart_specs(at) if "Memory hierarchy of" in s["layout"]["title"]["text"])
    assert [a["text"] for a in normalised["layout"]["annotations"]] == [a["text"] for a in diagram["layout"]["annotations"]]
    chart = next(s for s in _chart_specs(at) if "Read bandwidth" in s["layout"]["title"]["text"])
    assert "TB/s" not in chart["layout"]["yaxis"]["title"]["text"]
    assert not [a for a in chart["layout"].get("annotations", []) if "TB/s" in a.get("text", "")]


def test_coalescing_normalised_scales_the_models_bounds_with_the_points():
    at = open_page("pages/coalescing.py")
    stride = next(s for s in _chart_specs(at) if "read stride" in s["layout"]["title"]["text"])
    sector = max(next(t for t in stride["data"] if t["name"].startswith("sector model"))["y"])
    at.sidebar.radio(key="scale").set_value("normalised").run()
    assert not at.exception
    specs = _chart_specs(at)
    stride = next(s for s in specs if "read stride" in s["layout"]["title"]["text"])
    assert max(next(t for t in stride["data"] if t["name"].startswith("sector model"))["y"]) <= 1.0 < sector
    for spec in specs:
        if spec["layout"].get("yaxis", {}).get("title", {}).get("text", "").startswith("useful bandwidth"):
            assert "TB/s" not in spec["layout"]["yaxis"]["title"]["text"]
            assert not [a for a in spec["layout"].get("annotations", []) if "TB/s" in a.get("text", "")]


def test_attention_names_the_run_behind_each_skipped_point():
    """Three unlabelled 'skipped: ... 82.6 GB are free' warnings, two of them about another pass or mask than the
    charts show: each now names its run, and only points of the charts' view are listed."""
    from labs.engine.results import list_recorded

    at = open_page("pages/attention.py")
    labels = [r.label for r in list_recorded("attention")]
    warnings = [w.value for w in at.warning if "skipped" in w.value or "refused" in w.value]
    assert warnings and all(any(w.startswith(label) for label in labels) for w in warnings), warnings
    assert all(", fwd:" in w for w in warnings)  # the charts show the forward pass by default


def test_predictions_are_scored_in_plain_numbers_with_their_unit():
    """'model: 1.108e+10 · measured: 1.108e+10' beside 'you: 11 bytes': every number gets the unit, none an exponent
    (the question is asked, and scored, in GB)."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params["predict"] = "1"
    at.run()
    at.switch_page("pages/trainmem.py")
    at.run()
    at.number_input(key=next(n.key for n in at.number_input if n.key.startswith("input:guess:trainmem"))).set_value(
        11.0).run()
    at.button(key=next(b.key for b in at.button if b.key.startswith("lock:"))).click().run()
    assert not at.exception
    scored = next(m.value for m in at.markdown if m.value.startswith("you: "))
    assert "e+" not in scored and scored.count(" GB**") == 1 + scored.count("model:") + scored.count("measured (")
    assert scored.startswith("you: **11 GB**")


def test_a_lesson_figure_the_datasheet_lacks_reads_as_a_question_mark():
    """On a T4 (no bf16 rate) the Hopper lesson read 'a slice costs nan µs'."""
    at = open_page("pages/hopper.py")
    at.selectbox(key="target").set_value("T4").run()
    assert not at.exception
    text = " ".join(m.value for m in at.markdown)
    assert "nan µs" not in text and "? µs" in text
    assert any("no bf16 tensor-core rate" in w.value for w in at.warning)


def test_launch_normalised_keeps_its_figures_in_microseconds():
    """Normalised, 'one PyTorch launch' read 0.0 µs and the per-op table 0.0015 µs."""
    at = open_page("pages/launch.py")
    before = [(m.label, m.value) for m in at.metric]
    tables = [d.value.round(9).to_dict() for d in at.dataframe[:2]]  # the last bit may differ: x / s * s
    at.sidebar.radio(key="scale").set_value("normalised").run()
    assert not at.exception
    assert [(m.label, m.value) for m in at.metric] == before
    assert [d.value.round(9).to_dict() for d in at.dataframe[:2]] == tables
    assert not [s for s in _chart_specs(at) if "µs" in s["layout"]["yaxis"]["title"]["text"]]


@pytest.mark.parametrize("page", ["pages/precision.py", "pages/recompute.py", "pages/transfers.py",
                                  "pages/collectives.py", "pages/fusion.py", "pages/inference.py", "pages/attention.py"])
def test_normalised_charts_of_the_metric_do_not_name_its_unit(page):
    """Normalised, the values are fractions of each run's largest: an axis titled 'time (ms)' over 0.07 is wrong."""
    lab = next(lab for lab in all_labs() if f"pages/{lab.name}.py" == page)
    unit = {"ms": "(ms)", "tflops": "TFLOP/s"}[lab.metric]
    at = open_page(page)
    at.sidebar.radio(key="scale").set_value("normalised").run()
    assert not at.exception
    metric_axes = [s["layout"]["yaxis"]["title"]["text"] for s in _chart_specs(at)
                   if any(str(t.get("name", "")).startswith(("model", "NVIDIA")) for t in s.get("data", []))
                   and "normalised" in s["layout"].get("yaxis", {}).get("title", {}).get("text", "")]
    assert metric_axes, f"{page}: no chart says it is normalised"
    for spec in _chart_specs(at):
        title = spec["layout"].get("yaxis", {}).get("title", {}).get("text", "")
        if lab.metric == "ms":
            assert unit not in title, f"{page}: {spec['layout']['title']['text']}: {title}"


def test_normalised_matmul_draws_its_roofline_on_the_models_scale():
    at = open_page("pages/matmul.py")
    at.sidebar.radio(key="scale").set_value("normalised").run()
    assert not at.exception
    spec = next(s for s in _chart_specs(at) if s["layout"]["title"]["text"].startswith("Matmul throughput"))
    roof = next(t for t in spec["data"] if t["name"].startswith("roofline"))
    assert max(roof["y"]) <= 1.5 and "normalised" in spec["layout"]["yaxis"]["title"]["text"]
