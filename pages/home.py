"""Home: what Roofline is, how to use it, the labs, and the GPU this app found."""

from pathlib import Path

import streamlit as st

from labs import all_labs, glossary
from labs.engine import gpu
from labs.engine import runner
from ui import classroom, text
from ui.lab_page import gpu_status_line

sections = text.split_sections(text.link_terms(text.read("home.md")))
warmup_text = sections.pop("Instructor warm-up", "")
route_text = sections.pop("What to read next", "")
how_to = sections.pop("How to use it", "")
st.title("Roofline")
st.markdown(sections[""])
if how_to:  # the route through the app first, before the list of labs it leads to
    st.header("How to use it")
    st.markdown(how_to)
st.info(gpu_status_line())

st.header("The labs")
for lab in all_labs():
    with st.container(border=True):
        if (Path(__file__).parent / f"{lab.page_name}.py").exists():
            st.page_link(f"pages/{lab.page_name}.py", label=f"**{lab.title}**", icon=":material/science:")
        else:
            st.markdown(f"**{lab.title}** (page coming soon)")
        st.caption(lab.summary)

if classroom.instructor_mode():
    st.header("Instructor warm-up")
    st.markdown(warmup_text)
    if not gpu.detect().available:
        st.info(f"The warm-up needs a GPU: {gpu.detect().reason}")
    elif st.button("Warm up every lab", type="primary"):
        with st.status("Running every lab's default sweep", expanded=True) as status:
            lines = {lab.name: st.empty() for lab in all_labs()}
            report = runner.warmup(all_labs(), lambda i, lab, s: lines[lab.name].markdown(f"**{lab.title}**: {s}"))
            status.update(label=f"Warm-up finished: {sum(1 for r in report if not r[2].startswith('failed'))} "
                                f"of {len(report)} labs ready", state="complete")
classroom.progress_download()

for title, body in sections.items():
    if title:
        st.header(title)
        st.markdown(body)

if route_text:  # one tab per kind of user, each an ordered list of lessons, labs and glossary entries
    st.header("What to read next")
    intro, routes = glossary.reading_routes(route_text)
    st.markdown(intro)
    for tab, (title, steps) in zip(st.tabs([title for title, _ in routes]), routes):
        ready = glossary.ready_steps(steps)  # steps whose lab pages exist, renumbered
        tab.markdown("\n".join(f"{n}. {step}" for n, step in enumerate(ready, start=1)))
