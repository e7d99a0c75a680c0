"""Inference lab page: prefill vs decode GEMM sweep, decode attention over a KV cache, one block's decode
step, and a memory calculator that needs no GPU."""

import plotly.graph_objects as go
import streamlit as st

from labs import memcalc
from labs.inference import model as inference_model
from labs.engine.gpu import DATASHEET
from labs.inference import LAB
from labs.engine.params import ParamError
from ui import charts
from ui.lab_page import LabPage, recorded_caption

page = LabPage(LAB)
lab_tab, memory_tab = st.tabs(["Prefill vs decode", "Memory calculator"])


# --- the memory calculator (drawn first: the lab tab may stop the script for predict-first) ---------
def _load_preset():
    name = st.session_state["mem_preset"]
    if name == "custom":
        return
    p = memcalc.preset(name)
    for field in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab"):
        st.session_state[f"mem_{field}"] = getattr(p, field)
    st.session_state["mem_params_b"] = 0.0


def memory_calculator():
    st.subheader("How much GPU memory does a model need?")
    defaults = memcalc.MemParams()
    for field in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab", "params_b"):
        st.session_state.setdefault(f"mem_{field}", getattr(defaults, field))
    names = [p.name for p in memcalc.PRESETS] + ["custom"]
    st.selectbox("Model", names, index=names.index("Llama 3 8B"), key="mem_preset", on_change=_load_preset,
                 help="Published shapes; edit any number below to explore your own.")
    c = st.columns(4)
    shape = {f: c[i % 4].number_input(f.replace("_", " "), min_value=0, step=1, key=f"mem_{f}")
             for i, f in enumerate(("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab"))}
    params_b = c[2].number_input("parameters (B, 0 = from the shape)", min_value=0.0, step=1.0, key="mem_params_b")
    c = st.columns(4)
    precision = c[0].selectbox("weights", list(memcalc.PRECISION_BYTES), index=1, key="mem_precision")
    kv_precision = c[1].selectbox("KV cache", ["bf16", "fp16", "fp8", "int8", "fp32"], key="mem_kv_precision")
    mode = c[2].radio("mode", ["inference", "training"], key="mem_mode", horizontal=True)
    gpu_name = c[3].selectbox("GPU kind", [r.name for r in DATASHEET], key="mem_gpu")
    c = st.columns(4)
    context = c[0].number_input("context (tokens)", min_value=1, value=8192, step=1024, key="mem_context")
    batch = c[1].number_input("batch (sequences)", min_value=1, value=1, step=1, key="mem_batch")
    headroom = c[2].number_input("headroom (%)", min_value=0.0, max_value=90.0, value=10.0, step=5.0, key="mem_headroom")
    checkpointing = c[3].checkbox("activation checkpointing", key="mem_ckpt", disabled=mode != "training")
    try:
        p = memcalc.MemParams(**{k: int(v) for k, v in shape.items()}, params_b=float(params_b), precision=precision,
                              kv_precision=kv_precision, context=int(context), batch=int(batch), mode=mode,
                              checkpointing=bool(checkpointing), gpu=gpu_name, headroom_pct=float(headroom))
        e = memcalc.estimate(p)
    except ParamError as exc:
        st.error(str(exc))
        return
    m = st.columns(4)
    m[0].metric("parameters", f"{e.params / 1e9:.2f} B")
    m[1].metric("total memory", f"{e.total_bytes / 1e9:,.1f} GB")
    m[2].metric(f"{gpu_name} GPUs needed", e.gpus_needed,
                help=f"{e.usable_bytes / 1e9:.0f} GB usable of {e.gpu_memory_bytes / 1e9:.0f} GB each")
    m[3].metric("rule of thumb: GPUs", e.rule_gpus,
                help=f"{e.rule_factor} x parameters x bytes per parameter = {e.rule_bytes / 1e9:,.1f} GB")
    fig = go.Figure()
    for name, nbytes in e.parts.items():
        fig.add_trace(go.Bar(name=name, x=["breakdown"], y=[nbytes / 1e9], hovertemplate="%{y:.1f} GB"))
    fig.add_trace(go.Bar(name=f"rule of thumb (x{e.rule_factor})", x=["rule of thumb"], y=[e.rule_bytes / 1e9],
                         marker_color="gray", hovertemplate="%{y:.1f} GB"))
    charts.reference_line(fig, e.gpu_memory_bytes / 1e9, f"one {gpu_name}", "y", line_dash="dash")
    fig.update_layout(barmode="stack", title="Memory by part (GB)", yaxis_title="GB", height=420,
                      legend=charts.LEGEND_BELOW)
    charts.show(fig, width="stretch")
    st.dataframe(e.to_rows(), width="stretch", hide_index=True)
    if mode == "inference":
        st.caption(f"KV cache: {memcalc.kv_bytes_per_token(p) / 1024:,.0f} KiB per token. Longest context that fits "
                   f"one {gpu_name} at this batch: {memcalc.max_context(p):,} tokens.")
    else:
        st.caption(f"Model state: {e.bytes_per_param:.0f} bytes per parameter (weights, gradients, Adam, master "
                   f"copy); the rule of thumb allows {e.rule_factor * memcalc.PRECISION_BYTES[precision]:.0f} for "
                   "everything.")
    st.markdown(page.section("Why the rule of thumb differs"))


with memory_tab:
    memory_calculator()


# --- the lab ---------------------------------------------------------------------------------
def ridge_lines(fig, target, params, shown):
    has_rate = bool(target.ceilings.matmul_tflops.get(params.dtype))  # a T4 has no bf16 rate: no model ridge
    predicted = inference_model.roofline_ridge_m(params.gemm_k, params.gemm_n, params.dtype, target) if has_rate else None
    if predicted:
        charts.reference_line(fig, predicted, f"predicted ridge M = {predicted:.0f}", "x", line_dash="dash",
                              line_color="gray", annotation_position="top left")
    measured = inference_model.ridge_m(shown.rows, "measured") if shown else None
    if measured:
        charts.reference_line(fig, measured, f"measured ridge M = {measured:.0f}", "x", line_dash="dot",
                              line_color="red", annotation_position="bottom right")
    return predicted, measured


def gemm_charts(params, live, model, recorded, shown):
    target = page.target
    time_fig = charts.figure(f"One {params.gemm_k} x {params.gemm_n} {params.dtype} layer: time per step", "M (rows = batch x tokens)",
                             page.axis("time (ms)"), log_x=True, log_y=True)
    rate_fig = charts.figure(f"Achieved TFLOP/s against the roof of {target.name}", "M (rows = batch x tokens)", "TFLOP/s",
                             log_x=True, log_y=True)
    cost_fig = charts.figure(f"Cost per million tokens (this layer, ${params.usd_per_gpu_hour:g} per GPU-hour)",
                             "M (rows = batch x tokens)", "$ per million tokens", log_x=True, log_y=True)
    hover = ("kernel", "m", "intensity_flop_per_byte", "error_pct")
    model_rows = charts.rows_where(model.rows, experiment="gemm", kernel="cublas")
    for fig, y in ((time_fig, "ms"), (rate_fig, "tflops"), (cost_fig, "usd_per_mtok")):
        charts.add_series(fig, model_rows, "m", f"predicted_{y}", "model (roofline + fixed cost)", charts.MODEL_STYLE, hover[:3])
        for kernel in params.gemm_kernels:
            if live is not None:
                charts.add_series(fig, charts.rows_where(live.rows, experiment="gemm", kernel=kernel), "m",
                                  f"measured_{y}", f"measured, {kernel}", charts.LIVE_STYLE, hover)
            for rec in recorded:
                charts.add_series(fig, charts.rows_where(rec.rows, experiment="gemm", kernel=kernel), "m",
                                  f"measured_{y}", f"{rec.label}, {kernel}", charts.RECORDED_STYLE, hover)
    peak = target.ceilings.matmul_tflops.get(params.dtype)
    if peak:
        charts.reference_line(rate_fig, peak, f"{params.dtype} matmul peak {peak:.0f} TFLOP/s", "y",
                              line_color="black")
    predicted, measured = ridge_lines(time_fig, target, params, shown)
    ridge_lines(rate_fig, target, params, shown)
    charts.show(time_fig, width="stretch")
    st.caption("Flat, then rising: below the ridge every step reads the same weights, so more rows cost (almost) "
               "nothing. Dashed: the M where the intensity 2MKN / bytes reaches peak / bandwidth. Dotted: where the "
               "measured flat part meets the measured compute line.")
    charts.show(rate_fig, width="stretch")
    charts.show(cost_fig, width="stretch")
    st.caption("Tokens per second (in the hover of the table) are M / time; the cost per token is the GPU's rent "
               "times the time divided by M, for this one layer.")


def attention_charts(params, live, model, recorded):
    fig = charts.figure("Decode attention over the KV cache: time per step (one layer)", "context (cached tokens)",
                        page.axis("time (ms)"), log_x=True, log_y=True)
    hover = ("kernel", "batch", "context", "kv_bytes", "error_pct")
    for batch in params.attn_batch:
        charts.add_series(fig, charts.rows_where(model.rows, experiment="attention", kernel=params.attn_kernels[0],
                                                 batch=batch), "context", "predicted_ms",
                          f"model, batch {batch}", charts.MODEL_STYLE, hover[:4])
        for kernel in params.attn_kernels:
            if live is not None:
                charts.add_series(fig, charts.rows_where(live.rows, experiment="attention", kernel=kernel, batch=batch),
                                  "context", "measured_ms", f"measured {kernel}, batch {batch}", charts.LIVE_STYLE, hover)
            for rec in recorded:
                charts.add_series(fig, charts.rows_where(rec.rows, experiment="attention", kernel=kernel, batch=batch),
                                  "context", "measured_ms", f"{rec.label}: {kernel}, batch {batch}",
                                  charts.RECORDED_STYLE, hover)
    bytes_fig = charts.figure("Bytes of K and V read per decode step (one layer)", "context (cached tokens)",
                              "KV cache bytes", log_x=True, log_y=True)
    for batch in params.attn_batch:
        charts.add_series(bytes_fig, charts.rows_where(model.rows, experiment="attention", kernel=params.attn_kernels[0],
                                                       batch=batch), "context", "kv_bytes", f"batch {batch}",
                          dict(mode="lines+markers"))
    weights = inference_model.gemm_bytes(0, params.gemm_k, params.gemm_n, params.dtype)
    charts.reference_line(bytes_fig, weights, f"the {params.gemm_k} x {params.gemm_n} layer's weights", "y",
                          line_dash="dash")
    charts.show(bytes_fig, width="stretch")
    per_token = inference_model.kv_bytes(1, 1, params.kv_heads, params.d_model // params.heads, params.dtype)
    st.caption(f"KV cache: {per_token / 1024:.0f} KiB per cached token per layer ({params.kv_heads} K/V heads of "
               f"{params.d_model // params.heads} dims, K and V, {params.dtype}). Weights are shared by the batch; "
               "the KV cache is not.")
    charts.show(fig, width="stretch")


def block_charts(params, live, model, recorded):
    rows = charts.rows_where(model.rows, experiment="block")
    fig = go.Figure()
    batches = [str(r["batch"]) for r in rows]
    scale = (model.meta.get("normalised_by") or 1) if page.normalise else 1
    for part, label in (("gemm_ms", "GEMMs (weights)"), ("attention_ms", "attention (KV cache)"),
                        ("small_ms", "norms, adds, SiLU, cache writes"), ("fixed_ms", "fixed cost per kernel")):
        # on the model's scale: normalised, its parts are divided as its predicted_ms was
        fig.add_trace(go.Bar(name=f"model: {label}", x=batches, y=[r[f"predicted_{part}"] / scale for r in rows]))
    shown = ([("measured now", live, charts.LIVE_STYLE)] if live else []) + [(r.label, r, charts.RECORDED_STYLE)
                                                                          for r in recorded]
    for label, result, style in shown:
        got = charts.rows_where(result.rows, experiment="block")
        fig.add_trace(go.Scatter(name=label, x=[str(r["batch"]) for r in got if r.get("measured_ms")],
                                 y=[r["measured_ms"] for r in got if r.get("measured_ms")], **style))
    fig.update_layout(barmode="stack", title=f"One block's decode step ({params.block_context} cached tokens): "
                      "measured against the sum of the models", xaxis_title="batch (sequences)",
                      yaxis_title=page.axis("time (ms)"), height=480, legend=charts.LEGEND_BELOW,
                      xaxis_type="category")  # plotly reads "1", "8", ... as numbers and spaces them linearly
    charts.show(fig, width="stretch")
    st.caption("Bars: the model, piece by piece (each piece on the roofline, plus the measured fixed cost of each "
               "kernel in a CUDA graph). Markers: the whole step, timed as one graph replay.")


def lab():
    page.lesson()
    params = page.params_form()
    if params is None:
        return
    live, model, recorded = page.results(params)
    shown = live or (recorded[0] if recorded else None)
    views = {"gemm": "Prefill vs decode: one layer", "attention": "Decode attention and the KV cache",
             "block": "One block, decoding"}
    options = [views[e] for e in inference_model.EXPERIMENTS if e in params.experiments] + ["Model error"]
    view = st.radio("Show", options, horizontal=True, key="inference_view", label_visibility="collapsed")
    if view == views["gemm"]:
        gemm_charts(params, live, model, recorded, shown)
    elif view == views["attention"]:
        attention_charts(params, live, model, recorded)
    elif view == views["block"]:
        block_charts(params, live, model, recorded)
    elif shown is None:
        st.caption("No measurement to compare with yet: run the lab on a GPU, or record one.")
    else:
        for experiment, x, band in (("gemm", "m", 15), ("block", "batch", 25), ("attention", "context", 25)):
            got = [r for r in charts.rows_where(shown.rows, experiment=experiment) if r.get("error_pct") is not None]
            if got:
                charts.show(charts.error_figure(got, x, "kernel" if experiment != "attention" else "batch", band,
                                                    log_x=True, title=f"Model error, {experiment}, {shown.label}"),
                                width="stretch")
        st.markdown(page.section("Near the ridge"))
    if recorded:
        st.caption(recorded_caption(recorded))
    page.table_and_downloads(live or model)


with lab_tab:
    lab()
