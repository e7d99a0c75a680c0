"""Precision lab page: ReLU time by dtype against bytes, matmul rates by dtype, accumulation error."""

import plotly.graph_objects as go
import streamlit as st

from labs.precision import LAB
from labs.precision.measure import accumulation_example
from labs.precision.model import matmul_rates, time_ratios
from ui import charts
from ui.lab_page import LabPage, recorded_caption

page = LabPage(LAB)
page.lesson()
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
target = page.target
runs = ([live] if live else []) + recorded
shown = live or (recorded[0] if recorded else None)

# --- 1. the same ReLU in four dtypes ------------------------------------------------------------------
st.subheader("ReLU over the same elements in every dtype")
fig = charts.figure(f"ReLU over {params.elements_m} million elements, {target.name}", "", page.axis("time (ms)"))
relu_model = charts.rows_where(model.rows, experiment="relu")
fig.add_trace(go.Bar(x=[r["dtype"] for r in relu_model], y=[r["predicted_ms"] for r in relu_model],
                     name="model: bytes / copy bandwidth", customdata=[r["bytes_per_flop"] for r in relu_model],
                     marker=dict(color="rgba(0,0,0,0)", line=dict(color="black", width=2)),
                     hovertemplate="%{x}: %{y:.3g} ms, %{customdata} bytes per FLOP<extra>model</extra>"))
for run in runs:
    got = [r for r in charts.rows_where(run.rows, experiment="relu") if r.get("measured_ms") is not None]
    fig.add_trace(go.Bar(x=[r["dtype"] for r in got], y=[r["measured_ms"] for r in got], name=f"measured, {run.label}"))
fig.update_layout(barmode="group")
charts.show(fig, width="stretch")
if shown is not None:
    ratios = time_ratios(shown.rows)
    if ratios:
        st.dataframe(ratios, hide_index=True, width="stretch")
        st.caption(f"{shown.label}: fp32 time over each dtype's time, beside the ratio of their bytes.")

# --- 2. matmul by dtype -----------------------------------------------------------------------------
st.subheader("Matmul throughput by dtype")
rates = matmul_rates(target)
fig = charts.figure(f"Matrix multiply, {target.name}", "", "TFLOP/s", log_y=True)
fig.add_trace(go.Bar(x=[r["dtype"] for r in rates], y=[r["calibrated_tflops"] for r in rates],
                     name=f"calibration ({target.ceilings.source})", text=[
                         f"{r['speedup_vs_fp32']:.0f}x fp32" if r.get("speedup_vs_fp32") else "" for r in rates],
                     textposition="outside"))
fig.add_trace(go.Bar(x=[r["dtype"] for r in rates], y=[r["datasheet_tflops"] for r in rates], name="datasheet (dense)",
                     marker=dict(color="rgba(0,0,0,0)", line=dict(color="gray", width=2))))
fig.update_layout(barmode="group")
charts.show(fig, width="stretch")
st.caption(f"The calibration's cuBLAS rates ({target.describe_ceilings()}); fp32 runs on the CUDA cores, the "
           "others on the tensor cores. Not measured by this lab: see the Your GPU page to calibrate.")
st.markdown(page.section("Why the tensor cores only pay off when the bytes do too"))

# --- 3. accumulation --------------------------------------------------------------------------------
st.subheader("Mixed precision: where the sum is kept")
fig = charts.figure("Relative error of bf16 dot products against float64", "terms per dot product (K)",
                    "relative error", log_x=True, log_y=True)
for acc in params.accumulators:
    charts.add_series(fig, charts.rows_where(model.rows, experiment="accumulation", dtype=acc), "k",
                      "predicted_rel_error", f"model, {acc} accumulator", charts.MODEL_STYLE)
    for run in runs:
        charts.add_series(fig, charts.rows_where(run.rows, experiment="accumulation", dtype=acc), "k",
                          "measured_rel_error", f"{run.label}, {acc} accumulator",
                          charts.LIVE_STYLE if run is live else charts.RECORDED_STYLE)
charts.show(fig, width="stretch")
with st.expander("Try it on this machine's CPU (no GPU needed)"):
    k = st.select_slider("terms per dot product (K)", [256, 1024, 4096], value=1024, key="precision.cpu_k")
    if st.button("Sum 256 dot products in fp32 and in bf16", key="precision.cpu_run"):
        st.dataframe(accumulation_example(k), hide_index=True, width="stretch")
        st.caption("Step-by-step sums in torch on the CPU, rounded to the accumulator after every addition, "
                   "against float64.")
st.markdown(page.section("Why fp32 accumulation beats its model"))

if recorded:
    st.caption(recorded_caption(recorded))
page.table_and_downloads(live or model)
