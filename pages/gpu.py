"""Your GPU: what the device reports, what its datasheet promises, and what it measurably does."""

import plotly.graph_objects as go
import streamlit as st

from labs.engine import gpu
from labs.engine import params
from labs.engine import runner
from ui import charts, classroom, tables, text

st.title("Your GPU")
classroom.instructor_mode()
sections = text.split_sections(text.link_terms(text.read("gpu.md")))
st.markdown(sections[""])
info = gpu.detect()

if info.available:
    sheet = gpu.datasheet_for(info.name)
    left, right = st.columns(2)
    with left:
        st.subheader("What the device reports")
        st.dataframe(gpu.gpu_properties(info), hide_index=True, width="stretch")
    with right:
        st.subheader("Measured ceilings")
        target = gpu.live_target()
        st.caption(target.describe_ceilings())
        if st.button("Measure the ceilings (about a minute)", type="primary"):
            bar = st.progress(0.0, text="starting")
            try:
                runner.calibrate(lambda f, m: bar.progress(min(f, 1.0), text=m),
                                 on_wait=lambda pos: st.info(f"Waiting for the GPU: {pos} run(s) ahead."))
                st.rerun()
            except params.ParamError as exc:
                st.error(str(exc))
            except Exception as exc:  # keep serving whatever went wrong on the GPU
                st.error(f"Calibration failed: {type(exc).__name__}: {exc}")
        st.dataframe(gpu.ceilings_vs_datasheet(target.ceilings, sheet), hide_index=True, width="stretch")
    if sheet:
        st.caption(f"Datasheet row: {sheet.name}. Source: {sheet.source}. {sheet.note}")
    else:
        st.warning("This GPU is not in the datasheet table; the ratios need its vendor figures.")
else:
    st.info(info.reason)

st.header("Recorded GPUs")
st.caption("Ceilings measured by `python -m labs calibrate --record` on real GPUs and committed with their metadata.")
recorded = gpu.recorded_ceilings()
if recorded:
    fig = go.Figure()
    for ceilings in recorded:
        rows = [r for r in gpu.ceilings_vs_datasheet(ceilings, gpu.datasheet_for(ceilings.gpu)) if r["measured / datasheet"]]
        fig.add_trace(go.Bar(x=[r["ceiling"] for r in rows], y=[r["measured / datasheet"] for r in rows],
                             name=ceilings.gpu, text=[f"{r['measured']:,.0f} {r['unit']}" if r["measured"] >= 100
                                                      else f"{r['measured']:.3g} {r['unit']}" for r in rows]))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(title="Measured ceilings as a fraction of each GPU's datasheet", yaxis_title="measured / datasheet",
                      barmode="group", height=420)
    charts.show(fig, width="stretch")
for ceilings in recorded:
    sheet = gpu.datasheet_for(ceilings.gpu)
    v = ceilings.versions
    st.subheader(ceilings.gpu)
    st.caption(f"measured {ceilings.date}, torch {v.get('torch')}, triton {v.get('triton')}, driver {v.get('driver')}")
    st.dataframe(gpu.ceilings_vs_datasheet(ceilings, sheet), hide_index=True, width="stretch")

for title, body in sections.items():
    if title:
        st.header(title)
        st.markdown(body)

st.header("Datasheet table")
st.caption("TF32, FP16, BF16 and FP8: dense tensor-core rates in TFLOP/s; None where the GPU has no such rate.")
tables.show(gpu.datasheet_rows(), width="stretch")
