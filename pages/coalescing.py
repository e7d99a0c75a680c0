"""Coalescing lab page: strided reads against the sector model, row vs column walks, the transpose ladder."""

import plotly.graph_objects as go
import streamlit as st

from labs.coalescing import LAB
from labs.coalescing.model import GRANULE_BYTES, ladder_gains
from ui import charts, tables
from ui.lab_page import LabPage, recorded_caption

GRANULE = GRANULE_BYTES

page = LabPage(LAB)
page.lesson()
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
target = page.target
runs = ([live] if live else []) + recorded
# Normalised, every run's TB/s is divided by its best, the model's by the model's best: so are the model's bounds
# drawn beside them (and the y axis says so), or they float a few times above the points in TB/s.
scale = (model.meta.get("normalised_by") or 1) if page.normalise else 1
Y_TITLE = "useful bandwidth / each run's best" if page.normalise else "useful bandwidth (TB/s)"


def bars(title: str, experiment: str) -> go.Figure:
    """Model and measurements side by side for each variant of one experiment."""
    fig = charts.figure(title, "", Y_TITLE)
    rows = charts.rows_where(model.rows, experiment=experiment)
    fig.add_trace(go.Bar(x=[r["variant"] for r in rows], y=[r["predicted_tbps"] for r in rows], name="model",
                         marker=dict(color="rgba(0,0,0,0)", line=dict(color="black", width=2)),
                         customdata=[r["bound"] for r in rows],
                         hovertemplate="%{x}: %{y:.3g} TB/s (%{customdata}-bound)<extra>model</extra>"))
    for run in runs:
        got = [r for r in charts.rows_where(run.rows, experiment=experiment) if r.get("measured_tbps") is not None]
        fig.add_trace(go.Bar(x=[r["variant"] for r in got], y=[r["measured_tbps"] for r in got],
                             name=f"measured, {run.label}"))
    if not page.normalise:
        charts.reference_line(fig, target.ceilings.copy_tbps, f"copy {target.ceilings.copy_tbps:.2f} TB/s", "y",
                              line_dash="dash", line_color="gray", annotation_position="top right")
    fig.update_layout(barmode="group")
    return fig


# --- 1. stride ------------------------------------------------------------------------------------
if "stride" in params.experiments:
    st.subheader("Reading with a stride")
    fig = charts.figure(f"Useful bandwidth against read stride, {target.name}", "stride (floats)",
                        Y_TITLE, log_x=True, log_y=True)
    bounds = ("sector_model_tbps", "dram_bound_tbps", "l1_bound_tbps")
    stride_model = [{**r, **{c: r[c] / scale for c in bounds if r.get(c) is not None}}
                    for r in charts.rows_where(model.rows, experiment="stride")]
    hover = ("sector_efficiency", "granule_efficiency", "bound", "error_pct")
    charts.add_series(fig, stride_model, "stride", "sector_model_tbps", "sector model (32-byte sectors at copy bandwidth)",
                      dict(mode="lines+markers", line=dict(dash="dot", color="gray"), marker=dict(symbol="circle-open")),
                      hover[:1])
    charts.add_series(fig, stride_model, "stride", "dram_bound_tbps", "DRAM bytes (64-byte granules at copy bandwidth)",
                      charts.MODEL_STYLE, hover[1:3])
    charts.add_series(fig, stride_model, "stride", "l1_bound_tbps", "L1 limit (one 128-byte line per clock per SM)",
                      dict(mode="lines", line=dict(dash="dash", color="gray")))
    shown = live or (recorded[0] if recorded else None)
    if shown is not None:
        charts.add_series(fig, charts.rows_where(shown.rows, experiment="stride"), "stride", "predicted_tbps",
                          f"model with the measured request rate, {shown.label}",
                          dict(mode="lines", line=dict(color="black", width=3)), hover[2:3])
    if live is not None:
        charts.add_series(fig, charts.rows_where(live.rows, experiment="stride"), "stride", "measured_tbps",
                          "measured", charts.LIVE_STYLE, hover)
    for rec in recorded:
        charts.add_series(fig, charts.rows_where(rec.rows, experiment="stride"), "stride", "measured_tbps",
                          rec.label, charts.RECORDED_STYLE, hover)
    charts.show(fig, width="stretch")
    st.caption("Before a run the model knows the bytes and the L1. A run first measures how many separate small "
               "requests DRAM serves per second (one float from each 64-byte granule, in a scrambled order); "
               "strides whose lanes each need their own sector are capped by that rate (black line).")
    if shown is not None:
        probe = charts.rows_where(shown.rows, experiment="probe")
        if probe and probe[0].get("requests_per_s"):
            rate = probe[0]["requests_per_s"]
            # the copy bandwidth of the GPU that ran the probe, not of the GPU the model describes
            copy_tbps = (shown.meta.get("ceilings") or {}).get("copy_tbps") or target.ceilings.copy_tbps
            st.markdown(f"**Probe** ({shown.label}): DRAM served **{rate / 1e9:.1f} G** separate {GRANULE}-byte "
                        f"requests per second, {rate * GRANULE / 1e12:.2f} TB/s of granules against a copy's "
                        f"{copy_tbps:.2f} TB/s.")
        charts.show(charts.error_figure(charts.rows_where(shown.rows, experiment="stride"), "stride", "experiment",
                                            15, log_x=True, title=f"Model error by stride, {shown.label}"),
                        width="stretch")
        st.markdown(page.section("Why large strides fall below the sector model"))

# --- 2. walks -------------------------------------------------------------------------------------
if "walk" in params.experiments:
    st.subheader("Each thread a row, or each thread a column")
    charts.show(bars(f"Same loads, same sums: walking a {params.matrix_n} x {params.matrix_n} matrix", "walk"),
                    width="stretch")
    st.markdown(page.section("Why the row walk is not 8x slower"))

# --- 3. transpose ---------------------------------------------------------------------------------
if "transpose" in params.experiments:
    st.subheader("The transpose ladder")
    charts.show(bars(f"Transposing a {params.matrix_n} x {params.matrix_n} fp32 matrix", "transpose"),
                    width="stretch")
    shown = live or (recorded[0] if recorded else None)
    if shown is not None:
        gains = ladder_gains(shown.rows)
        if gains:
            tables.show(gains, width="stretch")
            st.caption(f"{shown.label}: each rung's bandwidth, its gain over the rung below, and its share of "
                       "copy bandwidth.")
    st.markdown(page.section("Why padding one column helps"))

if recorded:
    st.caption(recorded_caption(recorded))
page.table_and_downloads(live or model)
