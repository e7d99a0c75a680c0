"""Collectives page: NCCL collectives over message sizes against the ring model; one layer's DP and TP steps."""

import streamlit as st

from labs.collectives import LAB
from labs.collectives.measure import world_size
from labs.collectives.model import link_for
from ui import charts, tables
from ui.lab_page import LabPage, recorded_caption

page = LabPage(LAB)
page.lesson()
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
link = link_for(page.target)
n = world_size(params, page.target)
st.markdown(f"**Link on the datasheet:** {link['link']}, **{link['link_gbps']:.0f} GB/s** per direction "
            f"({link['link_source']}); {n} GPUs.")

bw = charts.figure("Bus bandwidth by message size", "message size S (bytes)", "bus bandwidth (GB/s)",
                   log_x=True, log_y=True)
times = charts.figure("Time per call", "message size S (bytes)", page.axis("time (ms)"), log_x=True, log_y=True)
for op in params.ops:
    where = {"experiment": "collective", "op": op}
    charts.overlay(bw, model, live, recorded, "size_bytes", "busbw_gbps", op, where,
                   ("gpus", "model_bus_gbps", "model_host_us", "model_protocol"))
    textbook = charts.rows_where((live or model).rows, **where)
    charts.add_series(bw, textbook, "size_bytes", "textbook_busbw_gbps", f"textbook: datasheet B, {op}",
                      dict(mode="lines", line=dict(dash="dot", width=1)))
    charts.overlay(times, model, live, recorded, "size_bytes", "ms", op, where, ("gpus",))
charts.reference_line(bw, link["link_gbps"], f"{link['link']} {link['link_gbps']:.0f} GB/s per direction", "y",
                      line_dash="dash", line_color="gray")
charts.show(bw, width="stretch")
st.caption("Model: in a loop of calls each call takes the longer of the host's cost of issuing it and the GPUs' "
           "time, latency + factor x S / bus bandwidth, where the factor is 2 x (n - 1) / n for all-reduce, "
           "(n - 1) / n for all-gather and reduce-scatter and 1 for broadcast, with the faster of NCCL's protocols: "
           "LL, a small latency at half the rate, or Simple, a larger latency at the full rate. The bus bandwidth is the link or NCCL's kernels, whichever "
           "is slower. "
           "Dotted: the textbook alpha + factor x S / B with the datasheet's B.")
charts.show(times, width="stretch")

steps = [("dp", "Data parallel: every GPU the whole layer, gradients all-reduced"),
         ("tp", "Tensor parallel: every GPU a slice of each matmul, partial outputs all-reduced")]
for kind, title in steps:
    if kind not in params.layer_steps:
        continue
    fig = charts.grouped_bars(model, live, recorded, "ms", {"experiment": kind},
                              lambda r: f"{r['tokens']} tokens: {r['step']}",
                              f"{title} ({params.d_model} x {params.d_ff} MLP)", page.axis("time per step (ms)"), height=440)
    charts.show(fig, width="stretch")
st.caption("compute: forward and backward alone. communication: the collectives alone. serial: one after the other. "
           "overlapped (data parallel): each gradient's all-reduce starts as soon as backward has made it. "
           "Each model bar is the slower of the GPUs' time and the CPU's time to issue the step, timed in the run "
           "(the table's model_bound says which).")

result = live or (recorded[0] if recorded else None)
if result is not None:
    rows = [r for r in charts.rows_where(result.rows, experiment="collective") if r.get("error_pct") is not None]
    if rows:
        charts.show(charts.error_figure(rows, "size_bytes", "op", 20, log_x=True,
                                            title=f"Model error, {result.label}"), width="stretch")
    probes = [r for r in result.rows if r["experiment"] in ("peer_copy", "nccl_p2p", "collective_gpu")]
    if probes:
        st.markdown("**The model's terms, measured in the same run**")
        tables.show([{k: r.get(k) for k in ("experiment", "op", "size_bytes", "measured_ms", "measured_gbps",
                                            "of_datasheet_pct")} for r in probes])
if recorded:
    st.caption(recorded_caption(recorded))
page.table_and_downloads(live or model)
