"""Launch-overhead lab page: the launch figures of this machine, a chain of tiny ops four ways, and the
three regimes (overhead, memory, compute) of an add and a matmul across tensor sizes."""

import streamlit as st

from labs.launch import LAB
from labs.launch.model import PROBES
from ui import charts
from ui.lab_page import LabPage, absolute, recorded_caption

page = LabPage(LAB)
page.lesson()
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
measured = ([live] if live is not None else []) + recorded  # every measurement to draw, live first
numbers = page.numbers()
# the metrics and tables carry µs: they read each run's own numbers, also when the charts are normalised
first = absolute(measured[0], LAB.metric) if measured else None
US = " (normalised)" if page.normalise else " (µs)"

# --- the launch figures -------------------------------------------------------------------------
st.subheader("What a launch costs here")
probe = {r["variant"]: r["measured_us"] for r in (first.rows if first else [])
         if r.get("experiment") == "probe"}
labels = (("eager_add", "one PyTorch launch", "eager_us"), ("eager_triton", "one Triton launch", "triton_us"),
          ("graph_kernel", "one kernel in a CUDA graph", "graph_kernel_us"),
          ("round_trip", "launch + .item()", "round_trip_us"))
cols = st.columns(len(labels) + 1)
for col, (name, label, key) in zip(cols, labels):
    value = f"{probe[name]:.1f} µs" if name in probe else f"{numbers[key]} µs"
    col.metric(label, value, help=PROBES[name])
cols[-1].metric("the notes' figure", "20-40 µs", help="'Calling kernels from the CPU has overhead: around 20-40 "
                "microseconds' - a round trip, not a queued launch.")
st.caption(f"Measured by the probes of {measured[0].label}." if probe else
           f"No run to show yet: the model's figures are {numbers['launch_source']}.")

# --- the chain ---------------------------------------------------------------------------------------
if "chain" in params.experiments:
    fig = charts.figure(f"A chain of K tiny ops on {params.elements} elements: eager, graph, fused, with .item()",
                        "K (ops in the chain)", "time per chain" + US, log_x=True, log_y=True)
    hover = ("variant", "predicted_per_op_us", "measured_per_op_us", "error_pct")
    for variant in params.variants:
        charts.add_series(fig, charts.rows_where(model.rows, experiment="chain", variant=variant), "k", "predicted_us",
                          f"model, {variant}", charts.MODEL_STYLE, hover[:2])
        for result in measured:
            style = charts.LIVE_STYLE if result is live else charts.RECORDED_STYLE
            charts.add_series(fig, charts.rows_where(result.rows, experiment="chain", variant=variant), "k",
                              "measured_us", f"{result.label}, {variant}", style, hover)
    charts.show(fig, width="stretch")
    st.caption("Open circles: the model from the launch figures. Filled: measured now. Diamonds, squares: recorded runs, one shape per GPU.")
    source = first or absolute(model, LAB.metric)
    fits = charts.rows_where(source.rows, experiment="fit")
    if fits:
        st.caption(f"What one more op costs (slope of a straight line through the chain's times), {source.label}:")
        st.dataframe([{"variant": r["variant"], "measured_us_per_op": r.get("measured_us"),
                       "predicted_us_per_op": r.get("predicted_us"), "error_pct": r.get("error_pct")} for r in fits],
                     hide_index=True, width="stretch")
    st.markdown(page.section("Why a graph is not free"))

# --- the three regimes --------------------------------------------------------------------------------
if "regimes" in params.experiments:
    fig = charts.figure("Three regimes: time of one eager call against the bytes it moves",
                        "bytes moved per call", "time per call" + US, log_x=True, log_y=True)
    hover = ("size", "predicted_regime", "measured_regime", "measured_gpu_us")
    for op in params.ops:
        charts.add_series(fig, charts.rows_where(model.rows, experiment="regimes", variant=op), "bytes_moved",
                          "predicted_us", f"model, {op}", charts.MODEL_STYLE, hover[:2])
        for result in measured:
            style = charts.LIVE_STYLE if result is live else charts.RECORDED_STYLE
            for regime, symbol in (("overhead", "circle"), ("memory", "square"), ("compute", "diamond")):
                rows = charts.rows_where(result.rows, experiment="regimes", variant=op, measured_regime=regime)
                charts.add_series(fig, rows, "bytes_moved", "measured_us", f"{result.label}, {op}, {regime}",
                                  {**style, "marker": {**style["marker"], "symbol": symbol}}, hover)
    charts.show(fig, width="stretch")
    st.caption("Lines: the model, max(launch, bytes / bandwidth, FLOPs / peak). Markers: measured, shaped by the "
               "regime read off the measurement (circle overhead, square memory, diamond compute).")
    source = first or absolute(model, LAB.metric)
    st.dataframe([{"op": r["variant"], "size": r["size"], "bytes_moved": r["bytes_moved"],
                   "predicted_regime": r["predicted_regime"], "measured_regime": r.get("measured_regime"),
                   "predicted_us": r["predicted_us"], "measured_us": r.get("measured_us")}
                  for r in charts.rows_where(source.rows, experiment="regimes")], hide_index=True, width="stretch")
    st.markdown(page.section("Why the regimes have sharp corners"))

if recorded:
    st.caption(recorded_caption(recorded))
page.table_and_downloads(live or model)
