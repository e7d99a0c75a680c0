"""Recomputation lab page: three stacked sigmoids, forward + backward, stored vs recomputed activations."""

import plotly.graph_objects as go
import streamlit as st

from labs.recompute import LAB
from labs.recompute.model import KERNELS
from ui import charts
from ui.lab_page import LabPage, recorded_caption

COLORS = dict(zip(("stored", "recomputed", "autograd"), charts.OKABE_ITO))  # colour-blind safe


def overlay(fig, model, live, recorded, dtype, x, y, hover):
    for variant in KERNELS:
        charts.overlay(fig, model, live, recorded, x, y, variant, dict(dtype=dtype, variant=variant), hover,
                       COLORS[variant])


def memory_figure(model, shown, dtype):
    """Activation memory kept for the backward pass at each size: model bars, measured markers."""
    fig = go.Figure()
    for variant in KERNELS:
        rows = charts.rows_where(model.rows, dtype=dtype, variant=variant)
        fig.add_trace(go.Bar(name=f"model, {variant}", x=[str(r["size_mib"]) for r in rows],
                             y=[r["predicted_activation_bytes"] / 2**20 for r in rows], marker_color=COLORS[variant],
                             opacity=0.45, offsetgroup=variant))
        if shown is not None:
            got = [r for r in charts.rows_where(shown.rows, dtype=dtype, variant=variant)
                   if r.get("measured_activation_bytes") is not None]
            fig.add_trace(go.Scatter(name=f"{shown.label}, {variant}", x=[str(r["size_mib"]) for r in got],
                                     y=[r["measured_activation_bytes"] / 2**20 for r in got], mode="markers",
                                     marker=dict(color=COLORS[variant], size=10, symbol="diamond"),
                                     offsetgroup=variant))  # on its own variant's bar (scattermode="group")
    fig.update_layout(barmode="group", title=f"Activation memory kept for the backward pass ({dtype})",
                      xaxis_title="size of x (MiB)", yaxis_title="MiB", height=420,
                      legend=charts.LEGEND_BELOW, xaxis_type="category",  # one group per size, evenly spaced
                      scattermode="group")
    return fig


page = LabPage(LAB)
page.lesson()
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
shown = live or (recorded[0] if recorded else None)
dtype = st.radio("dtype", params.dtypes, horizontal=True, key="recompute_dtype") if len(params.dtypes) > 1 \
    else params.dtypes[0]

time_fig = charts.figure(f"Forward + backward of three sigmoids ({dtype}): time per step", "size of x (MiB)",
                         page.axis("time (ms)"), log_x=True, log_y=True)
overlay(time_fig, model, live, recorded, dtype, "size_mib", "ms", ("accesses", "predicted_kernels", "bound"))
charts.show(time_fig, width="stretch")
st.caption("Open circles: the model, element-sized trips x bytes / bandwidth (or the special function units' time, "
           "whichever is longer) per kernel, plus a launch cost. Filled: measured now. Diamonds, squares: recorded runs, one shape per GPU.")

speed_fig = charts.figure(f"Speed-up over storing the activations ({dtype})", "size of x (MiB)", "speed-up (x)",
                          log_x=True)
overlay(speed_fig, model, live, recorded, dtype, "size_mib", "speedup", ("accesses",))
# unlabelled: the points near 1.6 run the whole width of the chart, so a label on the line would cover one
charts.reference_line(speed_fig, 8 / 5, "", "y", line_dash="dash", line_color="gray")
charts.show(speed_fig, width="stretch")
st.caption("The dashed line: 8/5, the speed-up of the memory-bound model.")
charts.show(memory_figure(model, shown, dtype), width="stretch")
st.caption("Measured with torch.cuda.max_memory_allocated(): the forward pass's peak, minus what existed before "
           "it and minus its output.")
st.markdown(page.section("Why bf16 gains less"))
if shown is not None:
    rows = [r for r in charts.rows_where(shown.rows, dtype=dtype) if r.get("error_pct") is not None]
    if rows:
        charts.show(charts.error_figure(rows, "size_mib", "variant", 15, log_x=True,
                                            title=f"Model error, {shown.label}"), width="stretch")
if recorded:
    st.caption(recorded_caption(recorded))
page.table_and_downloads(live or model)
