"""FlashAttention lab page: the online softmax step by step, the tile picture, then the measured sweep."""

import re

import plotly.graph_objects as go
import streamlit as st

from labs.attention import LAB
from labs.attention.compare import rung_table
from labs.attention.gluon_rung import gluon_rung_note
from labs.attention.model import FREE_SHARE, GLUON_IMPL, MODELLED_IMPLS
from labs.attention.online_softmax import online_softmax_steps, softmax_at_once, stepper_example
from labs.attention.tiles import tile_counts, tile_map
from labs.engine import runner
from ui import charts
from ui.lab_page import LabPage, recorded_caption

page = LabPage(LAB)
page.lesson(expanded=False)

# --- 1. the online softmax, one tile at a time (numpy, no GPU) ------------------------------------
st.subheader("The online softmax, one tile at a time")
c1, c2, c3 = st.columns(3)
length = c1.slider("keys in the row", 4, 48, 24, key="stepper_length")
tile = c2.slider("keys per tile", 1, 16, 4, key="stepper_tile")
seed = c3.number_input("random row", 0, 999, 0, key="stepper_seed")
scores, values = stepper_example(length, int(seed))
steps = online_softmax_steps(scores, values, tile)
once = softmax_at_once(scores, values)
config = (length, tile, int(seed))
if st.session_state.get("stepper_config") != config:  # new row or tile size: start over
    st.session_state.stepper_config, st.session_state.stepper_step = config, 0
b1, b2, b3 = st.columns([1, 1, 4])
if b1.button("Back", key="stepper_back", disabled=st.session_state.stepper_step == 0):
    st.session_state.stepper_step -= 1
if b2.button("Next tile", key="stepper_next", disabled=st.session_state.stepper_step >= len(steps) - 1):
    st.session_state.stepper_step += 1
k = min(st.session_state.stepper_step, len(steps) - 1)
step = steps[k]
b3.markdown(f"Step **{k + 1} of {len(steps)}**: keys {step['start']} to {step['stop'] - 1}")

colors = [charts.OKABE_ITO[0] if j < step["start"] else charts.OKABE_ITO[1] if j < step["stop"] else "#d3d3d3"
          for j in range(length)]
fig = charts.figure("One query's scores: done (blue), this tile (orange), not loaded yet (grey)", "key", "score")
fig.add_trace(go.Bar(x=list(range(length)), y=list(scores), marker_color=colors, name="scores"))
charts.reference_line(fig, step["m"], f"running max m = {step['m']:.2f}", "y", line_dash="dash")
fig.update_layout(height=320, showlegend=False)
charts.show(fig, width="stretch")
m1, m2, m3, m4 = st.columns(4)
m1.metric("running max m", f"{step['m']:.3f}", f"{step['m'] - steps[k - 1]['m']:+.3f}" if k else None)
m2.metric("rescale alpha = exp(m_old - m_new)", f"{step['alpha']:.4f}")
m3.metric("running sum l", f"{step['l']:.4f}")
m4.metric("output so far o / l", ", ".join(f"{x:.3f}" for x in step["output"]))
st.dataframe([{"step": s["step"] + 1, "keys": f"{s['start']}-{s['stop'] - 1}", "tile max": round(s["tile_max"], 3),
               "m": round(s["m"], 3), "alpha": round(s["alpha"], 4), "l": round(s["l"], 4),
               "o / l": ", ".join(f"{x:.4f}" for x in s["output"])} for s in steps[:k + 1]],
             hide_index=True, width="stretch")
if k == len(steps) - 1:
    diff = max(abs(a - b) for a, b in zip(step["output"], once["output"]))
    st.success(f"Last tile: o / l = softmax(scores) @ values computed at once, to {diff:.1e}. "
               f"The log-sum-exp m + ln l = {step['lse']:.4f} is the one number "
               f"per query the backward pass keeps ({once['lse']:.4f} at once).")
else:
    st.caption("Press Next tile: when a tile brings a larger score, alpha < 1 shrinks the old sum and output.")

# --- 2. which tiles one program touches ------------------------------------------------------------
st.subheader("The tile picture: what one program of the forward kernel loads")
c1, c2, c3, c4, c5 = st.columns(5)
lq = c1.number_input("queries Lq", 1, 65536, 1000, key="tiles_lq")
lk = c2.number_input("keys Lk", 1, 65536, 1000, key="tiles_lk")
bm = c3.selectbox("BLOCK_M", [16, 32, 64, 128], index=2, key="tiles_bm")
bn = c4.selectbox("BLOCK_N", [16, 32, 64, 128], index=3, key="tiles_bn")
causal = c5.checkbox("causal", True, key="tiles_causal")
grid = tile_map(int(lq), int(lk), bm, bn, causal)
n_m, n_n = len(grid), len(grid[0])
if n_m * n_n > 4096:
    st.info(f"{n_m} x {n_n} tiles is too many to draw: choose fewer queries or keys, or larger tiles.")
else:
    program = st.slider("program (query tile)", 0, n_m - 1, n_m // 2, key="tiles_program")
    code = {"skipped": 0, "full": 1, "masked": 2}
    z = [[code[s] + (3 if i == program and s != "skipped" else 0) for s in row] for i, row in enumerate(grid)]
    fig = go.Figure(go.Heatmap(z=z, x=[f"K,V {j}" for j in range(n_n)], y=[f"Q {i}" for i in range(n_m)],
                               zmin=0, zmax=5, showscale=False, text=grid,
                               hovertemplate="%{y}, %{x}: %{text}<extra></extra>",
                               colorscale=[[0, "#f0f0f0"], [0.2, "#9ecae1"], [0.4, "#fdae6b"], [0.6, "#08519c"],
                                           [0.8, "#08519c"], [1.0, "#e6550d"]]))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=min(600, 120 + 22 * n_m), margin=dict(t=30, b=10),
                      title="light blue: no mask · orange: mask (diagonal or ragged end) · grey: skipped")
    charts.show(fig, width="stretch")
    row = grid[program]
    counts = tile_counts(int(lq), int(lk), bm, bn, causal)
    st.markdown(f"Program {program} loads its **Q tile once** ({bm} rows) and streams **{row.count('full')} K,V tiles "
                f"without a mask and {row.count('masked')} with one**; it skips {row.count('skipped')}. Over the whole "
                f"grid: {counts['full']} full, {counts['masked']} masked, {counts['skipped']} skipped of "
                f"{counts['tiles']} tiles.")

# --- 3. the measured sweep ---------------------------------------------------------------------------
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
runs = ([live] if live else []) + recorded
gpu_info = runner.live_gpu()
gluon_note = gluon_rung_note(gpu_info.compute_capability if gpu_info.available else None)
if gluon_note and GLUON_IMPL in params.impls:
    st.info(gluon_note)
st.subheader("Time, rate and memory against sequence length")
f1, f2, f3, f4 = st.columns(4)
mode = f1.selectbox("pass", list(params.modes), key="view_mode")
mask = f2.selectbox("mask", list(params.masks), key="view_mask")
d = f3.selectbox("head dim", list(params.head_dims), key="view_d")
dtype = f4.selectbox("dtype", list(params.dtypes), key="view_dtype")
view = dict(mode=mode, causal=mask == "causal", head_dim=d, dtype=dtype)
hover = ("impl", "seq_len", "error_pct")
for metric, unit, log_y in (("tflops", "TFLOP/s", False), ("ms", "time (ms)", True),
                             ("peak_bytes", "peak memory (bytes)", True)):
    fig = charts.figure(f"{unit}, {mode}, {mask}, d = {d}, {dtype}", "sequence length N",
                        page.axis(unit) if metric == LAB.metric else unit, log_x=True, log_y=log_y)
    for impl in MODELLED_IMPLS:
        charts.add_series(fig, charts.rows_where(model.rows, impl=impl, **view), "seq_len", f"predicted_{metric}",
                          f"model, {impl}", charts.MODEL_STYLE, hover[:2])
    for run in runs:
        for impl in params.impls:
            style = charts.LIVE_STYLE if run is live else charts.RECORDED_STYLE
            charts.add_series(fig, charts.rows_where(run.rows, impl=impl, **view), "seq_len", f"measured_{metric}",
                              f"{impl}, {run.label}", style, hover)
    if metric == "peak_bytes":
        charts.reference_line(fig, page.target.memory_bytes,
                              f"{page.target.name}: {page.target.memory_bytes / 1e9:.0f} GB", "y", line_dash="dash",
                              line_color="gray")
    charts.show(fig, width="stretch")
# the points missing from the charts above (this pass, mask, head dim and dtype), each with the run that skipped it
refused = [(run, r) for run in runs for r in charts.rows_where(run.rows, **view)
           if str(r.get("note", "")).startswith(("refused", "skipped"))]
SKIP_NOTE = re.compile(r"skipped: (?P<impl>\S+) would need (?P<need>[\d.]+) GB \((?P<what>[^)]*)\).*?"
                       r"(?P<free>[\d.]+) GB (?:are )?free")


def plain_note(note: str) -> str:
    """A skip note in one plain sentence: what the point needs against the share of free memory a point may use
    (a recorded note said "would need 137.8 GB; 148.0 GB are free", which reads as if it fitted)."""
    m = SKIP_NOTE.match(note)
    if not m:
        return note
    share = FREE_SHARE
    free = float(m["free"])
    return (f"{m['impl']} was skipped at this size. It would need {m['need']} GB for {m['what']}, more than the "
            f"{share * free:.1f} GB a point may use: {100 * share:.0f} % of the {free:.1f} GB free, the rest being "
            "left to the CUDA libraries.")


for run, r in refused[:3]:
    st.warning(f"{run.label}, N = {r['seq_len']}, {r['mode']}: {plain_note(str(r['note']))}")

# --- 3b. the Gluon FlashAttention-3 rung beside cuDNN --------------------------------------------------
st.subheader("Beside cuDNN: our Triton FlashAttention-2 and the Gluon FlashAttention-3")
shown = live or (recorded[0] if recorded else None)
table = rung_table(shown.rows, **view) if shown is not None else []
if table:
    st.dataframe(table, hide_index=True, width="stretch")
    st.caption(f"{shown.label}: TFLOP/s of each kernel, and its speed as a share of cuDNN's (1.00 = as fast).")
else:
    st.caption("No run shown here timed cuDNN at this pass, mask, head dim and dtype.")
st.markdown(page.section("Why FlashAttention-3 overlaps: warpgroups with one job each"))

# --- 4. where the model's time goes, and how far off it is -----------------------------------------
st.subheader("The model: bytes, then tensor cores plus exponentials")
kernel = st.radio("kernel", ["ours", GLUON_IMPL], horizontal=True, key="parts_kernel",
                  help="our Triton FlashAttention-2, or the Gluon FlashAttention-3 (on Hopper)")
modelled = charts.rows_where(model.rows, impl=kernel, **view)
fig = charts.figure("Bytes moved (model): naive's N x N round trips against FlashAttention's K, V re-reads",
                    "sequence length N", "bytes", log_x=True, log_y=True)
charts.add_series(fig, charts.rows_where(model.rows, impl="naive", **view), "seq_len", "predicted_hbm_bytes",
                  "naive: HBM", dict(mode="lines+markers"))
charts.add_series(fig, modelled, "seq_len", "predicted_l2_request_bytes",
                  f"{kernel}: requested by the tiles (L2 serves repeats)", dict(mode="lines+markers", line=dict(dash="dot")))
charts.add_series(fig, modelled, "seq_len", "predicted_hbm_bytes", f"{kernel}: HBM", dict(mode="lines+markers"))
charts.show(fig, width="stretch")
fig = charts.figure("Predicted time per part (multiplies + exponentials - hidden + waves and starts)",
                    "sequence length N", "time (ms)", log_x=True, log_y=True)
for part, name in (("predicted_mma_ms", "matrix multiplies (tensor cores)"), ("predicted_exp_ms", "exponentials (SFU)"),
                   ("predicted_hidden_ms", "hidden under the other program's (FA3: warpgroup's) multiplies"),
                   ("predicted_schedule_ms", "waves, tail, program starts"),
                   ("predicted_mem_ms", "HBM traffic (overlapped)")):
    charts.add_series(fig, modelled, "seq_len", part, name, dict(mode="lines+markers"))
charts.show(fig, width="stretch")
if shown is not None:
    mine = [dict(r) for r in charts.rows_where(shown.rows, impl=kernel, dtype=dtype, head_dim=d)
            if r.get("error_pct") is not None]
    if mine:
        for r in mine:
            r["pass, mask"] = f"{r['mode']}, {'causal' if r['causal'] else 'full'}"
        charts.show(charts.error_figure(mine, "seq_len", "pass, mask", 25, log_x=True,
                                           title=f"Model error of {kernel}, {shown.label}"), width="stretch")
if recorded:
    st.caption(recorded_caption(recorded))
page.table_and_downloads(live or model)
