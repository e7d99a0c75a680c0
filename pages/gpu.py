"""Your GPU: what the device reports, what its datasheet promises, and what it measurably does."""

import streamlit as st

from labs import gpu, params, runner
from ui import text

st.title("Your GPU")
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
for ceilings in gpu.recorded_ceilings():
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
st.dataframe(gpu.datasheet_rows(), hide_index=True, width="stretch")
