"""Hopper matmul anatomy page: each feature switched on in turn, its share of cuBLAS against the model,
the bytes the tile order sends to DRAM, the instructions in the compiled kernel, and the warp-tiled
CUDA-core kernel's intensity per level."""

import plotly.graph_objects as go
import streamlit as st

from labs import hopper
from labs.engine import runner
from labs.hopper.measure import gluon_step_note
from labs.hopper.model import BEST_STEP
from labs.matmul import ladder_model
from ui import charts
from ui.lab_page import LabPage, recorded_caption

page = LabPage(hopper.LAB)
page.lesson()
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
target = page.target
if not target.ceilings.matmul_tflops.get(params.dtype):
    st.warning(f"The {target.name}'s datasheet gives no {params.dtype} tensor-core rate, so the model (and the "
               "lesson's times, shown as ?) cannot describe this lab on it. The lab is written for Hopper GPUs: "
               "choose an H100 or H200 in the sidebar.")
gpu_info = runner.live_gpu()
ws_note = gluon_step_note(gpu_info.compute_capability if gpu_info.available else None)
if ws_note:
    st.info(ws_note)
shown = live or (recorded[0] if recorded else None)
steps = ["cuBLAS", *params.steps]

# --- each step as a share of cuBLAS: model against measurement ------------------------------------
st.subheader("Each step as a share of cuBLAS")
bars = charts.figure(f"Steps at each size ({params.dtype}, model for {target.name})", "step", "% of cuBLAS")
for n in params.sizes:
    rows = [r for r in charts.rows_where(model.rows, n=n) if r.get("step") in steps]
    bars.add_trace(go.Bar(x=[r["step"] for r in rows], y=[r.get("predicted_pct_of_cublas") for r in rows],
                          name=f"model, N = {n}", opacity=0.45))
    if shown is not None:
        rows = [r for r in charts.rows_where(shown.rows, n=n) if r.get("measured_pct_of_cublas") and r["step"] in steps]
        bars.add_trace(go.Bar(x=[r["step"] for r in rows], y=[r["measured_pct_of_cublas"] for r in rows],
                              name=f"{shown.label}, N = {n}"))
charts.reference_line(bars, 95, "95% of cuBLAS", "y", line_dash="dash", line_color="gray")
bars.update_layout(barmode="group")
charts.show(bars, width="stretch")
st.caption("Model: the SM's share of cuBLAS's measured rate at the same N, the SM's 128 bytes per clock into shared "
           "memory, a published memory latency and the tile waves (faint bars). Measured: the same kernel with the "
           "switches of each step, checked against float64 first, timed from a CUDA graph beside cuBLAS in the same "
           "run. Step 8 keeps the fastest of a few configurations, each checked first; the table names it.")
chosen = [r for r in (shown.rows if shown else []) if r.get("step") == BEST_STEP and r.get("config")]
for r in chosen:
    st.caption(f"Step {BEST_STEP!r} at N = {r['n']} ({shown.label}) chose {r['config']}. Tried: {r.get('tried')}.")
if recorded:
    st.caption(recorded_caption(recorded))
if shown is not None:
    rows = [r for r in shown.rows if r.get("error_pct") is not None and r["step"] != "cuBLAS"]
    charts.show(charts.error_figure(rows, "step", "n", 15, title=f"Model error by step, {shown.label}"),
                    width="stretch")

# --- what the tile order changes: bytes from the L2 against bytes from DRAM -----------------------
st.subheader("Tile order: bytes asked of the L2, bytes fetched from DRAM")
n_big = max(params.sizes)
rows = [r for r in charts.rows_where(model.rows, n=n_big) if r.get("predicted_dram_bytes")]
traffic = charts.figure(f"Operand traffic at N = {n_big} (model)", "step", "GB (log)", log_y=True)
traffic.add_trace(go.Bar(x=[r["step"] for r in rows], y=[r["predicted_l2_request_bytes"] / 1e9 for r in rows],
                         name="requested from the L2"))
traffic.add_trace(go.Bar(x=[r["step"] for r in rows], y=[r["predicted_dram_bytes"] / 1e9 for r in rows],
                         name="fetched from DRAM"))
traffic.update_layout(barmode="group")
charts.show(traffic, width="stretch")
st.caption("Every tile asks for its whole row panel of A and column panel of B, whatever the order; the order "
           "decides how many of those panels the tiles running at the same time share, and so how many the L2 "
           "must fetch from DRAM.")

# --- the instructions: PTX and SASS of the compiled kernels ---------------------------------------
st.subheader("The instructions each step compiled to")
asm_rows = [r for r in (shown.rows if shown else []) if any(k.startswith("ptx_") for k in r)]
if asm_rows:
    first = min(r["n"] for r in asm_rows)
    columns = [c for c in dict.fromkeys(k for r in asm_rows for k in r) if c.startswith(("ptx_", "sass_"))
               and c != "ptx_excerpt"]
    st.dataframe([{"step": r["step"], **{c: r.get(c) for c in columns}} for r in asm_rows if r["n"] == first],
                 width="stretch", hide_index=True)
    for r in (r for r in asm_rows if r.get("ptx_excerpt") and r["n"] == first):
        where = "the partitions taking their registers (setmaxnreg)" if "setmaxnreg" in r["ptx_excerpt"] \
            else "the first tensor-core instruction"
        st.caption(f"PTX around {where} in step {r['step']!r} ({shown.label}):")
        st.code(r["ptx_excerpt"], language="text")
else:
    st.info("The instruction counts come from a run on a Hopper GPU (or its recording): none is shown yet.")
st.markdown(page.section("Near the metal: reading the PTX"))

# --- the step before tensor cores: warp tiling on the CUDA cores ---------------------------------
st.subheader("Before tensor cores: the warp-tiled CUDA-core kernel, level by level")
st.markdown(page.section("Near the CUDA cores: warp tiling"))
levels = ladder_model.warptile_levels(4096, "fp32", target)
st.dataframe([{"level": r["level"], "GB": r["bytes"] / 1e9, "FLOP/byte": r["intensity_flop_per_byte"],
               "TB/s": r["bandwidth_tbps"], "ms at this level": r["time_ms"], "source": r["source"]} for r in levels],
             width="stretch", hide_index=True)
warp = ladder_model.predict_warptile(4096, "fp32", target)
st.caption(f"Model at N = 4096, fp32, {target.name}: {warp['predicted_tflops']:.1f} TFLOP/s "
           f"({100 * warp['predicted_tflops'] / target.ceilings.fma_tflops:.0f}% of the FP32 FMA ceiling), "
           f"bound by {warp['bound']}.")
st.markdown("Measured on the [Matmul page](matmul)'s ladder, rung `warptiled`, beside naive, tiled, Triton and cuBLAS.")
page.table_and_downloads(live or model)
