"""The coalescing lab: Triton kernels against float64 (interpreter on CPU), the sector model, the CUDA
transpose ladder (GPU only), the page."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from labs.engine import timing
from labs.engine import gpu
from labs.engine import runner
from labs.coalescing import LAB, Params
from labs.coalescing.kernels import scattered_granules, scattered_read, strided_read, transpose, walk
from labs.coalescing.measure import scattered_reference, strided_reference, transpose_reference, walk_reference
from labs.coalescing.model import (GRANULE_BYTES, TRANSPOSES, fetched_bytes_per_element, ladder_gains, predict,
                                   repredict, requests_per_element, riding_granules_per_element, stride_efficiency,
                                   stride_row, stride_wavefronts, walk_efficiency)
from labs.engine.params import ParamError
from tests.conftest import render_page

ROOT = Path(__file__).resolve().parent.parent
H200 = gpu.datasheet_target(gpu.datasheet_by_name("H200"))


# --- kernels ---------------------------------------------------------------------------------
@pytest.mark.parametrize("stride", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("span", [1, 4097, 10007])
def test_strided_read_matches_float64_on_odd_sizes(device, stride, span):
    x = timing.random_tensor((span,), "fp32", device)
    out = torch.full((-(-span // stride),), float("nan"), device=device)  # unwritten elements fail the check
    strided_read(x, stride, out)
    assert timing.check_close(out, strided_reference(x, stride), "fp32", "strided read") == 0.0


@pytest.mark.parametrize("along_rows", [False, True])
@pytest.mark.parametrize("n", [1, 67, 131])
def test_walks_match_float64_on_odd_sizes(device, along_rows, n):
    x = timing.random_tensor((n, n), "fp32", device)
    ref = walk_reference(x, along_rows)
    out = torch.full(ref.shape, float("nan"), device=device)
    walk(x, along_rows, out)
    timing.check_close(out, ref, "fp32", "walk")


@pytest.mark.parametrize("span", [16, 4097, 100_003])
def test_scattered_probe_reads_every_granule_once(device, span):
    x = timing.random_tensor((span,), "fp32", device)
    n = scattered_granules(span)
    assert n & (n - 1) == 0 and n * GRANULE_BYTES <= 4 * span < 2 * n * GRANULE_BYTES
    out = torch.full((n,), float("nan"), device=device)
    scattered_read(x, out)
    assert timing.check_close(out, scattered_reference(x), "fp32", "scattered read") == 0.0
    firsts = x[: n * 16].reshape(n, 16)[:, 0]  # the first float of every granule, each exactly once
    assert torch.equal(torch.sort(out).values, torch.sort(firsts).values)
    if n >= 8:  # neighbouring lanes land far apart
        order = (torch.arange(8, dtype=torch.int64) * 2654435761) & (n - 1)
        assert (order[1:] - order[:-1]).abs().min() > 1


def test_walk_reference_sums_segments_of_rows_and_columns():
    x = torch.arange(100 * 100, dtype=torch.float32).reshape(100, 100)
    rows, cols = walk_reference(x, True), walk_reference(x, False)
    assert rows.shape == (100, 2) and cols.shape == (2, 100)
    assert rows[3, 0] == x[3, :64].double().sum() and rows[3, 1] == x[3, 64:].double().sum()
    assert cols[1, 7] == x[64:, 7].double().sum()


def test_check_catches_a_wrong_stride(device):
    x = timing.random_tensor((4099,), "fp32", device)
    with pytest.raises(timing.KernelMismatch):
        timing.check_close(strided_read(x, 2)[:1000], strided_reference(x, 3)[:1000], "fp32", "wrong stride")


# --- the sector model, by hand ----------------------------------------------------------------
def test_granules_and_requests_by_hand():
    # 64-byte DRAM granules: strides up to 16 floats fetch the whole span, beyond that a granule per float
    assert [fetched_bytes_per_element(s, fetch=64) for s in (1, 2, 8, 16, 32, 64)] == [4, 8, 32, 64, 64, 64]
    assert stride_efficiency(16, fetch=64) == pytest.approx(8 / 68)
    # elements closer than a sector share it (whole lines, streamed); from 32 bytes apart every 128-byte line
    # touched is one separate request: four floats share it at stride 8, two at 16, one each from 32 on
    assert [requests_per_element(s) for s in (1, 2, 4, 8, 16, 32, 64)] == [0, 0, 0, 0.25, 0.5, 1, 1]
    # the line's other needed granule rides along: one per line at strides 8 and 16, none beyond
    assert [riding_granules_per_element(s) for s in (1, 4, 8, 16, 32, 64)] == [0, 0, 0.25, 0.5, 0, 0]


def test_request_rate_caps_scattered_strides_once_measured():
    params = Params(size_mib=1024)
    before = stride_row(params, 16, H200)
    assert before["bound"] == "DRAM" and before["request_bound_tbps"] is None
    assert before["predicted_tbps"] == pytest.approx(H200.ceilings.copy_tbps * 8 / 68)
    assert before["sector_model_tbps"] == pytest.approx(H200.ceilings.copy_tbps * 8 / 36)
    rate = 40e9  # separate requests per second
    after = stride_row(params, 16, H200, rate)
    n = 1024 * 2**20 // 4 // 16
    # n / 2 lines, each one request plus one granule streamed at copy bandwidth
    streamed_s = (n / 2) * 64 / (H200.ceilings.copy_tbps * 1e12)
    assert after["dram_requests"] == n / 2 and after["riding_granules"] == n / 2
    assert after["bound"] == "DRAM requests"
    assert after["predicted_ms"] == pytest.approx((n / 2 / rate + streamed_s) * 1e3)
    # from stride 32 on every float is a lone request, exactly what the probe measured
    far = stride_row(params, 32, H200, rate)
    assert far["predicted_ms"] == pytest.approx(far["dram_requests"] / rate * 1e3) and far["riding_granules"] == 0
    assert stride_row(params, 2, H200, rate)["bound"] == "DRAM"  # streamed: no request limit


def test_request_model_follows_each_gpus_dram():
    """Stride 8 with the two recorded Hoppers' copy bandwidths and probe rates: a line costs one request plus
    one streamed granule, and the streamed granule is cheaper where DRAM streams faster, so the H200 gains
    more over counting both granules as requests than the H100 does."""
    params, gains = Params(), {}
    for key, copy, rate in (("h100", 3.0, 28.7e9), ("h200", 4.24, 35.3e9)):
        target = dataclasses.replace(H200, ceilings=dataclasses.replace(H200.ceilings, copy_tbps=copy))
        line_s = 1 / rate + 64 / (copy * 1e12)  # 4 floats per line, 8 useful bytes each
        got = stride_row(params, 8, target, rate)["request_bound_tbps"]
        assert got == pytest.approx(4 * 8 / line_s / 1e12)
        gains[key] = got / (4 * 8 / (2 / rate) / 1e12)  # against two lone requests per line
    assert 1.2 < gains["h100"] < gains["h200"] < 1.35



def test_sector_model_by_hand():
    # fp32, 32-byte sectors: stride 1 fetches 4 B per float, stride 2 8 B, stride 8 and beyond a whole sector
    assert [fetched_bytes_per_element(s) for s in (1, 2, 4, 8, 16, 64)] == [4, 8, 16, 32, 32, 32]
    # useful = 4 B read + 4 B written; fetched = read above + 4 B written
    assert stride_efficiency(1) == 1.0
    assert stride_efficiency(2) == pytest.approx(8 / 12)
    assert stride_efficiency(4) == pytest.approx(8 / 20)
    assert stride_efficiency(8) == stride_efficiency(64) == pytest.approx(8 / 36)
    # a warp on 32 neighbours touches 4 sectors (all bytes used); on 32 rows, 32 sectors (1/8 used)
    assert walk_efficiency(False) == 1.0 and walk_efficiency(True) == pytest.approx(1 / 8)


def test_wavefronts_by_hand():
    # stride 1: 32 floats in one 128-byte line, + 1 line written; stride 8: 8 lines; stride 64: 32 lines
    assert stride_wavefronts(1) == (256, 2) and stride_wavefronts(8) == (256, 9) and stride_wavefronts(64) == (256, 33)


def test_predict_takes_the_lower_of_dram_and_l1():
    rows = predict(Params(), H200)
    bw = H200.ceilings.copy_tbps
    l1 = 132 * 1980e6 / 1e12  # TB/s per useful byte per wavefront on an H200 (132 SMs, 1980 MHz)
    by = {r["variant"]: r for r in rows}
    # strides: DRAM-bound at every stride (the L1 allows 256 B per 33 clocks even at stride 64)
    assert by["stride 1"]["predicted_tbps"] == pytest.approx(bw)
    assert by["stride 8"]["predicted_tbps"] == pytest.approx(bw * 2 / 9)
    assert all(by[f"stride {s}"]["bound"] == "DRAM" for s in Params().strides)
    # row walk: DRAM would allow the copy rate (the L1 keeps the sectors), the L1 only 128 B per 32 clocks
    assert by["row walk"]["predicted_tbps"] == pytest.approx(l1 * 4) and by["row walk"]["bound"] == "L1"
    assert by["row walk"]["no_reuse_tbps"] == pytest.approx(bw / 8)
    assert by["column walk"]["predicted_tbps"] == pytest.approx(bw)
    # transposes: unpadded tile 256 B per 35 clocks; padded DRAM-bound; naive and torch bound by the L2's
    # 64-byte request slots: 8 useful bytes per element over 2 + 4/64 slots (a partial-sector write costs two)
    # and 1 + 4/64 slots (a read of its own sector)
    from labs.hierarchy.model import l2_tbps

    l2 = l2_tbps(H200)[0]
    assert by["tiled"]["predicted_tbps"] == pytest.approx(l1 * 256 / 35)
    assert by["naive"]["predicted_tbps"] == pytest.approx(l2 * 8 / ((2 + 4 / 64) * 64))
    assert by["naive"]["bound"] == by["torch"]["bound"] == "L2 requests"
    assert by["torch"]["predicted_tbps"] == pytest.approx(l2 * 8 / ((1 + 4 / 64) * 64))
    assert by["tiled+padded"]["predicted_tbps"] == pytest.approx(bw)
    # stride 4 over 2 GiB: 2^27 outputs, useful 8 B each
    assert by["stride 4"]["useful_bytes"] == 8 * 2**27
    measured, predicted = LAB.headline.answer(rows)
    assert measured is None and predicted == pytest.approx(bw * 2 / 9)


def test_ladder_gains_compare_each_rung_with_the_one_below():
    rows = [{"experiment": "transpose", "variant": v, "measured_tbps": t, "dram_bound_tbps": 4.0}
            for v, t in (("naive", 1.0), ("tiled", 2.0), ("tiled+padded", 3.0), ("torch", 1.5))]
    gains = {g["variant"]: g for g in ladder_gains(rows)}
    assert gains["naive"]["gain_over_previous"] is None
    assert gains["tiled"]["gain_over_previous"] == 2.0 and gains["tiled+padded"]["gain_over_previous"] == 1.5
    assert gains["tiled+padded"]["fraction_of_copy"] == 0.75 and gains["torch"]["gain_over_previous"] is None


def test_check_refuses_what_does_not_fit():
    t4 = gpu.datasheet_target(gpu.datasheet_by_name("T4"))  # 16 GB
    with pytest.raises(ParamError, match="needs 17.2 GB"):
        LAB.check(Params(size_mib=8192), t4)
    LAB.check(Params(experiments=("walk",)), t4)  # the 16384^2 matrix and its transpose fit


def test_model_run_without_a_gpu():
    result = runner.model(LAB, Params(strides=(1, 8), experiments=("stride",)), H200)
    assert [r["variant"] for r in result.rows] == ["stride 1", "stride 8"]


# --- the CUDA C++ transpose ladder (GPU only) ---------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1), (31, 33), (1001, 1003), (64, 4097)])
@pytest.mark.parametrize("variant", TRANSPOSES)
def test_transposes_match_float64(shape, variant):
    x = timing.random_tensor(shape, "fp32")
    out = torch.full((shape[1], shape[0]), float("nan"), device="cuda")
    transpose(x, variant, out)
    assert timing.check_close(out, transpose_reference(x), "fp32", variant) == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("tile,rows", [(32, 8), (32, 16), (64, 8), (64, 16), (64, 32)])
@pytest.mark.parametrize("padded", [False, True])
def test_every_tile_shape_transposes(tile, rows, padded):
    x = timing.random_tensor((257, 130), "fp32")
    out = torch.full((130, 257), float("nan"), device="cuda")
    transpose(x, "tiled+padded" if padded else "tiled", out, tile=tile, rows_per_block=rows)
    assert timing.check_close(out, transpose_reference(x), "fp32", f"tile {tile}x{rows}") == 0.0


@pytest.mark.gpu
def test_live_run_is_checked_and_the_stride_model_holds():
    result = runner.run(LAB, Params(strides=(1, 2, 8), size_mib=512, matrix_n=4096), use_cache=False)
    by = {r["variant"]: r for r in result.rows}
    assert all(r["check_rel_error"] < 1e-5 for r in result.rows)
    assert by["stride 2"]["measured_tbps"] < by["stride 1"]["measured_tbps"]
    assert by["tiled+padded"]["measured_tbps"] > by["tiled"]["measured_tbps"]
    probe = by["scattered granules"]
    assert probe["experiment"] == "probe" and 1e9 < probe["requests_per_s"] < 1e12
    assert by["stride 8"]["request_bound_tbps"] > 0 and by["stride 1"]["request_bound_tbps"] is None


# --- the page ----------------------------------------------------------------------------------
def test_page_renders_fast_without_a_gpu():
    pytest.importorskip("streamlit.testing.v1")  # the GPU image has no streamlit
    pytest.importorskip("plotly")

    at = render_page("coalescing.py", timeout=60)
    assert at.title[0].value == "Coalescing"
    figures = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    titles = [f["layout"]["title"]["text"] for f in figures]
    assert any("stride" in t for t in titles) and any("Transposing" in t for t in titles)
    traces = [t["name"] for f in figures for t in f["data"]]
    assert "model" in traces and any(t.startswith("sector model") for t in traces)


def test_transpose_l2_limit_uses_the_recorded_l2_figure_offline():
    """The naive and torch rungs are capped by the L2's 64-byte request slots at the L2 bandwidth the run used;
    a re-prediction of a recording takes that figure from the recording's rows."""
    params = Params(experiments=("transpose",))
    recording = {"params": {"experiments": ["transpose"]},
                 "rows": [{"experiment": "transpose", "variant": "naive", "l2_tbps": 4.0}]}
    rows = {r["variant"]: r for r in repredict(recording, H200)}
    assert rows["naive"]["predicted_tbps"] == pytest.approx(4.0 * 8 / ((2 + 4 / 64) * 64))
    assert rows["torch"]["predicted_tbps"] == pytest.approx(4.0 * 8 / ((1 + 4 / 64) * 64))
    assert rows["naive"]["bound"] == "L2 requests" and rows["naive"]["l2_tbps"] == 4.0
    assert predict(params, H200)[0]["l2_tbps"] > H200.ceilings.copy_tbps  # this GPU's own L2 figure
