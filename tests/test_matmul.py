"""Tests of the matmul labs (labs/matmul/, labs/matmul_ladder/, pages/matmul.py).

On CPU the Triton kernel runs in Triton's interpreter on small odd shapes; the model is checked
against numbers worked out by hand; the page renders from the model and the recordings alone.
The CUDA C++ kernels and the timed sweep need a GPU (marked `gpu`).
"""

import dataclasses
import math
import time
from pathlib import Path

import pytest
import torch

from labs import matmul as mm, matmul_ladder as ladder
from labs.matmul import configs, kernels, ladder_model, lesson, measure, model
from labs.matmul_ladder import measure as ladder_measure
from labs.engine import timing
from labs.engine import gpu
from labs.engine.gpu import Ceilings, Target
from labs.engine.params import ParamError, from_strings, validate

ROOT = Path(__file__).resolve().parent.parent
SMALL = configs.TileConfig(16, 32, 16, 2, 4, 2)  # small tiles: many programs even on tiny shapes


def toy_target(cc="9.0", l2_mb=50, memory_gb=80, dtypes=("fp32", "tf32", "fp16", "bf16", "fp8")) -> Target:
    """100 SMs at a 1 GHz clock: FP32 FMA = 100 x 128 lanes x 2 x 1e9 = 25.6 TFLOP/s, and tensor cores
    doing 4096 FLOP per clock per SM = 409.6 TFLOP/s, memory at 2 TB/s."""
    rates = {d: 409.6 for d in dtypes}
    ceilings = Ceilings(copy_tbps=2.0, fma_tflops=25.6, matmul_tflops=rates, source="test")
    return Target("Toy GPU", "toy", 100, int(l2_mb * 1e6), int(memory_gb * 1e9), cc, ceilings, None, live=False)


# ---------------------------------------------------------------------------------------------
# The Triton kernel in the interpreter (or on the GPU when there is one)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp32", "tf32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", [(37, 45, 51), (1, 33, 17), (50, 3, 70)])
def test_triton_pointer_path_odd_shapes(dtype, shape, device):
    m, n, k = shape
    a, b = kernels.operands(m, n, k, dtype, device)
    out = torch.full((m, n), float("nan"), device=device, dtype=kernels.out_dtype(dtype))
    _, path, _ = kernels.triton_matmul(a, b, dtype, out, SMALL, tma="off")
    assert path.startswith("vec")
    timing.check_close(out, measure.reference(a, b), dtype, f"{dtype} {shape}")


@pytest.mark.parametrize("dtype,kmajor", [("bf16", False), ("fp16", True), ("fp32", False), ("fp8", True)])
@pytest.mark.parametrize("shape", [(37, 40, 56), (65, 36, 44), (9, 50, 26)])
def test_triton_pointer_path_promised_alignment(dtype, kmajor, shape, device):
    """N and K multiples of 8, 4 or 2 elements but not of 16: the launcher promises Triton that much alignment
    (ALIGN), the loads get wider, and the masks along K and N must still cut the partial steps exactly."""
    if dtype == "fp8" and (device != "cuda" or configs._cc(kernels._device_cc(torch.device("cuda"))) < (8, 9)):
        pytest.skip("fp8 needs a GPU with fp8 tensor cores")
    m, n, k = shape
    a, b = kernels.operands(m, n, k, dtype, device, kmajor_b=kmajor)
    out = torch.full((m, n), float("nan"), device=device, dtype=kernels.out_dtype(dtype))
    tile = dataclasses.replace(SMALL, block_k=32) if dtype == "fp8" else SMALL  # fp8 products take K steps of 32
    _, path, _ = kernels.triton_matmul(a, b, dtype, out, tile, tma="off")
    e = timing.element_bytes(dtype)
    assert path == f"vec{configs.vector_elems(e, n, k) * e}" and path != f"vec{e}"
    timing.check_close(out, measure.reference(a, b), dtype, f"{dtype} {shape} {path}")


@pytest.mark.parametrize("dtype,kmajor", [("bf16", False), ("fp16", True), ("fp32", True), ("fp32", False)])
def test_triton_tma_path_odd_rows(dtype, kmajor, device):
    if device == "cuda" and not configs.tma_supported(kernels._device_cc(torch.device("cuda"))):
        pytest.skip("this GPU has no TMA")
    m, n, k = 45, 48, 80  # M odd, N and K multiples of 16 elements (16-byte aligned rows); edges partial
    a, b = kernels.operands(m, n, k, dtype, device, kmajor_b=kmajor)
    out = torch.full((m, n), float("nan"), device=device, dtype=kernels.out_dtype(dtype))
    _, path, _ = kernels.triton_matmul(a, b, dtype, out, SMALL, tma="on")
    assert path == "tma"
    timing.check_close(out, measure.reference(a, b), dtype, f"TMA {dtype}")


def test_triton_kernel_catches_a_wrong_reference(device):
    """The check is not vacuous: a different product fails it."""
    a, b = kernels.operands(33, 35, 37, "fp32", device)
    out, _, _ = kernels.triton_matmul(a, b, "fp32", None, SMALL, tma="off")
    with pytest.raises(timing.KernelMismatch):
        timing.check_close(out, measure.reference(a, b.flip(0)), "fp32", "flipped")


def test_sampled_check_sees_unwritten_and_wrong_elements(device):
    a, b = kernels.operands(40, 30, 20, "fp32", device)
    good = measure.reference(a, b).float()
    assert measure.check_sampled(good, a, b, "fp32", "good") < 1e-6
    holes = good.clone()
    holes[17, 3] = float("nan")
    with pytest.raises(timing.KernelMismatch, match="not written"):
        measure.check_sampled(holes, a, b, "fp32", "holes")
    wrong = good.clone()
    wrong[-1, :] += 1.0  # the last row is always sampled: it crosses the edge tiles
    with pytest.raises(timing.KernelMismatch):
        measure.check_sampled(wrong, a, b, "fp32", "wrong")


def test_launch_order_is_a_permutation_in_bands():
    tiles_m, tiles_n, g = 7, 5, 3
    seen = {model.grouped_tile(pid, tiles_m, tiles_n, g) for pid in range(tiles_m * tiles_n)}
    assert seen == {(i, j) for i in range(tiles_m) for j in range(tiles_n)}
    # the first band walks 3 tile rows column by column: pids 0,1,2 are rows 0-2 of column 0
    assert [model.grouped_tile(p, tiles_m, tiles_n, g) for p in range(4)] == [(0, 0), (1, 0), (2, 0), (0, 1)]
    # the last band has only 7 - 6 = 1 row
    assert model.grouped_tile(6 * tiles_n, tiles_m, tiles_n, g) == (6, 0)


# ---------------------------------------------------------------------------------------------
# The model, against hand-worked numbers
# ---------------------------------------------------------------------------------------------
def test_alignment_classes():
    assert [configs.pow2_dividing(n) for n in (2048, 2049, 2050, 2052, 2056, 2064, 1792)] == [2048, 1, 2, 4, 8, 16, 256]
    assert configs.pow2_dividing(4096, cap=256) == 256
    # bf16 rows are 16-byte aligned when N is a multiple of 8: TMA on Hopper; the pointer path loads as many
    # bytes at once as the rows' alignment allows (the launcher promises it to Triton where N % 16 != 0)
    assert configs.load_path(2048, "bf16", "9.0") == "tma"
    assert configs.load_path(2056, "bf16", "9.0") == "tma"
    assert configs.load_path(2052, "bf16", "9.0") == "vec8"  # 4104-byte rows: 8-byte aligned
    assert configs.load_path(2050, "bf16", "9.0") == "vec4"
    assert configs.load_path(2049, "bf16", "9.0") == "vec2"  # odd N: element by element
    assert configs.load_path(2052, "fp32", "9.0") == "tma"  # 2052 x 4 bytes = 8208, a multiple of 16
    assert configs.load_path(2049, "fp8", "9.0") == "vec1"
    assert configs.load_path(2056, "fp8", "9.0") == "vec8"  # 2056 bytes: 8-byte aligned rows, no TMA
    assert configs.load_path(2048, "bf16", "8.0") == "vec16"  # no TMA before Hopper
    assert configs.load_path(2056, "bf16", "8.0") == "vec16"  # 4112-byte rows: 16-byte loads without TMA too
    assert configs.load_path(2048, "bf16", "9.0", tma="off") == "vec16"
    assert configs.vector_elems(2, 2056, 2052) == 4 and configs.vector_elems(4, 2052) == 4 and configs.vector_elems(1, 4096) == 16


def test_tile_grid_reproduces_the_lecture_puzzle():
    """256 x 128 tiles on an A100 (108 SMs): 1792 -> 7 x 14 = 98 tiles, one wave; 1793 -> 8 x 15 = 120
    tiles, two waves, the second with 12 tiles."""
    g = model.tile_grid(1792, 1792, 256, 128, 108)
    assert (g["tiles_m"], g["tiles_n"], g["tiles"], g["waves"]) == (7, 14, 98, 1)
    assert g["padding_fraction"] == 0
    g = model.tile_grid(1793, 1793, 256, 128, 108)
    assert (g["tiles"], g["waves"], g["last_wave_tiles"]) == (120, 2, 12)
    assert g["last_wave_util"] == pytest.approx(12 / 108)
    assert g["padding_fraction"] == pytest.approx(1 - 1793**2 / (8 * 256 * 15 * 128))
    waves = [w for row in g["wave"] for w in row]
    assert waves.count(1) == 12 and waves.count(0) == 108
    # the first wave covers whole bands of GROUP_M = 8 rows, column by column
    assert g["order"][0][0] == 0 and g["order"][1][0] == 1 and g["order"][0][1] == 8


def test_blocks_per_sm_limits():
    # 128x256x64 bf16, 3 stages: 3 x (128 + 256) x 64 x 2 = 147456 B (Triton 3.6 reported 147480)
    cfg = configs.TileConfig(128, 256, 64, 8, 8, 3)
    assert configs.shared_bytes(cfg, "bf16") == 147456
    assert configs.registers_per_thread(cfg, "bf16") == 128 * 256 // 256 + 26  # Triton 3.6 used 154
    assert configs.blocks_per_sm(cfg, "bf16", "tma", "9.0") == 1
    assert configs.blocks_per_sm(cfg, "bf16", "tma", "8.9") == 0  # 144 KiB > the 99 KiB of an Ada SM
    # 64x64x32, 4 warps: smem 3 x 128 x 32 x 2 = 24576 -> 9 per 227 KiB;
    # registers 64 x 64 / 128 + 26 = 58 per thread x 128 threads = 7424 -> 8; threads 2048 / 128 = 16
    small = configs.TileConfig(64, 64, 32, 8, 4, 3)
    assert configs.blocks_per_sm(small, "bf16", "tma", "9.0") == 8


def test_wave_model_by_hand():
    """Toy GPU: 100 SMs at 1 GHz, 4096 tensor FLOP per clock per SM, 2 TB/s, 50 MB of L2.
    bf16, N = 4096, 128x256x64 tiles: 32 x 16 = 512 tiles, one per SM at a time -> 6 rounds.
    One K step: 2 x 128 x 256 x 64 / 4096 = 1024 clocks; 64 steps -> 65.536 us per tile; 6 tiles -> 393.216 us.
    Memory (A and B do not fit the L2): a wave of 100 tiles touches 8 row panels and ceil(100 / 8) = 13
    column panels: (8 x 128 + 13 x 256) x 4096 x 2 B = 35.65 MB, times 6 waves, plus C: 247.5 MB / 2 TB/s
    = 124 us < 393 us: compute-bound. Total 393.216 + 3 us fixed = 396.216 us."""
    t = toy_target()
    cfg = configs.TileConfig(128, 256, 64, 8, 8, 3)
    assert model.clock_hz(t) == pytest.approx(1e9)
    assert model.matmul_flop_per_clock(t, "bf16") == pytest.approx(4096)
    p = model.predict_point(4096, "bf16", cfg, t)
    assert (p["tiles"], p["waves"], p["blocks_per_sm"], p["path"], p["bound"]) == (512, 6, 1, "tma", "tensor cores")
    assert p["last_wave_util"] == pytest.approx(12 / 100)
    dram = 6 * (8 * 128 + 13 * 256) * 4096 * 2 + 4096**2 * 2
    assert p["dram_bytes"] == pytest.approx(dram)
    assert model.FIXED_US == 3.0
    assert p["predicted_ms"] == pytest.approx(0.396216, rel=1e-6)
    assert p["predicted_tflops"] == pytest.approx(2 * 4096**3 / 396.216e-6 / 1e12, rel=1e-6)


def test_wave_model_dips_one_tile_past_a_wave():
    """On the toy GPU (100 SMs, one 128x256 tile per SM at a time): N = 1792 gives 14 x 7 = 98 tiles, one
    round; N = 1920 gives 15 x 8 = 120 tiles, two rounds with the second 20% full, so more work runs at
    fewer FLOP/s. N = 2560 gives 20 x 10 = 200 tiles, two full rounds, faster than 2304 (162 tiles)."""
    t = toy_target()
    cfg = configs.DEFAULT_CONFIGS["bf16"]
    rate = {n: model.predict_point(n, "bf16", cfg, t)["predicted_tflops"] for n in (1792, 1920, 2048, 2304, 2560)}
    assert model.predict_point(1792, "bf16", cfg, t)["tiles"] == 14 * 7 == 98  # one round
    assert model.predict_point(1920, "bf16", cfg, t)["tiles"] == 15 * 8 == 120  # two rounds, the 2nd 20% full
    assert rate[1920] < rate[1792]  # more work, fewer FLOP/s: the wave-quantization dip
    assert rate[2560] > rate[2304]  # 200 tiles fill both rounds exactly


def test_unaligned_sizes_are_predicted_slower():
    t = toy_target()
    cfg = configs.DEFAULT_CONFIGS["bf16"]
    aligned = model.predict_point(4096, "bf16", cfg, t)
    odd = model.predict_point(4097, "bf16", cfg, t)
    assert odd["path"] == "vec2" and odd["bound"] == "loads"
    assert odd["predicted_tflops"] < 0.7 * aligned["predicted_tflops"]
    # per K step: 384 x 64 elements, one per lane: 768 warp loads + 768 shared stores, each 4 wavefronts
    # (lanes 16 bytes apart) = 6144 clocks, not overlapped with the 1024 clocks of tensor-core work
    cyc = model.step_cycles(cfg, "bf16", "vec2", 4096)
    assert (cyc["mma"], cyc["load"], cyc["step"]) == (1024, 6144, 7168)


def test_roofline_climb():
    t = toy_target()
    # bf16: 2N^3 FLOPs over 3 x 2 x N^2 bytes = N/3 FLOP/byte; x 2 TB/s = 2N/3 TFLOP/s until the peak
    assert model.roofline_tflops(300, "bf16", t) == pytest.approx(200.0)
    assert model.roofline_tflops(4096, "bf16", t) == pytest.approx(409.6)


def test_dtype_support_and_refusals():
    a100 = gpu.datasheet_target(gpu.datasheet_by_name("A100 80GB"))
    reasons = configs.dtype_support(a100)
    assert reasons["bf16"] == "" and "8.9" in reasons["fp8"]
    with pytest.raises(ParamError, match="8.9"):
        measure.check(mm.Params(dtypes=("fp8",)), a100)
    t4 = gpu.datasheet_target(gpu.datasheet_by_name("T4"))
    assert "8.0" in configs.dtype_support(t4)["bf16"]
    small = toy_target(memory_gb=1)
    with pytest.raises(ParamError, match=r"needs .* GB .* Choose sizes up to \d+"):
        measure.check(mm.Params(sizes=(1024, 16384)), small)
    measure.check(mm.Params(sizes=(1024, 4096)), small)  # 4096: 100 MB + the 256 MiB flush buffer fits
    with pytest.raises(ParamError, match="shared memory"):
        measure.check(mm.Params(block_m=256, block_n=256, block_k=128, num_stages=6), toy_target())


def test_every_dtype_has_a_default_and_autotune_configs():
    for dtype in configs.DTYPES:
        assert dtype in configs.DEFAULT_CONFIGS
        candidates = configs.AUTOTUNE_CONFIGS[timing.element_bytes(dtype)]
        assert 3 <= len(candidates) <= 6  # a handful: each one is compiled and timed
        assert all(configs.blocks_per_sm(c, dtype, "tma", "9.0") >= 1 for c in candidates)


def test_params_parse_and_validate():
    p = from_strings(mm.Params, {"dtypes": "bf16,fp16", "sizes": "2048,2049", "tma": "off"})
    assert p.dtypes == ("bf16", "fp16") and p.sizes == (2048, 2049) and p.tma == "off"
    with pytest.raises(ParamError):
        from_strings(mm.Params, {"block_m": "100"})
    with pytest.raises(ParamError):
        validate(mm.Params(sizes=(8,)))
    assert configs.config_for(mm.Params(block_n=128), "bf16") == configs.TileConfig(128, 128, 64, 8, 8, 3)


def test_predict_covers_every_point_and_the_headline():
    params = mm.Params()
    rows = mm.predict(params, gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM")))
    assert [(r["dtype"], r["n"]) for r in rows] == [("bf16", n) for n in params.sizes]
    assert all(r["predicted_tflops"] > 0 for r in rows)
    measured, predicted = mm.LAB.headline.answer(rows)
    assert measured is None and predicted > 0


def test_lesson_numbers():
    nums = lesson.lesson_numbers(gpu.datasheet_target(gpu.datasheet_by_name("A100 80GB")))
    assert (nums["tiles_1792"], nums["tiles_1793"], nums["waves_1792"], nums["waves_1793"]) == ("98", "120", "1", "2")


# ---------------------------------------------------------------------------------------------
# The ladder model
# ---------------------------------------------------------------------------------------------
def test_ladder_requests_and_time_by_hand():
    n = 1024
    assert ladder_model.requested_bytes("naive", n, "fp32") == 2 * n**3 * 4
    assert ladder_model.requested_bytes("tiled16", n, "fp32") == 2 * n**3 * 4 / 16
    assert ladder_model.requested_bytes("tiled32", n, "bf16") == 2 * n**3 * 2 / 32
    t = toy_target()
    # naive: a warp covers 2 rows of C: A's load touches 2 lines, B's 1, so 3 L1 wavefronts per warp FMA;
    # N^3 / 32 warp FMAs x 3 = 100,663,296 wavefronts over 100 SMs at 1 GHz (one per clock) = 1006.6 us;
    # FMA: N^3 / (100 x 128 x 1e9) = 83.9 us; plus 3 us fixed
    p = ladder_model.predict_cuda("naive", n, "fp32", t)
    assert p["bound"] == "L1 wavefronts"
    assert p["predicted_ms"] == pytest.approx((n**3 / 32 * 3 / 100e9 + 3e-6) * 1e3, rel=1e-9)
    # tiled (TILE 8, 4 rows per warp): per k 1 (Bs) + 2 / 4 (a 16-byte As load, 2 wavefronts, every 4 k),
    # per 8 k 4 + 4 lines of global loads and 2 shared stores: 1.5 + 10 / 8 = 2.75
    assert ladder_model.wavefronts_per_fma("tiled8") == 2.75 and ladder_model.wavefronts_per_fma("tiled32") == 1.5 + 4 / 32
    assert ladder_model.predict_cuda("tiled8", n, "fp32", t)["predicted_ms"] == pytest.approx(
        (n**3 / 32 * 2.75 / 100e9 + 3e-6) * 1e3, rel=1e-9)


def test_ladder_predict_rows():
    rows = ladder.predict(ladder.Params(n=2048, dtypes=("bf16",)), toy_target())
    assert [r["kernel"] for r in rows] == ["naive", "tiled8", "tiled16", "tiled32", "warptiled", "triton", "cublas"]
    pct = {r["kernel"]: r["predicted_pct_of_cublas"] for r in rows}
    assert pct["cublas"] == 100 and pct["naive"] < 5 < 50 < pct["triton"] <= 100


def _calibrated_h100(bf16_tflops: float = 679.0) -> Target:
    sheet = gpu.datasheet_by_name("H100 SXM")
    t = gpu.datasheet_target(sheet)
    return dataclasses.replace(t, ceilings=dataclasses.replace(
        t.ceilings, matmul_tflops={**t.ceilings.matmul_tflops, "bf16": bf16_tflops}))


def test_a_partly_filled_wave_clocks_up_to_the_datasheet():
    t = _calibrated_h100()
    assert model.clock_boost(t, "bf16", 1.0) == 1.0
    assert model.clock_boost(t, "bf16", 0.5) == pytest.approx(0.5 ** (-1 / 3))  # power ~ busy SMs x clock^3
    assert model.clock_boost(t, "bf16", 0.01) == pytest.approx(989.4 / 679.0, rel=1e-3)  # the datasheet's clock
    sheet = gpu.datasheet_by_name("H100 SXM")  # ceilings that are the datasheet's: no headroom left
    assert model.clock_boost(dataclasses.replace(t, ceilings=Ceilings.from_datasheet(sheet)), "bf16", 0.5) == 1.0


def test_the_last_wave_of_half_the_sms_runs_faster_where_tensor_cores_set_the_pace():
    t = _calibrated_h100()
    cfg = configs.TileConfig(128, 256, 64, 8, 8, 3)
    fpc = model.matmul_flop_per_clock(t, "bf16")
    full = model._grid_cycles(128 * 132, 256, cfg, "bf16", "tma", t, fpc, k=4096)  # one full wave
    half = model._grid_cycles(128 * 66, 256, cfg, "bf16", "tma", t, fpc, k=4096)  # one wave, half the SMs
    two = model._grid_cycles(128 * 198, 256, cfg, "bf16", "tma", t, fpc, k=4096)  # a full wave, then half
    assert half == pytest.approx(full / 0.5 ** (-1 / 3)) and two == pytest.approx(full + half)
    # narrow loads set the pace (an unaligned N): no boost
    narrow = [model._grid_cycles(128 * s, 256, cfg, "bf16", "vec2", t, fpc, k=4096) for s in (132, 66)]
    assert narrow[0] == pytest.approx(narrow[1])


def test_ladder_tensor_core_rungs_take_cublas_rate_at_their_size():
    """On a GPU kind the Matmul lab recorded, the cuBLAS and Triton rungs at N run at the rate cuBLAS reached at
    that N (the calibration's N = 8192 holds a lower, power-capped clock); elsewhere at the ceiling."""
    from labs.engine.results import list_recorded
    from labs.engine.repredict import recorded_target
    from labs.matmul import rates

    recording = next((r for r in list_recorded("matmul") if r.meta["gpu"]["key"] == "nvidia-h100-80gb-hbm3"), None)
    if recording is None:
        pytest.skip("no H100 recording of the matmul lab")
    target = recorded_target(recording.meta)
    measured = rates.recorded_cublas_tflops(target.key)[("bf16", 4096)]
    assert measured != target.ceilings.matmul_tflops["bf16"]
    rows = {r["kernel"]: r for r in ladder.predict(ladder.Params(n=4096, dtypes=("bf16",)), target)}
    assert rows["cublas"]["predicted_tflops"] == pytest.approx(measured)
    at_n, _ = rates.at_size(target, "bf16", 4096)
    assert rows["triton"]["predicted_tflops"] == pytest.approx(
        model.predict_point(4096, "bf16", configs.DEFAULT_CONFIGS["bf16"], at_n)["predicted_tflops"])
    toy = toy_target()  # never recorded: the ceiling
    assert rates.at_size(toy, "bf16", 4096)[0] is toy
    rows = {r["kernel"]: r for r in ladder.predict(ladder.Params(n=4096, dtypes=("bf16",)), toy)}
    assert rows["cublas"]["predicted_tflops"] == pytest.approx(model.roofline_tflops(4096, "bf16", toy))


def test_warptiled_levels_and_time_by_hand():
    n, t = 4096, toy_target()  # 100 SMs at 1 GHz, FMA 25.6 TFLOP/s, no L2 measurement: 2.5 x 2 TB/s
    levels = {r["level"]: r for r in ladder_model.warptile_levels(n, "fp32", t)}
    # global: 128 x 128 block tiles read (128 + 128) x 16 floats per 2 x 128 x 128 x 16 FLOPs = 32 FLOP/byte
    assert levels["global (L2)"]["intensity_flop_per_byte"] == pytest.approx(32)
    assert levels["global (L2)"]["time_ms"] == pytest.approx(2 * n**3 / 32 / 5e12 * 1e3)
    # shared: 8 + 8 floats per 64 FMAs = 2 FLOP/byte requested; 4 wavefronts of 128 B per warp and k served
    assert levels["shared memory"]["intensity_flop_per_byte"] == pytest.approx(2)
    assert levels["shared memory"]["time_ms"] == pytest.approx(n**3 / 2048 * 4 / (100 * 1e9) * 1e3)
    assert levels["registers (FMA)"]["time_ms"] == pytest.approx(2 * n**3 / 25.6e12 * 1e3)
    assert ladder_model.requested_bytes("warptiled", n, "bf16") == n**3 * 2 * (2 / 128)
    # issue: 64 FMAs + 4 shared loads per k, plus the slice's overhead over its 8 k (fp32)
    over = ladder_model.warptile_overhead_per_slice("fp32")
    assert over == 2 + (4 + 1) + 0 + 1 + 8  # 2 LDG.128, 4 + 1 STS, no conversions, a barrier, 8 more
    p = ladder_model.predict_warptile(n, "fp32", t)
    tiles, slots = 32 * 32, 200
    util = tiles / (math.ceil(tiles / slots) * slots)
    issue_ms = levels["registers (FMA)"]["time_ms"] * (64 + 4 + over / 8) / 64
    assert p["bound"] == "FMA issue"
    assert p["predicted_ms"] == pytest.approx(issue_ms / util + 3e-3)
    assert ladder_model.warptile_overhead_per_slice("bf16") > over  # 16-bit inputs are converted to float


def test_ladder_refuses_what_does_not_fit():
    with pytest.raises(ParamError, match="smaller n"):
        ladder_measure.check(ladder.Params(n=16384), toy_target(memory_gb=1))
    with pytest.raises(ParamError, match="8.0"):
        ladder_measure.check(ladder.Params(), gpu.datasheet_target(gpu.datasheet_by_name("T4")))


# ---------------------------------------------------------------------------------------------
# On the GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("kernel", ["naive", "tiled8", "tiled16", "tiled32"])
def test_cuda_kernels_match_float64(kernel, dtype):
    ladder_measure._check_cuda_kernel(kernel, dtype)  # odd sizes, output poisoned with NaN, raises on mismatch


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("min_blocks", [1, 2])
def test_warptiled_kernel_matches_float64(dtype, min_blocks):
    # odd probe (element loads) and a 16-byte-aligned probe (128-bit loads), edges partial in both
    ladder_measure._check_cuda_kernel("warptiled", dtype, min_blocks=min_blocks)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "tf32", "fp8"])
def test_triton_default_configs_on_gpu(dtype):
    target = gpu.live_target()
    if configs.dtype_support(target)[dtype]:
        pytest.skip(configs.dtype_support(target)[dtype])
    params = mm.Params(dtypes=(dtype,))
    for kind in ("tma", "ptr"):
        measure.probe_check(dtype, params, kind)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,config", [
    ((1536,) * 3, dataclasses.replace(configs.NARROW_TILE, row_tail=True)),
    ((3072,) * 3, dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], row_tail=True)),
    ((2432,) * 3, dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], row_tail=True, tail="W")),
    ((2304,) * 3, dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], row_tail=True, tail="T")),
    ((2064,) * 3, dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], edge=True)),
    ((2057, 2064, 1000), dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], edge=True))])
def test_early_start_finishes_every_part_before_the_stream_moves_on(shape, config):
    """The row tail and interior + edge with the early start (programmatic dependent launch, the last program of each
    later kernel waiting for the one before): C poisoned with NaN, then every element of every part compared with
    float64 by the next work in the same stream, with no synchronisation in between, after 3 direct launches and 3
    replays of a captured CUDA graph (how the lab times it). A part still running would show NaN or a wrong sum."""
    if not configs.tma_supported(kernels._device_cc(torch.device("cuda"))):
        pytest.skip("this GPU has no TMA")
    m, n, k = shape
    a, b = kernels.operands(m, n, k, "bf16")
    ref = measure.reference(a, b)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    slots = torch.cuda.get_device_properties(0).multi_processor_count
    before = configs.EARLY_START
    configs.EARLY_START = True
    try:
        launch = lambda: kernels.triton_matmul(a, b, "bf16", out, config, "auto", programs=slots)  # noqa: E731
        for _ in range(3):
            out.fill_(float("nan"))
            launch()
            timing.check_close(out, ref, "bf16", f"early start {shape} {config.label}")
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            launch()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            launch()
        for _ in range(3):
            out.fill_(float("nan"))
            graph.replay()
            timing.check_close(out, ref, "bf16", f"early start {shape} {config.label}, graph")
    finally:
        configs.EARLY_START = before
    assert kernels._PDL_WORKS.get("ok")  # the early start really ran


@pytest.mark.gpu
def test_autotuned_kernel_on_gpu():
    params = mm.Params(dtypes=("bf16",), autotune=True)
    measure.probe_check("bf16", params, "tma")
    measure.probe_check("bf16", params, "ptr")


@pytest.mark.gpu
def test_short_sweep_runs_end_to_end():
    from labs.engine import runner

    started = time.monotonic()
    result = runner.run(mm.LAB, mm.Params(sizes=(512, 1023, 1024)), use_cache=False)
    assert result.complete and time.monotonic() - started < 60
    rows = {(r["kernel"], r["n"]): r for r in result.rows}
    assert all(rows[(k, n)]["measured_tflops"] > 0 for k in ("cublas", "triton") for n in (512, 1023, 1024))
    assert rows[("triton", 1024)]["error_pct"] is not None


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------
def test_page_renders_the_model_explorer_and_ladder_without_a_gpu():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / "matmul.py"), default_timeout=120)
    at.run()  # the first render imports and warms caches
    assert not at.exception, [e.value for e in at.exception]
    started = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - started
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == mm.LAB.title
    assert [h.value for h in at.header] == ["Tile-count explorer", "The ladder: naive, tiled, Triton, cuBLAS"]
    assert len(at.get("plotly_chart")) >= 5  # wavy plot, explorer grid and curve, ladder bars and requests
    choice = at.sidebar.selectbox(key="target").value  # the GPU the page models
    target = gpu.live_target() if choice.startswith("This GPU") else gpu.datasheet_target(gpu.datasheet_by_name(choice))
    metrics = {m.label: m.value for m in at.metric}
    grid = model.explorer(2304, "bf16", 128, 256, target)
    assert metrics["tiles"] == f"{grid['tiles_m']} x {grid['tiles_n']} = {grid['tiles']}"
    text = " ".join(m.value for m in at.markdown)
    assert "{{" not in text and "wave" in text  # every placeholder filled, the lesson shown
    assert elapsed < 1.5, f"the page took {elapsed:.2f} s to render"
    # the explorer follows its inputs
    at.number_input(key="explorer.n").set_value(2049).run()
    assert not at.exception
    g = model.explorer(2049, "bf16", 128, 256, target)
    assert {m.label: m.value for m in at.metric}["waves"] == f"{g['waves']} of {g['slots_per_wave']} slots"


def test_page_refuses_bad_input_with_a_message():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / "matmul.py"), default_timeout=120)
    at.run()
    at.text_input(key="matmul.sizes").set_value("1024,70000").run()
    assert not at.exception
    assert any("out of range" in e.value for e in at.error)


# ---------------------------------------------------------------------------------------------
# Per-size tiles, the L2 feed and the sector rule (issue 15)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", configs.SMALL_TILES + (configs.NARROW_TILE,), ids=lambda c: c.label)
def test_per_size_tiles_match_float64_on_odd_shapes(config, device):
    if device == "cuda" and not configs.tma_supported(kernels._device_cc(torch.device("cuda"))):
        pytest.skip("this GPU has no TMA")
    m, n, k = 70, 144, 80  # M odd, N and K 16-byte aligned; every edge tile partial
    a, b = kernels.operands(m, n, k, "fp16", device)
    out = torch.full((m, n), float("nan"), device=device, dtype=torch.float16)
    _, path, _ = kernels.triton_matmul(a, b, "fp16", out, config, tma="on")
    assert path == "tma"
    timing.check_close(out, measure.reference(a, b), "fp16", config.label)


def test_tuned_config_gives_every_sm_a_tile_and_fills_waves(monkeypatch):
    big = configs.DEFAULT_CONFIGS["bf16"]
    # N = 1024 on 132 SMs: 128x256 makes 32 tiles; 64x128 makes 128 (>= 0.7 x 132), one an SM even with 6 stages
    assert configs.tuned_config(1024, "bf16", 132) == dataclasses.replace(configs.SMALL_TILES[0], num_stages=6)
    assert configs.tuned_config(1280, "bf16", 132) == configs.SMALL_TILES[0]  # 200 tiles: 6 stages fit one an SM, 4 fit two
    assert configs.tuned_config(512, "bf16", 132) == configs.SMALL_TILES[1]  # 64x128 gives 32 tiles; 64x64 gives 64
    assert configs.tuned_config(1792, "bf16", 132) == big  # 98 tiles >= 92.4
    # N = 2304: 162 big tiles, a full wave of 132 and a last one 23 % full: the row tail (128x64 tail tiles in one
    # round: test_tail_rounds_by_hand)
    assert configs.tuned_config(2304, "bf16", 132) == dataclasses.replace(big, row_tail=True, tail="T")
    assert configs.tuned_config(3072, "bf16", 132).row_tail  # 288 tiles: 2 full waves, the last 18 % full
    assert configs.tuned_config(2560, "bf16", 132) == big  # 200 tiles: the last wave 52 % full
    assert configs.tuned_config(4096, "bf16", 132) == big  # 512 tiles, 88 % full
    # N = 1536 without the early start: 288 tiles of 64x128; 4 stages fit 2 programs an SM (264 slots), 3 stages
    # fit 3 (396): 3 stages (with it, a 128x128 row tail: test_narrow_row_tail_where_the_big_tile_leaves_sms_idle)
    monkeypatch.setattr(configs, "EARLY_START", False)
    assert configs.tuned_config(1536, "bf16", 132) == dataclasses.replace(configs.SMALL_TILES[0], num_stages=3)
    assert configs.tuned_config(1024, "fp8", 132) == configs.DEFAULT_CONFIGS["fp8"]  # only the 16-bit types are tuned


def test_config_for_keeps_the_learners_knobs_and_unaligned_sizes():
    p = mm.Params()
    assert configs.config_for(p, "bf16", 1280, 132) == configs.SMALL_TILES[0]
    assert configs.config_for(p, "bf16", 2049, 132) == configs.DEFAULT_CONFIGS["bf16"]  # pointer path: measured default
    assert configs.config_for(mm.Params(block_n=128), "bf16", 1024, 132).block_m == 128  # a set knob wins


def test_element_loads_cost_four_wavefronts_per_instruction():
    """Unaligned bf16: one scalar load per element, lanes 16 bytes apart: 4 L1 wavefronts per warp
    instruction, then the same again to store into shared memory, not overlapped with the math."""
    cfg = configs.TileConfig(128, 256, 64, 8, 8, 3)
    cyc = model.step_cycles(cfg, "bf16", "vec2", flop_per_clock=4096)
    instr = (128 + 256) * 64 / 32  # 768 warp instructions per step
    assert cyc["load"] == pytest.approx(2 * instr * 4)
    assert cyc["step"] == pytest.approx(cyc["mma"] + cyc["load"]) and not cyc["overlapped"]
    aligned = model.step_cycles(cfg, "bf16", "tma", flop_per_clock=4096)
    assert aligned["load"] == pytest.approx((128 + 256) * 64 * 2 / 128)  # whole tiles at 128 bytes per clock


def test_floor_probe_replaces_the_assumed_fixed_cost():
    t = toy_target()
    assert model.fixed_us(t) == model.FIXED_US
    model._FLOOR_PROBED[t.key] = 6.0
    try:
        row = model.predict_point(256, "bf16", configs.TileConfig(64, 64, 64, 8, 4, 4), t)
        assert row["bound"] == "launch" and row["predicted_ms"] > 6.0e-3
    finally:
        del model._FLOOR_PROBED[t.key]


# ---------------------------------------------------------------------------------------------
# Stream-K (issue 15): the partial wave's K steps shared out among all SMs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,config,programs", [
    ((70, 144, 80), configs.TileConfig(16, 32, 16, 2, 4, 2, True), 4),  # 25 tiles: 20 whole, 5 shared out
    ((45, 48, 160), configs.TileConfig(16, 16, 16, 2, 4, 2, True), 5),  # 9 tiles, 10 steps each, all shared
    ((32, 32, 160), configs.TileConfig(32, 32, 16, 2, 4, 2, True), 7),  # one tile split 7 ways
    ((100, 96, 64), configs.TileConfig(16, 32, 16, 2, 4, 2, True), 13),  # 21 tiles over 13 programs
], ids=["dp+sk", "all-sk", "one-tile", "odd-programs"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("reversed_order", [False, True], ids=["owner", "owner-runs-last"])
def test_streamk_matches_float64_and_resets_its_counters(shape, config, programs, dtype, reversed_order, device):
    """The programs in order and numbered backwards: in the interpreter (one program after another) the owner of
    each shared tile then runs after the other sharers and takes its shortcut."""
    if device == "cuda" and not configs.tma_supported(kernels._device_cc(torch.device("cuda"))):
        pytest.skip("this GPU has no TMA")
    m, n, k = shape
    for _ in range(2):  # the second call finds the counters the first one left: they must be back at zero
        a, b = kernels.operands(m, n, k, dtype, device)
        out = torch.full((m, n), float("nan"), device=device, dtype=kernels.out_dtype(dtype))
        _, path, _ = kernels.triton_matmul(a, b, dtype, out, config, tma="on", programs=programs,
                                      reversed_order=reversed_order)
        assert path == "tma"
        timing.check_close(out, measure.reference(a, b), dtype, f"stream-K {config.label} {shape}")
        assert int(kernels._SCRATCH[str(a.device)][1].abs().sum()) == 0


def test_streamk_owner_adds_the_other_parts_in_registers(device):
    """9 tiles of 10 K steps over 5 programs (18 steps each): the runs end at steps 18, 36, 54 and 72, inside
    tiles 1, 3, 5 and 7, so those 4 tiles are shared by 2 programs each: 8 pieces. In forward order (in the
    interpreter, one program after another) each owner runs first and finds the other part missing, so all 8
    pieces go to scratch. Numbered backwards, each owner runs after the other sharer, finds its part in, adds
    it in registers and writes none of its own: only the 4 other pieces reach scratch, and the product is
    still right."""
    if device == "cuda":
        pytest.skip("the order of programs is fixed only in the interpreter")
    cfg, (m, n, k) = configs.TileConfig(16, 16, 16, 2, 4, 2, True), (45, 48, 160)
    plan = configs.streamk_plan(9, 10, 5)
    assert (plan["grid"], plan["sk_tiles"], plan["max_sharers"]) == (5, 9, 2)
    written = {}
    for reversed_order in (False, True):
        a, b = kernels.operands(m, n, k, "bf16", device)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
        kernels.triton_matmul(a, b, "bf16", out, cfg, tma="on", programs=5, reversed_order=reversed_order)  # scratch
        parts = kernels._SCRATCH["cpu"][0]
        parts.fill_(float("nan"))
        out.fill_(float("nan"))
        kernels.triton_matmul(a, b, "bf16", out, cfg, tma="on", programs=5, reversed_order=reversed_order)
        timing.check_close(out, measure.reference(a, b), "bf16", f"stream-K reversed={reversed_order}")
        written[reversed_order] = int((~parts.view(-1, 16 * 16).isnan().all(1)).sum())
    assert written == {False: 8, True: 4}


def test_streamk_plan_by_hand():
    """132 slots. N = 2064 in 128x256 tiles: 17 x 9 = 153 tiles of 33 steps, one full wave and 21 more.
    The 21 and the full wave before them (153 tiles) are shared out: 5049 steps, 38.25 a program, so the
    busiest has 39; a tile's 33 steps span at most 2 programs. N = 4096: 512 tiles = 3 waves + 116: the
    116 + 132 = 248 last are shared (248 x 64 / 132 = 120.24 -> 121 steps), the first 264 are whole
    (2 a program, 128 steps): 249 steps against 4 waves x 64 = 256 without stream-K."""
    p = configs.streamk_plan(153, 33, 132)
    assert (p["grid"], p["sk_tiles"], p["dp_tiles"], p["steps_busiest"], p["max_sharers"]) == (132, 153, 0, 39, 2)
    p = configs.streamk_plan(512, 64, 132)
    assert (p["sk_tiles"], p["dp_tiles"], p["steps_busiest"]) == (248, 264, 249)
    assert configs.streamk_plan(264, 64, 132)["sk_tiles"] == 0  # full waves: nothing to share
    one = configs.streamk_plan(153, 33, 132, extra_wave=False)  # only the 21 tiles of the partial wave
    assert (one["sk_tiles"], one["steps_busiest"]) == (21, 6 + 33)
    assert configs.streamk_plan(1, 64, 132)["grid"] == configs.SK_MAX_SHARERS  # one deep tile: at most 8 sharers


def test_streamk_model_by_hand():
    """Toy GPU (100 SMs, 1 GHz, 4096 FLOP per clock per SM): N = 2304 in 128x256 tiles gives 18 x 9 = 162
    tiles of 36 steps, one wave and 62 more. Without stream-K: 2 rounds x 36 steps x 1024 clocks = 73.7 us.
    With it, all 162 are shared: 5832 steps over 100 programs, 59 for the busiest (60.4 us), plus its
    fix-up (the owner's shortcut): 1 part written + the other 1 read (128 x 256 x 4 bytes each) + the bf16 tile,
    327680 bytes at 128 bytes a clock = 2560 clocks."""
    t = toy_target()
    big = configs.DEFAULT_CONFIGS["bf16"]
    tiles = model.predict_point(2304, "bf16", big, t)
    sk = model.predict_point(2304, "bf16", dataclasses.replace(big, streamk=True), t)
    assert tiles["schedule"] == "tiles" and sk["schedule"] == "stream-K" and sk["sk_tiles"] == 162
    assert tiles["predicted_ms"] == pytest.approx((2 * 36 * 1024 / 1e9 + 3e-6) * 1e3)
    assert sk["fixup_us"] == pytest.approx(2560 / 1e3)
    assert sk["predicted_ms"] == pytest.approx(((59 * 1024 + 2560) / 1e9 + 3e-6) * 1e3)
    plan = configs.streamk_plan(162, 36, 100)
    assert model.streamk_fixup_cycles(big, "bf16", plan) == pytest.approx(2560)
    assert not configs.config_for(mm.Params(), "bf16", 2304, 100, "9.0").streamk  # off unless asked for
    on = configs.config_for(mm.Params(streamk="on"), "bf16", 1024, 100, "9.0")
    assert on.streamk and (on.block_m, on.block_n) == (128, 256)
    assert configs.config_for(mm.Params(streamk="on", block_n=128), "bf16", 1024, 100, "9.0").streamk  # a knob keeps it
    assert not configs.config_for(mm.Params(streamk="on"), "bf16", 2049, 100, "9.0").streamk  # pointer path


def test_labels_read_back():
    for cfg in (configs.TileConfig(128, 256, 64, 8, 8, 3), configs.TileConfig(64, 128, 64, 4, 4, 4, True)):
        assert configs.parse_label(cfg.label) == cfg
    assert configs.parse_label("autotuned") is None and configs.parse_label(None) is None


def test_repredict_uses_the_recorded_floor_and_tiles():
    """Offline re-prediction must give what the live run predicted: the floor and load latency that run
    probed (in its rows, or the floor in its note for older runs) and the tile config each point ran."""
    t = toy_target()
    cfg = configs.TileConfig(128, 128, 64, 8, 4, 4)
    rows = [{"kernel": "triton", "dtype": "bf16", "n": 2048, "config": cfg.label, "floor_us": 7.0,
             "load_latency_us": 3.0}]
    rec = {"params": {"sizes": [2048], "kernels": ["triton"]}, "rows": rows, "messages": []}
    (row,) = mm.repredict(rec, t)
    assert row["config"] == cfg.label
    assert t.key not in model._FLOOR_PROBED and t.key not in model._LATENCY_PROBED  # left as it found them
    model._FLOOR_PROBED[t.key], model._LATENCY_PROBED[t.key] = 7.0, 3.0
    try:
        assert row["predicted_ms"] == pytest.approx(model.predict_point(2048, "bf16", cfg, t)["predicted_ms"])
    finally:
        del model._FLOOR_PROBED[t.key], model._LATENCY_PROBED[t.key]
    old = {"params": rec["params"], "rows": [{**rows[0], "floor_us": None}],
           "messages": ["A tiny kernel, timed like the products, took 5.0 us: the model's floor."]}
    assert model.recorded_floor_us(old) == 5.0
    assert model.recorded_floor_us({"rows": [], "messages": [measure.FLOOR_NOTE.format(6.4, 2.4, 0.9)]}) == 6.4


def test_load_latency_bounds_short_steps():
    """Toy GPU at 1 GHz with a 0.9 us load latency: a 64x64x64 step is 2 x 64^3 / 4096 = 128 clocks of tensor
    cores, but one program keeping 3 loads in flight (4 stages) gets a tile every 900 / 3 = 300 clocks. N = 512:
    64 tiles, one per SM, 8 steps -> 2.4 us (not 1.024 us). Big tiles keep their tensor-core time (1024 clocks
    against 900 / 2 = 450), and with no probe there is no latency bound."""
    t = toy_target()
    small = configs.TileConfig(64, 64, 64, 8, 4, 4)
    no_probe = model.predict_point(512, "bf16", small, t)["predicted_ms"]
    assert no_probe == pytest.approx((8 * 128 / 1e9 + 3e-6) * 1e3)
    model._LATENCY_PROBED[t.key] = 0.9
    try:
        assert model.predict_point(512, "bf16", small, t)["predicted_ms"] == pytest.approx((8 * 300 / 1e9 + 3e-6) * 1e3)
        big = configs.DEFAULT_CONFIGS["bf16"]
        assert model.predict_point(4096, "bf16", big, t)["predicted_ms"] == pytest.approx(0.396216, rel=1e-6)
    finally:
        del model._LATENCY_PROBED[t.key]


# ---------------------------------------------------------------------------------------------
# The row tail (issue 15): the full waves' tile rows in big tiles, the rest in short ones
# ---------------------------------------------------------------------------------------------
def test_row_tail_rows_by_hand():
    big = configs.DEFAULT_CONFIGS["bf16"]
    # N = 3072: 24 x 12 = 288 tiles; 2 full waves of 132 = 264 tiles = 22 whole tile rows
    assert configs.row_tail_rows(3072, 3072, big, 132) == 22 * 128
    # N = 2056: 17 x 9 = 153 tiles; one wave of 132 holds 14 whole rows of 9 (126 tiles)
    assert configs.row_tail_rows(2056, 2056, big, 132) == 14 * 128
    assert configs.row_tail_rows(2048, 2048, big, 128) == 2048  # 128 tiles, one full wave: nothing left over
    assert configs.row_tail_rows(1536, 1536, big, 132) == 0  # 72 tiles: no full wave
    assert configs.row_tail_applies(3072, big, "bf16", 132) and not configs.row_tail_applies(2560, big, "bf16", 132)


@pytest.mark.parametrize("shape,slots", [((45, 48, 80), 4), ((37, 64, 112), 5), ((70, 144, 48), 3)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_row_tail_matches_float64_on_odd_shapes(shape, slots, dtype, device):
    """Both launches (big tiles on the first rows, short tiles on the rest) on M odd shapes with partial edges."""
    if device == "cuda" and not configs.tma_supported(kernels._device_cc(torch.device("cuda"))):
        pytest.skip("this GPU has no TMA")
    m, n, k = shape
    big = configs.TileConfig(16, 32, 16, 2, 4, 2, row_tail=True)
    tail = configs.TileConfig(16, 16, 32, 2, 4, 2)
    rows = configs.row_tail_rows(m, n, big, slots)
    assert 0 < rows < m  # the shape really is split in two launches
    a, b = kernels.operands(m, n, k, dtype, device)
    out = torch.full((m, n), float("nan"), device=device, dtype=torch.float16 if dtype == "fp16" else torch.bfloat16)
    _, path, _ = kernels.triton_matmul(a, b, dtype, out, big, tma="on", programs=slots, tail_config=tail)
    assert path == "tma"
    timing.check_close(out, measure.reference(a, b), dtype, f"row tail {shape}")


def test_row_tail_model_by_hand(monkeypatch):
    """Toy GPU (100 SMs, 1 GHz, 4096 FLOP per clock per SM), N = 2304, 128x256 tiles with the row tail: 18 x 9 =
    162 tiles; one wave of 100 holds 11 whole rows (99 tiles): 36 K steps of 2*128*256*64 / 4096 = 1024 clocks.
    The other 2304 - 1408 = 896 rows make 14 x 36 = 504 tiles of 64x64 (128 clocks a step, 3 programs per SM):
    6 tiles on the busiest SM, 3 together twice, so 36 x 2 x 3 x 128 clocks. Plus the 3 us floor."""
    t = toy_target()
    monkeypatch.setattr(configs, "EARLY_START", False)  # the two launches in plain stream order: their times add up
    cfg = dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], row_tail=True)
    p = model.predict_point(2304, "bf16", cfg, t)
    assert configs.ROW_TAIL_TILE == configs.TileConfig(64, 64, 64, 8, 4, 4)
    cycles = 36 * 1024 + 36 * 2 * 3 * 128
    assert p["schedule"] == "row tail" and p["tail_rows"] == 896
    assert p["predicted_ms"] == pytest.approx((cycles / 1e9 + 3e-6) * 1e3, rel=1e-6)
    plain = model.predict_point(2304, "bf16", configs.DEFAULT_CONFIGS["bf16"], t)  # 2 waves of 36 steps of 1024 clocks
    assert plain["predicted_ms"] == pytest.approx((2 * 36 * 1024 / 1e9 + 3e-6) * 1e3, rel=1e-6)


def test_row_tail_model_with_the_early_start_by_hand(monkeypatch):
    """The same point with the early start: the 504 short tiles' K steps (36 of 128 clocks each) spread over the 100
    SMs add 504 x 36 x 128 / 100 clocks to the big tiles' 36 x 1024; that is more than the short tiles' own busiest SM
    (36 x 2 x 3 x 128), so it is the time."""
    monkeypatch.setattr(configs, "EARLY_START", True)
    p = model.predict_point(2304, "bf16", dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], row_tail=True), toy_target())
    cycles = max(36 * 1024 + 504 * 36 * 128 / 100, 36 * 2 * 3 * 128)
    assert p["predicted_ms"] == pytest.approx((cycles / 1e9 + 3e-6) * 1e3, rel=1e-6)


def test_tail_rounds_by_hand():
    """132 SMs (an H100), 128x256 tiles. N = 2304: 18 x 9 = 162 tiles; the full wave holds 14 whole rows (126 tiles), so
    6 SMs idle in it, and 2304 - 1792 = 512 rows are left: 4 x 36 = 144 tiles of 128x64. An idle SM does 4 of those (a
    quarter of a big tile each) in a big tile's time: 144 - 24 = 120 <= 132, one round; in plain stream order the idle
    SMs cannot start them: two. 72 tiles of 128x128: one round."""
    big = configs.DEFAULT_CONFIGS["bf16"]
    assert configs.row_tail_rows(2304, 2304, big, 132) == 14 * 128
    assert configs.tail_rounds(2304, big, configs.TALL_TAIL_TILE, "bf16", 132) == 1
    assert configs.tail_rounds(2304, big, configs.WIDE_TAIL_TILE, "bf16", 132) == 1
    assert configs.tail_rounds(2304, big, configs.ROW_TAIL_TILE, "bf16", 132) == 2  # 288 - 6 x 8 = 240 > 132
    with_early = configs.EARLY_START
    try:
        configs.set_early_start(False)
        assert configs.tail_rounds(2304, big, configs.TALL_TAIL_TILE, "bf16", 132) == 2
    finally:
        configs.set_early_start(with_early)
    # N = 3712: 29 x 15 = 435 tiles; 3 full waves (396) hold 26 whole rows (390 tiles): 6 idle SMs; 384 rows left:
    # 3 x 58 = 174 tiles of 128x64, 174 - 24 = 150 > 132: two rounds; 87 of 128x128: one
    assert configs.tail_rounds(3712, big, configs.TALL_TAIL_TILE, "bf16", 132) == 2
    assert configs.tail_rounds(3712, big, configs.WIDE_TAIL_TILE, "bf16", 132) == 1
    # N = 4864: 38 x 19 = 722 tiles; 5 full waves (660) hold 34 whole rows (646 tiles): 14 idle SMs, each doing two
    # 128x128 tiles (half a big tile) before the others finish; 512 rows left: 4 x 38 = 152, 152 - 28 = 124 <= 132
    assert configs.tail_rounds(4864, big, configs.WIDE_TAIL_TILE, "bf16", 132) == 1


def test_tail_tile_is_a_quarter_of_the_big_one_in_one_round_else_a_half():
    big = configs.DEFAULT_CONFIGS["bf16"]
    for n in (2176, 2304, 2944, 3072, 4224, 6656):  # 102, 144, 46, 96, 132, 208 tall tiles: one round
        assert configs.tuned_config(n, "bf16", 132) == dataclasses.replace(big, row_tail=True, tail="T"), n
    for n in (2432, 3200, 3712, 3840, 4352, 4736, 4864, 5632, 6400, 7552):  # 228, 250, 174, ... tall tiles: two rounds
        assert configs.tuned_config(n, "bf16", 132) == dataclasses.replace(big, row_tail=True, tail="W"), n
    assert configs.tuned_config(2688, "bf16", 132) == big  # 231 tiles: the last wave 75 % full, no row tail
    # N = 6656: 52 x 26 = 1352 tiles; 10 waves (1320) hold 50 whole rows (1300): 20 idle SMs take 80 of the 208 tall
    # tiles, 128 left
    assert configs.tail_rounds(6656, big, configs.TALL_TAIL_TILE, "bf16", 132) == 1
    # After 128x128 tiles the quarter is 64x64, the half 128x64; after 64x128 the half is 64x64 (no quarter tile);
    # after 64x64 nothing is half of it. N = 1536: 12 x 12 = 144 tiles, 11 whole rows in the wave, 128 rows left: 48
    # tiles of 64x64. N = 1664: 13 x 13 = 169, 10 whole rows (130), 2 idle SMs, 384 rows: 156 - 8 > 132
    narrow = configs.NARROW_TILE
    assert configs.tail_choice(1536, narrow, "bf16", 132) == ""
    assert configs.tail_choice(1664, narrow, "bf16", 132) == "T"
    assert configs.tail_choice(1152, configs.TileConfig(64, 128, 64, 8, 4, 6), "bf16", 132) == ""
    assert configs.tail_choice(768, configs.TileConfig(64, 64, 64, 8, 4, 4), "bf16", 132) is None
    assert {k: (t.block_m, t.block_n) for k, t in configs.TAIL_TILES.items()} == \
        {"": (64, 64), "T": (128, 64), "W": (128, 128)}


def test_small_sizes_by_the_busiest_sm():
    """In 128x128 tiles' worth of work on the busiest SM (132 SMs). N = 1152: 18 x 9 = 162 tiles of 64x128; 4 stages
    run them in one wave, 2 on the busiest SM (1.0); 6 stages (one an SM) hold 14 whole rows (126 tiles, 0.5), then 256
    rows in 4 x 18 = 72 tiles of 64x64 (one round, 0.25): 0.75. N = 1664: 26 x 13 = 338 tiles of 64x128, 3 stages in
    one wave, 3 on the busiest SM (1.5); 128x128 tiles with their tail: 1 + a round of 128x64 (0.5), a tie, and one
    launch wins it. N = 1536: 128x128 with 48 tiles of 64x64 (1.25) against 288 tiles of 64x128 (3 an SM: 1.5)."""
    small = configs.TileConfig(64, 128, 64, 8, 4, 4)
    s6_rt = dataclasses.replace(small, num_stages=6, row_tail=True)
    assert configs.busiest_sm_work(1152, dataclasses.replace(small, num_stages=4), "bf16", 132) == 1.0
    assert configs.busiest_sm_work(1152, s6_rt, "bf16", 132) == 0.75
    assert configs.tuned_config(1152, "bf16", 132) == s6_rt
    narrow_t = dataclasses.replace(configs.NARROW_TILE, row_tail=True, tail="T")
    assert configs.busiest_sm_work(1664, narrow_t, "bf16", 132) == 1.5
    assert configs.tuned_config(1664, "bf16", 132) == dataclasses.replace(small, num_stages=3)
    assert configs.busiest_sm_work(1536, dataclasses.replace(configs.NARROW_TILE, row_tail=True), "bf16", 132) == 1.25
    assert configs.tuned_config(1536, "bf16", 132) == dataclasses.replace(configs.NARROW_TILE, row_tail=True)
    for n, stages in ((1024, 6), (1280, 4), (1408, 4)):  # 128 tiles (one wave at 6 stages); 200, 242: no row tail
        assert configs.tuned_config(n, "bf16", 132) == dataclasses.replace(small, num_stages=stages), n
    with_early = configs.EARLY_START
    try:
        configs.set_early_start(False)  # re-predicting plain stream order: no small-size row tails
        assert configs.tuned_config(1152, "bf16", 132) == small
    finally:
        configs.set_early_start(with_early)


def test_tail_labels_read_back():
    big = configs.DEFAULT_CONFIGS["bf16"]
    for tail, flag in (("", "RT"), ("T", "RTT"), ("W", "RTW")):
        config = dataclasses.replace(big, row_tail=True, tail=tail)
        assert config.label == "128x256x64 G8 w8 s3 " + flag
        assert configs.parse_label(config.label) == config
    assert configs.parse_label("128x256x64 G8 w8 s3 RT").tail == ""  # recordings before the tail tiles
    assert configs.parse_label("128x256x64 G8 w8 s3 RTX") is None


def test_wide_tail_model_by_hand(monkeypatch):
    """Toy GPU (100 SMs, 1 GHz, 4096 FLOP per clock per SM), N = 2304 with the wide tail: the big tiles' 36 x 1024
    clocks as in test_row_tail_model_by_hand, then the 896 rows left in 7 x 18 = 126 tiles of 128x128 (one program
    an SM: 128 KiB; 2 x 128 x 128 x 64 / 4096 = 512 clocks a step), two on the busiest SM. A 128x128 program does not
    fit beside a 128x256 one (128 + 144 KiB > 227), so even with the early start the two times add up."""
    cfg = dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], row_tail=True, tail="W")
    cycles = 36 * 1024 + 36 * 2 * 512
    for early in (False, True):
        monkeypatch.setattr(configs, "EARLY_START", early)
        p = model.predict_point(2304, "bf16", cfg, toy_target())
        assert p["schedule"] == "row tail" and p["tail_rows"] == 896 and p["config"].endswith(" RTW")
        assert p["predicted_ms"] == pytest.approx((cycles / 1e9 + 3e-6) * 1e3, rel=1e-6), early


def test_tall_tail_model_by_hand(monkeypatch):
    """The same point with the tall tail: 896 rows in 7 x 36 = 252 tiles of 128x64 (2 x 128 x 64 x 64 / 4096 = 256
    clocks a step; 72 KiB, 3 programs an SM, so 3 on the busiest SM, together: 36 x 3 x 256). They fit beside a big
    program (72 + 144 KiB <= 227): with the early start their steps spread over the 100 SMs add 252 x 36 x 256 / 100
    clocks to the big tiles' 36 x 1024; in stream order the two times add up."""
    cfg = dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], row_tail=True, tail="T")
    for early, cycles in ((False, 36 * 1024 + 36 * 3 * 256), (True, max(36 * 1024 + 252 * 36 * 256 / 100, 36 * 3 * 256))):
        monkeypatch.setattr(configs, "EARLY_START", early)
        p = model.predict_point(2304, "bf16", cfg, toy_target())
        assert p["tail_rows"] == 896 and p["config"].endswith(" RTT")
        assert p["predicted_ms"] == pytest.approx((cycles / 1e9 + 3e-6) * 1e3, rel=1e-6), early


@pytest.mark.parametrize("tail", ["T", "W"])
@pytest.mark.parametrize("shape,slots", [((45, 48, 80), 4), ((70, 144, 48), 3)])
def test_tail_tiles_match_float64_on_odd_shapes(shape, slots, tail, device):
    """The launcher's own tail tile (no tail_config given): 128x64 or 128x128 on the rows left over."""
    if device == "cuda" and not configs.tma_supported(kernels._device_cc(torch.device("cuda"))):
        pytest.skip("this GPU has no TMA")
    m, n, k = shape
    big = configs.TileConfig(16, 32, 16, 2, 4, 2, row_tail=True, tail=tail)
    assert 0 < configs.row_tail_rows(m, n, big, slots) < m
    a, b = kernels.operands(m, n, k, "bf16", device)
    out = torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16)
    _, path, _ = kernels.triton_matmul(a, b, "bf16", out, big, tma="on", programs=slots)
    assert path == "tma"
    timing.check_close(out, measure.reference(a, b), "bf16", f"row tail {tail} {shape}")


# ---------------------------------------------------------------------------------------------
# Interior + edge (issue 15): whole big tiles inside, thin strips of narrow tiles at the bottom and on the right
# ---------------------------------------------------------------------------------------------
def test_edge_interior_and_rule_by_hand():
    big = configs.DEFAULT_CONFIGS["bf16"]
    assert configs.edge_interior(2064, 2064, big) == (2048, 2048)  # 16 rows and 16 columns left over
    assert configs.edge_interior(2057, 2100, big) == (2048, 2048)
    # 132 SMs: 16 x 8 = 128 whole tiles fill one wave to 97 %; 17 x 9 = 153 tiles over all of C fill two to 58 %
    assert configs.edge_applies(2064, big, "bf16", 132) and configs.edge_applies(2056, big, "bf16", 132)
    assert not configs.edge_applies(2048, big, "bf16", 132)  # no edge at all
    assert not configs.edge_applies(2304, big, "bf16", 132)  # 18 x 9 whole tiles: no edge
    assert not configs.edge_applies(2080, big, "bf16", 132)  # 32 rows left over: thicker than an edge tile covers
    # 160 SMs: the 153 tiles fit one wave (96 %), the 128 whole tiles fill only 80 %: not worth it
    assert not configs.edge_applies(2064, big, "bf16", 160)
    assert configs.tuned_config(2064, "bf16", 132) == dataclasses.replace(big, edge=True)
    assert configs.parse_label(dataclasses.replace(big, edge=True).label).edge


@pytest.mark.parametrize("shape", [(75, 144, 40), (64, 152, 40), (70, 128, 72)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_edge_matches_float64_on_odd_shapes(shape, dtype, device):
    """Interior + edge with small tiles: whole tiles inside, the bottom strip (M odd) and the right strip in
    narrow tiles, every element against float64 (the output poisoned with NaN first). The shapes have both strips,
    only the right one, and only the bottom one."""
    if device == "cuda" and not configs.tma_supported(kernels._device_cc(torch.device("cuda"))):
        pytest.skip("this GPU has no TMA")
    m, n, k = shape
    big = configs.TileConfig(32, 64, 16, 2, 4, 2, edge=True)
    rows, cols = configs.edge_interior(m, n, big)
    assert 0 < rows <= m and 0 < cols <= n and (rows, cols) != (m, n)  # there is an edge
    a, b = kernels.operands(m, n, k, dtype, device)
    out = torch.full((m, n), float("nan"), device=device, dtype=torch.float16 if dtype == "fp16" else torch.bfloat16)
    _, path, _ = kernels.triton_matmul(a, b, dtype, out, big, tma="on")
    assert path == "tma"
    ref = measure.reference(a, b)
    for part in ((slice(0, rows), slice(0, cols)), (slice(rows, m), slice(0, n)), (slice(0, rows), slice(cols, n))):
        if out[part].numel():
            timing.check_close(out[part], ref[part], dtype, f"edge {shape} {part}")


def test_edge_model_by_hand(monkeypatch):
    """Toy GPU, N = 2064, 128x256 tiles: the 2048 x 2048 interior is 128 tiles, 2 rounds on 100 SMs of 33 K steps
    (K = 2064) of 1024 clocks. The bottom strip is 33 tiles of 16x64, the right one 32 of 64x16, each 17 steps of
    BLOCK_K = 128 costing 160 clocks (loads: 80 x 128 x 2 bytes at 128 a clock); alone, one tile an SM, 17 x 160.
    In stream order the three add up; with the early start the strips' steps spread over the 100 SMs."""
    t = toy_target()
    cfg = dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], edge=True)
    assert (configs.EDGE_ROW_TILE.block_k, configs.EDGE_COL_TILE.block_k) == (128, 128)
    interior = 33 * 2 * 1024
    monkeypatch.setattr(configs, "EARLY_START", False)
    p = model.predict_point(2064, "bf16", cfg, t)
    assert p["schedule"] == "interior + edge"
    assert p["predicted_ms"] == pytest.approx(((interior + 2 * 17 * 160) / 1e9 + 3e-6) * 1e3, rel=1e-6)
    monkeypatch.setattr(configs, "EARLY_START", True)
    p = model.predict_point(2064, "bf16", cfg, t)
    assert p["predicted_ms"] == pytest.approx(((interior + (33 + 32) * 17 * 160 / 100) / 1e9 + 3e-6) * 1e3, rel=1e-6)



def test_narrow_row_tail_where_the_big_tile_leaves_sms_idle(monkeypatch):
    """N = 1536 on 132 SMs: 72 tiles of 128x256 leave 60 SMs idle. 128x128 tiles make 144: one full wave and 12 over,
    so with the early start the rule takes one wave of 128x128 tiles and the last 128 rows in short tiles; without it
    (two launches one after the other) it keeps 64x128 tiles, 3 stages deep."""
    monkeypatch.setattr(configs, "EARLY_START", True)
    assert configs.tuned_config(1536, "bf16", 132) == dataclasses.replace(configs.NARROW_TILE, row_tail=True)
    assert configs.row_tail_rows(1536, 1536, configs.NARROW_TILE, 132) == 11 * 128
    assert configs.tuned_config(1280, "bf16", 132) == configs.TileConfig(64, 128, 64, 8, 4, 4)  # 100 tiles of 128x128: no wave
    monkeypatch.setattr(configs, "EARLY_START", False)
    assert configs.tuned_config(1536, "bf16", 132) == configs.TileConfig(64, 128, 64, 8, 4, 3)


def test_probe_check_runs_both_row_tail_launches(device):
    """The lab's check of a row-tail config on its small probe shape splits it (a few slots), so both launches
    are checked against float64 before the sweep times them."""
    cfg = dataclasses.replace(configs.DEFAULT_CONFIGS["bf16"], row_tail=True)
    m, n, _ = measure.PROBE_TMA
    assert 0 < configs.row_tail_rows(m, n, cfg, measure.PROBE_ROW_TAIL_SLOTS) < m
    if device == "cpu":
        return  # a 128x256 tile on 517 x 528 x 560 takes minutes in the interpreter; the small shapes above do it
    assert measure.probe_check("bf16", mm.Params(), "tma", device, cfg) < 1e-2


def test_the_default_tile_shrinks_to_fit_an_sm_but_a_chosen_tile_is_refused():
    """An L4's or L40S's SM has 99 KiB of shared memory and a T4's 64 KiB: the default tile (144 KiB in bf16 on
    Hopper) takes fewer stages, then a narrower tile, so the defaults run everywhere; the same tile set by hand
    is refused with the reason."""
    for name in ("L4", "L40S", "RTX 4090", "A10G", "A100 40GB", "H100 SXM"):
        target = gpu.datasheet_target(gpu.datasheet_by_name(name))
        mm.LAB.check(mm.Params(), target)  # no refusal
        for dtype in ("bf16", "fp16", "fp8", "tf32", "fp32"):
            cfg = configs.config_for(mm.Params(), dtype, compute_capability=target.compute_capability)
            assert configs.blocks_per_sm(cfg, dtype, "vec16", target.compute_capability) >= 1
    assert configs.fitted_default("bf16", "8.9") == configs.TileConfig(128, 256, 64, 8, 8, 2)  # 96 of 99 KiB
    assert configs.fitted_default("bf16", "7.5") == configs.TileConfig(128, 128, 64, 8, 8, 2)  # 64 of 64 KiB
    assert configs.fitted_default("bf16", "9.0") == configs.DEFAULT_CONFIGS["bf16"]
    l4 = gpu.datasheet_target(gpu.datasheet_by_name("L4"))
    with pytest.raises(ParamError, match="shared memory"):
        mm.LAB.check(mm.Params(block_n=256, num_stages=3), l4)


def test_the_floor_probe_keeps_its_timings_off_the_first_row(monkeypatch):
    """The floor probe runs once a run, before the first row: its two timings are the floor note's. Left to the
    runner they fell on the first row of the first pass only, which then merged as 1 repeat (`labs run` said "the
    median of at least 1 repeats") with the probe's kernels in its spread."""
    t = toy_target()

    def fake_probe(target):
        timing.record_samples([0.006, 0.007])  # what the real probe's timers hand the collector
        model._FLOOR_PROBED[target.key] = 6.0
        return 6.0

    monkeypatch.setattr(measure, "probe_floor_us", fake_probe)
    monkeypatch.setattr(model, "_FLOOR_PROBED", {})
    monkeypatch.setattr(measure, "load_latency_us", lambda target: 0.8)
    with timing.collecting() as rows_timed:
        first = next(measure.measure(mm.Params(sizes=(256,)), t, lambda *a: None))
    assert isinstance(first, str) and "6.0" in first  # the floor note
    assert rows_timed.take() == []
