"""One chart style and a plain page flow on every page (issue 34), checked on what AppTest renders without a GPU:
legends without repeats, colour = implementation in Okabe-Ito, log axes labelled at powers of ten, axis titles in
words, one no-GPU notice, Home's route first, blank table cells, every lab in the navigation."""

import json
import re

import pytest

from labs.engine import gpu
from tests.test_pages import PAGES, open_page
from ui import charts

RAW_COLUMN = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)+$")


@pytest.fixture(scope="module")
def rendered():
    return {page: open_page(page) for page in PAGES}


def specs(at) -> list:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def legend_names(spec: dict) -> list:
    if spec.get("layout", {}).get("showlegend") is False:
        return []
    return [t.get("name") for t in spec.get("data", []) if t.get("name") and t.get("showlegend", True) is not False]


@pytest.mark.parametrize("page", PAGES)
def test_each_legend_names_each_thing_once(rendered, page):
    for spec in specs(rendered[page]):
        names = legend_names(spec)
        title = (spec["layout"].get("title") or {}).get("text", "")
        assert len(names) == len(set(names)), f"{page}, {title}: repeated legend entries {names}"
        assert len(names) <= 12, f"{page}, {title}: {len(names)} legend entries"


@pytest.mark.parametrize("page", PAGES)
def test_axes_read_in_words_and_log_axes_by_decades(rendered, page):
    for spec in specs(rendered[page]):
        layout = spec["layout"]
        title = (layout.get("title") or {}).get("text", "")
        for name, axis in layout.items():
            if not name.startswith(("xaxis", "yaxis")):
                continue
            text = (axis.get("title") or {}).get("text") or ""
            assert not RAW_COLUMN.match(text) and text != "n", f"{page}, {title}: {name} titled {text!r}"
            if axis.get("type") == "log" and not axis.get("tickvals"):
                assert axis.get("dtick") in (1, "D2"), f"{page}, {title}: {name} labelled at every minor tick"


@pytest.mark.parametrize("page", PAGES)
def test_colour_is_the_implementation_in_okabe_ito(rendered, page):
    palette = {c.lower() for c in charts.OKABE_ITO}
    for spec in specs(rendered[page]):
        by_impl = {}
        for trace in spec.get("data", []):
            source, impl = charts.trace_source(trace.get("name"))
            colour = (trace.get("marker") or {}).get("color")
            if source is None or not impl or not isinstance(colour, str) or trace.get("type", "scatter") != "scatter":
                continue
            assert colour.lower() in palette, f"{page}: {trace.get('name')} in {colour}"
            by_impl.setdefault(impl, set()).add(colour.lower())
        assert all(len(c) == 1 for c in by_impl.values()), f"{page}: one implementation in several colours {by_impl}"


def test_house_style_groups_a_legend_by_implementation_and_gpu():
    import plotly.graph_objects as go

    fig = charts.figure("t", "seq_len", "time (ms)", log_x=True, log_y=True)
    for source in ("model", "measured", "H100 80GB HBM3, 2026-11-21, recorded", "NVIDIA H200, 2026-11-20, recorded"):
        for impl in ("naive", "ours", "sdpa"):
            fig.add_trace(go.Scatter(x=[128, 1024, 8192], y=[0.01, 0.3, 9], name=f"{source}, {impl}"))
    charts.house_style(fig)
    shown = [t.name for t in fig.data if t.showlegend is not False]
    assert shown == ["naive", "ours", "sdpa", "model (dotted)", "measured now", "H100 80GB HBM3, recorded",
                     "NVIDIA H200, recorded"]
    assert fig.layout.xaxis.title.text == "sequence length N"
    assert fig.layout.xaxis.dtick == 1 and fig.layout.yaxis.dtick == 1


def test_a_lab_page_says_no_gpu_once(rendered):
    if gpu.detect().available:
        pytest.skip("this machine has a GPU")
    for page in PAGES:
        if page in ("pages/home.py", "pages/gpu.py", "pages/glossary.py", "pages/scorecard.py"):
            continue
        at = rendered[page]
        texts = [e.value for kind in ("info", "markdown", "caption", "warning") for e in getattr(at, kind)]
        told = [t for t in texts if "No CUDA GPU found" in t or t.startswith("No GPU")]
        assert len(told) == 1, f"{page}: the no-GPU notice {len(told)} times: {told}"


def test_home_shows_its_route_before_the_cards(rendered):
    headers = [h.value for h in rendered["pages/home.py"].header]
    assert headers.index("How to use it") < headers.index("The labs"), headers


def _displayed(table) -> list:
    """The cells a dataframe element displays (its styler's display values where it has one)."""
    import pyarrow as pa

    styler = table.proto.arrow_data.styler
    if styler.display_values:
        frame = pa.ipc.open_stream(styler.display_values).read_pandas()
    else:
        frame = table.value
    return [str(v) for v in frame.to_numpy().ravel()]


@pytest.mark.parametrize("page", [p for p in PAGES if p not in ("pages/home.py", "pages/glossary.py")])
def test_tables_show_a_dash_for_an_empty_cell(rendered, page):
    shown = [cell for table in rendered[page].dataframe for cell in _displayed(table)]
    assert shown and not {"None", "nan", "NaN", "<NA>"} & set(shown), page
    for table in rendered[page].dataframe:  # the browser draws a missing value as "None", whatever the styler says
        assert not table.value.isna().any().any(), (page, table.value.columns[table.value.isna().any()].tolist())
    from ui import tables

    assert tables.cell(None) == "-" and tables.cell(float("nan")) == "-" and tables.cell(805306368.0) == "805306368"


def test_workbench_models_the_labs_default_gpu(rendered):
    at = open_page("pages/workbench.py")
    lab = rendered["pages/roofline.py"]
    assert at.selectbox(key="target").value == lab.selectbox(key="target").value
    if not gpu.detect().available:
        assert at.selectbox(key="target").value == "H100 SXM"
        assert sum("No GPU on this machine" in i.value for i in at.info) == 1


def test_recorded_skip_notes_read_without_a_contradiction(rendered):
    """'would need 137.8 GB; 148.0 GB are free' read as if the point fitted: say what a point may use."""
    warnings = [w.value for w in rendered["pages/attention.py"].warning]
    assert warnings, "the attention page shows its recorded runs' skipped points"
    for text in warnings:
        assert not re.search(r"would need [\d.]+ GB.*; [\d.]+ GB are free", text), text
        assert "((" not in text and "))" not in text


def test_starter_and_solution_docstrings_fit_the_editor():
    import ast
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parent.parent / "content" / "workbench").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        assert max(map(len, doc.splitlines())) <= 80, path.name


def _nested_parentheses(text: str) -> bool:
    text = re.sub(r"\]\([^)]*\)", "]", text)  # a markdown link's target is not a parenthesis the reader sees
    depth = 0
    for ch in text:
        depth = depth + 1 if ch == "(" else max(0, depth - 1) if ch == ")" else depth
        if depth >= 2:
            return True
    return False


@pytest.mark.parametrize("page", PAGES)
def test_messages_read_as_plain_sentences(rendered, page):
    """No parenthesis inside a parenthesis in a page's messages and captions ('... (recorded on a GPU (date))')."""
    at = rendered[page]
    for kind in ("info", "warning", "error", "success", "caption"):
        for element in getattr(at, kind):
            assert not _nested_parentheses(element.value), f"{page} {kind}: {element.value}"
