"""Warp divergence lab page: the g sweep (CUDA C++), tl.where against a program branch (Triton), and
data-dependent loops in random and sorted order."""

import plotly.graph_objects as go
import streamlit as st

from labs.engine import gpu
from labs.divergence import LAB
from labs.divergence.kernels import cuda_unavailable_reason
from ui import charts, tables
from ui.lab_page import LabPage, recorded_caption

page = LabPage(LAB)
page.lesson()
if gpu.detect().available:
    reason = cuda_unavailable_reason()
    if reason:  # a GPU but no CUDA compiler: say so before anyone presses Run
        st.warning(f"{reason} The CUDA C++ experiments (branches, data-dependent) cannot be built on this machine; "
                   "the Triton experiment still runs (choose experiments = triton).")
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
measured = ([live] if live is not None else []) + recorded  # every measurement to draw, live first


def bars(fig: go.Figure, rows: list, x: str, y: str, name: str, **style) -> None:
    rows = [r for r in rows if r.get(y) is not None]
    if rows:
        fig.add_trace(go.Bar(x=[r[x] for r in rows], y=[r[y] for r in rows], name=name, **style))


# --- 1. the g sweep ------------------------------------------------------------------------------
if "branches" in params.experiments:
    fig = charts.figure("g sweep: kernel time against the branch group size (CUDA C++)",
                        "g (threads per group taking the same branch)", "time (ms)", log_x=True)
    fig.update_xaxes(tickvals=[2**i for i in range(11)], ticktext=[str(2**i) for i in range(11)])
    hover = ("cost_ratio", "predicted_slowdown", "measured_slowdown", "error_pct")
    for ratio in params.cost_ratios:
        rows = charts.rows_where(model.rows, experiment="branches", cost_ratio=ratio)
        charts.add_series(fig, rows, "g", "predicted_ms", f"model, cost ratio {ratio:g}", charts.MODEL_STYLE, hover[:2])
        for result in measured:
            style = charts.LIVE_STYLE if result is live else charts.RECORDED_STYLE
            charts.add_series(fig, charts.rows_where(result.rows, experiment="branches", cost_ratio=ratio), "g",
                              "measured_ms", f"{result.label}, cost ratio {ratio:g}", style, hover)
    charts.reference_line(fig, 32, "warp size 32", "x", line_dash="dash", line_color="gray",
                          annotation_position="top left")
    charts.show(fig, width="stretch")
    st.caption("Open circles: the model (a warp runs every branch any of its lanes takes). Filled: measured now. "
               "Diamonds, squares: recorded runs, one shape per GPU. Each cost ratio is one pair of levels: below 32 every warp runs both loops.")
    st.markdown(page.section("Why the step is at 32"))
    if measured:
        sweep = charts.rows_where(measured[0].rows, experiment="branches")
        if sweep:
            charts.show(charts.error_figure(sweep, "g", "cost_ratio", 10, log_x=True,
                                                title=f"Slowdown against g = 32: model error, {measured[0].label}"),
                            width="stretch")

# --- 2. Triton: tl.where against a branch per program ------------------------------------------------
if "triton" in params.experiments:
    fig = charts.figure("Triton: tl.where computes both sides, a per-program if runs one", "case", "time (ms)")
    fig.update_layout(barmode="group")
    for ratio in params.cost_ratios:
        bars(fig, charts.rows_where(model.rows, experiment="triton", cost_ratio=ratio), "case", "predicted_ms",
             f"model, cost ratio {ratio:g}", marker_pattern_shape="/", opacity=0.6)
        for result in measured[:2]:
            bars(fig, charts.rows_where(result.rows, experiment="triton", cost_ratio=ratio), "case", "measured_ms",
                 f"{result.label}, cost ratio {ratio:g}")
    charts.show(fig, width="stretch")
    st.markdown(page.section("Why Triton computes both sides"))

# --- 3. data-dependent work ------------------------------------------------------------------------
if "data-dependent" in params.experiments:
    fig = charts.figure(f"Data-dependent loops (k up to {params.k_max} trips): random order against sorted",
                        "case", "time (ms)")
    fig.update_layout(barmode="group")
    bars(fig, charts.rows_where(model.rows, experiment="data-dependent"), "case", "predicted_ms", "model",
         marker_pattern_shape="/", opacity=0.6)
    for result in measured[:2]:
        bars(fig, charts.rows_where(result.rows, experiment="data-dependent"), "case", "measured_ms", result.label)
    charts.show(fig, width="stretch")
    source = measured[0] if measured else model
    columns = ("case", "predicted_branch_efficiency", "counted_branch_efficiency", "measured_branch_efficiency",
               "predicted_sorting_speedup", "measured_sorting_speedup")
    st.caption(f"Branch efficiency (useful / issued lane-trips) and the speed-up from sorting, {source.label}: "
               "predicted from the distribution of k, counted from the actual k values and their warps, "
               "measured from the time.")
    tables.show([{c: r.get(c) for c in columns} for r in charts.rows_where(source.rows, experiment="data-dependent")],
                width="stretch")
    st.markdown(page.section("Why sorting wins it back"))

if recorded:
    st.caption(recorded_caption(recorded))
page.table_and_downloads(live or model)
