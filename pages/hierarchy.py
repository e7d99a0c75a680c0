"""Memory-hierarchy lab page: the diagram of the levels, bandwidth against buffer size, the L2 knee."""

import plotly.graph_objects as go
import streamlit as st

from labs.engine.gpu import MiB
from labs.hierarchy import LAB
from labs.hierarchy.diagram import hierarchy_levels
from labs.hierarchy.model import VARIANTS, find_knee, levels as level_figures
from ui import charts
from ui.lab_page import LabPage, absolute, recorded_caption

page = LabPage(LAB)
page.lesson()
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
target = page.target
shown = live or next((r for r in recorded if r.meta.get("gpu", {}).get("key") == target.key), None)
shown = absolute(shown, LAB.metric)  # the diagram and the knee are in TB/s, also when the overlay is normalised


def _size(b) -> str:
    if b is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KiB", 1024)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}" if unit != "KiB" else f"{b / scale:.0f} KiB"
    return f"{b} B"


def _rate(tbps) -> str:
    return f"{tbps:.2f} TB/s" if tbps is not None else "not measured"


def diagram(levels: list) -> go.Figure:
    """The hierarchy as stacked boxes, narrow and fast at the top, wide and slow at the bottom."""
    fig = go.Figure()
    colors = ["#2a9d8f", "#8ab17d", "#e9c46a", "#e76f51"]
    n = len(levels)
    for i, lv in enumerate(levels):
        half = 0.18 + 0.8 * (i + 1) / n / 2  # wider further from the SM
        y0, y1 = n - i - 1, n - i - 0.1
        fig.add_shape(type="rect", x0=0.5 - half, x1=0.5 + half, y0=y0, y1=y1, fillcolor=colors[i % 4],
                      opacity=0.85, line=dict(width=0))
        size = _size(lv["size_bytes"]) + (f" {lv['scope']}" if lv["size_bytes"] else "")
        if lv["scope"] == "per SM" and lv.get("total_bytes"):
            size += f" ({_size(lv['total_bytes'])} on the chip)"
        if lv.get("l1_and_shared_bytes"):
            size += f"; L1 + shared {_size(lv['l1_and_shared_bytes'])}"
        rate = _rate(lv["tbps"]) + (f" (datasheet {lv['datasheet_tbps']:.2f})" if lv.get("datasheet_tbps") else "")
        # dark text: the theme's grey text is unreadable on the coloured boxes
        fig.add_annotation(x=0.5, y=(y0 + y1) / 2, showarrow=False, font=dict(size=13, color="#1a1a1a"),
                           text=f"<b>{lv['level']}</b>: {size}<br>{rate}",
                           hovertext=f"size: {lv['size_source']}<br>bandwidth: {lv['tbps_source']}")
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[-0.1, n])
    fig.update_layout(title=f"Memory hierarchy of {target.name}", height=420, margin=dict(t=50, b=10, l=10, r=10),
                      showlegend=False)
    return fig


# --- the diagram ----------------------------------------------------------------------------------
levels = hierarchy_levels(target, shown.rows if shown else None,
                          f"measured by this lab ({shown.label})" if shown else "")
charts.show(diagram(levels), width="stretch")
st.caption("Sizes: " + "; ".join(f"{lv['level']}: {lv['size_source']}" for lv in levels) + ". Bandwidths: "
           + "; ".join(f"{lv['level']}: {lv['tbps_source']}" for lv in levels) + ".")

# --- bandwidth against buffer size ----------------------------------------------------------------
fig = charts.figure(f"Read bandwidth against buffer size, {target.name}", "buffer size (bytes)",
                    "read bandwidth / each run's best" if page.normalise else "read bandwidth (TB/s)",
                    log_x=True, log_y=True)
hover = ("level", "passes", "error_pct")
for variant in params.variants:
    charts.add_series(fig, charts.rows_where(model.rows, variant=variant), "size_bytes", "predicted_tbps",
                      f"model, {VARIANTS[variant]}", charts.MODEL_STYLE, hover[:1])
    if live is not None:
        charts.add_series(fig, charts.rows_where(live.rows, variant=variant), "size_bytes", "measured_tbps",
                          f"measured, {VARIANTS[variant]}", charts.LIVE_STYLE, hover)
    for rec in recorded:
        charts.add_series(fig, charts.rows_where(rec.rows, variant=variant), "size_bytes", "measured_tbps",
                          f"{rec.label}, {VARIANTS[variant]}", charts.RECORDED_STYLE, hover)
charts.reference_line(fig, target.l2_bytes, f"L2 {target.l2_bytes / MiB:.0f} MiB", "x", line_dash="dash",
                      line_color="gray", annotation_position="top left")
if not page.normalise:  # a line in TB/s has no place among points divided by their run's best
    charts.reference_line(fig, target.ceilings.copy_tbps, f"copy {target.ceilings.copy_tbps:.2f} TB/s", "y",
                          line_dash="dot", line_color="gray", annotation_position="bottom right")
knee = find_knee(shown.rows) if shown else None
if knee:
    charts.reference_line(fig, knee["knee_bytes"], "knee", "x", line_color="firebrick",
                          annotation_position="bottom left")
charts.show(fig, width="stretch")
lv = level_figures(target)
st.caption(f"Model: the L2 plateau below {target.l2_bytes / MiB:.0f} MiB, HBM above; level figures "
           f"{lv.source}. Open circles: model. Filled: measured now. Diamonds, squares: recorded runs, one shape per GPU.")
if knee:
    st.markdown(f"**The knee** ({shown.label}): bandwidth falls from {knee['plateau_tbps']:.2f} to "
                f"{knee['floor_tbps']:.2f} TB/s, crossing halfway (geometric mean) at **{knee['knee_bytes'] / MiB:.1f} "
                f"MiB**, {100 * knee['knee_bytes'] / target.l2_bytes:.0f} % of the {target.l2_bytes / MiB:.0f} MiB "
                f"L2 the device reports.")
st.markdown(page.section("Why the two curves part near 40 MiB"))

if shown is not None:
    charts.show(charts.error_figure(shown.rows, "size_bytes", "variant", 15, log_x=True,
                                        title=f"Model error, {shown.label}"), width="stretch")
    st.markdown(page.section("Near the small end"))
if recorded:
    st.caption(recorded_caption(recorded))
page.table_and_downloads(live or model)
