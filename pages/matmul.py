"""Matmul lab page: the wavy plot (cuBLAS and Triton against the model), the tile-count explorer, the ladder."""

import plotly.graph_objects as go
import streamlit as st

from labs import matmul, matmul_ladder
from labs.matmul import model as mm
from labs.matmul.configs import dtype_support
from ui import charts
from ui.lab_page import LabPage, recorded_caption

page = LabPage(matmul.LAB)
page.lesson()
target = page.target
support = dtype_support(target)
off = {d: why for d, why in support.items() if why}
if off:
    st.caption("Disabled on this GPU: " + " ".join(f"**{d}**: {why}" for d, why in off.items()))
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)

# --- the wavy plot: TFLOP/s against N, coloured by the largest power of two dividing N ----------------
COLOURS = dict(zip(mm.DIVISIBILITY_ORDER, charts.OKABE_ITO))  # colour-blind safe
SYMBOLS = {"cublas": "circle", "triton": "square"}
shown = live or (recorded[0] if recorded else None)
dtype = params.dtypes[0] if len(params.dtypes) == 1 else st.radio("dtype shown", params.dtypes, horizontal=True)

fig = charts.figure(f"Matmul throughput against N ({dtype}, {target.name})", "N (M = N = K)", page.axis("TFLOP/s"))
scale = (model.meta.get("normalised_by") or 1) if page.normalise else 1  # the roofline on the model's scale
roof = [{**r, "roofline_tflops": r["roofline_tflops"] / scale if r.get("roofline_tflops") is not None else None}
        for r in mm.roofline_rows(dtype, params.sizes, target)]  # None where the GPU has no rate for the dtype
charts.add_series(fig, roof, "n", "roofline_tflops",
                  "roofline (each matrix moved once)", dict(mode="lines", line=dict(color="black", width=1)))
charts.add_series(fig, charts.rows_where(model.rows, dtype=dtype, kernel="triton"), "n", "predicted_tflops",
                  "model: Triton kernel", charts.MODEL_STYLE, ("path", "tiles", "waves", "last_wave_util", "bound"))
if shown is not None:
    for kernel in params.kernels:
        for label in mm.DIVISIBILITY_ORDER:
            rows = [r for r in charts.rows_where(shown.rows, dtype=dtype, kernel=kernel)
                    if r.get("n") and mm.divisibility_label(r["n"]) == label]
            style = dict(mode="markers", marker=dict(size=10, color=COLOURS[label], symbol=SYMBOLS[kernel],
                                                    line=dict(width=1, color="white")))
            charts.add_series(fig, rows, "n", "measured_tflops", f"{kernel}, {label}", style,
                              ("path", "error_pct", "measured_ms"))
for rec in recorded[1:] if shown is not live else recorded:
    for kernel in params.kernels:
        charts.add_series(fig, charts.rows_where(rec.rows, dtype=dtype, kernel=kernel), "n", "measured_tflops",
                          f"{rec.label}, {kernel}", charts.RECORDED_STYLE)
charts.show(fig, width="stretch")
st.caption(("Points: " + (shown.label if shown else "") + ". " if shown else "No measurement to show yet: run "
            "the lab on a GPU or pick a recorded run. ") + "Circles: cuBLAS; squares: the Triton kernel; colour: "
           "the largest power of two dividing N. Dotted: the model for the Triton kernel; black: the roofline.")
if recorded:
    st.caption(recorded_caption(recorded))

# --- the model against the measurement -------------------------------------------------------------
if shown is not None:
    triton_rows = charts.rows_where(shown.rows, kernel="triton")
    charts.show(charts.error_figure(triton_rows, "n", "dtype", mm.MISS_BAND_PCT,
                                        title=f"Model error for the Triton kernel, {shown.label}"), width="stretch")
    misses = mm.explain_misses(shown.rows)
    if misses:
        st.markdown(f"**Points off by more than {mm.MISS_BAND_PCT:.0f} %**, and why:")
        st.dataframe(misses, hide_index=True, width="stretch")

# --- tile-count explorer (no GPU needed) -----------------------------------------------------------
st.header("Tile-count explorer")
st.markdown(page.section("Why one more tile can cost a whole wave"))
c1, c2, c3, c4 = st.columns(4)
n = int(c1.number_input("N", min_value=16, max_value=32768, value=2304, step=1, key="explorer.n"))
shape = c2.selectbox("tile (BLOCK_M x BLOCK_N)", ["128x256", "256x128", "128x128", "64x128", "64x64"],
                     key="explorer.tile")
group_m = int(c3.number_input("GROUP_M", min_value=1, max_value=64, value=8, key="explorer.group"))
x_dtype = c4.selectbox("dtype", ["bf16", "fp16", "fp8", "tf32", "fp32"], key="explorer.dtype")
block_m, block_n = (int(v) for v in shape.split("x"))
grid = mm.explorer(n, x_dtype, block_m, block_n, target, group_m)
m1, m2, m3, m4 = st.columns(4)
m1.metric("tiles", f"{grid['tiles_m']} x {grid['tiles_n']} = {grid['tiles']}")
m2.metric("waves", f"{grid['waves']} of {grid['slots_per_wave']} slots")
m3.metric("last wave busy", f"{100 * grid['last_wave_util']:.0f} %")
m4.metric("padding in the tiles", f"{100 * grid['padding_fraction']:.1f} %")
heat = go.Figure(go.Heatmap(z=grid["wave"], customdata=grid["order"], colorscale="Viridis",
                            colorbar=dict(title="wave", tick0=0, dtick=max(1, -(-grid["waves"] // 8))),  # whole waves
                            hovertemplate="tile row %{y}, column %{x}<br>wave %{z}<br>launch order %{customdata}"
                                          "<extra></extra>"))
heat.update_layout(title=f"{grid['tiles']} tiles of C coloured by wave ({target.sm_count} SMs, "
                         f"{grid['blocks_per_sm']} per SM)", height=420, margin=dict(t=50, b=10),
                   xaxis_title="tile column", yaxis_title="tile row")
heat.update_yaxes(autorange="reversed")
charts.show(heat, width="stretch")
if grid["blocks_per_sm"] == 0:
    st.warning(f"A {shape} tile in {x_dtype} does not fit in one SM's shared memory on {target.name}; "
               "the grid assumes one per SM.")
curve = mm.explorer_curve(x_dtype, block_m, block_n, target, group_m=group_m)
eff = charts.figure(f"Wave and tile efficiency against N ({shape} tiles, {target.name})", "N", "efficiency")
charts.add_series(eff, curve, "n", "wave_util", "wave efficiency (tiles / slots used)", dict(mode="lines"),
                  ("tiles", "waves"))
charts.add_series(eff, curve, "n", "tile_util", "tile efficiency (useful / computed area)", dict(mode="lines"))
eff.add_vline(x=n, line_dash="dash", line_color="gray")
charts.show(eff, width="stretch")

page.table_and_downloads(live or model)

# --- the ladder ------------------------------------------------------------------------------------
st.header("The ladder: naive, tiled, Triton, cuBLAS")
st.markdown(page.section("Why tiling alone is not enough"))
lad = LabPage.second_lab(matmul_ladder.LAB, page)  # the ladder is a lab of its own (parameters, runs, recordings)
lparams = lad.params_form()
if lparams is not None:
    llive, lmodel, lrecorded = lad.results(lparams, stop=False)
    lshown = llive or (lrecorded[0] if lrecorded else None)
    if not lad.waiting_for_prediction:
        bars = charts.figure(f"Each kernel as % of cuBLAS, N = {lparams.n}", "kernel", "% of cuBLAS (log)", log_y=True)
        for ldtype in lparams.dtypes:
            bars.add_trace(go.Bar(x=[r["kernel"] for r in charts.rows_where(lmodel.rows, dtype=ldtype)],
                                  y=[r.get("predicted_pct_of_cublas") for r in charts.rows_where(lmodel.rows, dtype=ldtype)],
                                  name=f"model, {ldtype}", opacity=0.45))
            if lshown is not None:
                rows = [r for r in charts.rows_where(lshown.rows, dtype=ldtype) if r.get("measured_pct_of_cublas")]
                bars.add_trace(go.Bar(x=[r["kernel"] for r in rows], y=[r["measured_pct_of_cublas"] for r in rows],
                                      name=f"{lshown.label}, {ldtype}"))
        bars.update_layout(barmode="group")
        charts.show(bars, width="stretch")
        reads = charts.figure("Global-memory requests and the rate they are served at", "kernel",
                              "GB requested / TB/s (log)", log_y=True)
        for ldtype in lparams.dtypes:
            rows = [r for r in charts.rows_where(lmodel.rows, dtype=ldtype) if r.get("requested_bytes")]
            reads.add_trace(go.Bar(x=[r["kernel"] for r in rows], y=[r["requested_bytes"] / 1e9 for r in rows],
                                   name=f"GB requested, {ldtype}", opacity=0.45))
            if lshown is not None:
                rows = [r for r in charts.rows_where(lshown.rows, dtype=ldtype) if r.get("measured_request_tbps")]
                reads.add_trace(go.Bar(x=[r["kernel"] for r in rows], y=[r["measured_request_tbps"] for r in rows],
                                       name=f"TB/s requested, measured, {ldtype}"))
        charts.reference_line(reads, target.ceilings.copy_tbps,
                              f"device memory: {target.ceilings.copy_tbps:.2f} TB/s", "y", line_dash="dash",
                              line_color="gray")
        reads.update_layout(barmode="group")
        charts.show(reads, width="stretch")
        st.caption("Requested bytes: what the kernel's loads ask global memory for (2N³ elements for the naive "
                   "kernel, N/TILE times less tiled); the rate above the device-memory line is served by the caches.")
        if lrecorded:
            st.caption(recorded_caption(lrecorded))
        lad.table_and_downloads(llive or lmodel, "Ladder numbers")
