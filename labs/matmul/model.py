"""
Matmul model: the napkin math behind the wavy plot
==================================================

predict(params, target) for the Triton kernel at every size of the sweep: pure arithmetic on the Params, the tile
configs (labs/matmul/configs.py) and the GPU's facts and measured ceilings (labs/engine/gpu.py). It never asks the
GPU anything and never launches a kernel: the page, the workbench and the tests call it on any machine.

time = max(compute, memory) + a floor, where
- compute = the busiest SM's tiles x K steps x clocks per step (tensor cores at the measured rate per SM, or
  longer when the load path cannot keep up), with the schedules' launches (row tail, interior + edge,
  stream-K) added as the launcher runs them;
- memory = the bytes each wave's tiles fetch from device memory (shared panels counted once per wave);
- the floor = the smallest product timed like the others (a probe at the start of a run, labs/matmul/measure.py),
  and a load's latency from the same probe bounds short steps (Little's law).
"""

from __future__ import annotations

import math
from typing import Optional

from labs.engine import timing
from labs.engine.gpu import (KERNEL_LAUNCH_US, L1_BYTES_PER_CLOCK, LSU_INSTR_PER_CLOCK, Target,  # noqa: F401
                             clock_hz, sm_shape)
from labs.hierarchy.model import l2_tbps  # noqa: F401  (the L2 plateau that lab measures)
import labs.matmul.configs as configs
from labs.matmul.configs import (EDGE_COL_TILE, EDGE_ROW_TILE, TileConfig, blocks_per_sm, config_for,
                                 edge_interior, load_path, out_bytes, parse_label, pow2_dividing, row_tail_rows,
                                 shared_bytes, streamk_plan, tail_tile)

LAYOUT_BYTES_PER_THREAD = 16  # Triton's load layout gives each thread 16 consecutive bytes of a row
FIXED_US = KERNEL_LAUNCH_US  # per launch: the kernel's start, the first tiles' trip from memory, the last store


def matmul_flop_per_clock(target: Target, dtype: str) -> Optional[float]:
    """Multiply-add FLOPs per clock per SM at the measured matmul ceiling of this dtype."""
    peak = target.ceilings.matmul_tflops.get(dtype)
    if not peak:
        return None
    return peak * 1e12 / (target.sm_count * clock_hz(target))


def grouped_tile(pid: int, tiles_m: int, tiles_n: int, group_m: int) -> tuple:
    """The kernel's launch order (_tile_of) in plain Python."""
    per_group = group_m * tiles_n
    first_m = (pid // per_group) * group_m
    rows_here = min(tiles_m - first_m, group_m)
    return first_m + (pid % per_group) % rows_here, (pid % per_group) // rows_here


def tile_grid(m: int, n: int, block_m: int, block_n: int, sm_count: int, blocks_per_sm_: int = 1,
              group_m: int = 8) -> dict:
    """The tile-count explorer: which wave every tile of C runs in (no GPU needed).

    Returns the grid as a list of rows of wave numbers (wave[i][j] for tile row i, tile column j),
    the launch order, and the counts: tiles, slots per wave, waves, last-wave utilisation, and the
    share of the computed area that is padding past the matrix edge.
    """
    tiles_m, tiles_n = math.ceil(m / block_m), math.ceil(n / block_n)
    tiles = tiles_m * tiles_n
    slots = max(1, sm_count * max(1, blocks_per_sm_))
    wave = [[0] * tiles_n for _ in range(tiles_m)]
    order = [[0] * tiles_n for _ in range(tiles_m)]
    for pid in range(tiles):
        i, j = grouped_tile(pid, tiles_m, tiles_n, group_m)
        wave[i][j] = pid // slots
        order[i][j] = pid
    waves = math.ceil(tiles / slots)
    last = tiles - (waves - 1) * slots
    padded_area = tiles_m * block_m * tiles_n * block_n
    return {"tiles_m": tiles_m, "tiles_n": tiles_n, "tiles": tiles, "slots_per_wave": slots, "waves": waves,
            "last_wave_tiles": last, "last_wave_util": last / slots, "wave_util": tiles / (waves * slots),
            "padding_fraction": 1 - m * n / padded_area, "wave": wave, "order": order}


def _wave_dram_bytes(n: int, config: TileConfig, dtype: str, slots: int, tiles_m: int, tiles_n: int,
                     l2_bytes: int) -> float:
    """Bytes from device memory with the grouped launch order: the tiles of one wave share
    GROUP_M row panels of A and the column panels of B they touch, each read once per wave.
    If A and B fit in the L2 together, each is read once in all."""
    e = timing.element_bytes(dtype)
    minimum = 2 * n * n * e + n * n * out_bytes(dtype)
    if 2 * n * n * e <= 0.8 * l2_bytes:
        return minimum
    tiles = tiles_m * tiles_n
    waves = math.ceil(tiles / slots)
    band = min(config.group_m, tiles_m)
    if slots >= band * tiles_n:  # a wave holds whole bands
        rows, cols = min(tiles_m, math.ceil(slots / tiles_n)), tiles_n
    else:
        rows, cols = band, min(tiles_n, math.ceil(slots / band))
    per_wave = (rows * config.block_m + cols * config.block_n) * n * e
    return max(minimum, waves * per_wave + n * n * out_bytes(dtype))


def step_cycles(config: TileConfig, dtype: str, path: str, flop_per_clock: float) -> dict:
    """Clocks one SM spends per BLOCK_K step of one tile, on the tensor cores and on loads.

    - tensor cores: 2 BLOCK_M BLOCK_N BLOCK_K FLOPs at the measured rate per SM;
    - TMA and 16-byte vector loads move the tiles at the L1's 128 bytes per clock, asynchronously,
      overlapped with the math;
    - narrower loads keep the 16-byte path's layout (each thread owns 16 consecutive bytes of a row) and
      issue one instruction per 2, 4 or 8 bytes: a warp instruction then touches 32 addresses 16 bytes
      apart, 512 bytes, which the L1 serves as 4 wavefronts of 128 bytes for 64, 128 or 256 useful bytes.
      So a step costs (BLOCK_M + BLOCK_N) BLOCK_K bytes / (32 x load bytes) instructions x 4 wavefronts, and
      it is not overlapped with the math: measured on an H100 and an H200 (N = 2050 and 2052, 4- and 8-byte
      asynchronous copies), the step took the tensor cores' time plus the loads', within 4 %, not the
      longer of the two as with 16-byte loads. Under 4 bytes there is no asynchronous copy (cp.async moves
      4, 8 or 16 bytes), so each element is loaded into registers and stored to shared memory (the same
      pattern again).
    """
    e = timing.element_bytes(dtype)
    elems = (config.block_m + config.block_n) * config.block_k
    mma = 2 * config.block_m * config.block_n * config.block_k / flop_per_clock
    if path == "tma":
        load, overlapped = elems * e / L1_BYTES_PER_CLOCK, True
    else:
        vec_bytes = int(path[3:])
        instr = elems * e / (32 * vec_bytes)
        wavefronts = 32 * LAYOUT_BYTES_PER_THREAD / L1_BYTES_PER_CLOCK  # per instruction: lanes 16 bytes apart
        load = max(instr / LSU_INSTR_PER_CLOCK, instr * wavefronts)
        overlapped = vec_bytes >= 16
        if vec_bytes < 4:
            load *= 2  # global load into registers, then a store into shared memory
    return {"mma": mma, "load": load, "step": max(mma, load) if overlapped else mma + load,
            "overlapped": overlapped}


_FLOOR_PROBED: dict = {}  # gpu key -> time of the smallest product through the same timer (us)
_LATENCY_PROBED: dict = {}  # gpu key -> time one tile load takes to arrive, from the same probe (us)
FLOOR_TILE = TileConfig(64, 64, 64, 8, 4, 4)  # the probe: one program, one tile, one K step
LATENCY_STEPS = 8  # the latency probe: the same product with this many more K steps


def fixed_us(target: Target) -> float:
    """The per-kernel floor: the smallest product timed exactly as the others are (graph replay, L2 flushed
    before each), measured by this lab's probe; FIXED_US until this GPU has been probed in this process."""
    return _FLOOR_PROBED.get(target.key, FIXED_US)


def load_latency_us(target: Target) -> float:
    """How long a tile's load takes to arrive (probed with the floor; 0, no latency bound, until then)."""
    return _LATENCY_PROBED.get(target.key, 0.0)


def _step_of(config: TileConfig, cyc: dict, target: Target):
    """Clocks of one K step when `a` programs share an SM: a x step, but no less than a load's latency over the
    num_stages - 1 loads each program keeps in flight (Little's law: few programs, short steps)."""
    latency = load_latency_us(target) * 1e-6 * clock_hz(target) / max(1, config.num_stages - 1)
    return lambda a: max(a * cyc["step"], latency)


def _grid_cycles(m: int, n: int, config: TileConfig, dtype: str, path: str, target: Target,
                 flop_per_clock: float, k: Optional[int] = None) -> float:
    """Clocks of the busiest SM for one launch of plain tiles over an m x n block of C (K = n unless given). An SM
    shares its tensor cores among its r programs: it runs ceil(tiles / SMs) tiles, r at a time."""
    if m <= 0 or n <= 0:
        return 0.0
    r = max(1, blocks_per_sm(config, dtype, path, target.compute_capability))
    tiles = math.ceil(m / config.block_m) * math.ceil(n / config.block_n)
    k_steps = math.ceil((n if k is None else k) / config.block_k)
    cyc = step_cycles(config, dtype, path, flop_per_clock)
    step_of = _step_of(config, cyc, target)
    rounds = math.ceil(tiles / target.sm_count)
    waves_sm = math.ceil(rounds / r)
    busy = min(target.sm_count, tiles - (waves_sm - 1) * r * target.sm_count) / target.sm_count  # in the last wave
    tensor_bound = cyc["overlapped"] and cyc["mma"] >= cyc["load"]  # the power cap binds where tensor cores work
    last = step_of(rounds - (waves_sm - 1) * r) / (clock_boost(target, dtype, busy) if tensor_bound else 1.0)
    return k_steps * ((waves_sm - 1) * step_of(r) + last)


POWER_CLOCK_EXPONENT = 3  # dynamic power ~ clock x voltage^2, and the voltage rises with the clock: ~ clock^3


def clock_boost(target: Target, dtype: str, busy_fraction: float) -> float:
    """How much faster than in the calibration the SMs clock while only `busy_fraction` of them multiply.

    The calibration's matmul (cuBLAS, N = 8192, every SM busy) runs at the clock the GPU's power cap allows, below
    the one the datasheet's peak assumes (on an H100 and an H200, 679-686 against 989 TFLOP/s). With fewer SMs
    busy, the same power buys a higher clock: power ~ busy SMs x clock^3 gives clock ~ busy^(-1/3), up to the
    datasheet's clock (its peak over the calibrated rate). A last wave that fills half the SMs runs ~1.26 x faster."""
    sheet = target.datasheet
    peak = sheet.matmul_tflops(dtype) if sheet is not None else None
    calibrated = target.ceilings.matmul_tflops.get(dtype)
    if not peak or not calibrated or busy_fraction >= 1 or busy_fraction <= 0:
        return 1.0
    return min(max(1.0, peak / calibrated), busy_fraction ** (-1 / POWER_CLOCK_EXPONENT))


def _parts_cycles(first: float, first_config: TileConfig, later: list, k: int, dtype: str, path: str,
                  target: Target, flop_per_clock: float) -> float:
    """Clocks of the busiest SM for a chain of launches (_launch_chain): `first` for the first part (in tiles of
    `first_config`), then each (rows, columns, config) of `later`. In plain stream order they add up. With the early
    start, the programs of a later part that fits on an SM beside a first part's program run beside them, on every
    SM: their K steps (at their own cost per step) spread over all SMs add to the first part's time, but no part ends
    before its own busiest SM has done its share. A later part too large to fit beside one (the wide row tail) waits
    for the first part's SMs to free: its time adds up, as in stream order."""
    own = [_grid_cycles(m, n, cfg, dtype, path, target, flop_per_clock, k=k) for m, n, cfg in later]
    if not configs.EARLY_START:
        return first + sum(own)
    room = sm_shape(target.compute_capability).smem_bytes - shared_bytes(first_config, dtype, path)
    beside = [shared_bytes(cfg, dtype, path) <= room for _, _, cfg in later]
    spread = 0.0
    for (m, n, cfg), fits in zip(later, beside):
        if m > 0 and n > 0 and fits:
            tiles = math.ceil(m / cfg.block_m) * math.ceil(n / cfg.block_n)
            step = step_cycles(cfg, dtype, path, flop_per_clock)["step"]
            spread += tiles * math.ceil(k / cfg.block_k) * step / target.sm_count
    after = sum(t for t, fits in zip(own, beside) if not fits)
    return max([first + spread] + [t for t, fits in zip(own, beside) if fits]) + after


def predict_point(n: int, dtype: str, config: TileConfig, target: Target, tma: str = "auto") -> dict:
    """The model for the Triton kernel at one square size: roofline, tile and wave quantization, alignment."""
    path = load_path(n, dtype, target.compute_capability, tma)
    row = {"kernel": "triton", "dtype": dtype, "n": n, "pow2": pow2_dividing(n, 256), "path": path,
           "config": config.label, "roofline_tflops": roofline_tflops(n, dtype, target)}
    flop_per_clock = matmul_flop_per_clock(target, dtype)
    r = blocks_per_sm(config, dtype, path, target.compute_capability)
    if flop_per_clock is None or r == 0:
        row["note"] = "no matmul ceiling for this dtype" if flop_per_clock is None else \
            "tile does not fit in shared memory"
        return row
    tiles_m, tiles_n = math.ceil(n / config.block_m), math.ceil(n / config.block_n)
    tiles, slots = tiles_m * tiles_n, target.sm_count * r
    waves = math.ceil(tiles / slots)
    k_steps = math.ceil(n / config.block_k)
    cyc = step_cycles(config, dtype, path, flop_per_clock)
    step_of = _step_of(config, cyc, target)
    busy_cycles = _grid_cycles(n, n, config, dtype, path, target, flop_per_clock)
    tail_rows = edge_rows = 0
    if config.row_tail and path == "tma":  # the full waves' rows in big tiles, then the rest in short ones
        rows = row_tail_rows(n, n, config, slots)
        tail_rows = n - rows
        if 0 < rows < n:
            busy_cycles = _parts_cycles(
                _grid_cycles(rows, n, config, dtype, path, target, flop_per_clock), config,
                [(tail_rows, n, tail_tile(config))], n, dtype, path, target, flop_per_clock)
    if config.edge and path == "tma":  # whole tiles inside, then the strips at the bottom and on the right
        rows, cols = edge_interior(n, n, config)
        if 0 < rows and 0 < cols and (rows, cols) != (n, n):
            edge_rows = n - rows
            strips = [(n - rows, n, EDGE_ROW_TILE), (rows, n - cols, EDGE_COL_TILE)]
            first = _grid_cycles(rows, cols, config, dtype, path, target, flop_per_clock, k=n)
            busy_cycles = _parts_cycles(first, config, strips, n, dtype, path, target, flop_per_clock)
    fixup_cycles, sk_tiles = 0.0, 0
    if config.streamk and path == "tma":  # the busiest program's share of steps, plus its fix-up traffic
        plan = streamk_plan(tiles, k_steps, slots)
        sk_tiles = plan["sk_tiles"]
        busy_cycles = plan["steps_busiest"] * step_of(r)
        fixup_cycles = r * streamk_fixup_cycles(config, dtype, plan)
    compute_s = (busy_cycles + fixup_cycles) / clock_hz(target)
    dram = _wave_dram_bytes(n, config, dtype, slots, tiles_m, tiles_n, target.l2_bytes)
    memory_s = dram / (target.ceilings.copy_tbps * 1e12)
    floor_s = fixed_us(target) * 1e-6
    total_s = max(compute_s, memory_s) + floor_s
    bound = "memory" if memory_s > compute_s else ("loads" if cyc["load"] > cyc["mma"] or not cyc["overlapped"]
                                                   else "tensor cores")
    if floor_s > max(compute_s, memory_s):
        bound = "launch"
    row.update({
        "tiles": tiles, "blocks_per_sm": r, "waves": waves, "last_wave_util": (tiles - (waves - 1) * slots) / slots,
        "tile_util": n * n / (tiles_m * config.block_m * tiles_n * config.block_n),
        "k_util": n / (k_steps * config.block_k), "dram_bytes": dram, "bound": bound,
        "predicted_ms": total_s * 1e3, "predicted_tflops": 2.0 * n**3 / total_s / 1e12,
        "schedule": "stream-K" if sk_tiles else ("row tail" if tail_rows else ("interior + edge" if edge_rows
                                                                                 else "tiles")),
        "sk_tiles": sk_tiles,
        "tail_rows": tail_rows,
        "fixup_us": fixup_cycles / clock_hz(target) * 1e6,
    })
    return row


def streamk_fixup_cycles(config: TileConfig, dtype: str, plan: dict) -> float:
    """Clocks the busiest stream-K program spends on partial sums, all through its SM's L1 at L1_BYTES_PER_CLOCK.
    With the owner's shortcut a program writes the FP32 part of at most one tile (the one its run starts in) and,
    as the owner of the tile its run ends in, reads the other parts of it (max_sharers - 1) and writes the tile
    of C."""
    if not plan["sk_tiles"]:
        return 0.0
    part = config.block_m * config.block_n * 4
    written, read = 1, plan["max_sharers"] - 1
    moved = (written + read) * part + config.block_m * config.block_n * out_bytes(dtype)
    return moved / L1_BYTES_PER_CLOCK


def roofline_tflops(n: int, dtype: str, target: Target) -> Optional[float]:
    """min(peak, intensity x bandwidth) with each matrix moved once: 2N^3 FLOPs over (2 e_in + e_out) N^2 bytes."""
    peak = target.ceilings.matmul_tflops.get(dtype)
    if not peak:
        return None
    intensity = 2.0 * n / (2 * timing.element_bytes(dtype) + out_bytes(dtype))
    return min(peak, intensity * target.ceilings.copy_tbps)


def divisibility_label(n: int) -> str:
    """The colour class of a size in the wavy plot: the largest power of two dividing N, 32 and up together."""
    p = pow2_dividing(n)
    return "N % 32 = 0" if p >= 32 else f"largest 2^k | N: {p}"


DIVISIBILITY_ORDER = ("N % 32 = 0", "largest 2^k | N: 16", "largest 2^k | N: 8", "largest 2^k | N: 4",
                      "largest 2^k | N: 2", "largest 2^k | N: 1")


def roofline_rows(dtype: str, sizes, target: Target) -> list[dict]:
    """The roofline for drawing: min(peak, intensity x bandwidth) at every N of the sweep."""
    return [{"n": n, "dtype": dtype, "roofline_tflops": roofline_tflops(n, dtype, target)} for n in sorted(set(sizes))]


MISS_BAND_PCT = 15.0


def explain_misses(rows: list, band_pct: float = MISS_BAND_PCT) -> list[dict]:
    """Triton points where measurement and model differ by more than band_pct, each with the reason
    the lesson's "Behind the model" gives for its kind of point."""
    out = []
    for r in rows:
        err = r.get("error_pct")
        if r.get("kernel") != "triton" or err is None or abs(err) <= band_pct:
            continue
        if str(r.get("path", "")).startswith("vec") and r.get("path") != "vec16":
            reason = f"unaligned N: loads of {str(r['path'])[3:]} bytes"
        elif r.get("path") == "tma" and (r.get("n", 0) * timing.element_bytes(r.get("dtype", "bf16"))) % 32:
            reason = "rows not 32-byte aligned: 5 sectors read for 4 of data"
        elif r.get("n", 0) < 1100 or r.get("bound") == "launch":
            reason = "small N: start-up and first loads dominate"
        elif " EG" in str(r.get("config", "")) and err < 0:
            reason = "interior + edge: the strips run mostly where the interior leaves SMs idle"
        elif str(r.get("config", "")).endswith((" RT", " RTT")) and err > 0:  # tail tiles that fit beside big ones
            reason = "row tail: the short tiles overlap the big ones' last wave"
        elif (r.get("last_wave_util") or 1) < 0.75 and err > 0:
            reason = "partial last wave: fewer SMs busy, higher clock"
        else:
            reason = "ceiling: measured cuBLAS rate differs from today's"
        out.append({"dtype": r.get("dtype"), "n": r.get("n"), "path": r.get("path"), "waves": r.get("waves"),
                    "last_wave_util": r.get("last_wave_util"), "measured_tflops": r.get("measured_tflops"),
                    "predicted_tflops": r.get("predicted_tflops"), "error_pct": err, "reason": reason})
    return out


def explorer(n: int, dtype: str, block_m: int, block_n: int, target: Target, group_m: int = 8,
             block_k: int = 64, num_warps: int = 8, num_stages: int = 3) -> dict:
    """The tile-count explorer for a page: the tile -> wave grid for this GPU's SM count, with the number
    of programs per SM the model expects for this tile shape (no GPU needed)."""
    cfg = TileConfig(block_m, block_n, block_k, group_m, num_warps, num_stages)
    r = blocks_per_sm(cfg, dtype, "tma", target.compute_capability)
    grid = tile_grid(n, n, block_m, block_n, target.sm_count, max(1, r), group_m)
    grid.update({"blocks_per_sm": r, "sm_count": target.sm_count, "n": n, "block_m": block_m, "block_n": block_n})
    return grid


def explorer_curve(dtype: str, block_m: int, block_n: int, target: Target, n_max: int = 8192, step: int = 64,
                   group_m: int = 8, block_k: int = 64, num_warps: int = 8, num_stages: int = 3) -> list[dict]:
    """Wave efficiency (tiles / (waves x slots)) and tile efficiency (useful / padded area) against N."""
    cfg = TileConfig(block_m, block_n, block_k, group_m, num_warps, num_stages)
    slots = target.sm_count * max(1, blocks_per_sm(cfg, dtype, "tma", target.compute_capability))
    rows = []
    for n in range(step, n_max + 1, step):
        tiles_m, tiles_n = math.ceil(n / block_m), math.ceil(n / block_n)
        tiles = tiles_m * tiles_n
        waves = math.ceil(tiles / slots)
        rows.append({"n": n, "tiles": tiles, "waves": waves, "wave_util": tiles / (waves * slots),
                     "tile_util": n * n / (tiles_m * block_m * tiles_n * block_n)})
    return rows


# ---------------------------------------------------------------------------------------------


def recorded_floor_us(recording: dict) -> Optional[float]:
    """The floor a recorded run probed: its rows' `floor_us`, or (older runs) the number in its note."""
    import re

    for row in recording.get("rows", []):
        if row.get("floor_us"):
            return float(row["floor_us"])
    for note in recording.get("messages", []):
        hit = re.search(r"timed like the (?:products|others), took ([0-9.]+) us", str(note))
        if hit:
            return float(hit.group(1))
    return None


def repredict(recording: dict, target: Target, params) -> list[dict]:
    """The model of a recorded run (its Params given): with the floor and load latency that run probed (older runs:
    the floor alone), and for each point the tile config the kernel actually ran (its `config` column), as the
    live run predicts it. The package's repredict hook (labs/matmul/__init__.py) builds the Params."""
    ran = {(r.get("dtype"), r.get("n")): parse_label(r.get("config")) for r in recording["rows"]
           if r.get("kernel") == "triton"}
    floor = recorded_floor_us(recording)
    latency = next((float(r["load_latency_us"]) for r in recording["rows"] if r.get("load_latency_us") is not None),
                   None)
    before = _FLOOR_PROBED.get(target.key), _LATENCY_PROBED.get(target.key)
    early_before = configs.EARLY_START
    configs.set_early_start(any(r.get("early_start") for r in recording["rows"]))  # older runs: plain stream order
    if floor is not None:
        _FLOOR_PROBED[target.key] = floor
    if latency is not None:
        _LATENCY_PROBED[target.key] = latency
    try:
        cc = target.compute_capability
        return [predict_point(n, dtype, ran.get((dtype, n)) or config_for(params, dtype, n, target.sm_count, cc),
                              target, params.tma)
                for dtype in params.dtypes for n in params.sizes if "triton" in params.kernels]
    finally:
        configs.set_early_start(early_before)
        for probed, value in zip((_FLOOR_PROBED, _LATENCY_PROBED), before):
            if value is None:
                probed.pop(target.key, None)
            else:
                probed[target.key] = value


def predict(params, target: Target) -> list[dict]:
    return [predict_point(n, dtype, config_for(params, dtype, n, target.sm_count, target.compute_capability), target,
                          params.tma)
            for dtype in params.dtypes for n in params.sizes if "triton" in params.kernels]


def bytes_needed(n: int, dtype: str) -> int:
    """A, B and one output, plus the 256 MB buffer do_bench clears the L2 with."""
    return 2 * n * n * timing.element_bytes(dtype) + n * n * out_bytes(dtype) + 256 * 2**20


