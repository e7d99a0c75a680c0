"""Plotly figures shared by lab pages: the same look for model, live and recorded data everywhere."""

from __future__ import annotations

import math

import plotly.graph_objects as go

MODEL_STYLE = dict(mode="lines+markers", marker=dict(symbol="circle-open", size=9), line=dict(dash="dot"))
LIVE_STYLE = dict(mode="markers", marker=dict(size=10))
RECORDED_STYLE = dict(mode="markers", marker=dict(size=8, symbol="diamond", opacity=0.75))
# The legend in rows along the bottom of the whole figure, below the axis title. Placed in the plot's own (paper)
# coordinates instead, at a fixed fraction below the axis, a legend of many rows shrinks the plot until that
# fraction is less than the tick labels and axis title need, and the legend covers them.
LEGEND_BELOW = dict(orientation="h", yref="container", yanchor="bottom", y=0)


def figure(title: str, x_title: str, y_title: str, log_x: bool = False, log_y: bool = False) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, height=480,
                      legend=LEGEND_BELOW, margin=dict(t=60, b=10))
    # 1G, not plotly's default 1B (billion), which on an axis of bytes reads as one byte
    fig.update_xaxes(exponentformat="SI")
    fig.update_yaxes(exponentformat="SI")
    if log_x:
        fig.update_xaxes(type="log")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def reference_line(fig: go.Figure, value: float, text: str = "", axis: str = "y", **style) -> None:
    """A line across the plot at `value` on the x or y axis (add_hline / add_vline, `style` passed on), labelled.

    Plotly draws a line on a log axis at the value itself but places an annotation on a log axis by its exponent,
    so a label added at the value (what add_hline's annotation_text does) lands at 10^value and stretches the axis
    to it: a 57 GB/s line took the y axis of a GB/s chart up to 1e57. On a log axis the label's coordinate is
    therefore set to log10(value)."""
    add = fig.add_hline if axis == "y" else fig.add_vline
    if not text:
        add(**{axis: value}, **style)
        return
    add(**{axis: value}, annotation_text=text, **style)
    log = (fig.layout.yaxis.type if axis == "y" else fig.layout.xaxis.type) == "log"
    if log and value > 0:
        label = fig.layout.annotations[-1]
        setattr(label, axis, math.log10(value))


def rows_where(rows: list, **match) -> list:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def add_series(fig: go.Figure, rows: list, x: str, y: str, name: str, style: dict, hover: tuple = ()) -> None:
    """One trace from the rows that have both x and y (rows without a value are skipped)."""
    rows = [r for r in rows if r.get(x) is not None and r.get(y) is not None]
    if not rows:
        return
    custom = [[r.get(h) for h in hover] for r in rows]
    template = "<br>".join(f"{h}: %{{customdata[{i}]:.4g}}" if isinstance(rows[0].get(h), (int, float))
                           else f"{h}: %{{customdata[{i}]}}" for i, h in enumerate(hover))
    fig.add_trace(go.Scatter(x=[r[x] for r in rows], y=[r[y] for r in rows], name=name, customdata=custom,
                             hovertemplate=f"{x}: %{{x:.4g}}<br>{y}: %{{y:.4g}}<br>{template}<extra>{name}</extra>",
                             **style))


def error_figure(rows: list, x: str, group: str, band_pct: float, log_x: bool = False, title: str = "") -> go.Figure:
    """error_pct against x, one trace per group, with the +-band the issue sets as the target."""
    fig = figure(title or "Model error (measured vs predicted)", x, "error (%)", log_x=log_x)
    numeric = all(isinstance(r.get(x), (int, float)) for r in rows if r.get(x) is not None)
    for value in dict.fromkeys(r.get(group) for r in rows):
        series = rows_where(rows, **{group: value})
        if numeric:  # a line drawn in row order zigzags where a run measured its reference point first
            series = sorted((r for r in series if r.get(x) is not None), key=lambda r: r[x])
        add_series(fig, series, x, "error_pct", str(value), dict(mode="lines+markers"))
    fig.add_hrect(y0=-band_pct, y1=band_pct, fillcolor="green", opacity=0.08, line_width=0)
    fig.add_hline(y=0, line_color="gray", line_width=1)
    fig.update_layout(legend_title_text=f"{group}:")  # the traces are named by value alone ("1.0", "4.0")
    return fig


def colored(style: dict, color) -> dict:
    """A copy of a trace style with its marker (and line) in one colour."""
    out = dict(style)
    out["marker"] = {**style.get("marker", {}), "color": color}
    if "line" in style:
        out["line"] = {**style["line"], "color": color}
    return out


def overlay(fig: go.Figure, model, live, recorded: list, x: str, metric: str, name: str, where: dict,
            hover: tuple = (), color=None) -> None:
    """One series three ways: the model (open circles), this GPU now (filled), recorded runs (diamonds).

    `where` picks the rows of the series; the y values are predicted_<metric> and measured_<metric>.
    """
    paint = (lambda style: colored(style, color)) if color else dict
    add_series(fig, rows_where(model.rows, **where), x, f"predicted_{metric}", f"model, {name}", paint(MODEL_STYLE), hover)
    if live is not None:
        add_series(fig, rows_where(live.rows, **where), x, f"measured_{metric}", f"measured, {name}",
                   paint(LIVE_STYLE), hover + ("error_pct",))
    for rec in recorded:
        add_series(fig, rows_where(rec.rows, **where), x, f"measured_{metric}", f"{rec.label}, {name}",
                   paint(RECORDED_STYLE), hover + ("error_pct",))


def grouped_bars(model, live, recorded: list, metric: str, where: dict, label_of, title: str,
                 y_title: str, height: int = 420) -> go.Figure:
    """Bars side by side per row: the model, this GPU now, and each recorded run.

    `where` picks the rows; `label_of(row)` names the bar's place on the x axis; the heights are
    predicted_<metric> for the model and measured_<metric> for the runs.
    """
    fig = go.Figure()
    shown = [("model", model, f"predicted_{metric}")] + \
        ([("measured now", live, f"measured_{metric}")] if live is not None else []) + \
        [(rec.label, rec, f"measured_{metric}") for rec in recorded]
    for name, result, column in shown:
        rows = [r for r in rows_where(result.rows, **where) if r.get(column)]
        fig.add_trace(go.Bar(name=name, x=[label_of(r) for r in rows], y=[r[column] for r in rows]))
    fig.update_layout(barmode="group", title=title, yaxis_title=y_title, height=height)
    return fig
