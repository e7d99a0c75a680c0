"""Plotly figures shared by lab pages: the same look for model, live and recorded data everywhere."""

from __future__ import annotations

import math
import re

import plotly.graph_objects as go
import plotly.io as pio

# Okabe & Ito's palette, safe for the common colour-vision deficiencies (yellow last: faint on white)
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
# plotly_white with that palette, merged once: a default named "plotly_white+..." is merged again for every figure
# (about 7 ms a figure, measured: 60 of the 350 ms the attention page with nine charts took to rerun)
pio.templates["roofline"] = pio.templates.merge_templates(
    "plotly_white", go.layout.Template(layout=dict(colorway=list(OKABE_ITO))))
pio.templates.default = "roofline"
# marker = GPU: the model a dotted line with open circles, this GPU filled circles, each recorded GPU its own shape
SOURCE_SYMBOLS = ("diamond", "square", "triangle-up", "x", "star", "pentagon")
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
    measured = y.startswith("measured_") and any(r.get("spread_pct") is not None for r in rows)
    if measured:  # the timing rule's spread on every measured point (labs/engine/timing.py)
        hover = tuple(hover) + tuple(h for h in ("spread_pct", "unsteady") if h not in hover)
    custom = [[r.get(h) for h in hover] for r in rows]
    template = "<br>".join(f"{axis_words(h)}: %{{customdata[{i}]:.4g}}" if isinstance(rows[0].get(h), (int, float))
                           and not isinstance(rows[0].get(h), bool) else f"{axis_words(h)}: %{{customdata[{i}]}}"
                           for i, h in enumerate(hover))
    extra = dict(error_y=spread_bars(rows, y)) if measured else {}
    predicted = "predicted_" + y[len("measured_"):]
    if y.startswith("measured_") and any(r.get(predicted) is not None for r in rows):
        # the model of this run's own GPU, kept with its points: drawn by house_style where it differs from
        # the model the chart draws (another GPU's points must not read as model error)
        extra["meta"] = {"model_y": [r.get(predicted) for r in rows]}
    fig.add_trace(go.Scatter(x=[r[x] for r in rows], y=[r[y] for r in rows], name=name, customdata=custom,
                             hovertemplate=f"{axis_words(x)}: %{{x:.4g}}<br>{axis_words(y)}: %{{y:.4g}}<br>{template}"
                                           f"<extra>{name}</extra>", **style, **extra))


def spread_bars(rows: list, y: str) -> dict:
    """Error bars from each point's spread (p10 to p90 of its repeats, in % of its median): half above, half below."""
    half = [abs(r[y]) * (r.get("spread_pct") or 0.0) / 200 for r in rows]
    return dict(type="data", array=half, visible=True, thickness=1, width=3)


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


# ---------------------------------------------------------------------------------------------
# One style for every chart: applied to each figure just before it is drawn (show)
# ---------------------------------------------------------------------------------------------
# column names that reach an axis title, in words with their units
AXIS_WORDS = {"intensity_flop_per_byte": "arithmetic intensity (FLOP/byte)", "n": "N", "seq_len": "sequence length N",
              "size_bytes": "size (bytes)", "size_mib": "size (MiB)", "stride": "stride (floats)", "k": "k",
              "g": "branch group size g", "m": "M (rows)", "batch": "batch", "context": "context (cached tokens)",
              "tokens": "tokens per step", "error_pct": "error (%)", "bytes_moved": "bytes moved"}
_UNITS = {"ms": "ms", "us": "µs", "tbps": "TB/s", "gbps": "GB/s", "tflops": "TFLOP/s", "bytes": "bytes", "pct": "%",
          "mib": "MiB", "gb": "GB"}
_RECORDED = re.compile(r"^(?P<gpu>.+?), (?P<date>\d{4}-\d{2}-\d{2}), (?P<kind>[a-z]+)(?:[,:] (?P<impl>.+))?$")
_RECORDED_LAST = re.compile(r"^(?P<impl>[^,]+), (?P<gpu>.+?), (?P<date>\d{4}-\d{2}-\d{2}), (?P<kind>[a-z]+)$")
_LIVE = re.compile(r"^measured(?: now)?(?:[,:] | (?=\S))(?P<impl>.+)$")
_MODEL = re.compile(r"^model(?:[,:] (?P<impl>.+))?$")
_GPU_MODEL = re.compile(r"^model of (?P<gpu>.+?)(?:, (?P<impl>.+))?$")  # another GPU's model (models_of_each_gpu)


def axis_words(title: str) -> str:
    """'intensity_flop_per_byte' -> 'arithmetic intensity (FLOP/byte)'; 'measured_ms' -> 'measured (ms)'; 'n' -> 'N'.
    A title already in words (with a space or a unit in parentheses) is kept."""
    if not title or " " in title or "(" in title:
        return title
    if title in AXIS_WORDS:
        return AXIS_WORDS[title]
    head, _, unit = title.rpartition("_")
    if head and unit in _UNITS:
        return f"{head.replace('_', ' ')} ({_UNITS[unit]})"
    return title.replace("_", " ")


def trace_source(name: str):
    """(source, implementation) of a trace named the overlay way: 'model, ours' -> ('model', 'ours');
    'measured, ours' -> ('this GPU', 'ours'); 'H100 80GB HBM3, 2026-11-21, recorded, ours' -> ('H100 80GB HBM3',
    'ours'); 'model of NVIDIA H200, ours' -> ('model of NVIDIA H200', 'ours'). (None, name) for any other name."""
    name = name or ""
    first, last = _RECORDED.match(name), _RECORDED_LAST.match(name)  # "<run>, impl" or "impl, <run>"
    m = first if first and first.group("impl") else last or first
    if m:
        return ("this GPU" if m.group("kind") == "live" else m.group("gpu")), m.group("impl") or ""
    if name in ("measured", "measured now"):
        return "this GPU", ""
    m = _LIVE.match(name)
    if m:
        return "this GPU", m.group("impl")
    m = _GPU_MODEL.match(name)
    if m:
        return f"model of {m.group('gpu')}", m.group("impl") or ""
    m = _MODEL.match(name)
    if m:
        return "model", m.group("impl") or ""
    return None, name


GPU_MODEL_DASHES = ("dash", "dashdot", "longdash", "longdashdot")  # the chart's own model is dotted
MODELS_AGREE_PCT = 2.0  # another GPU's model this close to the drawn one everywhere adds nothing to draw


def _close(a, b) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= abs(b) * MODELS_AGREE_PCT / 100


def models_of_each_gpu(fig: go.Figure) -> None:
    """For every run's points (add_series kept their GPU's model with them) whose model is not the one the chart
    draws, that GPU's model as a line of its own: named 'model of <GPU>, <impl>', dashed, one dash per GPU, in
    the colour of the implementation. Without it an H200's points sit beside the H100's model and read as model
    error. A run of the GPU the chart models (its model agrees with the drawn one) adds nothing."""
    parsed = [(t, *trace_source(t.name)) for t in fig.data if isinstance(t, go.Scatter)]
    drawn = {impl: dict(zip(t.x or (), t.y or ())) for t, source, impl in parsed if source == "model"}
    gpus = []
    for t, source, impl in parsed:
        model_y = (t.meta or {}).get("model_y") if isinstance(t.meta, dict) else None
        if source in (None, "model") or source.startswith("model of ") or not model_y:
            continue
        if impl not in drawn:  # the chart draws no model for this series: none of another GPU's either
            continue
        mine = drawn[impl]
        points = [(x, y) for x, y in zip(t.x, model_y) if y is not None]
        if not points or all(_close(y, mine.get(x)) for x, y in points):
            continue
        if source not in gpus:
            gpus.append(source)
        dash = GPU_MODEL_DASHES[gpus.index(source) % len(GPU_MODEL_DASHES)]
        colour = t.marker.color if isinstance(t.marker.color, str) else None
        name = f"model of {source}" + (f", {impl}" if impl else "")
        fig.add_trace(go.Scatter(x=[x for x, _ in points], y=[y for _, y in points], name=name,
                                 mode="lines+markers", marker=dict(symbol="circle-open", size=8, color=colour),
                                 line=dict(dash=dash, color=colour), hovertemplate=f"%{{x:.4g}}: %{{y:.4g}}<extra>{name}</extra>"))


def _positive(values) -> list:
    out = []
    for v in values if values is not None else ():
        if isinstance(v, (int, float)) and v == v and v > 0 and math.isfinite(v):
            out.append(float(v))
    return out


def _decades(fig: go.Figure, name: str) -> None:
    """Log axes labelled at powers of ten only (no 2, 5, 0.1 minor labels), in plain numbers where they are small.
    `name`: a layout axis ('xaxis', 'yaxis2', ...)."""
    layout_axis = fig.layout[name]
    if layout_axis.type != "log" or layout_axis.tickvals is not None:
        return
    letter, ref = name[0], name[0] + name[5:]  # 'yaxis2' -> the traces on 'y2'
    values = [v for t in fig.data if (getattr(t, f"{letter}axis", None) or letter) == ref
              for v in _positive(getattr(t, letter, None))]
    if layout_axis.range is not None and None not in layout_axis.range:
        values += [10 ** layout_axis.range[0], 10 ** layout_axis.range[1]]
    if not values:
        return
    low, high = min(values), max(values)
    if math.log10(high / low) >= 1.0:
        layout_axis.update(dtick=1, minor=dict(showgrid=False))
    else:  # less than a decade: 1, 2, 5 between the powers of ten
        layout_axis.update(dtick="D2")
    title = layout_axis.title.text if layout_axis.title else ""
    if "bytes" not in (title or ""):  # bytes keep SI prefixes (1G, not 1B); small plain numbers read best as such
        layout_axis.update(exponentformat="none" if low >= 1e-3 and high < 1e5 else "SI")


def _factor_legend(fig: go.Figure) -> bool:
    """Traces named 'a, b' whose marker symbol follows a and colour follows b (cuBLAS and Triton by symbol, N's
    divisibility by colour): one legend entry per a (its symbol, grey) and one per b (its colour)."""
    named = [t for t in fig.data if isinstance(t, go.Scatter) and t.showlegend is not False and t.name
             and ", " in t.name and isinstance(t.marker.color, str) and t.marker.symbol
             and trace_source(t.name)[0] is None and any(v is not None for v in (t.x or ()))]
    if len(named) < 4:
        return False
    pairs = [(t, *t.name.split(", ", 1)) for t in named]
    symbol, colour = {}, {}
    for t, a, b in pairs:
        if symbol.setdefault(a, t.marker.symbol) != t.marker.symbol or colour.setdefault(b, t.marker.color) != \
                t.marker.color:
            return False  # not a product of two encodings
    if len(symbol) < 2 or len(colour) < 2:
        return False
    for t, a, b in pairs:
        t.update(showlegend=False, legendgroup=b)
    for b, c in colour.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=b, legendgroup=b,
                                 marker=dict(color=c, size=10, symbol="circle")))
    for a, sym in symbol.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=a, legendgroup=f"symbol: {a}",
                                 marker=dict(color="#555555", size=10, symbol=sym)))
    return True


def _sources(fig: go.Figure) -> None:
    """Colour = implementation (Okabe-Ito), marker = GPU, and one legend: an entry per implementation and one per
    GPU, not one per implementation and GPU."""
    parsed = [(t, *trace_source(t.name)) for t in fig.data if isinstance(t, go.Scatter)]
    grouped = [(t, source, impl) for t, source, impl in parsed if source is not None and impl]
    sources = list(dict.fromkeys(source for _, source, _ in grouped))
    impls = list(dict.fromkeys(impl for _, _, impl in grouped))
    if len(sources) < 2 or not impls:
        return
    shapes = {}
    for t, source, _ in grouped:
        shapes.setdefault(source, set()).add(t.marker.symbol)
    if any(len(v) > 1 for v in shapes.values()):  # the page already spends the marker on something else
        return
    taken = {str(getattr(t.line, "color", None) or getattr(t.marker, "color", None) or "").lower()
             for t, source, _ in parsed if source is None}
    palette = [c for c in OKABE_ITO if c.lower() not in taken] or list(OKABE_ITO)
    colour = {impl: palette[i % len(palette)] for i, impl in enumerate(impls)}
    recorded = [s for s in sources if s not in ("model", "this GPU") and not s.startswith("model of ")]
    symbol = {"model": "circle-open", "this GPU": "circle"} | \
        {s: SOURCE_SYMBOLS[i % len(SOURCE_SYMBOLS)] for i, s in enumerate(recorded)}
    for s in sources:  # another GPU's model: its GPU's marker, open
        if s.startswith("model of "):
            symbol[s] = symbol.get(s[len("model of "):], "circle") + "-open"
    for t, source, impl in grouped:
        t.update(legendgroup=impl, showlegend=False)
        t.marker.update(color=colour[impl], symbol=symbol[source])
        if t.mode and "lines" in t.mode:
            t.line.update(color=colour[impl])
    for impl in impls:  # legend only: the implementation's colour
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines+markers", name=impl, legendgroup=impl,
                                 marker=dict(color=colour[impl], size=9), line=dict(color=colour[impl])))
    dashes = {t_source: t.line.dash for t, t_source, _ in grouped if t_source.startswith("model of ")}
    for source in sources:  # legend only: the GPU's marker, in grey
        model = source == "model" or source.startswith("model of ")
        dash = dashes.get(source, "dot")
        name = {"model": "model (dotted)", "this GPU": "measured now"}.get(source) or \
            (f"{source} ({dash})" if model else f"{source}, recorded")
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines+markers" if model else "markers", name=name,
                                 legendgroup=f"source: {source}",
                                 marker=dict(color="#555555", symbol=symbol[source], size=9),
                                 line=dict(color="#555555", dash=dash)))


def _one_entry_per_name(fig: go.Figure) -> None:
    seen = set()
    for t in fig.data:
        if not t.name or t.showlegend is False:
            continue
        if t.name in seen:
            t.update(showlegend=False)
        seen.add(t.name)
        t.update(legendgroup=t.legendgroup or t.name)


PLOT_PX = (800, 330)  # about the plot area of a full-width chart on a 1366 px screen: width, height


def _span(fig: go.Figure, axis: str):
    """(to_axis, low, high): how a value maps onto the axis (log10 on a log axis) and the range the data spans."""
    log = getattr(fig.layout, f"{axis}axis").type == "log"
    values = [v for t in fig.data if (getattr(t, f"{axis}axis", None) or axis) == axis
              for v in (_positive(getattr(t, axis, None)) if log else
                        [v for v in (getattr(t, axis, None) or ()) if isinstance(v, (int, float)) and v == v])]
    if not values:
        return None
    f = math.log10 if log else (lambda v: v)
    return f, f(min(values)), f(max(values))


def _markers(fig: go.Figure, xs, ys) -> list:
    """(x, y) of every marker drawn, each 0 to 1 across the data's range."""
    (fx, x0, x1), (fy, y0, y1) = xs, ys
    out = []
    for t in fig.data:
        if not isinstance(t, go.Scatter) or (t.mode and "markers" not in t.mode) or t.x is None or t.y is None:
            continue
        for x, y in zip(t.x, t.y):
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x == x and y == y:
                if (fx is math.log10 and x <= 0) or (fy is math.log10 and y <= 0):
                    continue
                out.append(((fx(x) - x0) / ((x1 - x0) or 1), (fy(y) - y0) / ((y1 - y0) or 1)))
    return out


def _place_labels(fig: go.Figure) -> None:
    """Each reference line's label where it covers the fewest markers and other labels, inside the plot: a horizontal
    line's at its left or right end, above or below it; a vertical line's at the top or bottom, left or right of it."""
    xs, ys = _span(fig, "x"), _span(fig, "y")
    points = _markers(fig, xs, ys) if xs and ys else []
    placed = []

    def cost(box) -> float:
        (bx0, bx1), (by0, by1) = box
        out = max(0.0, -bx0) + max(0.0, bx1 - 1) + max(0.0, -by0) + max(0.0, by1 - 1)
        hits = sum(bx0 - 0.01 <= px <= bx1 + 0.01 and by0 - 0.02 <= py <= by1 + 0.02 for px, py in points)
        crowd = sum(min(bx1, qx1) > max(bx0, qx0) and min(by1, qy1) > max(by0, qy0)
                    for (qx0, qx1), (qy0, qy1) in placed)
        return 1000 * out + 100 * crowd + hits

    for a in fig.layout.annotations:
        if a.showarrow is not False or not a.text:
            continue
        w, h = (7 * len(a.text) + 10) / PLOT_PX[0], 24 / PLOT_PX[1]
        if a.xref == "x" and a.yref in ("y domain", "paper") and xs:  # a vertical line's label, at its x
            xn = (a.x - xs[1]) / ((xs[2] - xs[1]) or 1)
            options = [dict(y=y, yanchor=ya, xanchor=xa) for y, ya in ((a.y, a.yanchor), (1, "top"), (0, "bottom"))
                       for xa in ("left", "right")]
            box = lambda o: ((xn, xn + w) if o["xanchor"] == "left" else (xn - w, xn),  # noqa: E731
                             (1 - h, 1) if o["y"] == 1 else (0, h))
        elif a.xref in ("x domain", "paper") and a.yref == "y" and ys:  # a horizontal line's label, at its y
            yn = (a.y - ys[1]) / ((ys[2] - ys[1]) or 1)
            options = [dict(x=x, xanchor=xa, yanchor=ya) for x, xa in ((1, "right"), (0, "left"))
                       for ya in ("bottom", "top")]
            box = lambda o: ((1 - w, 1) if o["x"] == 1 else (0, w),  # noqa: E731
                             (yn, yn + h) if o["yanchor"] == "bottom" else (yn - h, yn))
        else:
            continue
        best = min(options, key=lambda o: cost(box(o)))  # ties keep the first: the page's own choice
        a.update(**best, bgcolor="rgba(255,255,255,0.75)")  # legible over the grid behind it
        placed.append(box(best))


def house_style(fig: go.Figure) -> go.Figure:
    """The one chart style, applied in place (and returned)."""
    models_of_each_gpu(fig)
    if not _factor_legend(fig):  # a chart that spends colour and marker on two other things keeps them
        _sources(fig)
    _one_entry_per_name(fig)
    for name in [k for k in fig.layout.to_plotly_json() if re.match(r"^[xy]axis\d*$", k)] or ["xaxis", "yaxis"]:
        layout_axis = fig.layout[name]
        title = layout_axis.title.text if layout_axis.title else None
        if title:
            layout_axis.title.text = axis_words(title)
        _decades(fig, name)
    _place_labels(fig)
    return fig


def show(fig: go.Figure, **kwargs) -> None:
    """Draw a figure in the house style (Streamlit's own theme off: it would recolour the traces)."""
    import streamlit as st

    kwargs.setdefault("width", "stretch")
    st.plotly_chart(house_style(fig), theme=None, **kwargs)
