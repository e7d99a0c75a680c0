"""Warp divergence's napkin math: a warp issues every loop any of its lanes takes, so its time is the sum over
the sides its lanes take (branches) or its slowest lane's trips (data-dependent work), at the FP32 FMA ceiling.

Counting is exact, warp by warp, for the branch pattern and the Triton programs; for random trip counts the
expected max of 32 draws is used. Pure: never touches the GPU, launches no kernel.
"""

from __future__ import annotations

import math

import numpy as np

from labs.engine.gpu import Target
from labs.engine.params import ParamError

WARP = 32  # threads per warp on every NVIDIA GPU
FMAS_PER_TRIP = 32  # CUDA kernels: one loop trip = 32 FMAs per thread (path A: 4 chains x 8)
TRITON_BLOCK = 256  # elements per Triton program: 2 per thread, many small programs (kernels.py launches these)
TRITON_UNROLL = 8  # FMAs per trip of a Triton chain
EXPERIMENTS = ("branches", "triton", "data-dependent")
CUDA_EXPERIMENTS = ("branches", "data-dependent")
DEFAULT_FMAS, DEFAULT_THREADS, DEFAULT_K_MAX = 2048, 4_194_304, 256  # Params' defaults, quoted by the lesson

DISTRIBUTIONS = ("uniform", "bimodal")
BIMODAL_HEAVY = 1 / 8  # bimodal: this fraction of elements needs k_max trips, the rest k_max / 8


def k_pmf(distribution: str, k_max: int) -> dict:
    """{trips: probability} of an element's trip count."""
    if distribution == "uniform":  # k uniform on 1..k_max
        return {j: 1 / k_max for j in range(1, k_max + 1)}
    if distribution == "bimodal":  # most elements finish early, a few need the full count
        light = max(1, k_max // 8)
        return {light: 1 - BIMODAL_HEAVY, k_max: BIMODAL_HEAVY} if light < k_max else {k_max: 1.0}
    raise ParamError(f"unknown distribution {distribution!r}; choose from {', '.join(DISTRIBUTIONS)}")


def trips(fmas: int, cost_ratio: float, per_trip: int) -> tuple:
    """(trips of branch A, trips of branch B) for `fmas` FMAs on branch A, in chains of `per_trip` FMAs per trip."""
    trips_a = max(1, fmas // per_trip)
    return trips_a, max(1, round(cost_ratio * trips_a))


def trips_for(params, cost_ratio: float, per_trip: int) -> tuple:
    """trips() for params.fmas."""
    return trips(params.fmas, cost_ratio, per_trip)


def warp_trip_ms(target: Target) -> float:
    """Time of one CUDA loop trip for one warp at the FMA ceiling: 32 lanes x 32 FMAs x 2 FLOP."""
    return WARP * FMAS_PER_TRIP * 2 / (target.ceilings.fma_tflops * 1e12) * 1e3


def memory_ms(nbytes: float, target: Target) -> float:
    return nbytes / (target.ceilings.copy_tbps * 1e12) * 1e3


def branch_counts(n: int, g: int, trips_a: int, trips_b: int) -> tuple:
    """(issued warp-trips, useful warp-trips) for n threads whose branch alternates every g threads.

    A warp issues the loop of every branch any of its lanes takes; useful work is each lane's own
    trips, in units of whole warps (lane-trips / 32). The pattern repeats every lcm(32, 2g) threads,
    so one period is counted and scaled, then the tail is added.
    """
    period = math.lcm(WARP, 2 * g)

    def count(threads: int) -> tuple:
        idx = np.arange(-(-threads // WARP) * WARP)
        side = np.where(idx < threads, (idx // g) % 2, -1).reshape(-1, WARP)  # -1: lane past the end
        issued = (side == 0).any(axis=1).sum() * trips_a + (side == 1).any(axis=1).sum() * trips_b
        useful = ((side == 0).sum() * trips_a + (side == 1).sum() * trips_b) / WARP
        return float(issued), float(useful)

    full, tail = divmod(n, period)
    per_issued, per_useful = count(period) if full else (0.0, 0.0)
    tail_issued, tail_useful = count(tail) if tail else (0.0, 0.0)
    return full * per_issued + tail_issued, full * per_useful + tail_useful


def branch_ms(n: int, g: int, trips_a: int, trips_b: int, target: Target) -> float:
    issued, _ = branch_counts(n, g, trips_a, trips_b)
    return max(issued * warp_trip_ms(target), memory_ms(8 * n, target))  # 4-byte read + 4-byte write


def odd_group_count(n: int, g: int) -> int:
    """How many of the indices 0..n-1 fall in an odd group of g (those take branch B)."""
    pairs, rest = divmod(n, 2 * g)
    return pairs * g + max(0, rest - g)


def triton_counts(n: int, trips_a: int, trips_b: int, per_program: bool, g: int) -> tuple:
    """(issued element-trips, useful element-trips) of the Triton kernel (masked lanes still compute)."""
    programs = -(-n // TRITON_BLOCK)
    odd_programs = programs // 2
    on_b = odd_group_count(n, TRITON_BLOCK if per_program else g)
    useful = float(on_b * trips_b + (n - on_b) * trips_a)
    if per_program:
        issued = TRITON_BLOCK * ((programs - odd_programs) * trips_a + odd_programs * trips_b)
    else:
        issued = TRITON_BLOCK * programs * (trips_a + trips_b)
    return float(issued), useful


def triton_ms(n: int, trips_a: int, trips_b: int, per_program: bool, g: int, target: Target) -> float:
    issued, _ = triton_counts(n, trips_a, trips_b, per_program, g)
    flops = issued * TRITON_UNROLL * 2
    return max(flops / (target.ceilings.fma_tflops * 1e12) * 1e3, memory_ms(8 * n, target))


def _warp_ms(trips: float, target: Target) -> float:
    """One warp of the data-dependent kernel: its slowest lane's trips, or its share of memory time."""
    return max(trips * warp_trip_ms(target), memory_ms(WARP * 12, target))  # k, x read; y written


def data_dependent_model(distribution: str, k_max: int, n: int, target: Target) -> dict:
    """Predicted ms and branch efficiency for random order, sorted order, and every k = k_max."""
    pmf = k_pmf(distribution, k_max)
    values = sorted(pmf)
    mean_k = sum(v * p for v, p in pmf.items())
    warps = -(-n // WARP)
    # random order: a warp's max M of 32 independent draws has P(M <= v) = F(v)^32
    cdf, previous, p_max = 0.0, 0.0, {}
    for v in values:
        cdf += pmf[v]
        p_max[v] = min(cdf, 1.0) ** WARP - previous
        previous = min(cdf, 1.0) ** WARP
    mean_max_random = sum(v * p for v, p in p_max.items())
    random_ms = warps * sum(p * _warp_ms(v, target) for v, p in p_max.items())
    # sorted: each warp holds (nearly) equal k; a warp that straddles two values pays the larger,
    # about half a gap more than its mean, once per boundary between consecutive values
    excess = sum(b - a for a, b in zip(values, values[1:])) / 2
    mean_max_sorted = mean_k + excess / warps
    sorted_ms = warps * sum(p * _warp_ms(v, target) for v, p in pmf.items()) + excess * warp_trip_ms(target)
    ideal_ms = warps * mean_k * warp_trip_ms(target)  # every lane busy, no divergence
    return {
        "mean_k": mean_k,
        "random": {"ms": random_ms, "efficiency": mean_k / mean_max_random, "ideal_ms": ideal_ms},
        "sorted": {"ms": sorted_ms, "efficiency": mean_k / mean_max_sorted, "ideal_ms": ideal_ms},
        "all-max": {"ms": warps * _warp_ms(k_max, target), "efficiency": 1.0,
                    "ideal_ms": warps * k_max * warp_trip_ms(target)},
    }


def case_name(distribution: str, order: str) -> str:
    return f"{distribution}, {order}"


ALL_MAX_CASE = "every k = k_max"


def predict(params, target: Target) -> list[dict]:
    rows = []
    n = params.threads
    if "branches" in params.experiments:
        for ratio in params.cost_ratios:
            ta, tb = trips_for(params, ratio, FMAS_PER_TRIP)
            base_ms = branch_ms(n, WARP, ta, tb, target)
            for g in params.g:
                issued, useful = branch_counts(n, g, ta, tb)
                ms = branch_ms(n, g, ta, tb, target)
                rows.append({"experiment": "branches", "case": "g sweep", "cost_ratio": ratio, "g": g,
                             "trips_a": ta, "trips_b": tb, "predicted_ms": ms, "predicted_slowdown": ms / base_ms,
                             "predicted_branch_efficiency": useful / issued})
    if "triton" in params.experiments:
        for ratio in params.cost_ratios:
            ta, tb = trips_for(params, ratio, TRITON_UNROLL)
            base_ms = triton_ms(n, ta, tb, True, 1, target)
            for case, per_program, g in TRITON_CASES:
                issued, useful = triton_counts(n, ta, tb, per_program, g)
                ms = triton_ms(n, ta, tb, per_program, g, target)
                rows.append({"experiment": "triton", "case": case, "cost_ratio": ratio,
                             "g": g if not per_program else None,
                             "trips_a": ta, "trips_b": tb, "predicted_ms": ms, "predicted_slowdown": ms / base_ms,
                             "predicted_branch_efficiency": useful / issued})
    if "data-dependent" in params.experiments:
        for dist in params.distributions:
            model = data_dependent_model(dist, params.k_max, n, target)
            for order in ("random", "sorted"):
                m = model[order]
                row = {"experiment": "data-dependent", "case": case_name(dist, order), "cost_ratio": None, "g": None,
                       "distribution": dist, "order": order, "mean_k": model["mean_k"], "predicted_ms": m["ms"],
                       "predicted_slowdown": m["ms"] / m["ideal_ms"], "predicted_branch_efficiency": m["efficiency"]}
                if order == "sorted":
                    row["predicted_sorting_speedup"] = model["random"]["ms"] / m["ms"]
                rows.append(row)
        model = data_dependent_model(params.distributions[0], params.k_max, n, target)["all-max"]
        rows.append({"experiment": "data-dependent", "case": ALL_MAX_CASE, "cost_ratio": None, "g": None,
                     "distribution": "constant", "order": "any", "mean_k": params.k_max, "predicted_ms": model["ms"],
                     "predicted_slowdown": model["ms"] / model["ideal_ms"], "predicted_branch_efficiency": 1.0})
    return rows


# (case, per_program, g): g = 1 alternates every element; g = TRITON_BLOCK makes the condition
# uniform across each program, yet it is still a per-element tl.where
TRITON_CASES = (("tl.where, g = 1", False, 1), (f"tl.where, g = {TRITON_BLOCK}", False, TRITON_BLOCK),
                ("if per program", True, 1))


def lesson_numbers(target: Target) -> dict:
    """The {{placeholders}} of content/labs/divergence.md for this GPU, at the default parameters."""
    fmas, threads, k_max = DEFAULT_FMAS, DEFAULT_THREADS, DEFAULT_K_MAX
    ta, tb = trips(fmas, 1.0, FMAS_PER_TRIP)
    uniform = data_dependent_model("uniform", k_max, threads, target)
    bimodal = data_dependent_model("bimodal", k_max, threads, target)
    return {
        "gpu": target.name,
        "fma_tflops": f"{target.ceilings.fma_tflops:.1f}",
        "ceilings_source": target.describe_ceilings(),
        "default_fmas": fmas,
        "default_threads_m": f"{threads / 2**20:.0f}",
        "uniform_ms": f"{branch_ms(threads, WARP, ta, tb, target):.3f}",
        "divergent_ms": f"{branch_ms(threads, 1, ta, tb, target):.3f}",
        "k_max": k_max,
        "uniform_efficiency_pct": f"{100 * uniform['random']['efficiency']:.0f}",
        "uniform_speedup": f"{uniform['random']['ms'] / uniform['sorted']['ms']:.2f}",
        "bimodal_efficiency_pct": f"{100 * bimodal['random']['efficiency']:.0f}",
        "bimodal_speedup": f"{bimodal['random']['ms'] / bimodal['sorted']['ms']:.2f}",
        "triton_block": TRITON_BLOCK,
    }
