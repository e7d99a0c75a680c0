"""
Hopper matmul anatomy, modelled: what each feature should buy
=============================================================

Pure arithmetic (no GPU, no kernels): the switches and the steps that turn them on one at a time, the tile orders
(row-major, grouped, Hilbert) and the DRAM bytes each makes the L2 fetch, and the time of one K slice and of a
tile's start and end by the features on, from this GPU's measured ceilings (tensor-core rate, L2 and DRAM
bandwidth) and a published memory latency.
"""

from __future__ import annotations

import contextvars
import functools
import math
from dataclasses import dataclass
from typing import Optional

from labs.engine import timing
from labs.engine.gpu import Target
from labs.engine.params import ParamError
from labs.glossary import LATENCY_CYCLES, LATENCY_SOURCE
from labs.matmul.configs import TileConfig, blocks_per_sm, out_bytes
from labs.matmul.ladder_model import lesson_numbers as ladder_numbers
from labs.matmul.model import (FIXED_US, L1_BYTES_PER_CLOCK, POWER_CLOCK_EXPONENT, clock_hz, grouped_tile, l2_tbps,
                               load_latency_us)
from labs.matmul.rates import recorded_cublas_tflops, recorded_load_latency_us

DTYPES = ("bf16", "fp16")
ORDERS = ("row-major", "grouped", "hilbert")
# Tile shape of every step: 128 x 256 x 64 on 8 warps (two warpgroups), the shape the matmul lab found
# closest to cuBLAS on an H200 (labs/matmul/configs.py). Only the switches change from step to step.
BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS = 128, 256, 64, 8


# ---------------------------------------------------------------------------------------------
# The switches, and the steps that turn them on one at a time
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Switches:
    tma: bool  # tensor descriptors (TMA) instead of pointer loads
    stages: int  # num_stages: slices of A and B in flight in shared memory
    persistent: bool  # one program per SM walking many tiles, instead of one program per tile
    order: str  # the order tiles are visited in: row-major, grouped, hilbert
    warp_specialize: bool  # a producer warp (TMA) and consumer warpgroups (wgmma): the Gluon kernel, gluon_ws.py
    block: tuple = (BLOCK_M, BLOCK_N, BLOCK_K)  # tile rows x columns x depth of one K slice
    num_warps: int = NUM_WARPS  # warps per program (4 = one warpgroup)
    flatten: bool = False  # persistent only: one flat loop over (tile, slice), so the next tile's loads
    #                        start while this tile's output is written (Triton's tl.range(flatten=True))

    @property
    def label(self) -> str:
        return (f"{'TMA' if self.tma else 'pointers'}, {self.stages} stage{'s' if self.stages > 1 else ''}, "
                f"{'persistent' if self.persistent else 'one program per tile'}, {self.order}"
                f"{', flattened' if self.flatten else ''}{', warp-specialized (Gluon)' if self.warp_specialize else ''}")

    @property
    def config_label(self) -> str:
        """The tile shape and warps, then the switches: names one configuration of the best step."""
        bm, bn, bk = self.block
        return f"{bm}x{bn}x{bk} w{self.num_warps}, {self.label}"


# Each step changes one switch of the step before it (the order of a lesson, not of importance).
STEPS: dict = {
    "1 baseline": Switches(False, 1, False, "row-major", False),
    "2 pipeline": Switches(False, 3, False, "row-major", False),
    "3 TMA": Switches(True, 3, False, "row-major", False),
    "4 grouped order": Switches(True, 3, False, "grouped", False),
    "5 persistent": Switches(True, 3, True, "grouped", False),
    "6 Hilbert order": Switches(True, 3, True, "hilbert", False),
    "7 warp-specialized": Switches(True, 3, True, "hilbert", True),
}
# The last step is not one set of switches but a choice made at run time, as autotuners do: each
# candidate is checked against float64 and timed on the operands of the size, and the fastest is
# kept (its configuration is named in the row). Candidates: the best fixed steps (grouped, one program
# per tile; persistent Hilbert), a fourth stage for the one-program-per-tile kernel (it fits in shared
# memory only there: the persistent kernel also keeps a C tile for its store), the persistent kernel
# with its loops flattened (the next tile's loads overlap this tile's store), and a 256 x 128 tile.
BEST_STEP = "8 best configuration"
BEST_CANDIDATES = (
    Switches(True, 3, False, "grouped", False),
    Switches(True, 4, False, "grouped", False),
    Switches(True, 3, True, "hilbert", False),
    Switches(True, 3, True, "hilbert", False, flatten=True),
    Switches(True, 3, True, "hilbert", False, block=(256, 128, 64)),
)
STEP_NAMES = tuple(STEPS) + (BEST_STEP,)
GROUP_M = 8  # tile rows per band of the grouped order


def step_candidates(step: str) -> tuple:
    """The configurations a step runs: one for the switch steps, several for the best-configuration step."""
    return BEST_CANDIDATES if step == BEST_STEP else (STEPS[step],)


def _hilbert_d2xy(side: int, d: int) -> tuple:
    """Position d along the Hilbert curve filling a side x side square (side a power of two)."""
    x = y = 0
    s, t = 1, d
    while s < side:
        rx = 1 & (t // 2)
        ry = 1 & (t ^ rx)
        if ry == 0:  # rotate the quadrant so the curve stays continuous
            if rx == 1:
                x, y = s - 1 - x, s - 1 - y
            x, y = y, x
        x, y = x + s * rx, y + s * ry
        t //= 4
        s *= 2
    return x, y


@functools.lru_cache(maxsize=64)
def tile_order(order: str, tiles_m: int, tiles_n: int, group_m: int = GROUP_M) -> tuple:
    """The (tile row, tile column) of every launch slot, in the order the programs run them."""
    if order == "row-major":
        return tuple((i, j) for i in range(tiles_m) for j in range(tiles_n))
    if order == "grouped":
        return tuple(grouped_tile(pid, tiles_m, tiles_n, group_m) for pid in range(tiles_m * tiles_n))
    if order == "hilbert":  # the curve over the enclosing power-of-two square, cells outside skipped
        side = 1 << max(0, math.ceil(math.log2(max(tiles_m, tiles_n))))
        cells = (_hilbert_d2xy(side, d) for d in range(side * side))
        return tuple((i, j) for i, j in cells if i < tiles_m and j < tiles_n)
    raise ParamError(f"order = {order!r} is not known; choose from {', '.join(ORDERS)}.")


_ORDER_TABLES: dict = {}


# Load-to-use latency of device memory on Hopper from published microbenchmarks, the figure the
# glossary quotes (labs/glossary/facts.py): the model's last resort, where no probe on this GPU kind measured it.
HBM_LATENCY_CYCLES = LATENCY_CYCLES["hbm"]
# The load latency the probe measured in the run being re-predicted (see repredict): (us, whether it is the median
# of the passes' probes rather than one reading); None outside one
_RUN_LATENCY_US: contextvars.ContextVar = contextvars.ContextVar("hopper_run_latency_us", default=None)


def load_latency(target: Target) -> tuple:
    """(seconds, where it comes from): how long a slice asked of memory takes to land in shared memory.

    Measured where it can be: the Matmul lab's probe (a 64 x 64 tile with more K steps, L2 flushed, timed like
    the products: labs/matmul/measure.py probe_floor_us). It includes what a real load pays besides the DRAM's own
    latency (the request's trip, the copy's completion on a barrier): on an H100 and an H200 it is ~0.8 us, three
    times the published 480 cycles, which are the fallback. The probe is the difference of two ~6 us timings, so
    one reading can be far off: a run's own figure comes first where it is the median of its passes' probes; a run
    that probed once (before 2026-11-28) comes after the Matmul lab's probe of this GPU kind, in this process or
    recorded. Its one reading on an H100 (0.32 us) was 2.4 times below every one of the Matmul lab's on either kind."""
    in_run_us, median_of_passes = _RUN_LATENCY_US.get() or (None, False)
    if in_run_us and median_of_passes:
        return in_run_us * 1e-6, "the median of the probes of the same run's passes"
    here = load_latency_us(target)
    if here:
        return here * 1e-6, "probed on this GPU by the Matmul lab's probe"
    recorded = recorded_load_latency_us(target.key)
    if recorded:
        return recorded * 1e-6, "probed by the Matmul lab on this GPU kind"
    if in_run_us:
        return in_run_us * 1e-6, "probed once in the same run"
    return HBM_LATENCY_CYCLES / clock_hz(target), f"never probed on this GPU kind: the published figure, {LATENCY_SOURCE}"


def unthrottled_math_s(math_s: float, wait_s: float, headroom: float) -> float:
    """Time of one slice's math when the tensor cores work only between waits of `wait_s`.

    The rate the model starts from (cuBLAS's) is held at the clock the power cap allows with the tensor cores busy
    all the time. Busy a fraction f of the time, they draw about f x clock^3 (the Matmul lab's power rule,
    labs/matmul/model.py clock_boost), so the same power holds a clock f^(-1/3) times higher, up to the datasheet's
    (`headroom`: datasheet rate over the starting rate). f depends on the clock it buys: a few rounds settle it."""
    boost = 1.0
    for _ in range(20):
        busy = math_s / boost / (math_s / boost + wait_s)
        boost = min(max(1.0, headroom), busy ** (-1 / POWER_CLOCK_EXPONENT))
    return math_s / boost


def dram_bytes(order: str, n: int, dtype: str, slots: int, l2_bytes: int, block=(BLOCK_M, BLOCK_N)) -> float:
    """Bytes the L2 must fetch from DRAM, walking the tiles in `order`, `slots` at a time.

    Tiles that run at the same time stream through K together, so every row panel of A and column
    panel of B that a wave of tiles touches is fetched once for that wave and shared through the L2;
    nothing survives from one wave to the next unless A and B fit in the L2 together. Plus C, once.
    """
    e = timing.element_bytes(dtype)
    bm, bn = block[0], block[1]
    c_bytes = n * n * e
    if 2 * n * n * e <= 0.8 * l2_bytes:
        return 2 * n * n * e + c_bytes
    tiles = tile_order(order, math.ceil(n / bm), math.ceil(n / bn))
    total = 0.0
    for start in range(0, len(tiles), slots):
        wave = tiles[start:start + slots]
        rows, cols = {i for i, _ in wave}, {j for _, j in wave}
        total += (len(rows) * bm + len(cols) * bn) * n * e
    return total + c_bytes


def tile_config(sw: Switches) -> TileConfig:
    return TileConfig(*sw.block, GROUP_M, sw.num_warps, sw.stages)


# (dtype, N) -> cuBLAS TFLOP/s measured in the run being re-predicted (see repredict); None outside one
_RUN_CUBLAS: contextvars.ContextVar = contextvars.ContextVar("hopper_run_cublas", default=None)


def tensor_core_tflops(n: Optional[int], dtype: str, target: Target) -> tuple:
    """(TFLOP/s, where it comes from): the rate the tensor cores hold in a matmul of size N.

    The tensor cores' rate is capped by power: the longer a big matmul runs, the lower the clock the GPU
    holds, so cuBLAS runs faster at N = 4096 than at the calibration's N = 8192. The model therefore takes
    cuBLAS's rate measured at this very N on this GPU kind (the Matmul lab's recording) and falls back to
    the calibrated ceiling (cuBLAS at N = 8192) for sizes that were never recorded."""
    in_run = (_RUN_CUBLAS.get() or {}).get((dtype, n)) if n else None
    if in_run:
        return in_run, f"cuBLAS at N = {n}, measured in the same run"
    recorded = recorded_cublas_tflops(target.key).get((dtype, n)) if n else None
    if recorded:
        return recorded, f"cuBLAS at N = {n}, recorded by the Matmul lab on this GPU kind"
    ceiling = target.ceilings.matmul_tflops.get(dtype)
    return ceiling, f"the {target.ceilings.source} {dtype} matmul ceiling"


def cublas_tflops(n: int, dtype: str, target: Target) -> Optional[float]:
    """The cuBLAS row's prediction: the tensor-core rate at this N, under the roofline's bandwidth limit."""
    rate, _ = tensor_core_tflops(n, dtype, target)
    if not rate:
        return None
    intensity = 2.0 * n / (2 * timing.element_bytes(dtype) + out_bytes(dtype))  # A, B, C moved once
    return min(rate, intensity * target.ceilings.copy_tbps)


def step_times(sw: Switches, dtype: str, target: Target, n: Optional[int] = None) -> dict:
    """Seconds one SM spends per K slice and per tile (start and end), by the features on.

    - math: 2 BM BN BK FLOPs at the SM's share of the tensor-core rate at this N (tensor_core_tflops);
    - operands: the slice ((BM + BN) BK elements) written into the SM's shared memory at 128 bytes per
      clock, as the Matmul lab's model does (a one-stage pointer kernel moves it twice: into registers,
      then into shared memory). The L2 is not a limit here: it serves every SM at once, and the recorded
      steps draw more from it than the Memory hierarchy lab's streaming kernel does (see l2_tbps);
    - latency: a slice arrives one load latency (load_latency: probed) after it is asked for; with S stages,
      S - 1 slices are in flight, so a slice can be consumed every latency / (S - 1) at best (Little's law), and
      with one stage the SM waits for each slice before multiplying it. Registers allow one such program per SM
      (228 a thread, 8 warps), so no other program fills the wait. The tensor cores, idle most of the time,
      then clock above the rate cuBLAS holds (unthrottled_math_s);
    - tile start (pipeline fill: one latency and one slice) and end (the C tile leaving through shared
      memory at the same 128 bytes per clock; the L2 takes it, and its trip to DRAM is in the DRAM term):
      paid per tile with one program per tile; a persistent kernel overlaps the end with the next tile
      (the TMA store runs on its own), and warp specialization or a flattened loop the start too: the producer
      warp runs up to `stages` slices ahead into the next tile while the consumers write this one.
    """
    sms = target.sm_count
    e = timing.element_bytes(dtype)
    bm, bn, bk = sw.block
    tflops, _ = tensor_core_tflops(n, dtype, target)
    rate = (tflops or 0) * 1e12 / sms
    clock = clock_hz(target)
    latency, _ = load_latency(target)
    math_s = 2 * bm * bn * bk / rate if rate else float("nan")
    through_registers = not sw.tma and sw.stages == 1  # no asynchronous copy: load, then store to shared
    operand_s = (bm + bn) * bk * e * (2 if through_registers else 1) / (L1_BYTES_PER_CLOCK * clock)
    if sw.stages == 1:  # load, wait, multiply: nothing overlaps, and the idle tensor cores clock higher
        sheet_rate = target.datasheet.matmul_tflops(dtype) if target.datasheet is not None else None
        headroom = sheet_rate / tflops if sheet_rate and tflops else 1.0
        math_s = unthrottled_math_s(math_s, latency + operand_s, headroom) if rate else math_s
        slice_s = math_s + latency + operand_s
    else:
        slice_s = max(math_s, operand_s, (latency + operand_s) / (sw.stages - 1))
    fill = latency + operand_s
    drain = bm * bn * e / (L1_BYTES_PER_CLOCK * clock)
    if sw.persistent and (sw.warp_specialize or sw.flatten):
        edges = 0.0
    elif sw.persistent:
        edges = fill
    else:
        edges = fill + drain
    return {"math_s": math_s, "operand_s": operand_s, "latency_s": latency, "slice_s": slice_s, "edges_s": edges}


def predict_config(sw: Switches, n: int, dtype: str, target: Target) -> dict:
    """The model's columns for one configuration at size N (tiles, waves, bytes, time, bound)."""
    bm, bn, bk = sw.block
    per_sm = blocks_per_sm(tile_config(sw), dtype, "tma", target.compute_capability)
    if per_sm == 0:
        return {"note": "the tile does not fit in shared memory"}
    tiles_m, tiles_n = math.ceil(n / bm), math.ceil(n / bn)
    tiles, slots = tiles_m * tiles_n, target.sm_count * per_sm
    waves = math.ceil(tiles / slots)
    t = step_times(sw, dtype, target, n)
    k_slices = math.ceil(n / bk)
    rounds = math.ceil(tiles / target.sm_count)  # tiles on the busiest SM (its tensor cores are shared)
    compute_s = rounds * (k_slices * t["slice_s"] + t["edges_s"])
    l2_bytes = tiles * (bm + bn) * n * timing.element_bytes(dtype)  # every tile's operand requests
    dram = dram_bytes(sw.order, n, dtype, slots, target.l2_bytes, sw.block)
    dram_s = dram / (target.ceilings.copy_tbps * 1e12)
    total = max(compute_s, dram_s) + FIXED_US * 1e-6
    limits = {"tensor cores": rounds * k_slices * t["math_s"], "shared-memory fill": rounds * k_slices * t["operand_s"],
              "latency": rounds * k_slices * max(0.0, t["slice_s"] - max(t["math_s"], t["operand_s"])),
              "tile start/end": rounds * t["edges_s"], "DRAM": dram_s}
    return {
        "tiles": tiles, "waves": waves, "last_wave_util": (tiles - (waves - 1) * slots) / slots,
        "predicted_l2_request_bytes": float(l2_bytes), "predicted_dram_bytes": dram,
        "predicted_l2_request_tbps": l2_bytes / total / 1e12,
        "predicted_latency_hidden_pct": 100.0 * min(1.0, max(0, sw.stages - 1) * t["math_s"] /
                                                    (t["latency_s"] + t["operand_s"])),
        "predicted_ms": total * 1e3, "predicted_tflops": 2.0 * n**3 / total / 1e12,
        "bound": max(limits, key=limits.get),
    }


def predict_step(step: str, n: int, dtype: str, target: Target) -> dict:
    """One step's prediction; for the best-configuration step, the candidate the model finds fastest."""
    configs = step_candidates(step)
    row = {"step": step, "n": n, "dtype": dtype,
           "switches": "fastest of: " + "; ".join(c.config_label for c in configs) if step == BEST_STEP
           else configs[0].label}
    if not target.ceilings.matmul_tflops.get(dtype):
        return row | {"note": f"no {dtype} matmul ceiling for {target.name}"}
    fits = [(predict_config(c, n, dtype, target), c) for c in configs]
    fits = [(p, c) for p, c in fits if "predicted_tflops" in p]
    if not fits:
        return row | {"note": "the tile does not fit in shared memory"}
    best, chosen = max(fits, key=lambda pc: pc[0]["predicted_tflops"])
    cublas = cublas_tflops(n, dtype, target)
    row |= best | {"predicted_pct_of_cublas": 100.0 * best["predicted_tflops"] / cublas if cublas else None}
    if step == BEST_STEP:
        row["predicted_config"] = chosen.config_label
    return row


def predict(params, target: Target) -> list[dict]:
    rows = []
    for n in params.sizes:
        cublas = cublas_tflops(n, params.dtype, target)
        _, source = tensor_core_tflops(n, params.dtype, target)
        rows.append({"step": "cuBLAS", "n": n, "dtype": params.dtype, "switches": "the library (torch.matmul)",
                     "predicted_tflops": cublas, "predicted_pct_of_cublas": 100.0 if cublas else None,
                     "bound": f"measured rate ({source})"})
        rows += [predict_step(step, n, params.dtype, target) for step in params.steps]
    return rows


# ---------------------------------------------------------------------------------------------
# The instructions: what the compiler made of each step

def repredict(recording: dict, target: Target, params) -> list[dict]:
    """The model of a recorded run (its Params given) at the tensor-core rate of that run's own cuBLAS rows (timed
    beside the steps at each N), not at whatever the Matmul lab's newest recording holds: a new matmul recording
    then cannot move these predictions (the engine's re-predictions, and the pages' recorded overlays). The load
    latency is the run's own where it is the median of its passes' probes; a run that probed once, or not at all,
    takes the Matmul lab's probe of the GPU kind first (load_latency says why)."""
    rates = {(r.get("dtype"), r.get("n")): r["measured_tflops"] for r in recording["rows"]
             if r.get("step") == "cuBLAS" and isinstance(r.get("measured_tflops"), (int, float))}
    probed = next((r for r in recording["rows"]
                   if isinstance(r.get("load_latency_us"), (int, float)) and r["load_latency_us"] > 0), None)
    latency = (float(probed["load_latency_us"]), bool(probed.get("load_latency_each_pass"))) if probed else None
    tokens = _RUN_CUBLAS.set(rates), _RUN_LATENCY_US.set(latency)
    try:
        return predict(params, target)
    finally:
        _RUN_CUBLAS.reset(tokens[0])
        _RUN_LATENCY_US.reset(tokens[1])


def lesson_numbers(target: Target) -> dict:
    dtype = "bf16"
    n = 8192
    base = step_times(STEPS["1 baseline"], dtype, target, n)
    piped = step_times(STEPS["2 pipeline"], dtype, target, n)
    sms = target.sm_count
    slots = sms * max(1, blocks_per_sm(tile_config(STEPS["1 baseline"]), dtype, "tma",
                                          target.compute_capability))
    row_major, grouped, hilbert = (dram_bytes(o, n, dtype, slots, target.l2_bytes) for o in ORDERS)
    tiles = math.ceil(n / BLOCK_M) * math.ceil(n / BLOCK_N)
    l2_plateau, l2_source = l2_tbps(target)
    tma_8192 = predict_step("3 TMA", n, dtype, target)
    rate_4096, _ = tensor_core_tflops(4096, dtype, target)
    rate_8192, rate_source = tensor_core_tflops(n, dtype, target)
    us = 1e6

    def known(x, spec: str) -> str:
        """x formatted, or '?' where this GPU's datasheet lacks the figure (no bf16 rate: a T4's times are NaN)."""
        return "?" if x is None or x != x or x == 0 else format(x, spec)

    # the warp-tiled CUDA-core kernel of the ladder, the step before tensor cores
    warp = {k: v for k, v in ladder_numbers(target).items() if k.startswith("warp_")}
    return warp | {
        "fma_tflops": f"{target.ceilings.fma_tflops:.1f}",
        "fp32_matmul_pct": f"{100 * (target.ceilings.matmul_tflops.get('fp32') or 0) / target.ceilings.fma_tflops:.0f}",
        "gpu": target.name, "sms": str(sms), "tile": f"{BLOCK_M}x{BLOCK_N}x{BLOCK_K}",
        "bf16_tflops": known(target.ceilings.matmul_tflops.get(dtype), ".0f"),
        "rate_4096": known(rate_4096, ".0f"), "rate_8192": known(rate_8192, ".0f"), "rate_source": rate_source,
        "l2_plateau_tbps": f"{l2_plateau:.1f}",
        "l2_needed_tbps": f"{tma_8192.get('predicted_l2_request_tbps', 0):.1f}",
        "math_us": known(piped["math_s"] * us, ".2f"),
        "operand_us": known(base["operand_s"] * us, ".2f"), "latency_us": known(base["latency_s"] * us, ".2f"),
        "latency_cycles": f"{base['latency_s'] * clock_hz(target):.0f}", "latency_source": load_latency(target)[1],
        "published_cycles": str(HBM_LATENCY_CYCLES), "l2_source": l2_source,
        "math_1_us": known(base["math_s"] * us, ".2f"),
        "slice_1_us": known(base["slice_s"] * us, ".2f"), "slice_3_us": known(piped["slice_s"] * us, ".2f"),
        "tiles_8192": str(tiles), "waves_8192": str(math.ceil(tiles / slots)),
        "dram_row_gb": f"{row_major / 1e9:.2f}", "dram_grouped_gb": f"{grouped / 1e9:.2f}",
        "dram_hilbert_gb": f"{hilbert / 1e9:.2f}",
        "l2_request_gb": f"{tiles * (BLOCK_M + BLOCK_N) * n * 2 / 1e9:.1f}",
    }
