"""Glossary page: search and sections on the left, one entry on the right with its links, the entries
that mention it, related terms and the labs where it can be measured; ?term=<slug> opens an entry."""

import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run pages/glossary.py` on its own
    sys.path.insert(0, str(ROOT))

import plotly.graph_objects as go  # noqa: E402
import streamlit as st  # noqa: E402
from plotly.subplots import make_subplots  # noqa: E402
from streamlit.errors import StreamlitAPIException  # noqa: E402

from labs import glossary  # noqa: E402
from ui import charts, classroom, text  # noqa: E402

G = glossary.load()
ALL = "All sections"
DIAGRAM_GPUS = ("H100 SXM", "H100 PCIe", "H200", "A100 80GB", "L4")  # rows with per-SM facts


def open_term(slug: str) -> None:
    st.query_params["term"] = slug


def close_term() -> None:
    st.query_params.pop("term", None)


def term_buttons(entries: list, prefix: str) -> None:
    """A row of buttons that open entries in place (keys '<prefix>_<slug>')."""
    cols = st.columns(3)
    for i, e in enumerate(entries):
        cols[i % 3].button(e.title, key=f"{prefix}_{e.slug}", on_click=open_term, args=(e.slug,),
                           width="stretch")


def try_it_live(entry) -> None:
    labs = glossary.lab_pages(entry)
    if not labs:
        return
    st.subheader("Try it live")
    for lab, title, page in labs:
        try:  # under st.navigation (app.py) the lab page is registered and this is a real page link
            st.page_link(str(page), label=title, icon=":material/science:")  # as on Home; 🧪 needs an emoji font
        except StreamlitAPIException:  # this page on its own: a plain link to the lab's URL
            st.markdown(f":material/science: [{title}]({lab})")


# --- diagrams: data from labs.glossary, drawn here -------------------------------------------------
def thread_figure(gpu: str) -> go.Figure:
    data = glossary.thread_hierarchy(gpu)
    fig = go.Figure()
    n = len(data["levels"])
    for i, level in enumerate(data["levels"]):
        y = n - 1 - i
        for x0, name, detail, color in ((0.0, level["software"], level["software_detail"], "#dbeafe"),
                                        (1.6, level["hardware"], level["hardware_detail"], "#fde68a")):
            fig.add_shape(type="rect", x0=x0, x1=x0 + 1.0, y0=y - 0.42, y1=y + 0.42, fillcolor=color,
                          line=dict(color="#555", width=1))
            lines = "<br>".join(textwrap.wrap(detail, 28))
            fig.add_annotation(x=x0 + 0.5, y=y, text=f"<b>{name}</b><br><span style='font-size:11px'>{lines}"
                               "</span>", showarrow=False, align="center", font=dict(color="#111"))
        fig.add_annotation(x=1.58, y=y, ax=1.02, ay=y, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=2, arrowwidth=1.5, text="")
        fig.add_trace(go.Scatter(x=[1.3], y=[y], mode="markers", marker=dict(size=18, opacity=0),
                                 hovertext=level["rule"], hoverinfo="text", showlegend=False))
    fig.add_annotation(x=0.5, y=n - 0.4, text="<b>CUDA (software)</b>", showarrow=False, yanchor="bottom")
    fig.add_annotation(x=2.1, y=n - 0.4, text=f"<b>{data['gpu']} (hardware)</b>", showarrow=False,
                       yanchor="bottom")
    fig.update_xaxes(visible=False, range=[-0.05, 2.65])
    fig.update_yaxes(visible=False, range=[-0.6, n + 0.1])
    fig.update_layout(height=120 * n + 60, margin=dict(l=10, r=10, t=10, b=10), plot_bgcolor="white")
    return fig


def memory_figure(gpu: str) -> go.Figure:
    levels = glossary.memory_hierarchy(gpu)
    names = [lv["level"] for lv in levels]
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=("size (bytes)", "latency (cycles)", "bandwidth (TB/s)"))
    sized = [lv for lv in levels if lv["total_bytes"]]
    fig.add_trace(go.Bar(y=[lv["level"] for lv in sized], x=[lv["total_bytes"] for lv in sized], orientation="h",
                         text=[glossary.human_bytes(lv["total_bytes"]) for lv in sized], textposition="auto",
                         marker_color="#60a5fa", hovertext=[lv["scope"] for lv in sized]), row=1, col=1)
    fig.add_trace(go.Bar(y=names, x=[lv["latency_cycles"] for lv in levels], orientation="h",
                         text=[f"~{lv['latency_cycles']:,}" for lv in levels], textposition="auto",
                         marker_color="#f59e0b"), row=1, col=2)
    fig.add_trace(go.Bar(y=names, x=[lv["bandwidth_tbps"] for lv in levels], orientation="h",
                         text=[f"{lv['bandwidth_tbps']:.3g}" for lv in levels], textposition="auto",
                         marker_color="#34d399", hovertext=[lv["note"] for lv in levels]), row=1, col=3)
    for col in (1, 2, 3):
        fig.update_xaxes(type="log", row=1, col=col)
    fig.update_xaxes(exponentformat="SI", row=1, col=1)  # 1G bytes: plotly's default "1B" reads as one byte
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=340, showlegend=False, margin=dict(l=10, r=10, t=40, b=10))
    fig.update_annotations(font_size=13)
    return fig


def diagram(name: str, key: str) -> None:
    gpu = st.selectbox("GPU", DIAGRAM_GPUS, key=f"diagram_gpu_{name}_{key}")
    if name == "threads":
        charts.show(thread_figure(gpu), width="stretch", key=f"threads_{key}")
        st.markdown("\n".join(f"- **{lv['software']} → {lv['hardware']}**: {lv['rule']}."
                               for lv in glossary.thread_hierarchy(gpu)["levels"]))
        st.caption("How CUDA's levels of work land on the hardware (hover between the boxes for the rule). "
                   "Sources: " + "; ".join(glossary.thread_hierarchy(gpu)["sources"]) + ".")
    else:
        levels = glossary.memory_hierarchy(gpu)
        charts.show(memory_figure(gpu), width="stretch", key=f"memory_{key}")
        rows = ["| level | scope | size (per SM or per GPU) | latency (cycles) | bandwidth, whole GPU (TB/s) |",
                "|---|---|---|---|---|"]
        for lv in levels:
            size = glossary.human_bytes(lv["unit_bytes"]) if lv["unit_bytes"] else "host RAM"
            rows.append(f"| {lv['level']} | {lv['scope']} | {size} | ~{lv['latency_cycles']:,} | "
                        f"{lv['bandwidth_tbps']:.3g} |")
        st.markdown("\n".join(rows))
        sources = sorted({s for lv in levels for s in lv["sources"]})
        st.caption("Fastest level at the top; all three axes are logarithmic; sizes and bandwidths are for the "
                   "whole GPU. Sizes and HBM bandwidth are "
                   "vendor figures; register and shared-memory bandwidths are computed from per-SM widths "
                   "at the clock implied by the FP32 rate; L2 bandwidth and all latencies are approximate. "
                   "Sources: " + "; ".join(sources) + ".")


# --- the page -------------------------------------------------------------------------------------
st.title("Glossary")
classroom.instructor_mode()
st.caption(f"{len(G)} terms in {len(glossary.SECTIONS)} sections, cross-linked, each with the labs where "
           "you can measure it. Numbers come from the datasheet table in the app and from recorded runs.")

term = st.query_params.get("term")
left, right = st.columns([1, 2], gap="large")

with left:
    query = st.text_input("Search", key="glossary_query", placeholder="warp, HBM, bank conflict, fp8 ...")
    titles = [ALL] + [s.title for s in glossary.SECTIONS]
    chosen = st.selectbox("Section", titles, key="glossary_section")
    section = next((s.slug for s in glossary.SECTIONS if s.title == chosen), None)
    results = G.search(query, section)
    st.caption(f"{len(results)} of {len(G)} entries")
    with st.container(height=620):
        if not results:
            st.info("Nothing matches. Try fewer words, or another section.")
        for e in results:
            st.button(e.title, key=f"open_{e.slug}", on_click=open_term, args=(e.slug,),
                      type="primary" if e.slug == term else "secondary", width="stretch")

with right:
    entry = G.get(term) if term else None
    if term and entry is None:
        st.warning(f"There is no entry named '{text.plain(term, 80)}'. Search for it on the left.")
    if entry is not None:
        sect = glossary.SECTION_BY_SLUG[entry.section]
        st.header(entry.title)
        st.caption(f"{sect.title}" + (f" · also: {', '.join(entry.aliases)}" if entry.aliases else ""))
        st.markdown(G.render(entry.slug))
        if glossary.diagram_for(entry.slug):
            diagram(glossary.diagram_for(entry.slug), entry.slug)
        if entry.sources:
            st.caption("Numbers from: " + "; ".join(entry.sources) + ".")
        try_it_live(entry)
        linked = [G.get(s) for s in entry.links if s in G and s != entry.slug]
        if linked:
            st.subheader("Links in this entry")
            term_buttons(linked, "link")
        if entry.related:
            st.subheader("Related terms")
            term_buttons(G.related(entry.slug), "rel")
        st.subheader("Mentioned in")
        mentions = G.mentioned_in(entry.slug)
        if mentions:
            term_buttons(mentions, "back")
        else:
            st.caption("No other entry links here yet.")
        st.button("Back to the overview", key="close_term", on_click=close_term)
    else:
        st.subheader("Sections")
        for s, entries in G.sections():
            st.markdown(f"**{s.title}** ({len(entries)}): {s.blurb}")
        st.subheader("Diagrams")
        tab_threads, tab_memory = st.tabs(["Threads on the hardware", "Memory hierarchy"])
        with tab_threads:
            diagram("threads", "overview")
        with tab_memory:
            diagram("memory", "overview")
