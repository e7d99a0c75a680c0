"""Tables as the pages show them: an empty cell reads "-" (never None or nan), numbers to four significant digits.

    tables.show(rows, **st.dataframe options)      rows: a list of dicts (or a DataFrame)

A column without an empty cell keeps its numbers underneath (it still sorts by value); only what is displayed is
formatted.
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
    """The table to draw. A column with an empty cell is drawn as text (Streamlit draws a missing value as a
    grey "None" whatever the styler says); a full column stays numeric, formatted by the styler."""
    frame = (rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))).copy()
    for column in frame.columns:
        if frame[column].isna().any():
            frame[column] = [cell(v) for v in frame[column]]
    return frame.style.format(cell, na_rep=EMPTY)


def show(rows, **kwargs) -> None:
    kwargs.setdefault("hide_index", True)
    st.dataframe(styled(rows), **kwargs)
