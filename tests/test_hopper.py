"""Tests of the Hopper matmul anatomy lab (labs/hopper/, pages/hopper.py).

On CPU every Triton step's kernel runs in Triton's interpreter on small odd shapes against float64 (TMA
descriptors included); the Gluon step (warp-specialized) cannot run there, and the tests check that it is left out
with a note; the model is checked against numbers worked out by hand; the page renders from the model and the
recordings alone. The timed steps, the Gluon kernel and the PTX need a Hopper GPU (marked `gpu`).
"""

import dataclasses
import json
import math
import time
from pathlib import Path

import pytest
import torch

from labs import hopper as hp
from labs.hopper import gluon_support, kernels, measure, model
from labs.matmul import configs
from labs.engine import timing
from labs.engine import gpu
from labs.engine.gpu import Ceilings, Target
from labs.engine import repredict
from labs.engine.params import ParamError, from_strings
from labs.engine.results import Result
from labs.matmul import model as matmul_model

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(block=(16, 32, 16), num_warps=4, programs=3)  # small tiles: several per program even on tiny shapes


def toy_target(cc="9.0", memory_gb=80) -> Target:
    """100 SMs at 1 GHz (FP32 FMA = 100 x 128 x 2 x 1e9 = 25.6 TFLOP/s), bf16 tensor cores at
    409.6 TFLOP/s (4096 FLOP per clock per SM), DRAM at 2 TB/s, 50 MB of L2."""
    ceilings = Ceilings(copy_tbps=2.0, fma_tflops=25.6, matmul_tflops={"bf16": 409.6, "fp16": 409.6}, source="test")
    return Target("Toy GPU", "toy", 100, int(50e6), int(memory_gb * 1e9), cc, ceilings, None, live=False)


# ---------------------------------------------------------------------------------------------
# Every step's kernel in the interpreter (or on the GPU)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("step", model.STEPS)
def test_every_step_matches_float64_on_odd_shapes(step, device):
    sw = model.STEPS[step]
    if sw.warp_specialize and gluon_support.unavailable_reason(gluon_support.device_capability(device)):
        pytest.skip("the Gluon step needs a Hopper GPU and Gluon (its hiding is tested below)")
    m, n, k = (45, 48, 80) if sw.tma else (37, 45, 51)  # TMA: rows on 16-byte boundaries; else all odd
    a, b = timing.random_tensor((m, k), "bf16", device), timing.random_tensor((k, n), "bf16", device)
    out = torch.full((m, n), float("nan"), device=device, dtype=a.dtype)
    kw = SMALL if device == "cpu" else {}
    kernels.anatomy_matmul(a, b, sw, out, **kw)
    timing.check_close(out, measure.reference(a, b), "bf16", step)


@pytest.mark.parametrize("sw", model.BEST_CANDIDATES, ids=lambda sw: sw.config_label)
def test_every_best_candidate_matches_float64_at_its_own_tile_shape(sw, device):
    """The candidates of the best-configuration step, with their real tiles (128 x 256 or 256 x 128) on a
    shape with partial tiles in every direction and a partial last K slice; persistent ones with two
    programs, so each walks several tiles (the flattened loop crosses from one tile to the next)."""
    m, n, k = 301, 520, 136
    a, b = timing.random_tensor((m, k), "bf16", device), timing.random_tensor((k, n), "bf16", device)
    out = torch.full((m, n), float("nan"), device=device, dtype=a.dtype)
    kernels.anatomy_matmul(a, b, sw, out, programs=2 if sw.persistent else None)
    timing.check_close(out, measure.reference(a, b), "bf16", sw.config_label)
    assert model.step_candidates(model.BEST_STEP) == model.BEST_CANDIDATES and model.BEST_STEP in model.STEP_NAMES


def test_the_probe_that_measure_runs_first(device):
    """usable_configs -> probe_check, as measure calls them: the 517 x 528 x 560 probe at the real tile
    shape, a persistent step on 3 programs (each walks several of the 15 tiles)."""
    ok, notes = measure.usable_configs("6 Hilbert order", "bf16", device)
    assert ok == [model.STEPS["6 Hilbert order"]] and notes == []


@pytest.mark.parametrize("tma,persistent", [(False, True), (True, False)])
def test_fp16_and_a_wrong_reference_fails(tma, persistent, device):
    sw = model.Switches(tma, 2, persistent, "hilbert", False)
    a, b = timing.random_tensor((33, 48, ), "fp16", device), timing.random_tensor((48, 64), "fp16", device)
    out, _ = kernels.anatomy_matmul(a, b, sw, **(SMALL if device == "cpu" else {}))
    timing.check_close(out, measure.reference(a, b), "fp16", "fp16")
    with pytest.raises(timing.KernelMismatch):  # the check is not vacuous
        timing.check_close(out, measure.reference(a, b.flip(1)), "fp16", "flipped")


def test_tma_refuses_unaligned_rows(device):
    a, b = timing.random_tensor((9, 7), "bf16", device), timing.random_tensor((7, 5), "bf16", device)
    with pytest.raises(ParamError, match="16-byte"):
        kernels.anatomy_matmul(a, b, model.STEPS["3 TMA"], **(SMALL if device == "cpu" else {}))


# ---------------------------------------------------------------------------------------------
# Tile orders
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", model.ORDERS)
@pytest.mark.parametrize("shape", [(7, 5), (4, 4), (1, 9), (64, 32)])
def test_every_order_visits_every_tile_once(order, shape):
    tiles = model.tile_order(order, *shape)
    assert sorted(tiles) == [(i, j) for i in range(shape[0]) for j in range(shape[1])]


def test_hilbert_steps_to_a_neighbour_on_a_square():
    tiles = model.tile_order("hilbert", 8, 8)
    assert all(abs(i0 - i1) + abs(j0 - j1) == 1 for (i0, j0), (i1, j1) in zip(tiles, tiles[1:]))
    assert tiles[:4] == ((0, 0), (1, 0), (1, 1), (0, 1)) or tiles[:4] == ((0, 0), (0, 1), (1, 1), (1, 0))


def test_dram_bytes_by_hand():
    # N = 1024 bf16: tiles 8 x 4 of 128 x 256. A + B = 4 MiB; with an L2 of 1 MB they do not fit.
    n, e = 1024, 2
    # row-major, 8 slots: wave 1 = tile row 0 and 1 (4 columns each): 2 A panels + 4 B panels, and so on
    # for 4 waves: 4 x (2 x 128 + 4 x 256) x 1024 x 2 bytes, plus C once
    expected = 4 * (2 * 128 + 4 * 256) * n * e + n * n * e
    assert model.dram_bytes("row-major", n, "bf16", 8, int(1e6)) == expected
    # a 2 x 4 wave is the same for grouped with GROUP_M = 8 (8 rows x 1 column): 8 A panels + 1 B panel
    assert model.dram_bytes("grouped", n, "bf16", 8, int(1e6)) == 4 * (8 * 128 + 1 * 256) * n * e + n * n * e
    # everything fits in a 50 MB L2: A and B once, C once
    assert model.dram_bytes("hilbert", n, "bf16", 8, int(50e6)) == 3 * n * n * e


def test_grouped_and_hilbert_fetch_less_than_row_major_at_8192():
    t = toy_target()
    slots = t.sm_count
    rm, gr, hb = (model.dram_bytes(o, 8192, "bf16", slots, t.l2_bytes) for o in model.ORDERS)
    assert hb < rm and gr < rm


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
def test_step_times_by_hand():
    t = toy_target()  # clock = 25.6e12 / (100 x 256) = 1 GHz; no recording: the ceiling at every N
    bf16 = model.step_times(model.STEPS["1 baseline"], "bf16", t, 4096)
    # math: 2 x 128 x 256 x 64 FLOPs at 409.6e12 / 100 per SM = 1.024 us
    assert bf16["math_s"] == pytest.approx(2 * 128 * 256 * 64 / 4.096e12)
    assert bf16["latency_s"] == pytest.approx(model.HBM_LATENCY_CYCLES * 1e-9)
    # one stage of pointer loads: (128 + 256) x 64 x 2 bytes into registers, then into shared memory,
    # each at 128 bytes per clock: 768 ns
    assert bf16["operand_s"] == pytest.approx(2 * (128 + 256) * 64 * 2 / 128 * 1e-9)
    # one stage: load, wait, multiply in series
    assert bf16["slice_s"] == pytest.approx(bf16["math_s"] + bf16["latency_s"] + bf16["operand_s"])
    piped = model.step_times(model.STEPS["2 pipeline"], "bf16", t, 4096)
    operand = (128 + 256) * 64 * 2 / 128 * 1e-9  # cp.async: straight into shared memory, 384 ns
    assert piped["operand_s"] == pytest.approx(operand)
    assert piped["slice_s"] == pytest.approx(max(bf16["math_s"], operand, (bf16["latency_s"] + operand) / 2))
    # per-tile edges: one program per tile pays fill and drain (the C tile, 64 KiB at 128 bytes per clock),
    # persistent the fill, warp-specialized or flattened none
    drain = 128 * 256 * 2 / 128 * 1e-9
    assert piped["edges_s"] == pytest.approx(bf16["latency_s"] + operand + drain)
    assert model.step_times(model.STEPS["5 persistent"], "bf16", t)["edges_s"] == pytest.approx(bf16["latency_s"] + operand)
    assert model.step_times(model.STEPS["7 warp-specialized"], "bf16", t)["edges_s"] == 0
    assert model.step_times(model.BEST_CANDIDATES[3], "bf16", t)["edges_s"] == 0  # flattened


def _with_datasheet(target: Target, bf16_tflops: float) -> Target:
    """The target with a datasheet whose bf16 rate is `bf16_tflops` (the toy GPU has none)."""
    sheet = dataclasses.replace(gpu.datasheet_by_name("H100 SXM"), name="Toy sheet", bf16_tflops=bf16_tflops)
    return dataclasses.replace(target, datasheet=sheet)


def test_unthrottled_math_settles_where_power_is_that_of_full_duty():
    """Busy a fraction f of the time at a clock b times cuBLAS's, the tensor cores draw f b^3 of cuBLAS's power:
    the answer's clock makes that 1, unless the datasheet's clock caps it first."""
    math_s, wait_s = 1.0, 2.0
    fast = model.unthrottled_math_s(math_s, wait_s, headroom=10.0)
    boost = math_s / fast
    busy = fast / (fast + wait_s)
    assert boost > 1.2 and busy * boost**matmul_model.POWER_CLOCK_EXPONENT == pytest.approx(1.0, rel=1e-6)
    assert model.unthrottled_math_s(math_s, wait_s, headroom=1.1) == pytest.approx(math_s / 1.1)  # the cap
    assert model.unthrottled_math_s(math_s, 0.0, headroom=10.0) == pytest.approx(math_s)  # never idle: no boost
    assert model.unthrottled_math_s(math_s, wait_s, headroom=0.5) == pytest.approx(math_s)  # never slower


def test_one_stage_waits_the_probed_latency_and_its_idle_tensor_cores_clock_up(monkeypatch):
    """Step 1: each slice pays the latency the Matmul lab's probe measured (not the published cycles, three times
    shorter than a real load), then the math at the clock the power cap allows tensor cores that mostly wait."""
    t = _with_datasheet(toy_target(), 600.0)  # the toy's cuBLAS rate is 409.6: headroom 1.46
    monkeypatch.setitem(matmul_model._LATENCY_PROBED, t.key, 0.8)
    base = model.step_times(model.STEPS["1 baseline"], "bf16", t, 4096)
    assert base["latency_s"] == pytest.approx(0.8e-6)
    at_cublas = 2 * 128 * 256 * 64 / 4.096e12  # 1.024 us at 409.6 TFLOP/s over 100 SMs
    assert base["math_s"] == pytest.approx(model.unthrottled_math_s(at_cublas, 0.8e-6 + base["operand_s"], 600 / 409.6))
    # busy about a third of the time, they would clock ~1.5 x higher: the datasheet's rate caps it
    assert base["math_s"] == pytest.approx(at_cublas * 409.6 / 600)
    assert base["slice_s"] == pytest.approx(base["math_s"] + 0.8e-6 + base["operand_s"])
    piped = model.step_times(model.STEPS["2 pipeline"], "bf16", t, 4096)  # busy all the time: cuBLAS's rate
    assert piped["math_s"] == pytest.approx(at_cublas) and piped["latency_s"] == pytest.approx(0.8e-6)
    monkeypatch.delitem(matmul_model._LATENCY_PROBED, t.key)
    assert model.load_latency(t)[0] == pytest.approx(model.HBM_LATENCY_CYCLES * 1e-9)  # nothing probed: published


def test_load_latency_comes_from_the_runs_passes_then_the_matmul_probe_then_one_reading(monkeypatch):
    """A run's latency is its own where the rows carry the median of its passes' probes; a run that probed once
    (one difference of two ~6 us timings) yields to the Matmul lab's probe of the GPU kind, and is used only where
    that lab never probed it; with nothing probed, the published cycles."""
    t = toy_target()
    monkeypatch.setattr(matmul_model, "_LATENCY_PROBED", {})
    monkeypatch.setattr(model, "recorded_load_latency_us", lambda key: 0.8 if key == t.key else None)

    def latency_us(run_latency):
        token = model._RUN_LATENCY_US.set(run_latency)
        try:
            return model.load_latency(t)[0] * 1e6
        finally:
            model._RUN_LATENCY_US.reset(token)

    assert latency_us((0.5, True)) == pytest.approx(0.5)  # the median of the run's passes: the run's own
    assert latency_us((0.3, False)) == pytest.approx(0.8)  # one reading: the Matmul lab's recorded probe
    monkeypatch.setitem(matmul_model._LATENCY_PROBED, t.key, 0.7)
    assert latency_us((0.3, False)) == pytest.approx(0.7)  # ... or its probe in this process
    monkeypatch.setattr(matmul_model, "_LATENCY_PROBED", {})
    monkeypatch.setattr(model, "recorded_load_latency_us", lambda key: None)
    assert latency_us((0.3, False)) == pytest.approx(0.3)  # never probed by the Matmul lab: the one reading
    assert latency_us(None) == pytest.approx(model.HBM_LATENCY_CYCLES / 1e3)  # toy clock 1 GHz: 480 cycles


def test_repredict_reads_whether_the_runs_latency_is_a_median_of_passes():
    """A recording whose rows say their latency is the median of the passes' probes is re-predicted with it; the
    same figure without that mark (one reading) is not, and the probe is not left behind for the next run."""
    from labs.matmul.rates import recorded_load_latency_us

    h200 = json.loads((ROOT / "content" / "recorded" / "nvidia-h200" / "hopper.json").read_text())
    target = repredict.recorded_target(h200["meta"])
    recorded = recorded_load_latency_us(target.key)
    if recorded is None:
        pytest.skip("no H200 matmul recording with a probed load latency")
    params = repredict.recorded_params(hp.LAB, h200["params"])
    step1 = lambda rec: next(r for r in model.repredict(rec, target, params)  # noqa: E731
                             if r["step"] == "1 baseline" and r["n"] == 8192)
    rows_with = lambda **kw: {**h200, "rows": [{**r, **kw} for r in h200["rows"]]}  # noqa: E731
    matmul_probe = step1(rows_with(load_latency_us=recorded, load_latency_each_pass=True))
    once = step1(rows_with(load_latency_us=2 * recorded, load_latency_each_pass=False))
    passes = step1(rows_with(load_latency_us=2 * recorded, load_latency_each_pass=True))
    assert once["predicted_ms"] == pytest.approx(matmul_probe["predicted_ms"])  # one reading yields
    assert passes["predicted_ms"] > matmul_probe["predicted_ms"]  # a median of passes is the run's own
    assert model.load_latency(target)[0] == pytest.approx(recorded * 1e-6)  # and is not left behind


def test_measure_probes_the_latency_every_pass_and_keeps_its_timings_off_the_rows(monkeypatch):
    """The run probes the load latency (the Matmul lab's probe) in every pass, so that the merged rows carry the
    median of the passes' readings; the probe's own timings must not land on the first row (its spread would mix
    the probe's kernels with cuBLAS's)."""
    t = toy_target()
    readings = iter([0.75, 0.3])
    calls = []

    def fake_probe(target):
        calls.append(target.key)
        timing.record_samples([0.01, 0.02, 0.03])  # what the real probe's timers hand the collector
        matmul_model._LATENCY_PROBED[target.key] = next(readings)
        return 5.0

    monkeypatch.setattr(measure, "probe_floor_us", fake_probe)
    monkeypatch.setattr(matmul_model, "_LATENCY_PROBED", {})
    with timing.collecting() as rows_timed:
        assert measure.probed_load_latency_us(t) == 0.75
        assert measure.probed_load_latency_us(t) == 0.3  # probed again: each pass reads its own
    assert calls == ["toy", "toy"] and rows_timed.take() == []


def test_passes_merge_the_latency_readings_into_their_median():
    """Five passes' rows, each with its own probe reading, merge into one row whose latency is their median:
    a reading 2.4 times low in one pass does not move it."""
    from labs.engine import passes

    readings = [0.80, 0.32, 0.79, 0.82, 0.78]
    merged = passes.merge_values(readings)
    assert merged == pytest.approx(0.79)  # sorted 0.32 0.78 [0.79] 0.80 0.82
    assert passes.merge_values([True] * 5) is True  # the mark every pass sets stays as it is


@pytest.mark.parametrize("gpu_key", ["nvidia-h100-80gb-hbm3", "nvidia-h200"])
def test_every_recorded_step_is_within_15_pct_of_the_model(gpu_key):
    """Issue 30: on both GPU kinds every step, the one-stage step included, stays within 15 % of its model."""
    path = ROOT / "content" / "recorded" / gpu_key / "hopper.json"
    if not path.exists():
        pytest.skip(f"no {gpu_key} recording")
    result = Result.from_json(path.read_text())
    shown = repredict.with_current_model(hp.LAB, result)
    errors = {(r["step"], r["n"]): r["error_pct"] for r in shown.rows if r.get("error_pct") is not None}
    assert errors and all(abs(e) <= repredict.WITHIN_PCT for e in errors.values()), errors


def test_tensor_core_rate_is_cublas_at_the_same_n_where_recorded():
    """The rate comes from the matmul lab's recording of this GPU kind at this N, else the ceiling."""
    from labs.engine.results import list_recorded

    t = gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM"))
    recorded = {(r["dtype"], r["n"]): r["measured_tflops"] for res in list_recorded("matmul")
                if res.meta["gpu"]["key"] == t.key for r in res.rows if r.get("kernel") == "cublas"}
    if ("bf16", 4096) not in recorded:
        pytest.skip("no H100 matmul recording with cuBLAS at N = 4096")
    rate, source = model.tensor_core_tflops(4096, "bf16", t)
    assert rate == pytest.approx(recorded[("bf16", 4096)]) and "4096" in source
    assert model.tensor_core_tflops(5000, "bf16", t)[0] == t.ceilings.matmul_tflops["bf16"]  # never recorded
    assert model.tensor_core_tflops(4096, "bf16", toy_target())[0] == 409.6
    cublas = [r for r in hp.predict(hp.Params(sizes=(4096,)), t) if r["step"] == "cuBLAS"][0]
    assert cublas["predicted_tflops"] == pytest.approx(recorded[("bf16", 4096)])


def test_best_step_predicts_its_fastest_candidate():
    t = toy_target()
    row = model.predict_step(model.BEST_STEP, 8192, "bf16", t)
    each = {c.config_label: model.predict_config(c, 8192, "bf16", t).get("predicted_tflops", 0)
            for c in model.BEST_CANDIDATES}
    assert row["predicted_tflops"] == pytest.approx(max(each.values()))
    assert each[row["predicted_config"]] == pytest.approx(row["predicted_tflops"])
    steps = [model.predict_step(s, 8192, "bf16", t)["predicted_tflops"] for s in ("4 grouped order", "6 Hilbert order")]
    assert row["predicted_tflops"] >= max(steps)  # the best fixed steps are candidates too


def test_predict_step_by_hand():
    t = toy_target()
    row = model.predict_step("5 persistent", 4096, "bf16", t)
    tiles = 32 * 16
    assert row["tiles"] == tiles and row["waves"] == math.ceil(tiles / 100)
    st = model.step_times(model.STEPS["5 persistent"], "bf16", t, 4096)
    compute = math.ceil(tiles / 100) * (64 * st["slice_s"] + st["edges_s"])
    assert row["predicted_ms"] == pytest.approx((max(compute, row["predicted_dram_bytes"] / 2e12) + 3e-6) * 1e3)
    assert row["predicted_l2_request_bytes"] == tiles * (128 + 256) * 4096 * 2


def test_model_orders_the_steps():
    """Stages hide latency; the later steps never predict slower; the orders only move DRAM bytes."""
    rows = {r["step"]: r for r in hp.predict(hp.Params(sizes=(8192,)), toy_target())}
    assert rows["1 baseline"]["predicted_tflops"] < 0.7 * rows["2 pipeline"]["predicted_tflops"]
    assert rows["1 baseline"]["predicted_latency_hidden_pct"] == 0
    assert rows["2 pipeline"]["predicted_latency_hidden_pct"] == 100
    assert rows["5 persistent"]["predicted_tflops"] > rows["4 grouped order"]["predicted_tflops"]
    assert rows["4 grouped order"]["predicted_dram_bytes"] < rows["3 TMA"]["predicted_dram_bytes"]
    assert rows["7 warp-specialized"]["predicted_pct_of_cublas"] <= 100
    assert rows["cuBLAS"]["predicted_tflops"] == pytest.approx(409.6)


def test_predict_without_a_ceiling_says_so():
    t = toy_target()
    t.ceilings.matmul_tflops.pop("fp16")
    row = model.predict_step("3 TMA", 4096, "fp16", t)
    assert "predicted_tflops" not in row and "fp16" in row["note"]


def test_instruction_counting():
    ptx = "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {...};\n" \
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd2, {%r3, %r4}];\n" \
          "mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r5], %r6;\ncp.async.cg.shared.global [%r7], [%rd8], 16;\n"
    counts = measure.count_instructions(ptx, measure.PTX_MARKERS)
    assert counts == {"wgmma": 1, "mma.sync": 0, "cp.async.bulk.tensor": 1, "cp.async": 1, "ld.global": 0,
                      "mbarrier": 1, "setmaxnreg": 0, "mbarrier.arrive": 0}
    assert "wgmma" in measure.ptx_excerpt(ptx) and measure.ptx_excerpt("add.s32 %r1, %r2, %r3;") == ""
    # lines of the Gluon kernel's PTX (Triton 3.6, sm_90a): the partitions' registers, the consumers' plain arrive
    # on an `empty` barrier (counted), the producer's arrive.expect_tx on a `ready` one (not an `empty` release)
    ws = "setmaxnreg.inc.sync.aligned.u32 \t240;\n@%p13 mbarrier.arrive.shared::cta.b64 _, [%r99];\n" \
         "@%p5 mbarrier.arrive.expect_tx.shared.b64 _, [%r44], 49152;\nsetmaxnreg.dec.sync.aligned.u32 \t40;\n"
    counts = measure.count_instructions(ws, measure.PTX_MARKERS)
    assert counts["setmaxnreg"] == 2 and counts["mbarrier.arrive"] == 1 and counts["mbarrier"] == 2
    assert measure.ptx_excerpt(ws, at=measure.PARTITION_LINE).startswith("setmaxnreg.inc")
    assert measure.count_instructions("USETMAXREG.TRY R2, 0xf0 ;", measure.SASS_MARKERS)["USETMAXREG"] == 1


def test_gluon_step_is_left_out_with_a_note_where_it_cannot_run(monkeypatch):
    """Without a Hopper GPU, or with a Triton lacking a Gluon feature the kernel uses, the warp-specialized step is
    not run: measure leaves it out with the reason, launching it says why, and the page's note names the step."""
    assert measure.WS_STEP == "7 warp-specialized"
    cc = gluon_support.device_capability("cuda")  # None on this CPU machine
    if cc is None or not cc.startswith("9."):
        ok, notes = measure.usable_configs(measure.WS_STEP, "bf16", "cuda")
        assert ok == [] and "Gluon" in notes[0] and gluon_support.hopper_missing(cc) in notes[0]
        a = timing.random_tensor((64, 64), "bf16", "cpu")
        with pytest.raises(gluon_support.GluonUnavailable, match="Hopper"):
            kernels.anatomy_matmul(a, a, model.STEPS[measure.WS_STEP], programs=1)
        assert measure.WS_STEP in measure.gluon_step_note(cc) and "left out" in measure.gluon_step_note(cc)
    assert "compute capability 8.0" in gluon_support.unavailable_reason("8.0")  # an A100: no wgmma
    # a Hopper GPU, but a Triton whose Gluon lacks something the kernel calls (looked for, not read from a version)
    gluon_support.gluon_missing.cache_clear()
    monkeypatch.setitem(gluon_support.REQUIRED, "triton.experimental.gluon.language",
                        ("warp_specialize", "a_feature_no_triton_has"))
    assert "a_feature_no_triton_has" in gluon_support.unavailable_reason("9.0")
    assert "a_feature_no_triton_has" in measure.gluon_step_note("9.0")
    monkeypatch.undo()
    gluon_support.gluon_missing.cache_clear()
    if gluon_support.gluon_missing() is None:  # this Triton has Gluon: a Hopper GPU would run the step
        assert gluon_support.unavailable_reason("9.0") is None and measure.gluon_step_note("9.0") == ""


def test_params_check_and_lesson_numbers():
    p = from_strings(hp.Params, {"sizes": "4096", "steps": "1 baseline,3 TMA"})
    assert p.steps == ("1 baseline", "3 TMA")
    with pytest.raises(ParamError):
        from_strings(hp.Params, {"steps": "9 magic"})
    with pytest.raises(ParamError, match="Hopper"):
        measure.check(hp.Params(), gpu.datasheet_target(gpu.datasheet_by_name("A100 80GB")))
    with pytest.raises(ParamError, match="multiple of 8"):
        measure.check(hp.Params(sizes=(4097,)), toy_target())
    measure.check(hp.Params(sizes=(4097,), steps=("1 baseline", "2 pipeline")), toy_target())  # pointers take any N
    with pytest.raises(ParamError, match="smaller sizes"):
        measure.check(hp.Params(sizes=(16384,)), toy_target(memory_gb=1))
    nums = model.lesson_numbers(gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM")))
    assert nums["tiles_8192"] == "2048" and nums["waves_8192"] == "16"
    assert float(nums["dram_hilbert_gb"]) < float(nums["dram_row_gb"])
    assert hp.LAB.headline.row["step"] in model.STEPS


# ---------------------------------------------------------------------------------------------
# On a Hopper GPU
# ---------------------------------------------------------------------------------------------
def _hopper_or_skip():
    target = gpu.live_target()
    if not configs.tma_supported(target.compute_capability):
        pytest.skip("needs a Hopper GPU (TMA, wgmma)")
    return target


@pytest.mark.gpu
def test_short_run_on_hopper_shows_wgmma_and_tma():
    from labs.engine import runner

    _hopper_or_skip()
    started = time.monotonic()
    steps = ("2 pipeline", "3 TMA", "6 Hilbert order", measure.WS_STEP, model.BEST_STEP)
    result = runner.run(hp.LAB, hp.Params(sizes=(2048,), steps=steps), use_cache=False)
    assert result.complete and time.monotonic() - started < 120
    rows = {r["step"]: r for r in result.rows if r.get("measured_tflops")}
    assert rows[model.BEST_STEP]["config"] in {c.config_label for c in model.BEST_CANDIDATES}
    assert rows["3 TMA"]["ptx_wgmma"] > 0 and rows["3 TMA"]["ptx_cp_async_bulk_tensor"] > 0
    assert rows["2 pipeline"]["ptx_cp_async_bulk_tensor"] == 0 and rows["2 pipeline"]["ptx_cp_async"] > 0
    assert rows["3 TMA"]["ptx_excerpt"]
    assert rows["3 TMA"]["load_latency_us"] > 0  # the run's probe, for re-predicting the one-stage step
    if not gluon_support.gluon_missing():  # the Gluon step ran, and its PTX is not the step before's
        assert rows[measure.WS_STEP]["ptx_changed"] and rows[measure.WS_STEP]["ptx_setmaxnreg"] > 0
        assert "setmaxnreg" in rows[measure.WS_STEP]["ptx_excerpt"]


def _gluon_or_skip():
    _hopper_or_skip()
    reason = gluon_support.gluon_missing()
    if reason:
        pytest.skip(f"the Gluon step cannot run: {reason}")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,programs", [(517, 528, 560, 3), (333, 344, 136, 2), (1000, 1000, 1000, None),
                                            (129, 264, 64, 1)])
def test_gluon_step_matches_float64_on_odd_shapes(m, n, k, programs):
    """M, N, K not multiples of the 128 x 256 x 64 tile (the TMA zero-fills and clips the edges); few programs, so
    each walks several tiles and the ring's phases wrap around many times, across tiles."""
    _gluon_or_skip()
    a, b = timing.random_tensor((m, k), "bf16", "cuda"), timing.random_tensor((k, n), "bf16", "cuda")
    out = torch.full((m, n), float("nan"), device="cuda", dtype=a.dtype)
    kernels.anatomy_matmul(a, b, model.STEPS[measure.WS_STEP], out, programs=programs)
    timing.check_close(out, measure.reference(a, b), "bf16", f"Gluon {m}x{n}x{k}")


@pytest.mark.gpu
def test_gluon_ptx_differs_from_the_step_before():
    """Step 6 (Triton, persistent, TMA) against step 7 (Gluon): the PTX differs, and in the ways warp
    specialization shows: setmaxnreg (registers moved between partitions), the consumers' plain arrives on the
    `empty` barriers, 12 warps (8 consumers and the producer's warpgroup) instead of 8."""
    _gluon_or_skip()
    m, n, k = measure.PROBE_TMA
    a, b = timing.random_tensor((m, k), "bf16", "cuda"), timing.random_tensor((k, n), "bf16", "cuda")
    before = kernels.anatomy_matmul(a, b, model.STEPS["6 Hilbert order"], programs=3)[1]
    after = kernels.anatomy_matmul(a, b, model.STEPS[measure.WS_STEP], programs=3)[1]
    assert before.asm["ptx"] != after.asm["ptx"]
    old, new = measure.instruction_summary(before), measure.instruction_summary(after)
    assert old["ptx_setmaxnreg"] == 0 and new["ptx_setmaxnreg"] > 0
    assert old["ptx_mbarrier_arrive"] == 0 and new["ptx_mbarrier_arrive"] > 0
    assert new["ptx_wgmma"] > 0 and new["ptx_cp_async_bulk_tensor"] > 0
    assert before.metadata.num_warps == 8 and after.metadata.num_warps == 12
    if "sass_USETMAXREG" in new:  # where Triton can disassemble (CUDA's cuobjdump)
        assert old["sass_USETMAXREG"] == 0 and new["sass_USETMAXREG"] > 0
    assert "setmaxnreg" in measure.ptx_excerpt(after.asm["ptx"], at=measure.PARTITION_LINE)


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------
def test_page_renders_without_a_gpu():
    from tests.conftest import render_page

    at = render_page("hopper.py")
    assert at.title[0].value == hp.LAB.title
    text = " ".join(m.value for m in at.markdown)
    assert "{{" not in text and "wgmma" in text
    assert len(at.get("plotly_chart")) >= 2
    headings = [h.value for h in at.subheader]
    assert any("DRAM" in h for h in headings) and any("warp-tiled" in h for h in headings)
    if gluon_support.unavailable_reason(gluon_support.device_capability("cuda")):  # the Gluon step's note
        assert any(measure.WS_STEP in i.value and "left out" in i.value for i in at.info)
    levels = [d.value for d in at.dataframe if "level" in d.value.columns]  # the warp-tiled kernel's levels
    assert len(levels) == 1 and list(levels[0]["level"]) == ["global (L2)", "shared memory", "registers (FMA)"]


def test_page_refuses_bad_input_with_a_message():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / "hopper.py"), default_timeout=120)
    at.run()
    at.text_input(key="hopper.sizes").set_value("4096,70000").run()
    assert not at.exception
    assert any("out of range" in e.value for e in at.error)


def test_lesson_numbers_say_what_a_gpu_lacks_instead_of_nan():
    """A T4 has no bf16 tensor-core rate: its figures read '?' (the page warns why), never 'nan' or '0 TFLOP/s'."""
    for target in gpu.available_targets():
        numbers = model.lesson_numbers(target)
        assert not [k for k, v in numbers.items() if "nan" in str(v).lower()], target.key
    t4 = next(t for t in gpu.available_targets() if t.key == "t4")
    assert model.lesson_numbers(t4)["bf16_tflops"] == "?" and model.lesson_numbers(t4)["slice_1_us"] == "?"


def test_repredict_takes_the_tensor_core_rate_from_the_runs_own_cublas_rows():
    """A newer Matmul recording moved the H200 run's predictions by 1.5 % (one point over 15 %); re-predicted, a run
    uses the cuBLAS rate it measured itself at each N, and outside a re-prediction nothing changes."""
    target = next(t for t in gpu.available_targets() if t.key == "nvidia-h200")
    recording = {"params": {"sizes": [4096], "dtype": "bf16", "steps": ["1 baseline"]},
                 "rows": [{"step": "cuBLAS", "n": 4096, "dtype": "bf16", "measured_tflops": 400.0}]}
    cublas = next(r for r in hp.repredict(recording, target) if r["step"] == "cuBLAS")
    assert cublas["predicted_tflops"] == pytest.approx(400.0)
    assert model.tensor_core_tflops(4096, "bf16", target)[0] != pytest.approx(400.0)  # the override is gone
