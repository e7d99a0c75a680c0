"""Charts draw the model of every GPU whose points they show (ui/charts.py, models_of_each_gpu): an H200's points
beside the H100's model alone would read as model error."""

import plotly.graph_objects as go
import pytest

from labs.engine import gpu as gpu_mod
from labs.engine import runner
from labs.engine.repredict import with_current_model_or_recorded
from labs.engine.results import list_recorded
from labs.roofline import LAB
from ui import charts

H100, H200 = "nvidia-h100-80gb-hbm3", "nvidia-h200"


def _recordings() -> list:
    """The roofline lab's committed recordings of an H100 and an H200, re-predicted as a lab page shows them."""
    found = {r.meta["gpu"]["key"]: with_current_model_or_recorded(LAB, r) for r in list_recorded(LAB.name)}
    if H100 not in found or H200 not in found:
        pytest.skip("needs the roofline recordings of an H100 and an H200 (content/recorded/)")
    return [found[H100], found[H200]]


def _chart(model_gpu, recorded: list) -> go.Figure:
    """A lab page's chart: the model of `model_gpu` (a datasheet row), the recordings' points."""
    target = gpu_mod.datasheet_target(model_gpu)
    model = runner.model(LAB, LAB.Params(**{k: tuple(v) if isinstance(v, list) else v
                                            for k, v in recorded[0].params.items()}), target)
    fig = charts.figure("roofline", "intensity_flop_per_byte", "TFLOP/s", log_x=True, log_y=True)
    for dtype in ("fp32", "bf16"):
        charts.overlay(fig, model, None, recorded, "intensity_flop_per_byte", "tflops", dtype, {"dtype": dtype})
    return charts.house_style(fig)


def _models(fig: go.Figure) -> dict:
    """{source: [traces]} of the model traces drawn with data (the legend's own entries left out)."""
    found = {}
    for t in fig.data:
        source, impl = charts.trace_source(t.name)
        if source and source.startswith("model") and t.x and t.x[0] is not None:
            found.setdefault(source, []).append(t)
    return found


def _gpu_name(result) -> str:
    return result.meta["gpu"]["name"]


def test_a_chart_of_two_recorded_gpus_draws_each_gpus_model():
    h100, h200 = _recordings()
    other = next(row for row in gpu_mod.DATASHEET if "A100" in row.name)
    fig = _chart(other, [h100, h200])  # a third GPU's model on the page: neither recording's
    models = _models(fig)
    assert set(models) == {"model", f"model of {_gpu_name(h100)}", f"model of {_gpu_name(h200)}"}
    for gpu in (h100, h200):
        traces = models[f"model of {_gpu_name(gpu)}"]
        assert sorted(charts.trace_source(t.name)[1] for t in traces) == ["bf16", "fp32"]  # one per series
        # the line is that GPU's own model: its recording's predicted values, point for point
        fp32 = next(t for t in traces if t.name.endswith("fp32"))
        rows = [r for r in gpu.rows if r["dtype"] == "fp32" and r.get("predicted_tflops") is not None]
        assert list(fp32.y) == pytest.approx([r["predicted_tflops"] for r in rows])
    # one dash per GPU, the chart's own model dotted; the colour is the series' (fp32's model lines share it)
    dashes = {source: {t.line.dash for t in traces} for source, traces in models.items()}
    assert dashes["model"] == {"dot"} and all(len(d) == 1 for d in dashes.values())
    assert len({d.pop() for d in dashes.values()}) == 3
    colours = {t.line.color for traces in models.values() for t in traces if t.name.endswith("fp32")}
    assert len(colours) == 1
    # the legend names each GPU's model
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert any(name.startswith(f"model of {_gpu_name(h200)}") for name in legend)
    assert any(name.startswith(f"model of {_gpu_name(h100)}") for name in legend)


def test_the_gpu_the_chart_models_gets_no_second_line():
    h100, h200 = _recordings()
    sheet = gpu_mod.datasheet_for(_gpu_name(h200))
    fig = _chart(sheet, [h200])  # the H200's model drawn, the H200's points: nothing to add
    assert set(_models(fig)) == {"model"}  # the page's H200 model and the recording's agree within 2 %
    fig = _chart(sheet, [h100, h200])
    assert f"model of {_gpu_name(h100)}" in _models(fig)  # the H100's points get the H100's model
