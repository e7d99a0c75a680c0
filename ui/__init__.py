"""Streamlit building blocks shared by the pages (the engine in labs/ never imports streamlit).

pandas is imported here, completely, before any page draws a chart: plotly imports it lazily, and when
several sessions draw their first chart at the same moment one of them can find it half-imported
("partially initialized module 'pandas'"), which stops that page's script halfway.
"""

import pandas  # noqa: F401
import plotly.graph_objects  # noqa: F401
