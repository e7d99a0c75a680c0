"""
Matmul tile configs: which tile, pipeline depth and schedule the Triton kernel runs at each size
=================================================================================================

Pure arithmetic (no GPU, no kernels): the tile shapes (TileConfig), the per-size choice (tuned_config,
config_for), how many programs of a tile fit on one SM (blocks_per_sm), which load path a size takes
(load_path), and the schedules' plans (row tail, interior + edge, stream-K). The launcher
(labs/matmul/kernels.py) and the model (labs/matmul/model.py) both read these, so they always agree.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch

from labs.engine import timing
from labs.engine.gpu import Target, compute_capability_tuple, sm_shape

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
KERNELS = ("cublas", "triton")
_cc = compute_capability_tuple


@dataclass(frozen=True)
class TileConfig:
    block_m: int  # tile rows (of C) per program
    block_n: int  # tile columns per program
    block_k: int  # depth of one step along K
    group_m: int = 8  # tile rows per band of the launch order (L2 reuse)
    num_warps: int = 8  # warps per program (4 warps = one warpgroup on Hopper)
    num_stages: int = 3  # tiles of A and B in flight in shared memory (software pipelining)
    streamk: bool = False  # persistent stream-K schedule (TMA path only): the partial wave's K steps shared out
    row_tail: bool = False  # row tail (TMA path only): the full waves' tile rows, then the rest in a tail tile
    edge: bool = False  # interior + edge (TMA path only): whole tiles inside, thin strips of EDGE tiles at the edges
    tail: str = ""  # with row_tail, the tail's tile (TAIL_TILES): "" 64x64, "T" tall 128x64, "W" wide 128x128

    @property
    def label(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} G{self.group_m} "
                f"w{self.num_warps} s{self.num_stages}" + (" SK" if self.streamk else "")
                + (" RT" + self.tail if self.row_tail else "") + (" EG" if self.edge else ""))


# Fixed configs per dtype, chosen from measurements on an H200 (Triton 3.6):
# bf16 128x256x64 w8 s3 reached 0.95-1.02x cuBLAS at N = 4096 and 8192 (128x128x64: 0.80-0.85x),
# fp8 128x128x128 w4 s4 0.96-1.08x (128x256x128: 0.89-0.96x), tf32 128x128x32 w4 s4 0.92x (w8 s3: 0.62x),
# fp32 (ieee, CUDA cores) 128x128x32 w8 s3 0.87x.
DEFAULT_CONFIGS = {
    "fp16": TileConfig(128, 256, 64, 8, 8, 3),
    "bf16": TileConfig(128, 256, 64, 8, 8, 3),
    "fp8": TileConfig(128, 128, 128, 8, 4, 4),
    "tf32": TileConfig(128, 128, 32, 8, 4, 4),
    "fp32": TileConfig(128, 128, 32, 8, 8, 3),
}
# Per-size choice for the 16-bit dtypes (measured on an H100 against cuBLAS, 2026-11-23):
# a 128x256 tile leaves SMs idle when the matrix has fewer tiles than SMs (N = 1024: 32 tiles for 132 SMs,
# 0.59x cuBLAS), so smaller N takes the largest tile that still gives about every SM one (64x128: 0.86-0.96x
# at N = 1024-1280; 64x64: 0.89-0.96x at N <= 768), with the deepest pipeline (6, 4 or 3 stages) whose programs
# per SM still hold every tile at once (N = 1536: 288 tiles of 64x128; 4 stages fit 2 programs an SM, 264 slots,
# 0.79x; 3 stages fit 3, 396 slots, 0.84x. N = 1024: 128 tiles, one program an SM with 6 stages, 0.97x against
# 0.87x with 4). Where the big tile's last wave is less than half full (N = 2056-3072, 5120) the row tail takes
# over (ROW_TAIL_TILE below; it replaced a 128x128 tile there: 0.86x -> 1.04x at 2304, 0.75x -> 0.90x at 3072,
# 0.53x -> 0.61x at 2056, 0.61x -> 0.69x at 2064, and 0.88-0.92x -> 0.99x at 5120 on an H100; its tail tile:
# tail_choice, measured at every multiple of 128 that takes it in TAIL_TILES' comment). Between 128x256 and
# 128x128 otherwise, the one whose last wave is fuller wins when it fills the waves by a tenth more. With the early start
# (EARLY_START below), N a little over a multiple of the big tile (2056, 2064) takes interior + edge (edge_applies), and
# where the big tile gives too few SMs a tile, a row tail after 128x128 tiles (1536) or after the small tile 6 stages
# deep (1152) replaces the small tiles in one wave where it keeps the busiest SM less long (_small_size_config).
SMALL_TILES = (TileConfig(64, 128, 64, 8, 4, 4), TileConfig(64, 64, 64, 8, 4, 4))
NARROW_TILE = TileConfig(128, 128, 64, 8, 4, 4)
MIN_SM_SHARE = 0.7  # a tile shape is large enough when it gives at least 70 % of the SMs a tile
WAVE_GAIN = 0.1  # the narrower tile must fill its waves this much better to be worth its extra loads
# Pipeline depths tried for a small tile, deepest first (measured for 64x128 on an H100; 64x64, used at N <= 768,
# keeps the 4 stages it was measured with there: 0.89-0.99x cuBLAS).
SMALL_STAGES = {(64, 128): (6, 4, 3)}

# A handful of configs for the autotuned option (compiling each costs seconds, so few), by element bytes.
AUTOTUNE_CONFIGS = {
    2: [TileConfig(128, 256, 64, 8, 8, 3), TileConfig(128, 128, 64, 8, 4, 4), TileConfig(128, 128, 64, 8, 8, 4),
         TileConfig(256, 128, 64, 8, 8, 3), TileConfig(64, 128, 64, 8, 4, 4)],
    1: [TileConfig(128, 128, 128, 8, 4, 4), TileConfig(128, 256, 128, 8, 8, 3), TileConfig(256, 128, 128, 8, 8, 3),
        TileConfig(64, 128, 128, 8, 4, 4)],
    4: [TileConfig(128, 128, 32, 8, 4, 4), TileConfig(128, 128, 32, 8, 8, 3), TileConfig(64, 256, 32, 8, 4, 3),
        TileConfig(128, 64, 32, 8, 4, 3)],
}

# Hopper's tensor cores read a transposed operand from shared memory only for 16-bit types, so for fp8
# and tf32 B is stored transposed (N x K, "column-major"; cuBLAS's fp8 path requires it too). The ieee
# fp32 path runs on the CUDA cores and is faster with B row-major (measured on an H200: 45 vs 6 TFLOP/s).
KMAJOR_B = ("fp8", "tf32")


def out_bytes(dtype: str) -> int:
    """Bytes of one element of C: fp8 products are written in bf16 (as torch._scaled_mm does)."""
    return 2 if dtype == "fp8" else timing.element_bytes(dtype)


def pow2_dividing(n: int, cap: int = 1 << 30) -> int:
    """The largest power of two that divides n (capped)."""
    return min(n & -n, cap) if n > 0 else cap


def tma_supported(compute_capability: str) -> bool:
    return _cc(compute_capability) >= (9, 0)


def vector_elems(element_bytes: int, *counts: int) -> int:
    """Elements one pointer load can move: the largest power of two that divides every count (row strides, K,
    N), up to 16 bytes' worth. Triton proves only multiples of 16 from the arguments themselves; the launcher
    promises the rest (matmul_kernel's ALIGN)."""
    most = 16 // element_bytes
    return min([most] + [pow2_dividing(c, most) for c in counts])


def load_path(n: int, dtype: str, compute_capability: str, tma: str = "auto", k: Optional[int] = None) -> str:
    """Which way the Triton kernel loads its tiles at this size: 'tma' (rows start on 16-byte boundaries,
    Hopper or newer), else 'vecB': pointer loads of B bytes, as many as the rows' alignment allows (vec16:
    rows on 16-byte boundaries; vec8 and vec4: 8 and 4; vecE with E the element size: element by element)."""
    k = n if k is None else k
    e = timing.element_bytes(dtype)
    if tma == "auto" and (n * e) % 16 == 0 and (k * e) % 16 == 0 and tma_supported(compute_capability):
        return "tma"
    return f"vec{vector_elems(e, n, k) * e}"


SK_EXTRA_WAVE = True  # share out one full wave more than the partial one (see streamk_plan)
SK_MAX_SHARERS = 8  # at most this many programs share one tile (fewer programs for very few, very deep tiles)


def streamk_plan(tiles: int, k_steps: int, slots: int, extra_wave: Optional[bool] = None) -> dict:
    """How the stream-K kernel shares out the work (the launcher and the model both use this).

    `slots` programs run at once (SMs x programs per SM). Whole waves of tiles stay whole; the tiles of the
    partial wave, plus one full wave before it where there is one (so that every program gets between one
    and two tiles' worth of steps rather than a sliver), have their K steps dealt out evenly to all programs.
    Returns the grid (programs), the tiles shared out and kept whole, the K steps of the busiest program, the
    scratch slots one program may need, and the most programs that share one tile."""
    extra_wave = SK_EXTRA_WAVE if extra_wave is None else extra_wave
    rest = tiles % slots
    if rest == 0:  # the waves are full: nothing to share out
        grid, sk = min(tiles, slots), 0
    else:
        sk = rest + slots if tiles > slots and extra_wave else rest
        grid = min(slots, sk * k_steps, sk * SK_MAX_SHARERS)  # every program gets at least one K step
    total = sk * k_steps
    share = -(-total // grid) if sk else 0
    sharers = [((t * k_steps + k_steps) * grid - 1) // total - ((t * k_steps + 1) * grid - 1) // total + 1
               for t in range(sk)] if sk else [1]
    return {"grid": grid, "sk_tiles": sk, "dp_tiles": tiles - sk,
            "steps_busiest": share + (tiles - sk) // grid * k_steps,
            "max_seg": (share + k_steps - 1) // k_steps + 1 if sk else 1, "max_sharers": max(sharers)}


# The rows after the full waves go to a tail tile: a quarter of the big tile where the tail's tiles all start in one
# round on the SMs (tail_rounds), else half of it (tail_choice). A round of quarter tiles takes a quarter of a big
# tile's time, a round of halves half; past one round, the hardware stacks the extra programs of a small tile on the
# SMs that free first (up to 3 of 128x64 or 64x64 an SM), while a 128x128 one (128 KiB) takes an SM to itself, so a
# second round of halves still spreads one to an SM. Measured on an H100 (a candidate script, since retired, 2026-11-27:
# docs/matmul-every128/candidates-h100-2026-11-27.txt; x cuBLAS, tail tiles counted for 132 SMs), after 128x256 tiles:
# - 128x64 in one round beat 128x128 and 64x64: 2176 (102 tiles: 0.980 against 0.826 and 0.935), 2304 (144, 6 SMs
#   idle in the last full wave: 1.100, 0.920, 1.028), 2944 (46: 0.934, 0.863, 0.895), 3072 (96: 0.954, 0.866,
#   0.920), 4224 (132: 0.980, 0.937, 0.937); 5888 (92) tied within its spread (1.004, 1.036, 1.001).
# - 128x64 past one round lost to 128x128: 2432 (228 tiles: 0.753 against 0.898), 3200 (250: 0.784, 0.929), 3712
#   (174: 0.956, 1.020), 3840 (0.892, 0.962), 4352 (0.917, 0.963), 4736 (0.916, 0.977), 7552 (0.957, 0.988), 4864
#   (0.915, 0.964: 152 wide tiles, which 14 SMs idle in the last full wave take 28 of), 6400 (0.936, 0.971); within
#   the spreads at 6656 (1.070; 1.044 and 1.061 in two timings of the 128x128 tail) and 5632 (0.945, 0.938; the
#   64x64 tail 0.978 there).
# A 64x64 tile does not run twice as fast as a 128x64 one alone on an SM (a single warpgroup waits on its loads
# either way: 2944 above), so after 128x256 it is not a tail tile; it is the quarter of a 128x128 tile (1536: 48
# tiles, 0.955) and the half of a 64x128 one (1152: 72 tiles, 0.927). The 64x64 and 128x64 programs (64 and 72 KiB)
# fit on an SM beside a 128x256 one (144 KiB) still finishing; a 128x128 one does not, so it starts as they free up.
ROW_TAIL_TILE = TileConfig(64, 64, 64, 8, 4, 4)
TALL_TAIL_TILE = TileConfig(128, 64, 64, 8, 4, 3)  # 3 stages: 72 KiB, so it fits beside a 128x256 program
WIDE_TAIL_TILE = NARROW_TILE
TAIL_TILES = {"": ROW_TAIL_TILE, "T": TALL_TAIL_TILE, "W": WIDE_TAIL_TILE}  # TileConfig.tail -> the tail's tile
ROW_TAIL_FILL = 0.5  # the row tail replaces the big tile's last wave when that wave is less than half full
# The later launches of the row tail and of interior + edge (below) are programmatic dependent launches (Hopper):
# their programs may start on the SMs the earlier kernel leaves idle or frees, instead of after it has drained (the
# parts write different elements of C), and the last program of each waits for the kernel before it just before it
# ends (WAIT_PRIMARY), because CUDA promises that the next work in the stream waits for the earlier kernel only if the
# later one does. On an H100 (measured 2026-11-23, each part checked element by element against float64 right
# after direct launches and graph replays, then timed beside cuBLAS in the same run) the early start with
# only the last program waiting was faster than stream order for every schedule that uses it (the row tail, interior +
# edge, the 128 x 128 row tail below). With every program waiting it gained nothing for the row tail: a tail program
# that has finished then holds its SM until the big kernel is done, and the tail programs still queued wait for it.
# The early start is the default on Hopper; re-predicting an older recording (plain stream order) turns it off for
# the time of the call (set_early_start). Read it as configs.EARLY_START, at call time.
EARLY_START = True


def tail_tile(config: TileConfig) -> TileConfig:
    """The tile of a row-tail config's second launch (TAIL_TILES by its `tail`)."""
    return TAIL_TILES[config.tail]


def row_tail_rows(m: int, n: int, config: TileConfig, slots: int) -> int:
    """Rows of C the big tile covers under the row-tail schedule: the whole tile rows that fit in the full waves
    (0 when there is no full wave, M when the waves are all full). The rest go to a tail tile in a second launch,
    whose many short tiles keep the SMs busy where the big tiles' last wave would have left most of them idle."""
    tiles_n = -(-n // config.block_n)
    tiles = -(-m // config.block_m) * tiles_n
    if tiles % slots == 0:
        return m
    return min(m, (tiles // slots * slots) // tiles_n * config.block_m)


# Interior + edge: when N is a little over a multiple of the big tile (2056 = 2048 + 8, 2064 = 2048 + 16), the big
# tiles that lie wholly inside the matrix fill their waves, while tiles over the whole matrix add a wave that is almost
# all padding. The strips left over (a few rows of every column, a few columns of the other rows) are ~1-2 % of the
# work but read all of B (or A): narrow tiles, 16 rows or 16 columns by 64, give them to many SMs at once, beside
# the interior's tiles (a 40 KiB program fits on an SM next to a 128x256 one's 144 KiB).
# Edge tiles measured on an H100 (same runs): BLOCK_K = 128 with 3 stages was a little faster at 2064 than 64 with 4
# or 6 stages, and strips 16 wide beat 32-wide ones and 128-long ones.
EDGE_ROW_TILE = TileConfig(16, 64, 128, 8, 4, 3)  # the bottom strip: at most 16 rows, every column
EDGE_COL_TILE = TileConfig(64, 16, 128, 8, 4, 3)  # the right strip: the interior's rows, at most 16 columns


def edge_interior(m: int, n: int, config: TileConfig) -> tuple:
    """(rows, columns) of C covered by whole tiles of `config`: the interior; the rest is the edge."""
    return m // config.block_m * config.block_m, n // config.block_n * config.block_n


def edge_applies(n: int, big: TileConfig, dtype: str, sm_count: int, compute_capability: str = "9.0") -> bool:
    """Interior + edge is worth its extra launches when the edge is thin (what one EDGE tile covers across) and the
    interior's whole tiles fill their waves by WAVE_GAIN more than tiles over the whole matrix do."""
    rows, cols = edge_interior(n, n, big)
    if rows == 0 or cols == 0 or (rows, cols) == (n, n):
        return False
    if n - rows > EDGE_ROW_TILE.block_m or n - cols > EDGE_COL_TILE.block_n:
        return False
    slots = sm_count * max(1, blocks_per_sm(big, dtype, "tma", compute_capability))
    inner = (rows // big.block_m) * (cols // big.block_n)
    fill = lambda t: t / (math.ceil(t / slots) * slots)  # noqa: E731
    return fill(inner) - fill(tiles_of(n, big)) >= WAVE_GAIN


# ---------------------------------------------------------------------------------------------
# What fits on one SM
# ---------------------------------------------------------------------------------------------
def registers_per_thread(config: TileConfig, dtype: str) -> int:
    """Accumulators (BLOCK_M x BLOCK_N FP32 spread over the threads) plus ~26 for addresses, loop
    counters and barriers (Triton 3.6 on an H200: 154 registers for 128x256 tiles on 8 warps, 90 for
    128x128); the ieee fp32 path also holds its operands in registers."""
    threads = 32 * config.num_warps
    regs = config.block_m * config.block_n // threads + 26
    if dtype == "fp32":
        regs += (config.block_m + config.block_n) * config.block_k // threads
    return min(255, regs)


def shared_bytes(config: TileConfig, dtype: str, path: str = "tma") -> int:
    """num_stages tiles of A and B in flight (the C tile is staged for its store in the same buffers
    once the loop is done)."""
    return config.num_stages * (config.block_m + config.block_n) * config.block_k * timing.element_bytes(dtype)


def blocks_per_sm(config: TileConfig, dtype: str, path: str, compute_capability: str) -> int:
    """Programs that fit on one SM at once: the smallest of the shared-memory, register and thread limits."""
    shape = sm_shape(compute_capability)
    threads = 32 * config.num_warps
    smem = shared_bytes(config, dtype, path)
    if smem > shape.smem_bytes:
        return 0
    by_regs = shape.registers // (registers_per_thread(config, dtype) * threads)
    return max(0, min(shape.smem_bytes // smem, by_regs, shape.max_threads // threads, 32))


def tiles_of(n: int, config: TileConfig) -> int:
    return math.ceil(n / config.block_m) * math.ceil(n / config.block_n)


def wave_fill(n: int, config: TileConfig, dtype: str, sm_count: int, compute_capability: str = "9.0") -> float:
    """Tiles over the slots of the waves they need: 1.0 when the last wave is full."""
    slots = sm_count * max(1, blocks_per_sm(config, dtype, "tma", compute_capability))
    tiles = tiles_of(n, config)
    return tiles / (math.ceil(tiles / slots) * slots)


def tuned_config(n: int, dtype: str, sm_count: int, compute_capability: str = "9.0") -> TileConfig:
    """The tile shape for an N x N x N product in fp16/bf16 (see SMALL_TILES); other dtypes keep their default."""
    big = DEFAULT_CONFIGS[dtype]
    if dtype not in ("fp16", "bf16"):
        return big
    for config in (big,) + SMALL_TILES:
        if tiles_of(n, config) >= MIN_SM_SHARE * sm_count:
            break
    if config is not big:
        return _small_size_config(n, config, dtype, sm_count, compute_capability)
    if edge_applies(n, big, dtype, sm_count, compute_capability):
        return dataclasses.replace(big, edge=True)
    if row_tail_applies(n, big, dtype, sm_count, compute_capability):
        return _with_row_tail(n, big, dtype, sm_count, compute_capability)
    narrow_gain = wave_fill(n, NARROW_TILE, dtype, sm_count, compute_capability) - \
        wave_fill(n, big, dtype, sm_count, compute_capability)
    return NARROW_TILE if narrow_gain >= WAVE_GAIN else big


def _small_size_config(n: int, small: TileConfig, dtype: str, sm_count: int, compute_capability: str) -> TileConfig:
    """Where the big tile leaves SMs idle: the small tile in one wave, or (with the early start) a row tail after
    128x128 tiles or after the small tile at its deepest pipeline, whichever keeps the busiest SM least long
    (busiest_sm_work); on a tie the first of that order: one launch, then the larger tile. Measured on an H100
    (2026-11-27): 1152 with 64x128 s6 and a 64x64 tail 0.927x cuBLAS (0.75 of a 128x128 tile's time) against 0.893x
    in one wave of 64x128 s4 (2 tiles on the busiest SM: 1.0); 1664 with 64x128 s3 in one wave 0.928x (3 on the
    busiest SM: 1.5) against 0.859x for 128x128 and a 64x64 tail (156 tiles, a second round; 0.907x 6 stages deep;
    the 128x64 tail the rule would take counts 1.5 too); 1536 with 128x128 and a 64x64 tail (48 tiles) 0.955x (1.25;
    64x128 s3: 1.5, 0.84x)."""
    options = [_deepest_in_one_wave(n, small, dtype, sm_count, compute_capability)]
    deepest = dataclasses.replace(small, num_stages=SMALL_STAGES.get((small.block_m, small.block_n),
                                                                     (small.num_stages,))[0])
    for big in (NARROW_TILE, deepest) if EARLY_START else ():
        if row_tail_applies(n, big, dtype, sm_count, compute_capability) and \
                tail_choice(n, big, dtype, sm_count, compute_capability) is not None:
            options.append(_with_row_tail(n, big, dtype, sm_count, compute_capability))
    return min(options, key=lambda c: busiest_sm_work(n, c, dtype, sm_count, compute_capability))


def _deepest_in_one_wave(n: int, config: TileConfig, dtype: str, sm_count: int,
                         compute_capability: str) -> TileConfig:
    """`config` with the most stages (SMALL_STAGES) whose programs per SM still run every tile in one wave: a
    deeper pipeline hides more of a load's latency, but a second wave for a few tiles costs a whole tile's time."""
    for stages in SMALL_STAGES.get((config.block_m, config.block_n), ()):
        deeper = dataclasses.replace(config, num_stages=stages)
        if tiles_of(n, deeper) <= sm_count * blocks_per_sm(deeper, dtype, "tma", compute_capability):
            return deeper
    return config


def _with_row_tail(n: int, big: TileConfig, dtype: str, sm_count: int, compute_capability: str) -> TileConfig:
    return dataclasses.replace(big, row_tail=True, tail=tail_choice(n, big, dtype, sm_count, compute_capability))


def _area(config: TileConfig) -> int:
    return config.block_m * config.block_n


def tail_rounds(n: int, big: TileConfig, tile: TileConfig, dtype: str, sm_count: int,
                compute_capability: str = "9.0") -> int:
    """Rounds of the row tail's tiles of `tile` on the SMs after the big tiles' full waves: one tile an SM a round
    (more on one SM share its time), less what the SMs the big tiles' last full wave leaves idle finish before it
    ends (as many as take a big tile's time each; only with the early start do they start there)."""
    per_sm = max(1, blocks_per_sm(big, dtype, "tma", compute_capability))
    slots = sm_count * per_sm
    rows = row_tail_rows(n, n, big, slots)
    big_tiles = rows // big.block_m * math.ceil(n / big.block_n)
    idle_sms = (math.ceil(big_tiles / slots) * slots - big_tiles) // per_sm
    early = idle_sms * (_area(big) // _area(tile)) if EARLY_START else 0
    tiles = math.ceil((n - rows) / tile.block_m) * math.ceil(n / tile.block_n)
    return max(1, math.ceil((tiles - early) / sm_count))


def tail_choice(n: int, big: TileConfig, dtype: str, sm_count: int, compute_capability: str = "9.0") -> Optional[str]:
    """The row tail's tile after `big` (a key of TAIL_TILES): the one a quarter of its size where those take one round
    (tail_rounds), else the one half its size; None where no tail tile is half of it (see TAIL_TILES)."""
    by_share = {_area(big) // _area(t): key for key, t in TAIL_TILES.items() if _area(big) % _area(t) == 0}
    quarter, half = by_share.get(4), by_share.get(2)
    if quarter is not None and tail_rounds(n, big, TAIL_TILES[quarter], dtype, sm_count, compute_capability) == 1:
        return quarter
    return half


def busiest_sm_work(n: int, config: TileConfig, dtype: str, sm_count: int, compute_capability: str = "9.0") -> float:
    """The wave arithmetic of a schedule: the busiest SM's tiles, in 128x128 tiles' worth of work (programs that share
    an SM share its time); under a row tail, the big tiles' full waves, then the tail's rounds (tail_rounds)."""
    if not config.row_tail:
        return math.ceil(tiles_of(n, config) / sm_count) * _area(config) / _area(NARROW_TILE)
    big = dataclasses.replace(config, row_tail=False, tail="")
    rows = row_tail_rows(n, n, big, sm_count * max(1, blocks_per_sm(big, dtype, "tma", compute_capability)))
    big_rounds = math.ceil(rows // big.block_m * math.ceil(n / big.block_n) / sm_count)
    tile = tail_tile(config)
    return (big_rounds * _area(big) + tail_rounds(n, big, tile, dtype, sm_count, compute_capability) * _area(tile)) \
        / _area(NARROW_TILE)


def row_tail_applies(n: int, big: TileConfig, dtype: str, sm_count: int, compute_capability: str = "9.0") -> bool:
    """The row tail is worth its second launch when the big tile makes at least one full wave and a last wave
    less than ROW_TAIL_FILL full (the SMs of the last wave would mostly idle)."""
    slots = sm_count * max(1, blocks_per_sm(big, dtype, "tma", compute_capability))
    tiles = tiles_of(n, big)
    return tiles > slots and 0 < tiles % slots < ROW_TAIL_FILL * slots


def config_for(params, dtype: str, n: Optional[int] = None, sm_count: Optional[int] = None,
               compute_capability: str = "9.0") -> TileConfig:
    """The tile config for this run: the knobs the learner set, else the per-size choice (given n and the
    SM count), else the dtype's default. `streamk` on: the big tile (unless set) on the stream-K schedule,
    on the TMA path only."""
    chosen = (params.block_m, params.block_n, params.block_k, params.num_warps, params.num_stages)
    # the per-size choice was measured on the TMA path; unaligned sizes keep the default tile
    tma_path = n is not None and load_path(n, dtype, compute_capability, params.tma) == "tma"
    if tma_path and sm_count and not any(chosen):
        d = tuned_config(n, dtype, sm_count, compute_capability)
        if params.streamk == "on":
            d = dataclasses.replace(DEFAULT_CONFIGS[dtype], streamk=True)
        return dataclasses.replace(d, group_m=params.group_m)
    d = DEFAULT_CONFIGS[dtype] if any(chosen) else fitted_default(dtype, compute_capability)
    return TileConfig(params.block_m or d.block_m, params.block_n or d.block_n, params.block_k or d.block_k,
                      params.group_m, params.num_warps or d.num_warps, params.num_stages or d.num_stages,
                      params.streamk == "on" and tma_path)


def fitted_default(dtype: str, compute_capability: str) -> TileConfig:
    """The dtype's default tile, made to fit one SM's shared memory where the GPU has less than Hopper's 227 KiB
    (99 KiB on an L4 or L40S, 64 KiB on a T4): fewer stages first (down to 2), then half the longer side of the
    tile, until one program fits. Only the default shrinks; a tile the learner sets is refused by check() instead."""
    config = DEFAULT_CONFIGS[dtype]
    smem = sm_shape(compute_capability).smem_bytes
    while shared_bytes(config, dtype, "vec16") > smem and min(config.block_m, config.block_n) > 16:
        if config.num_stages > 2:
            config = dataclasses.replace(config, num_stages=config.num_stages - 1)
        else:  # halve the longer side and start again from the default depth
            side = "block_n" if config.block_n >= config.block_m else "block_m"
            config = dataclasses.replace(config, **{side: getattr(config, side) // 2},
                                         num_stages=DEFAULT_CONFIGS[dtype].num_stages)
    return config


def parse_label(label: str) -> Optional[TileConfig]:
    """TileConfig.label read back ("128x256x64 G8 w8 s3", then " SK", " RT" with its tail's key (" RTT", " RTW") or " EG"
    for a schedule); None if it is not one."""
    try:
        parts = label.split()
        bm, bn, bk = (int(x) for x in parts[0].split("x"))
        flags = parts[4:]
        if any(f not in {"SK", "EG"} | {"RT" + key for key in TAIL_TILES} for f in flags):
            return None
        tail = next((f[2:] for f in flags if f.startswith("RT")), None)
        return TileConfig(bm, bn, bk, int(parts[1][1:]), int(parts[2][1:]), int(parts[3][1:]), "SK" in flags,
                          tail is not None, "EG" in flags, tail or "")
    except (AttributeError, IndexError, ValueError):
        return None


def set_early_start(on: bool) -> None:
    """Turn the early start (programmatic dependent launch) on or off for the launcher and the model."""
    global EARLY_START
    EARLY_START = bool(on)


def dtype_support(target: Target) -> dict:
    """dtype -> '' if this GPU runs it, else the reason it is disabled."""
    cc = _cc(target.compute_capability)
    have = target.ceilings.matmul_tflops
    reasons = {}
    for d in DTYPES:
        if d in ("bf16", "tf32") and cc < (8, 0):
            reasons[d] = (f"{d} needs tensor cores of compute capability 8.0 or newer; {target.name} is "
                          f"{target.compute_capability}. Choose fp16 (its tensor cores have it) or fp32.")
        elif d == "fp8" and cc < (8, 9):
            reasons[d] = (f"fp8 (e4m3) needs compute capability 8.9 or newer (Ada, Hopper); {target.name} is "
                          f"{target.compute_capability}.")
        elif d == "fp8" and not (hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")):
            reasons[d] = f"fp8 needs a PyTorch with float8_e4m3fn and _scaled_mm (this is {torch.__version__})."
        elif not have.get(d):
            reasons[d] = f"no {d} matmul ceiling is known for {target.name}: calibrate it on the Your GPU page."
        else:
            reasons[d] = ""
    return reasons

