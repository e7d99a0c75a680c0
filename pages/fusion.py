"""Fusion lab page: sin^2 + cos^2 three ways over sizes, a chain of k operations, the online softmax."""

import streamlit as st

from labs.fusion import LAB
from labs.fusion.model import EXPERIMENTS, SINCOS, SOFTMAX, chain_ridge_ops
from ui import charts
from ui.lab_page import LabPage, recorded_caption

COLORS = {"eager": "#d62728", "compiled": "#9467bd", "triton": "#1f77b4", "copy": "#7f7f7f",
          "eager_decomposed": "#d62728", "torch_softmax": "#ff7f0e", "triton_online": "#1f77b4"}


def overlay(fig, model, live, recorded, experiment, variants, x, y, hover, **match):
    """Model, this GPU now and recorded runs, one colour per variant."""
    for variant in variants:
        charts.overlay(fig, model, live, recorded, x, y, variant, dict(experiment=experiment, variant=variant, **match),
                       hover, COLORS.get(variant))


def sincos_view(params, model, live, recorded, target):
    fig = charts.figure("sin²x + cos²x: time per call", "tensor size (MiB, fp32)", page.axis("time (ms)"),
                        log_x=True, log_y=True)
    variants = [v for v in SINCOS if params.compile or v != "compiled"]
    shown = live or (recorded[0] if recorded else None)
    # once a run has measured the CPU's time per call, its rows carry the complete model
    with_cpu = (shown is not None and shown.meta.get("gpu", {}).get("key") == target.key  # the GPU modelled here
                and any(r.get("host_ms") for r in charts.rows_where(shown.rows, experiment="sincos")))
    overlay(fig, shown if with_cpu else model, live, recorded, "sincos", variants, "size_mib", "ms",
            ("bytes_moved", "predicted_kernels", "host_ms", "limited_by"))
    l2_mib = target.l2_bytes / 2**20
    charts.reference_line(fig, l2_mib, f"L2 {target.l2_bytes / 1e6:.0f} MB", "x", line_dash="dash", line_color="gray",
                          annotation_position="top left")
    charts.show(fig, width="stretch")
    model_text = (f"the larger of bytes / bandwidth + kernels x launch cost and the CPU's time per call measured in "
                  f"{shown.label}" if with_cpu else "bytes / bandwidth + kernels x launch cost (a run adds the CPU's "
                  "time per call)")
    st.caption(f"Open circles: the model, {model_text}. Filled: measured now. Diamonds, squares: recorded runs, one shape per GPU. Right of the "
               "dashed line the tensor no longer fits in the L2.")
    if shown is not None:
        rows = [r for r in charts.rows_where(shown.rows, experiment="sincos") if r.get("kernel_names")]
        largest = max((r["size_mib"] for r in rows), default=None)
        st.markdown(f"**What torch.profiler saw** ({shown.label}, {largest} MiB): kernels launched by one call")
        st.dataframe([{"variant": r["variant"], "kernels": r.get("measured_kernels"),
                       "model's kernels": r.get("predicted_kernels"),
                       "CPU per call (us)": round(1e3 * r["host_ms"], 1) if r.get("host_ms") else None,
                       "limited by": r.get("limited_by"), "names and times": r["kernel_names"]}
                      for r in rows if r["size_mib"] == largest], width="stretch", hide_index=True)
        notes = {r.get("note") for r in charts.rows_where(shown.rows, experiment="sincos") if r.get("note")}
        for note in notes:
            st.warning(note)
    st.markdown(page.section("The CPU's share: why small tensors miss the bytes model"))


def chain_view(params, model, live, recorded, target):
    fig = charts.figure(f"A chain of k multiply-adds on {params.chain_mib} MiB: time per call", "k (operations)",
                        page.axis("time (ms)"), log_x=True, log_y=True)
    overlay(fig, model, live, recorded, "chain", ("eager", "triton"), "ops", "ms", ("predicted_kernels", "bytes_moved"))
    ridge = chain_ridge_ops(target)
    charts.reference_line(fig, ridge, f"ridge: k = {ridge:.0f}", "x", line_dash="dash", line_color="gray",
                          annotation_position="top left")
    charts.show(fig, width="stretch")
    st.caption("Eager: k kernels, each reading and writing the whole tensor. Triton: one kernel; flat until its "
               "2k FLOPs per element take longer than its 8 bytes (the dashed line).")
    st.markdown(page.section("Near the ridge"))


def softmax_view(params, model, live, recorded, target):
    fig = charts.figure(f"Softmax over {params.softmax_mib} MiB: effective bandwidth (2 x size / time)",
                        "row length (columns)", "TB/s", log_x=True)
    overlay(fig, model, live, recorded, "softmax", tuple(SOFTMAX), "n_cols", "effective_tbps",
            ("predicted_kernels", "bytes_moved", "kernel_names"))
    copy = target.ceilings.copy_tbps
    charts.reference_line(fig, copy, f"copy bandwidth {copy:.2f} TB/s", "y", line_color="black")
    charts.reference_line(fig, 0.85 * copy, "85 % of copy", "y", line_dash="dot", line_color="gray")
    charts.show(fig, width="stretch")
    st.caption("Every version is credited with the same useful bytes (read the input once, write the output once), "
               "so the height shows how close each gets to the one-pass floor.")
    st.markdown(page.section("Where the softmax models miss"))


def error_view(shown):
    if shown is None:
        st.caption("No measurement to compare with yet: run the lab on a GPU, or record one.")
        return
    for experiment, x in (("sincos", "size_mib"), ("chain", "ops"), ("softmax", "n_cols")):
        rows = [r for r in charts.rows_where(shown.rows, experiment=experiment) if r.get("error_pct") is not None]
        if rows:
            charts.show(charts.error_figure(rows, x, "variant", 15, log_x=True,
                                                title=f"Model error, {experiment}, {shown.label}"), width="stretch")


page = LabPage(LAB)
page.lesson()
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
views = {"sincos": "sin² + cos², three ways", "chain": "A chain of k operations", "softmax": "Online softmax"}
options = [views[e] for e in EXPERIMENTS if e in params.experiments] + ["Model error"]
view = st.radio("Show", options, horizontal=True, key="fusion_view", label_visibility="collapsed")
if view == views["sincos"]:
    sincos_view(params, model, live, recorded, page.target)
elif view == views["chain"]:
    chain_view(params, model, live, recorded, page.target)
elif view == views["softmax"]:
    softmax_view(params, model, live, recorded, page.target)
else:
    error_view(live or (recorded[0] if recorded else None))
if recorded:
    st.caption(recorded_caption(recorded))
page.table_and_downloads(live or model)
