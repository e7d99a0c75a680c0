"""Tables as the pages show them: an empty cell reads "-" (never None or nan), numbers to four significant digits.

    tables.show(rows, **st.dataframe options)      rows: a list of dicts (or a DataFrame)

The numbers stay numbers underneath (a column still sorts by value); only what is displayed is formatted.
"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

EMPTY = "-"


def cell(value) -> str:
    """What one cell displays."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return EMPTY
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(v) for v in value) or EMPTY
    return str(value)


def styled(rows):
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    return frame.style.format(cell, na_rep=EMPTY)


def show(rows, **kwargs) -> None:
    kwargs.setdefault("hide_index", True)
    st.dataframe(styled(rows), **kwargs)
