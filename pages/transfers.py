"""Host transfers page: H2D and D2H, pinned and pageable, against latency + bytes over PCIe; copy/compute overlap."""

import streamlit as st

from labs.transfers import LAB
from labs.transfers.model import link_for
from ui import charts
from ui.lab_page import LabPage, recorded_caption

page = LabPage(LAB)
page.lesson()
params = page.params_form()
if params is None:
    st.stop()
live, model, recorded = page.results(params)
link = link_for(page.target)
st.markdown(f"**Link in the model:** PCIe Gen{link['pcie_gen']} x{link['pcie_lanes']}, "
            f"{link['pcie_line_gbps']:.1f} GB/s per direction after line coding, "
            f"**{link['pcie_gbps']:.1f} GB/s** of data once each packet's headers are paid.")
st.caption(f"Source: {link['link_source']}.")  # the datasheet's whole citation: too long for the sentence above

if "copies" in params.experiments:
    fig = charts.figure(f"Host transfers on {page.target.name}: achieved GB/s by copy size", "copy size (bytes)",
                        "GB/s", log_x=True, log_y=True)
    for direction in params.directions:
        for memory in params.memories:
            charts.overlay(fig, model, live, recorded, "size_bytes", "gbps", f"{direction}, {memory}",
                           {"experiment": "copies", "direction": direction, "memory": memory},
                           ("model_latency_us", "model_bandwidth_gbps", "model_route", "model_first_piece_us"))
    charts.reference_line(fig, link["pcie_gbps"], f"PCIe link {link['pcie_gbps']:.0f} GB/s", "y", line_dash="dash",
                          line_color="gray")
    charts.show(fig, width="stretch")
    st.caption("Open circles: the model, latency + bytes / bandwidth. Live runs use their own smallest copy's time "
               "as the latency. Pageable copies are staged by one CPU thread: the model uses that thread's copy "
               "rate measured on the same buffer, never faster than on a buffer beyond the core's own cache (the "
               "staging buffers are not in it); device to host writes your buffer as fast as a plain write of it "
               "(it needs none of its old bytes) and adds the first staging buffer's trip over the link. "
               "Large pageable device-to-host copies lock the buffer's pages, copy, unlock them: the model adds the "
               "locking and unlocking times measured on the same buffer, and takes the faster route. "
               "Filled: measured now. Diamonds, squares: recorded runs, one shape per GPU.")

if "overlap" in params.experiments:
    bars = charts.grouped_bars(model, live, recorded, "ms", {"experiment": "overlap"}, lambda r: r["schedule"],
                               f"A {params.overlap_mib} MiB pinned copy and bf16 matmuls: one stream or two",
                               page.axis("time (ms)"))
    charts.show(bars, width="stretch")
    st.caption("Two streams take about as long as the slower of the two pieces: the copy engine and the SMs work "
               "at the same time. One stream adds them up.")

if "staging" in params.experiments:
    fig = charts.figure(f"Pageable host-to-device copies staged by hand and by the driver on {page.target.name}",
                        "copy size (bytes)", "GB/s", log_x=True)
    where = {"experiment": "staging", "schedule": "by hand"}
    charts.overlay(fig, model, live, recorded, "size_bytes", "gbps", "staged by hand", where,
                   ("model_bandwidth_gbps", "model_latency_us", "model_route", "cpu_read_gbps"))
    for name, result in ([("now", live)] if live is not None else []) + [(rec.label, rec) for rec in recorded]:
        charts.add_series(fig, charts.rows_where(result.rows, experiment="staging", schedule="driver"), "size_bytes",
                          "driver_gbps", f"driver's own copy, {name}", dict(mode="markers", marker_symbol="x"))
    charts.show(fig, width="stretch")
    st.caption(page.section("Why stage by hand"))

shown = live or (recorded[0] if recorded else None)
if shown is not None:
    rows = [r for r in charts.rows_where(shown.rows, experiment="copies") if r.get("error_pct") is not None]
    for r in rows:
        r["series"] = f"{r['direction']}, {r['memory']}"
    if rows:
        charts.show(charts.error_figure(rows, "size_bytes", "series", 20, log_x=True,
                                            title=f"Model error, {shown.label}"), width="stretch")
if recorded:
    st.caption(recorded_caption(recorded))
page.table_and_downloads(live or model)
