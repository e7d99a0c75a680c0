"""The class page's two charts: the class's kernels on the roofline (or bandwidth) beside the model, our kernel and
the library; and the prediction poll's histogram against the model's and the measured answer."""

from __future__ import annotations

import html
import math

import plotly.graph_objects as go

from ui import charts

REFERENCE_STYLE = {"model": charts.MODEL_STYLE | {"mode": "markers"}, "our kernel": charts.RECORDED_STYLE,
                   "library": charts.RECORDED_STYLE}


def class_chart(points: list[dict], refs: list[dict], metric: str, target, exercise: str) -> go.Figure:
    """Roofline (FLOP/s against FLOP/byte) when the exercise does arithmetic, else achieved TB/s per point."""
    everything = points + refs
    if everything and all((p.get("intensity") or 0) > 0 for p in everything):
        fig = charts.figure(f"{exercise}: the class on the roofline of the {target.name}",
                            "arithmetic intensity (FLOP/byte)", "TFLOP/s", log_x=True, log_y=True)
        peak = target.ceilings.matmul_tflops.get("fp16") or target.ceilings.fma_tflops
        lo = min(p["intensity"] for p in everything) / 32
        hi = max(p["intensity"] for p in everything) * 32
        xs = [lo * (hi / lo) ** (k / 60) for k in range(61)]
        fig.add_trace(go.Scatter(x=xs, y=[min(peak, x * target.ceilings.copy_tbps) for x in xs], name="roof",
                                 mode="lines", line=dict(color="black")))
        x, y = "intensity", "tflops"
    else:
        fig = charts.figure(f"{exercise}: the class's achieved bandwidth on the {target.name}", "point", "TB/s")
        charts.reference_line(fig, target.ceilings.copy_tbps, f"copy ceiling {target.ceilings.copy_tbps:.2f} TB/s",
                              line=dict(dash="dash", color="gray"))
        x, y = "point", "tbps"
    for who in ("model", "our kernel", "library"):
        rows = [r for r in refs if r["who"] == who and r.get(y) is not None]
        if rows:
            fig.add_trace(go.Scatter(x=[r[x] for r in rows], y=[r[y] for r in rows], name=who,
                                     text=[r["point"] for r in rows], **REFERENCE_STYLE[who]))
    if points:
        fig.add_trace(go.Scatter(x=[p[x] for p in points], y=[p[y] for p in points], name="the class",
                                 mode="markers", marker=dict(size=11, opacity=0.8),
                                 text=[html.escape(f"{p['who']} ({p['point']})") for p in points],  # plotly reads tags
                                 hovertemplate="%{text}: %{y:.3g}<extra></extra>"))
    return fig


def poll_chart(question: dict) -> go.Figure:
    """The class's answers as a histogram, the model's and the measured answer as lines."""
    unit = question["unit"]
    fig = charts.figure(question["question"], f"answer ({unit})", "learners")
    fig.add_trace(go.Histogram(x=question["guesses"], name="the class", nbinsx=20))
    for value, label, color in ((question.get("model"), "model", "royalblue"),
                                (question.get("measured"), "measured", "firebrick")):
        if value is not None:
            charts.reference_line(fig, value, f"{label}: {value:.4g} {unit}", axis="x",
                                  line=dict(color=color, dash="dash"))
    values = question["guesses"] + [v for v in (question.get("model"), question.get("measured")) if v is not None]
    pad = 0.08 * ((max(values) - min(values)) or abs(max(values)) or 1.0)
    fig.update_xaxes(range=[min(values) - pad, max(values) + pad])
    fig.update_layout(bargap=0.05)
    return fig


def fmt(value, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}g}"
