"""
Warp divergence: what a branch costs when the threads of a warp disagree
=========================================================================

What you will learn:
- a warp is 32 threads that issue one instruction at a time together (SIMT); when its threads take
  different sides of a branch, the warp runs every side that any of them takes, one after the other,
  with the lanes that did not take it masked off;
- so divergence costs nothing when whole warps agree (groups of g >= 32 threads) and doubles the time
  of an if/else when they do not (g < 32), whatever the two sides cost;
- Triton has no per-thread branches: a per-element condition is a `tl.where` that computes both
  sides for every element, while a condition uniform across a program is a real branch;
- with data-dependent work (element i needs k_i loop trips) a warp costs the max of k over its lanes,
  so the order of the data matters: sorting puts equal k in the same warp and recovers the loss.

Three experiments, all compute-bound on purpose (thousands of FMAs per 8 bytes moved, so memory and
launch costs stay out of the way), each with a no-divergence baseline measured in the same run:
1. branches (CUDA C++): thread i takes branch B if (i / g) is odd, else branch A; g sweeps 1..256;
   branch B costs `cost_ratio` times branch A.
2. triton: the same two chains as `tl.where` (per element) and as a per-program `if`.
3. data-dependent (CUDA C++): k_i trips per element, in random order and sorted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine import cuda
CUDA_DIR = __import__("pathlib").Path(__file__).resolve().parent
from labs.engine.gpu import Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

WARP = 32  # threads per warp on every NVIDIA GPU
FMAS_PER_TRIP = 32  # CUDA kernels: one loop trip = 32 FMAs per thread (path A: 4 chains x 8)
# The chains y <- y * mul + add with mul = 1 and inputs on a 1/256 grid are exact in fp32, so the
# check against float64 is exact; the constants are run-time arguments, so every FMA is really issued.
A_MUL, A_ADD = 1.0, 0.5  # branch A
B_MUL, B_ADD = 1.0, -0.25  # branch B (other constants, other loop shape: nothing to merge)
EXPERIMENTS = ("branches", "triton", "data-dependent")
CUDA_EXPERIMENTS = ("branches", "data-dependent")


# ---------------------------------------------------------------------------------------------
# 1. Real divergence in CUDA C++ (labs/cuda/divergence.cu)
# ---------------------------------------------------------------------------------------------
CPP_DECLS = """
void branches(at::Tensor x, at::Tensor y, int64_t g, int64_t trips_a, int64_t trips_b,
              double a, double b, double c, double d);
void varying_work(at::Tensor k, at::Tensor x, at::Tensor y, double a, double b);
"""


def cuda_kernels():
    """The compiled extension (built on first use, ~30-60 s; ParamError with the reason if it cannot be)."""
    return cuda.build("roofline_divergence", CUDA_DIR / "divergence.cu", CPP_DECLS, ("branches", "varying_work"))


def cuda_unavailable_reason() -> str:
    """Why the CUDA C++ experiments cannot run here ('' when they can)."""
    return cuda.why_unavailable()


def branches(x: torch.Tensor, g: int, trips_a: int, trips_b: int, out: torch.Tensor) -> torch.Tensor:
    cuda_kernels().branches(x, out, g, trips_a, trips_b, A_MUL, A_ADD, B_MUL, B_ADD)
    return out


def varying_work(k: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    cuda_kernels().varying_work(k, x, out, A_MUL, A_ADD)
    return out


# float64 references (closed forms of the chains with mul = 1)
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


# ---------------------------------------------------------------------------------------------
# 2. The same two paths in Triton: per-element tl.where vs a per-program branch
# ---------------------------------------------------------------------------------------------
# 2 elements (2 independent chains) per thread; many small programs, so that the last wave of long
# programs (branch B with cost_ratio > 1) leaves little of the GPU idle
TRITON_BLOCK, TRITON_WARPS = 256, 4
TRITON_UNROLL = 8  # FMAs per trip of a Triton chain


@triton.jit
def _chain(y, trips, mul, add, UNROLL: tl.constexpr):
    for _ in range(trips):  # run-time trip count: the chain is really executed
        for _u in tl.static_range(UNROLL):
            y = y * mul + add  # one FMA per element
    return y


# g = 1 must not become a compile-time constant (Triton specializes integer arguments equal to 1): then
# the compiler would know which side each register holds and drop the other chain
@triton.jit(do_not_specialize=["g"])
def two_paths_kernel(x_ptr, y_ptr, n, g, trips_a, trips_b, a_mul, a_add, b_mul, b_add,
                     PER_PROGRAM: tl.constexpr, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # this program's BLOCK elements
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if PER_PROGRAM:
        # One scalar condition for the whole program: compiled to a real branch, and each program
        # runs only the side it takes.
        if pid % 2 == 1:
            y = _chain(x, trips_b, b_mul, b_add, UNROLL)
        else:
            y = _chain(x, trips_a, a_mul, a_add, UNROLL)
    else:
        # A condition per element: a block of values has no single "side", so Triton computes both
        # chains for every element and selects (even when the condition happens to be uniform).
        take_b = ((offs // g) % 2) == 1
        y = tl.where(take_b, _chain(x, trips_b, b_mul, b_add, UNROLL), _chain(x, trips_a, a_mul, a_add, UNROLL))
    tl.store(y_ptr + offs, y, mask=mask)


def two_paths(x: torch.Tensor, trips_a: int, trips_b: int, per_program: bool, g: int = 1,
              out: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.empty_like(x) if out is None else out
    grid = (triton.cdiv(x.numel(), TRITON_BLOCK),)
    two_paths_kernel[grid](x, out, x.numel(), g, trips_a, trips_b, A_MUL, A_ADD, B_MUL, B_ADD,
                           PER_PROGRAM=per_program, BLOCK=TRITON_BLOCK, UNROLL=TRITON_UNROLL,
                           num_warps=TRITON_WARPS)
    return out


def two_paths_reference(x: torch.Tensor, trips_a: int, trips_b: int, per_program: bool, g: int = 1) -> torch.Tensor:
    i = torch.arange(x.numel(), device=x.device)
    take_b = (i // TRITON_BLOCK) % 2 == 1 if per_program else (i // g) % 2 == 1
    x64 = x.double()
    steps = TRITON_UNROLL
    return torch.where(take_b, x64 + steps * trips_b * B_ADD, x64 + steps * trips_a * A_ADD)


# ---------------------------------------------------------------------------------------------
# 3. Data-dependent work: k_i trips per element
# ---------------------------------------------------------------------------------------------
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
# The model
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    experiments: tuple = param(EXPERIMENTS, "which experiments to run", choices=EXPERIMENTS)
    g: tuple = param(tuple(2**i for i in range(9)), "branches: threads per group taking the same side "
                     "(groups alternate between the two branches)", unit="threads", min=1, max=1024)
    cost_ratios: tuple = param((1.0, 2.0, 4.0), "cost of branch B / cost of branch A", min=0.25, max=8.0)
    fmas: int = param(2048, "FMAs per thread on branch A (a multiple of 32)", unit="FMA", min=32, max=16384,
                      step=32)
    threads: int = param(4_194_304, "threads launched (one element each)", unit="threads", min=4096,
                         max=67_108_864, log=True)
    k_max: int = param(256, "data-dependent: most loop trips an element can need (32 FMAs per trip)",
                       unit="trips", min=2, max=512)
    distributions: tuple = param(DISTRIBUTIONS, "data-dependent: how k is distributed", choices=DISTRIBUTIONS)


def trips_for(params: Params, cost_ratio: float, per_trip: int) -> tuple:
    """(trips of branch A, trips of branch B) for chains of `per_trip` FMAs per trip."""
    trips_a = max(1, params.fmas // per_trip)
    return trips_a, max(1, round(cost_ratio * trips_a))


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


def predict(params: Params, target: Target) -> list[dict]:
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


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
CHECK_THREADS = 100_003  # odd: the last block and the last warp are partly masked


def bytes_needed(params: Params) -> int:
    return params.threads * 4 * 6  # x, y, three k arrays, a poisoned output


def check(params: Params, target: Target) -> None:
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


def _measure_branches(params: Params, target: Target, step):
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


def _measure_triton(params: Params, target: Target, step):
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


def _measure_data_dependent(params: Params, target: Target, step):
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


def measure(params: Params, target: Target, progress):
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


def lesson_numbers(target: Target) -> dict:
    p = Params()
    ta, tb = trips_for(p, 1.0, FMAS_PER_TRIP)
    uniform = data_dependent_model("uniform", p.k_max, p.threads, target)
    bimodal = data_dependent_model("bimodal", p.k_max, p.threads, target)
    return {
        "gpu": target.name,
        "fma_tflops": f"{target.ceilings.fma_tflops:.1f}",
        "ceilings_source": target.describe_ceilings(),
        "default_fmas": p.fmas,
        "default_threads_m": f"{p.threads / 2**20:.0f}",
        "uniform_ms": f"{branch_ms(p.threads, WARP, ta, tb, target):.3f}",
        "divergent_ms": f"{branch_ms(p.threads, 1, ta, tb, target):.3f}",
        "k_max": p.k_max,
        "uniform_efficiency_pct": f"{100 * uniform['random']['efficiency']:.0f}",
        "uniform_speedup": f"{uniform['random']['ms'] / uniform['sorted']['ms']:.2f}",
        "bimodal_efficiency_pct": f"{100 * bimodal['random']['efficiency']:.0f}",
        "bimodal_speedup": f"{bimodal['random']['ms'] / bimodal['sorted']['ms']:.2f}",
        "triton_block": TRITON_BLOCK,
    }


from labs.divergence.counters import COUNTERS  # noqa: E402  (how ncu counts this lab)

LAB = Lab(
    name="divergence",
    title="Warp divergence",
    summary="Threads of a warp that take different branches run one after the other: sweep the branch "
            "granularity across the warp size, compare Triton's tl.where with a real branch, and watch "
            "data-dependent loops lose (and sorting win back) half the GPU.",
    terms=("warp", "warp-divergence", "branch-efficiency", "thread", "thread-block", "warp-scheduler", "cuda-core",
           "fma", "compute-bound", "triton", "sass"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("experiment", "case", "cost_ratio", "g"),
    metric="slowdown",
    order=40,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("Groups of 16 threads take one branch and the next 16 the other (both branches cost the "
                      "same). How many times longer does the kernel take than with groups of 32?", "x",
                      {"experiment": "branches", "g": 16, "cost_ratio": 1.0}, "slowdown"),
    counters=COUNTERS,
)
