"""Streamlit building blocks shared by the pages (the engine in labs/ never imports streamlit).

pandas is imported here, completely, before any page draws a chart: plotly imports it lazily, and when
several sessions draw their first chart at the same moment one of them can find it half-imported
("partially initialized module 'pandas'"), which stops that page's script halfway.
"""

import pandas  # noqa: F401
import plotly.graph_objects  # noqa: F401
import streamlit as st


def _use_app_navigation() -> None:
    """Serve every URL through app.py's grouped navigation, also the first one a fresh server sees.

    Streamlit treats a `pages/` folder beside the entry script as its old multipage layout until some
    session has run app.py's `st.navigation`: a learner whose first request is a shared link such as
    /roofline or /workbench?exercise=matmul would get that page alone, under a bare list of file names.
    Every page imports this package, so the first such request switches the server over and reruns:
    app.py then runs and opens the page the link names.
    """
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


_use_app_navigation()
