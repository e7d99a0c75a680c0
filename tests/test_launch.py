"""The launch-overhead lab: the chain against float64 (Triton interpreter and torch on CPU), the model
by hand, where the launch figures come from, a live run under `gpu`, and the page."""

import dataclasses
from pathlib import Path

import pytest
import torch

from labs import launch as ln
from labs.launch import kernels, measure, model
from labs.engine import timing
from labs.engine import gpu
from labs.engine import runner
from labs.engine.params import ParamError
from tests.conftest import render_page

ROOT = Path(__file__).resolve().parent.parent
H200 = gpu.datasheet_target(gpu.datasheet_by_name("H200"))
COSTS = {"eager_add": 4.0, "eager_matmul": 9.0, "eager_triton": 12.0, "graph_replay": 3.0, "graph_kernel": 1.0,
         "graph_fixed": 0.5, "round_trip": 20.0, "eager_stream_fixed": 3.0}


def toy_target(copy_tbps=1.0, fma_tflops=10.0, bf16=100.0):
    ceilings = gpu.Ceilings(copy_tbps=copy_tbps, fma_tflops=fma_tflops, matmul_tflops={"bf16": bf16})
    return dataclasses.replace(H200, ceilings=ceilings, key="toy-gpu", name="toy GPU")


# --- the chain's kernels ---------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 1023, 3 * kernels.FUSED_BLOCK + 5])
@pytest.mark.parametrize("k", [1, 2, 7, 64])
def test_fused_chain_matches_float64_on_odd_sizes(device, n, k):
    x = kernels.grid_input(n, device)
    y = torch.full_like(x, float("nan"))
    assert timing.check_close(kernels.chain_fused(x, y, k), kernels.chain_reference(x, k), "fp32", f"fused K={k}") == 0.0


@pytest.mark.parametrize("k", [1, 2, 5])
def test_eager_chain_matches_float64(device, k):
    x = kernels.grid_input(1001, device)
    y = torch.full_like(x, float("nan"))
    assert timing.check_close(kernels.chain_eager(x, y, k, sync_each=True), kernels.chain_reference(x, k), "fp32", "eager") == 0.0


def test_fused_check_catches_a_wrong_op_count(device):
    x = kernels.grid_input(500, device)
    with pytest.raises(timing.KernelMismatch):
        timing.check_close(kernels.chain_fused(x, torch.empty_like(x), 3), kernels.chain_reference(x, 2), "fp32", "K")


# --- the model, by hand ----------------------------------------------------------------------------
def test_chain_model_by_hand():
    t = toy_target(copy_tbps=1.0, fma_tflops=10.0)  # 1 TB/s: 8000 bytes take 0.008 us
    assert model.chain_us("eager", 10, 1000, COSTS, t) == pytest.approx(10 * 4.0)  # CPU-bound: K launches
    assert model.chain_us("graph", 10, 1000, COSTS, t) == pytest.approx(0.5 + 10 * 1.008)  # K kernels on the GPU
    assert model.chain_us("graph", 2, 1000, COSTS, t) == pytest.approx(3.0)  # the replay itself dominates
    assert model.chain_us("fused", 10, 1000, COSTS, t) == pytest.approx(12.0)  # one Triton launch
    assert model.chain_us("eager+item", 10, 1000, COSTS, t) == pytest.approx(10 * 20.008)
    # a big tensor makes every op GPU-bound: 1e6 floats read and written = 8 us per op at 1 TB/s
    assert model.chain_us("eager", 3, 10**6, COSTS, t) == pytest.approx(3 * 9.0)


def test_fit_rows_are_the_slope_of_the_points_both_measured_and_predicted():
    assert model.slope_us({1: 5.0, 2: 7.0, 4: 11.0, 8: 19.0}) == pytest.approx(2.0)  # 3 + 2 K
    t = toy_target(copy_tbps=1.0)
    params = ln.Params(experiments=("chain",), ks=(1, 2, 4, 8, 16), variants=("eager", "graph", "fused"))
    rows = {(r["experiment"], r["variant"]): r for r in model.model_rows(params, t, COSTS)}
    assert rows[("fit", "eager")]["predicted_us"] == pytest.approx(4.0)  # K launches of 4 us
    # the graph's flat start (the replay call, 3 us, dominates at K = 1 and 2) bends the slope below the
    # per-kernel 1.008 us, exactly as it bends a measured slope: both are read off the points the same way
    graph = {k: model.chain_us("graph", k, params.elements, COSTS, t) for k in params.ks}
    assert rows[("fit", "graph")]["predicted_us"] == pytest.approx(model.slope_us(graph))
    assert ("fit", "fused") not in rows
    # a point timed with its own figure: the fit predicted off the points as re-predicted
    probes = [{"experiment": "probe", "variant": k, "measured_us": v} for k, v in COSTS.items()]
    own = [{"experiment": "chain", "variant": "eager", "k": k, "size": params.elements, "measured_us": 1.0,
            "probe_us": 4.0 if k < 16 else 6.0} for k in params.ks]
    recording = {"params": {"experiments": ["chain"], "ks": list(params.ks), "variants": ["eager"]},
                 "rows": probes + own}
    fit = next(r for r in model.repredict(recording, t) if r["experiment"] == "fit")
    assert fit["predicted_us"] == pytest.approx(model.slope_us({1: 4.0, 2: 8.0, 4: 16.0, 8: 32.0, 16: 96.0}))


def test_regimes_by_hand():
    t = toy_target(copy_tbps=1.0, bf16=100.0)
    terms = model.regime_terms("add", 10**6, COSTS, t)
    assert terms["memory"] == pytest.approx(8.0) and terms["overhead"] == 4.0
    assert max(terms, key=terms.get) == "memory"
    assert model.regime_us("add", terms, COSTS) == pytest.approx(3.0 + 8.0)  # a streaming kernel's fixed cost
    tiny = model.regime_terms("add", 16, COSTS, t)
    assert max(tiny, key=tiny.get) == "overhead" and model.regime_us("add", tiny, COSTS) == 4.0
    big = model.regime_terms("matmul", 4096, COSTS, t)  # 2 * 4096^3 FLOP at 100 TFLOP/s
    assert big["compute"] == pytest.approx(2 * 4096**3 / 100e12 * 1e6)
    assert big["memory"] == pytest.approx(3 * 4096**2 * 2 / 1e12 * 1e6)
    assert max(big, key=big.get) == "compute"
    assert model.regime_us("matmul", big, COSTS) == pytest.approx(1.0 + big["compute"])  # a tiny kernel's fixed cost


def test_default_sweep_spans_three_regimes_on_a_real_gpu_model():
    rows = model.model_rows(ln.Params(experiments=("regimes",)), H200, COSTS)
    assert {r["predicted_regime"] for r in rows} == {"overhead", "memory", "compute"}
    adds = [r for r in rows if r["variant"] == "add"]
    assert adds[0]["predicted_regime"] == "overhead" and adds[-1]["predicted_regime"] == "memory"
    assert [r["size"] for r in adds][:3] == [1, 2, 4] and adds[-1]["size"] == 256 * 2**20 // 4


def test_launch_figures_are_flagged_until_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE", str(tmp_path))
    t = toy_target()
    assert model.launch_costs(t)["source"].startswith("assumed")
    assert all(r["launch_figures"].startswith("assumed") for r in model.predict(ln.Params(), t))
    measured = {name: 2.0 + i for i, name in enumerate(model.PROBES)}
    measure.remember_probes(t.key, measured, t.name)
    try:
        costs = model.launch_costs(t)
        assert costs["source"] == "measured in this run" and costs["eager_add"] == 2.0
        del model._PROBED[t.key]  # a later session reads them back from the cache file
        costs = model.launch_costs(t)
        assert costs["source"].startswith("measured on this machine") and costs["round_trip"] == measured["round_trip"]
    finally:
        model._PROBED.pop(t.key, None)


def test_headline_row_is_in_the_default_prediction():
    measured, predicted = ln.LAB.headline.answer(model.model_rows(ln.Params(), H200, COSTS))
    assert measured is None and predicted == pytest.approx(64 * 4.0)


def test_check_refuses_regime_sizes_that_do_not_fit():
    small = dataclasses.replace(H200, memory_bytes=2 * 10**9)
    with pytest.raises(ParamError, match="add_max_mib"):
        measure.check(ln.Params(add_max_mib=4096), small)


def test_model_only_run_works_without_a_gpu():
    result = runner.model(ln.LAB, ln.Params(), H200)
    assert {r["experiment"] for r in result.rows} == {"chain", "fit", "regimes"}


# --- on the GPU --------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_live_run_measures_launch_costs_and_graphs_remove_most_of_them():
    params = ln.Params(ks=(1, 16, 64), add_max_mib=16, matmul_max_n=512)
    result = runner.run(ln.LAB, params, use_cache=False)
    rows = {(r["experiment"], r["variant"], r["k"]): r for r in result.rows}
    probe = {name: rows[("probe", name, None)]["measured_us"] for name in model.PROBES}
    assert 0.5 < probe["eager_add"] < 50 and probe["graph_kernel"] < probe["eager_add"]
    eager, graph = rows[("chain", "eager", 64)], rows[("chain", "graph", 64)]
    assert graph["measured_us"] < 0.6 * eager["measured_us"]
    assert eager["launch_figures"] == "measured in this run"
    # A sanity bound, not the accuracy claim (that is in the recordings, within a few %): the CPU's launch
    # cost drifts by 30 % and more between the probe and the chain inside one run on a shared host
    # (seen on the H200 device: -30.8 % and +46.9 % in test runs, +5.5 % in the recording run).
    assert abs(eager["error_pct"]) < 60
    assert all(r["check_rel_error"] == 0.0 for r in result.rows if r["experiment"] == "chain")


# --- the page ------------------------------------------------------------------------------------------
def test_page_renders_model_and_charts_without_a_gpu():
    at = render_page("launch.py", timeout=60)
    assert at.title[0].value == ln.LAB.title
    specs = " ".join(c.proto.spec for c in at.get("plotly_chart"))
    assert "eager" in specs and "graph" in specs and "overhead" in specs
    if not torch.cuda.is_available():
        assert any("Live runs are off" in i.value for i in at.info)


def test_each_group_uses_its_own_re_measured_launch_figure():
    """The CPU-side cost drifts on a shared host: a group re-measured just before it runs uses that figure."""
    costs = dict(COSTS) | {"eager_add@regimes-add": 9.0}
    assert model.group_costs(costs, "regimes-add")["eager_add"] == 9.0
    assert model.group_costs(costs, "chain-eager")["eager_add"] == COSTS["eager_add"]  # not re-measured there
    assert model.group_costs(costs, "chain-graph") is costs  # no re-measured replay figure in these costs
    rows = model.model_rows(ln.Params(), H200, costs)
    add1 = next(r for r in rows if r["experiment"] == "regimes" and r["variant"] == "add" and r["size"] == 1)
    eager1 = next(r for r in rows if r["experiment"] == "chain" and r["variant"] == "eager" and r["k"] == 1)
    assert add1["predicted_us"] == pytest.approx(9.0)
    assert eager1["predicted_us"] == pytest.approx(max(COSTS["eager_add"], COSTS["graph_kernel"] + 8 * 4096 / (
        H200.ceilings.copy_tbps * 1e12) * 1e6))


def test_a_point_timed_with_its_own_figure_is_predicted_from_it():
    """Each point is timed in turns with the CPU figure it depends on; its prediction uses that figure."""
    t = toy_target(copy_tbps=1.0)
    c = model.point_costs(COSTS, "chain-eager", 6.0)
    assert c["eager_add"] == 6.0 and c["round_trip"] == COSTS["round_trip"]
    assert model.chain_us("eager", 10, 1000, c, t) == pytest.approx(60.0)
    assert model.point_costs(COSTS, "chain-graph", 5.0)["graph_replay"] == 5.0
    assert model.chain_us("graph", 1, 1000, model.point_costs(COSTS, "chain-graph", 5.0), t) == pytest.approx(5.0)
    assert model.point_costs(COSTS, "chain-eager", None) is COSTS


def test_repredict_uses_the_recorded_probes_and_each_points_own_figure():
    t = toy_target(copy_tbps=1.0)
    params = ln.Params(experiments=("chain",), ks=(4,), variants=("eager", "graph"))
    probes = [{"experiment": "probe", "variant": k, "measured_us": v} for k, v in COSTS.items()]
    recording = {"params": {"experiments": ["chain"], "ks": [4], "variants": ["eager", "graph"]}, "rows": probes + [
        {"experiment": "chain", "variant": "eager", "k": 4, "size": params.elements, "measured_us": 30.0,
         "probe_us": 7.5},
        {"experiment": "chain", "variant": "graph", "k": 4, "size": params.elements, "measured_us": 5.0}]}
    rows = {(r["experiment"], r["variant"], r["k"]): r for r in model.repredict(recording, t)}
    assert rows[("chain", "eager", 4)]["predicted_us"] == pytest.approx(4 * 7.5)  # its own figure, not 4.0
    assert rows[("chain", "graph", 4)]["predicted_us"] == pytest.approx(model.chain_us("graph", 4, params.elements,
                                                                                    COSTS, t))


def test_a_row_records_the_figures_it_reports_not_its_rounds():
    """paired_us times a point and its probe in many short rounds; the row's spread over the passes must be that of
    the medians it reports, so the rounds' own timings are kept from the row and own_time records its figures."""
    with timing.collecting() as timed, timing.in_pass(0, {}):
        us, probe_us = measure.paired_us(lambda: None, lambda: None, 1, budget_ms=2.0)
        assert timed.take() == []
        measure.own_time(us, probe_us)
        assert [t.samples_ms for t in timed.take()] == [[us * 1e-3], [probe_us * 1e-3]]
