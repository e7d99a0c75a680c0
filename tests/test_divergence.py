"""The divergence lab: Triton kernels against float64 (interpreter on CPU), the warp model by hand,
the CUDA C++ source (compiled to SASS where nvcc exists, run under `gpu`), and the page."""

import dataclasses
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

from labs.divergence import LAB, Params
from labs.divergence.kernels import branches, two_paths, varying_work
from labs.divergence.measure import (branches_reference, check, counted_efficiency, grid_input, path_a_reference,
                                     path_b_reference, sample_k, two_paths_reference, varying_work_reference,
                                     warp_max_sum)
from labs.divergence.model import (TRITON_BLOCK, TRITON_CASES, branch_counts, data_dependent_model, k_pmf,
                                   odd_group_count, predict, triton_counts, warp_trip_ms)
from labs.engine import timing
from labs.engine import cuda
from labs.engine import gpu
from labs.engine import runner
from labs.engine.params import ParamError
from tests.conftest import render_page

ROOT = Path(__file__).resolve().parent.parent
H200 = gpu.datasheet_target(gpu.datasheet_by_name("H200"))


# --- Triton kernels (interpreter on CPU, compiled on a GPU) --------------------------------------
@pytest.mark.parametrize("n", [1, 1023, 2 * TRITON_BLOCK + 7])
@pytest.mark.parametrize("case", TRITON_CASES + (("tl.where, g = 3", False, 3),))
def test_triton_two_paths_match_float64_on_odd_sizes(device, n, case):
    _, per_program, g = case
    x = grid_input(n, device)
    out = torch.full_like(x, float("nan"))  # an element left unwritten fails the check
    two_paths(x, 2, 3, per_program, g, out)
    assert timing.check_close(out, two_paths_reference(x, 2, 3, per_program, g), "fp32", case[0]) == 0.0


def test_triton_check_catches_the_wrong_branch(device):
    x = grid_input(2 * TRITON_BLOCK, device)
    out = two_paths(x, 2, 3, per_program=True)
    with pytest.raises(timing.KernelMismatch):  # per-program result is not the per-element one
        timing.check_close(out, two_paths_reference(x, 2, 3, per_program=False, g=1), "fp32", "wrong side")


def test_references_follow_the_closed_forms():
    x = torch.tensor([0.5, -1.25])
    assert path_a_reference(x, 3).tolist() == [2 + 6 + 32 * 3 * 0.5, -5 + 6 + 48]
    assert path_b_reference(x, 2).tolist() == [4 + 14 - 16, -10 + 14 - 16]
    k = torch.tensor([1, 4], dtype=torch.int32)
    assert varying_work_reference(k, x).tolist() == [8 + 16, 1 + 64]


# --- the warp model, counted by hand ---------------------------------------------------------------
def test_branch_counts_by_hand():
    # 64 threads, groups of 16: both warps hold both sides -> each issues 3 + 5 trips
    assert branch_counts(64, 16, 3, 5) == (16.0, 8.0)
    # groups of 32: warp 0 runs A only, warp 1 B only
    assert branch_counts(64, 32, 3, 5) == (8.0, 8.0)
    # groups of 64: both warps on A
    assert branch_counts(64, 64, 3, 5) == (6.0, 6.0)
    # 40 threads, g = 32: warp 0 all A (3), warp 1 has 8 live lanes on B (5): useful (32*3 + 8*5) / 32
    assert branch_counts(40, 32, 3, 5) == (8.0, 4.25)
    # g = 48 (not a power of two): warps 0 A, 1 A+B (lanes 32-47 A, 48-63 B), 2 B -> 3 + 8 + 5
    assert branch_counts(96, 48, 3, 5) == (16.0, 12.0)


def test_branch_counts_scale_over_many_periods():
    issued, useful = branch_counts(10_000_000 + 17, 8, 2, 7)
    warps = -(-(10_000_000 + 17) // 32)
    assert issued == warps * (2 + 7)
    assert useful == pytest.approx((10_000_000 + 17) * 4.5 / 32, rel=1e-6)


def test_odd_group_count():
    assert odd_group_count(9, 3) == 3  # indices 3, 4, 5
    assert odd_group_count(11, 3) == 5  # ... and 9, 10
    assert odd_group_count(2048, 1024) == 1024


def test_predicted_step_is_at_the_warp_size_for_every_cost_ratio():
    rows = [r for r in predict(Params(experiments=("branches",)), H200)]
    for r in rows:
        expected = 2.0 if r["g"] < 32 else 1.0
        assert r["predicted_slowdown"] == pytest.approx(expected)
        assert r["predicted_branch_efficiency"] == pytest.approx(1 / expected)
    # absolute time: one warp-trip = 32 lanes x 32 FMAs x 2 FLOP at the FMA ceiling
    r = next(r for r in rows if r["g"] == 32 and r["cost_ratio"] == 2.0)
    warps = Params().threads // 32
    flops = warps * (64 + 128) / 2 * 32 * 32 * 2
    assert r["predicted_ms"] == pytest.approx(flops / (H200.ceilings.fma_tflops * 1e12) * 1e3)


def test_triton_where_computes_both_sides_and_the_program_branch_one():
    rows = predict(Params(experiments=("triton",), cost_ratios=(3.0,)), H200)
    by_case = {r["case"]: r for r in rows}
    assert by_case["if per program"]["predicted_slowdown"] == 1.0
    for case in ("tl.where, g = 1", f"tl.where, g = {TRITON_BLOCK}"):
        assert by_case[case]["predicted_slowdown"] == pytest.approx(2.0, rel=1e-3)
    issued, useful = triton_counts(4 * TRITON_BLOCK, 2, 6, per_program=False, g=TRITON_BLOCK)
    assert issued == 4 * TRITON_BLOCK * 8 and useful == 2 * TRITON_BLOCK * 8


def test_data_dependent_model_by_hand():
    assert k_pmf("bimodal", 64) == {8: 7 / 8, 64: 1 / 8}
    model = data_dependent_model("uniform", 2, 32 * 1000, H200)
    # k in {1, 2}: a warp's max is 1 only if all 32 lanes drew 1
    mean_max = 2 - 0.5**32
    assert model["random"]["efficiency"] == pytest.approx(1.5 / mean_max)
    trip = warp_trip_ms(H200)
    floor = 32 * 12 / (H200.ceilings.copy_tbps * 1e12) * 1e3  # a warp's bytes at full bandwidth
    cost = {1: max(trip, floor), 2: max(2 * trip, floor)}  # each warp: the slower of its FMAs and its bytes
    assert model["random"]["ms"] == pytest.approx(1000 * (0.5**32 * cost[1] + (1 - 0.5**32) * cost[2]))
    assert model["sorted"]["ms"] == pytest.approx(1000 * (cost[1] + cost[2]) / 2 + 0.5 * trip)
    heavy = data_dependent_model("bimodal", 64, 2**22, H200)
    p_light_warp = (7 / 8) ** 32
    assert heavy["random"]["efficiency"] == pytest.approx(15 / (8 * p_light_warp + 64 * (1 - p_light_warp)))
    assert heavy["random"]["ms"] / heavy["sorted"]["ms"] > 4


def test_counted_efficiency_from_actual_k():
    k = torch.tensor([1] * 31 + [5] + [2] * 32 + [3] * 3, dtype=torch.int32)  # warps: max 5, 2, 3 (3 lanes)
    assert warp_max_sum(k) == 10
    assert counted_efficiency(k) == pytest.approx((31 + 5 + 64 + 9) / (32 * 10))
    sampled = sample_k("bimodal", 64, 10_000, "cpu")
    assert set(sampled.unique().tolist()) == {8, 64}


def test_headline_row_is_in_the_default_prediction():
    measured, predicted = LAB.headline.answer(predict(Params(), H200))
    assert measured is None and predicted == pytest.approx(2.0)


def test_check_refuses_fma_counts_that_are_not_whole_trips():
    with pytest.raises(ParamError, match="multiple of 32"):
        check(Params(fmas=100), H200)


def test_check_names_the_missing_compiler_and_the_way_out():
    live = dataclasses.replace(H200, live=True)
    reason = cuda.why_unavailable()
    if not reason:
        pytest.skip("this machine can build CUDA C++")
    with pytest.raises(ParamError) as info:
        check(Params(), live)
    assert reason in str(info.value) and "experiments = triton" in str(info.value)
    with pytest.raises(ParamError, match="GB"):  # the Triton part alone passes the compiler check
        check(Params(experiments=("triton",), threads=2**26), dataclasses.replace(H200, live=True,
                                                                                      memory_bytes=10**9))


def test_model_only_run_works_without_a_gpu():
    result = runner.model(LAB, Params(), H200)
    assert {r["experiment"] for r in result.rows} == {"branches", "triton", "data-dependent"}


# --- the CUDA C++ source ---------------------------------------------------------------------------
def _cuobjdump():
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(path) if path.exists() else shutil.which("cuobjdump")


@pytest.mark.skipif(not shutil.which("nvcc") or not _cuobjdump(), reason="needs nvcc and cuobjdump")
def test_compiled_branches_keep_two_separate_loops(tmp_path):
    """The compiler must not merge the branches into one loop or predicate them into straight-line code."""
    cubin = tmp_path / "divergence.cubin"
    subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-DROOFLINE_KERNELS_ONLY", "-cubin", "-x", "cu",
                    str(ROOT / "labs" / "divergence" / "divergence.cu"), "-o", str(cubin)], check=True, timeout=120)
    sass = subprocess.run([_cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    body = sass.split("Function : _Z15branches_kernel")[1].split("Function :")[0]
    jumps = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?BRA\s+0x([0-9a-f]+)", body)
    backward = [(int(a, 16), int(t, 16)) for a, t in jumps if int(t, 16) < int(a, 16)]
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", body)

    def chains(start: int, end: int) -> int:
        """Independent FMA chains in one loop body: destination registers written by many of its FFMAs."""
        dests = Counter(m.group(1) for a, text in lines if start <= int(a, 16) <= end
                        for m in [re.match(r"FFMA (R\d+),", text.strip())] if m)
        return sum(1 for count in dests.values() if count >= max(dests.values()) / 2) if dests else 0

    shapes = {chains(target, address) for address, target in backward} - {0}
    # path A's loop carries 4 chains and path B's 8: two loops of different shapes, one per branch
    # (a merged or if-converted kernel would have one loop shape, or none)
    assert {4, 8} <= shapes, shapes


@pytest.mark.gpu
def test_cuda_kernels_match_float64_on_odd_sizes():
    x = grid_input(100_003)
    for g in (1, 5, 16, 32, 100):
        out = torch.full_like(x, float("nan"))
        branches(x, g, 2, 3, out)
        assert timing.check_close(out, branches_reference(x, g, 2, 3), "fp32", f"g={g}") == 0.0
    k = sample_k("uniform", 9, x.numel())
    out = torch.full_like(x, float("nan"))
    assert timing.check_close(varying_work(k, x, out), varying_work_reference(k, x), "fp32", "k") == 0.0


@pytest.mark.gpu
def test_live_sweep_shows_the_step_at_the_warp_size():
    params = Params(experiments=("branches", "data-dependent"), g=(16, 32, 64), cost_ratios=(1.0,),
                       fmas=1024, threads=2**21, distributions=("uniform",))
    rows = {(r["experiment"], r["case"], r["g"]): r for r in runner.run(LAB, params, use_cache=False).rows}
    assert rows[("branches", "g sweep", 16)]["measured_slowdown"] == pytest.approx(2.0, rel=0.1)
    assert rows[("branches", "g sweep", 64)]["measured_slowdown"] == pytest.approx(1.0, rel=0.1)
    sorted_row = rows[("data-dependent", "uniform, sorted", None)]
    assert sorted_row["measured_sorting_speedup"] == pytest.approx(sorted_row["predicted_sorting_speedup"], rel=0.15)


# --- the page ---------------------------------------------------------------------------------------
def test_page_renders_model_and_charts_without_a_gpu():
    at = render_page("divergence.py", timeout=60)
    assert at.title[0].value == LAB.title
    specs = " ".join(c.proto.spec for c in at.get("plotly_chart"))
    assert "g sweep" in specs and "tl.where" in specs and "sorted" in specs
    if not torch.cuda.is_available():
        assert any("Live runs are off" in i.value for i in at.info)
