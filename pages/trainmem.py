"""Training memory page: a calculator (any model, ZeRO stage, GPU count) and a check against real training steps."""


import plotly.graph_objects as go
import streamlit as st

from labs import memcalc
from labs.engine.gpu import DATASHEET, GB
from labs.engine.params import ParamError
from labs.trainmem import LAB
from labs.trainmem.model import ZERO_STAGES, estimate, zero_table
from ui import charts
from ui.lab_page import LabPage, recorded_caption

page = LabPage(LAB)
# the lab comes first, as on every lab page (lesson, run, recorded runs, table); the calculator beside it
lab_tab, calc_tab = st.tabs(["Check on a GPU", "Calculator: any model, ZeRO stage and GPU count"])


def calculator_inputs():
    names = [p.name for p in memcalc.PRESETS]
    c = st.columns(4)
    name = c[0].selectbox("Model", names, index=names.index("Llama 2 7B"), key="tm_preset")
    precision = c[1].selectbox("weights and gradients", list(memcalc.TRAINING_PRECISIONS), index=1, key="tm_precision")
    gpu_name = c[2].selectbox("GPU kind", [r.name for r in DATASHEET], key="tm_gpu")
    checkpointing = c[3].checkbox("activation checkpointing", key="tm_ckpt")
    c = st.columns(4)
    context = c[0].number_input("sequence (tokens)", min_value=1, value=4096, step=1024, key="tm_context")
    batch = c[1].number_input("sequences per GPU", min_value=1, value=1, step=1, key="tm_batch")
    stage = c[2].selectbox("ZeRO stage", ZERO_STAGES, key="tm_stage",
                           help="0: plain data parallelism; 1: shard optimizer states; 2: and gradients; 3: and weights")
    gpus = c[3].number_input("data-parallel GPUs", min_value=1, max_value=100000, value=8, step=1, key="tm_gpus")
    mem = memcalc.MemParams.from_preset(name, precision=precision, gpu=gpu_name, context=int(context),
                                        batch=int(batch), checkpointing=bool(checkpointing), mode="training")
    return mem, int(stage), int(gpus)


def calculator():
    st.subheader("How much memory does training need, per GPU?")
    try:
        mem, stage, gpus = calculator_inputs()
        e = estimate(mem, stage, gpus)
    except ParamError as exc:
        st.error(str(exc))
        return
    m = st.columns(4)
    m[0].metric("parameters", f"{e.params / 1e9:.2f} B")
    m[1].metric("per GPU", f"{e.total_bytes / GB:,.1f} GB")
    m[2].metric(f"fits one {mem.gpu}?", "yes" if e.fits else "no",
                help=f"{e.gpu_memory_bytes / GB:.0f} GB, {mem.headroom_pct:.0f} % kept free")
    m[3].metric("6x rule (whole model)", f"{e.rule_bytes / GB:,.1f} GB",
                help="6 x parameters x bytes per weight: the rough rule, with no activations and no sharding")
    fig = go.Figure()
    for part, nbytes in e.parts.items():
        fig.add_trace(go.Bar(name=part, x=["per GPU"], y=[nbytes / GB], hovertemplate="%{y:.2f} GB"))
    fig.add_trace(go.Bar(name="6x rule", x=["6x rule"], y=[e.rule_bytes / GB], marker_color="gray"))
    charts.reference_line(fig, e.gpu_memory_bytes / GB, f"one {mem.gpu}", "y", line_dash="dash")
    fig.update_layout(barmode="stack", title=f"ZeRO stage {stage} over {gpus} GPUs: memory by part (GB)",
                      yaxis_title="GB", height=440, legend=charts.LEGEND_BELOW)
    charts.show(fig, width="stretch")
    st.dataframe(e.to_rows(), width="stretch", hide_index=True)
    st.markdown("**Model state per GPU at every ZeRO stage** (weights, gradients, fp32 master, Adam; GB)")
    st.dataframe([{"ZeRO stage": r["zero_stage"], **{k.removesuffix("_bytes"): round(v / GB, 2)  # GB, not bytes
                                                    for k, v in r.items() if k != "zero_stage"}}
                  for r in zero_table(e.params, mem.precision, gpus)], hide_index=True)
    st.markdown(page.section("Why the 6x rule is rough"))


def lab():
    page.lesson()
    params = page.params_form(columns=4)
    if params is None:
        return
    live, model, recorded = page.results(params, stop=False)
    if page.waiting_for_prediction:
        return
    fig = charts.figure("Peak memory of one training step", "tokens per step (batch x seq)", "bytes",
                        log_x=True, log_y=True)
    for ckpt in params.checkpointing:
        name = "checkpointing" if ckpt else "no checkpointing"
        charts.overlay(fig, model, live, recorded, "tokens", "peak_bytes", name, {"checkpointing": ckpt},
                       ("batch", "peak_phase"))
        charts.add_series(fig, charts.rows_where(model.rows, checkpointing=ckpt), "tokens", "sum_of_parts_bytes",
                          f"sum of every part, {name}", dict(mode="lines", line=dict(dash="dash")))
    rule = model.rows[0]["rule_of_thumb_bytes"] if model.rows else None
    if rule:
        charts.reference_line(fig, rule, "6x rule", "y", line_color="gray")
    charts.show(fig, width="stretch")
    st.caption("Open circles: the model's peak (model state + saved activations + the largest transient, in the "
               "phase the model names). Dashed: every part added up, as a plan would. Filled: "
               "torch.cuda.max_memory_allocated of a real step.")
    shown = live or (recorded[0] if recorded else None)
    if shown is not None:
        st.dataframe([{k: r.get(k) for k in ("batch", "checkpointing", "measured_peak_bytes", "predicted_peak_bytes",
                                             "error_pct", "measured_state_bytes", "predicted_state_bytes",
                                             "measured_activation_bytes", "predicted_activation_bytes", "peak_phase")}
                      for r in shown.rows if r.get("measured_peak_bytes")], hide_index=True)
    if recorded:
        st.caption(recorded_caption(recorded))
    page.table_and_downloads(live or model)


with calc_tab:
    calculator()
with lab_tab:
    lab()
