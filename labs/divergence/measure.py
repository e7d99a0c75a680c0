"""Measuring warp divergence: refuse what cannot run, check every kernel against float64 on an odd size (exact:
the chains are exact in fp32), then time each case beside its no-divergence baseline from the same run."""

from __future__ import annotations

import torch

from labs.engine import timing
from labs.engine.gpu import Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.divergence.kernels import (A_ADD, B_ADD, branches, cuda_kernels, cuda_unavailable_reason, two_paths,
                                     varying_work)
from labs.divergence.model import (ALL_MAX_CASE, BIMODAL_HEAVY, CUDA_EXPERIMENTS, FMAS_PER_TRIP, TRITON_BLOCK,
                                   TRITON_CASES, TRITON_UNROLL, WARP, case_name, trips_for)


# ---------------------------------------------------------------------------------------------
# References (float64): closed forms of the chains with mul = 1
# ---------------------------------------------------------------------------------------------
def path_a_reference(x: torch.Tensor, trips) -> torch.Tensor:
    """Four chains started at x, x+1, x+2, x+3, each 8 FMAs per trip, summed: 4x + 6 + 32 trips b."""
    return 4 * x.double() + 6 + 4 * 8 * A_ADD * torch.as_tensor(trips, dtype=torch.float64, device=x.device)


def path_b_reference(x: torch.Tensor, trips) -> torch.Tensor:
    """Eight chains started at x, x+0.5, ..., x+3.5, each 4 FMAs per trip, summed: 8x + 14 + 32 trips d."""
    return 8 * x.double() + 14 + 8 * 4 * B_ADD * torch.as_tensor(trips, dtype=torch.float64, device=x.device)


def branches_reference(x: torch.Tensor, g: int, trips_a: int, trips_b: int) -> torch.Tensor:
    take_b = (torch.arange(x.numel(), device=x.device) // g) % 2 == 1
    return torch.where(take_b, path_b_reference(x, trips_b), path_a_reference(x, trips_a))


def varying_work_reference(k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return path_a_reference(x, k.double())


def grid_input(n: int, device=None) -> torch.Tensor:
    """Fresh standard-normal values rounded to multiples of 1/256 (so the chains stay exact in fp32)."""
    return torch.round(timing.random_tensor((n,), "fp32", device) * 256) / 256


def two_paths_reference(x: torch.Tensor, trips_a: int, trips_b: int, per_program: bool, g: int = 1) -> torch.Tensor:
    i = torch.arange(x.numel(), device=x.device)
    take_b = (i // TRITON_BLOCK) % 2 == 1 if per_program else (i // g) % 2 == 1
    x64 = x.double()
    steps = TRITON_UNROLL
    return torch.where(take_b, x64 + steps * trips_b * B_ADD, x64 + steps * trips_a * A_ADD)


# ---------------------------------------------------------------------------------------------
# Data-dependent work: fresh trip counts, and the efficiency counted from them
# ---------------------------------------------------------------------------------------------
def sample_k(distribution: str, k_max: int, n: int, device=None) -> torch.Tensor:
    """Fresh random trip counts (int32), drawn from k_pmf."""
    device = device or timing.default_device()
    if distribution == "uniform":
        return torch.randint(1, k_max + 1, (n,), device=device, dtype=torch.int32)
    light = max(1, k_max // 8)
    heavy = torch.rand(n, device=device) < BIMODAL_HEAVY
    return torch.where(heavy, k_max, light).to(torch.int32)


def warp_max_sum(k: torch.Tensor) -> int:
    """Sum over warps (32 consecutive elements) of the largest k in the warp."""
    pad = (-k.numel()) % WARP
    kk = torch.nn.functional.pad(k, (0, pad)) if pad else k
    return int(kk.view(-1, WARP).amax(dim=1).sum().item())


def counted_efficiency(k: torch.Tensor) -> float:
    """Useful lane-trips / issued lane-trips, counted from the actual k values and warp grouping."""
    return float(k.sum().item()) / (WARP * warp_max_sum(k))


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
CHECK_THREADS = 100_003  # odd: the last block and the last warp are partly masked


def bytes_needed(params) -> int:
    return params.threads * 4 * 6  # x, y, three k arrays, a poisoned output


def check(params, target: Target) -> None:
    """Refuse what cannot run: no CUDA compiler for the CUDA C++ parts, memory, odd FMA counts."""
    if params.fmas % FMAS_PER_TRIP:
        nearest = max(FMAS_PER_TRIP, params.fmas // FMAS_PER_TRIP * FMAS_PER_TRIP)
        raise ParamError(f"fmas = {params.fmas} must be a multiple of {FMAS_PER_TRIP} (one loop trip is "
                         f"{FMAS_PER_TRIP} FMAs); try {nearest}.")
    cuda_parts = [e for e in params.experiments if e in CUDA_EXPERIMENTS]
    if cuda_parts and target.live:
        reason = cuda_unavailable_reason()
        if reason:
            raise ParamError(f"{reason} The {' and '.join(cuda_parts)} experiment(s) are written in CUDA C++; "
                             "choose experiments = triton to run the Triton part alone.")
    free = free_memory_bytes() if target.live else target.memory_bytes
    if bytes_needed(params) > 0.5 * free:
        raise ParamError(f"threads = {params.threads} needs {bytes_needed(params) / 1e9:.1f} GB; this GPU has "
                         f"{free / 1e9:.1f} GB free. Choose fewer threads.")


def _time(fn) -> float:
    return timing.time_ms(fn, warmup_ms=10, rep_ms=60)


def _measure_branches(params, target: Target, step):
    n = params.threads
    probe = grid_input(CHECK_THREADS)
    x, y = grid_input(n), torch.empty(n, device="cuda")
    for ratio in params.cost_ratios:
        ta, tb = trips_for(params, ratio, FMAS_PER_TRIP)
        base_ms = None
        for g in (WARP,) + tuple(v for v in params.g if v != WARP):  # the no-divergence baseline first
            step(f"CUDA branches, cost ratio {ratio:g}, g = {g}: checking, then timing")
            out = torch.full_like(probe, float("nan"))
            err = timing.check_close(branches(probe, g, ta, tb, out), branches_reference(probe, g, ta, tb), "fp32",
                                    f"CUDA branches (g={g}, ratio={ratio:g})")
            ms = _time(lambda: branches(x, g, ta, tb, y))
            base_ms = ms if g == WARP else base_ms
            if g in params.g:
                yield {"experiment": "branches", "case": "g sweep", "cost_ratio": ratio, "g": g, "measured_ms": ms,
                       "measured_slowdown": ms / base_ms, "measured_branch_efficiency": base_ms / ms,
                       "measured_useful_tflops": timing.tflops(n * (ta + tb) / 2 * FMAS_PER_TRIP * 2, ms),
                       "check_rel_error": err}


def _measure_triton(params, target: Target, step):
    n = params.threads
    probe = grid_input(CHECK_THREADS)
    x, y = grid_input(n), torch.empty(n, device="cuda")
    for ratio in params.cost_ratios:
        ta, tb = trips_for(params, ratio, TRITON_UNROLL)
        timed = {}
        for case, per_program, g in TRITON_CASES[::-1]:  # the per-program baseline first
            step(f"Triton, cost ratio {ratio:g}, {case}: checking, then timing")
            out = torch.full_like(probe, float("nan"))
            err = timing.check_close(two_paths(probe, ta, tb, per_program, g, out),
                                    two_paths_reference(probe, ta, tb, per_program, g), "fp32", f"Triton {case}")
            timed[case] = ms = _time(lambda: two_paths(x, ta, tb, per_program, g, y))
            base_ms = timed[TRITON_CASES[-1][0]]
            yield {"experiment": "triton", "case": case, "cost_ratio": ratio, "g": g if not per_program else None,
                   "measured_ms": ms, "measured_slowdown": ms / base_ms, "measured_branch_efficiency": base_ms / ms,
                   "check_rel_error": err}


def _measure_data_dependent(params, target: Target, step):
    n, k_max = params.threads, params.k_max
    x, y = grid_input(n), torch.empty(n, device="cuda")
    # every element needs k_max trips: no divergence; calibrates the time of one useful lane-trip
    step(f"data-dependent, every k = {k_max}: checking, then timing")
    probe_k = sample_k(params.distributions[0], k_max, CHECK_THREADS)
    out = torch.full((CHECK_THREADS,), float("nan"), device="cuda")
    probe_x = grid_input(CHECK_THREADS)
    timing.check_close(varying_work(probe_k, probe_x, out), varying_work_reference(probe_k, probe_x), "fp32",
                      "data-dependent kernel")
    k_all = torch.full((n,), k_max, device="cuda", dtype=torch.int32)
    all_ms = _time(lambda: varying_work(k_all, x, y))
    ms_per_lane_trip = all_ms / (n * k_max)
    yield {"experiment": "data-dependent", "case": ALL_MAX_CASE, "measured_ms": all_ms, "measured_slowdown": 1.0,
           "measured_branch_efficiency": 1.0, "counted_branch_efficiency": 1.0}
    del k_all
    for dist in params.distributions:
        k = sample_k(dist, k_max, n)
        k_sorted = torch.sort(k).values
        useful_ms = float(k.sum().item()) * ms_per_lane_trip  # the same work with every lane busy
        times = {}
        for order, kk in (("random", k), ("sorted", k_sorted)):
            step(f"data-dependent, {dist} k, {order} order: checking, then timing")
            m = min(CHECK_THREADS, n)  # the first m of these very k, on fresh x, output poisoned
            out = torch.full((m,), float("nan"), device="cuda")
            probe_x = grid_input(m)
            timing.check_close(varying_work(kk[:m], probe_x, out), varying_work_reference(kk[:m], probe_x), "fp32",
                              f"data-dependent ({order})")
            times[order] = ms = _time(lambda: varying_work(kk, x, y))
            row = {"experiment": "data-dependent", "case": case_name(dist, order), "measured_ms": ms,
                   "measured_slowdown": ms / useful_ms, "measured_branch_efficiency": useful_ms / ms,
                   "counted_branch_efficiency": counted_efficiency(kk), "measured_mean_k": float(kk.double().mean())}
            if order == "sorted":
                row["measured_sorting_speedup"] = times["random"] / ms
            yield row
        del k, k_sorted


def measure(params, target: Target, progress):
    n_points = 0
    if "triton" in params.experiments:
        n_points += len(params.cost_ratios) * len(TRITON_CASES)
    if "branches" in params.experiments:
        n_points += len(params.cost_ratios) * (len(params.g) + (WARP not in params.g))
    if "data-dependent" in params.experiments:
        n_points += 1 + 2 * len(params.distributions)
    done = [0]

    def step(message: str) -> None:
        progress(done[0] / n_points, message)
        done[0] += 1

    if "triton" in params.experiments:
        yield from _measure_triton(params, target, step)
    if any(e in params.experiments for e in CUDA_EXPERIMENTS):
        progress(done[0] / n_points, "building the CUDA C++ kernels (30-60 s the first time, then cached)")
        cuda_kernels()
    if "branches" in params.experiments:
        yield from _measure_branches(params, target, step)
    if "data-dependent" in params.experiments:
        yield from _measure_data_dependent(params, target, step)
    progress(1.0, "done")
