"""Home: what Roofline is, how to use it, the labs, and the GPU this app found."""

import streamlit as st

from labs import all_labs
from ui import text
from ui.lab_page import gpu_status_line

sections = text.split_sections(text.link_terms(text.read("home.md")))
st.title("Roofline")
st.markdown(sections[""])
st.info(gpu_status_line())

st.header("The labs")
for lab in all_labs():
    with st.container(border=True):
        st.page_link(f"pages/{lab.name}.py", label=f"**{lab.title}**", icon=":material/science:")
        st.caption(lab.summary)

for title, body in sections.items():
    if title:
        st.header(title)
        st.markdown(body)
