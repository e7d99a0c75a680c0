"""Roofline lab page: intensity sweep, measured points on the roof of this GPU, model error per point."""

import math

import streamlit as st

from labs.roofline import LAB
from labs.roofline.model import roof_curve
from ui import charts
from ui.lab_page import LabPage, recorded_caption

page = LabPage(LAB)
page.lesson()
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)

# --- the roofline: roof from the ceilings, the model's points, the measured points ---------------
target = page.target
fig = charts.figure(f"Roofline of {target.name}", "arithmetic intensity (FLOP/byte)",
                    "TFLOP/s / each run's best" if page.normalise else "TFLOP/s", log_x=True, log_y=True)
roof = roof_curve(target)
if page.normalise:  # the points are divided by their run's best: so is the roof, or it floats far above them
    top = max(r["tflops"] for r in roof)
    roof = [{**r, "tflops": r["tflops"] / top} for r in roof]
charts.add_series(fig, roof, "intensity_flop_per_byte", "tflops", f"roof: {target.describe_ceilings()}",
                  dict(mode="lines", line=dict(color="black", width=2)))
ridge = target.ridge_flop_per_byte
fig.add_vline(x=ridge, line_dash="dash", line_color="gray")
# annotations on a log axis take log10 coordinates (shapes take data coordinates); the label sits at the foot of
# the line, right of it: points there are compute-bound and sit up at the roof, so that corner stays empty
fig.add_annotation(x=math.log10(ridge), y=0, yref="paper", text=f"ridge {ridge:.1f} FLOP/byte", showarrow=False,
                   xanchor="left", yanchor="bottom")
fig.add_vrect(x0=ridge / 2, x1=ridge * 2, fillcolor="orange", opacity=0.08, line_width=0)
for dtype in params.dtypes:
    charts.overlay(fig, model, live, recorded, "intensity_flop_per_byte", "tflops", dtype, {"dtype": dtype},
                   ("flops_per_element", "predicted_tflops"))
charts.show(fig, width="stretch")
st.caption("Open circles: the model min(peak, intensity x bandwidth). Filled: this GPU, measured now. "
           "Diamonds, squares: recorded runs of real GPUs, one shape per GPU, each against its own roof. Shaded: within 2x of the ridge.")
if recorded:
    st.caption(recorded_caption(recorded))

# --- how far the model is from each measurement -------------------------------------------------
shown = live or (recorded[0] if recorded else None)
if shown is not None:
    charts.show(charts.error_figure(shown.rows, "intensity_flop_per_byte", "dtype", 15, log_x=True,
                                        title=f"Model error, {shown.label}"), width="stretch")
    st.markdown(page.section("Near the ridge"))
page.table_and_downloads(live or model)
