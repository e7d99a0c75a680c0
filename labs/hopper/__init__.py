"""
Hopper matmul anatomy: what each feature of a fast Hopper matmul buys
=====================================================================

What you will learn:
- a tensor-core matmul is a loop of "bring a BLOCK_K slice of A and B into shared memory, multiply
  it into the accumulators"; everything that follows is about keeping the tensor cores fed;
- the pipeline (num_stages): with S buffers, S - 1 slices are on their way while one is multiplied,
  so S - 1 memory latencies overlap the math (Little's law); one buffer means wait, then compute;
- TMA (tensor descriptors): one thread asks the copy engine for a whole tile instead of every
  thread issuing 16-byte loads; it frees registers and issue slots, and fills edges with zeros;
- the order tiles are visited in (row-major, grouped, Hilbert curve): it does not change the bytes
  every tile asks the L2 for, but it changes how many of them the L2 must fetch from DRAM;
- persistent kernels: one program per SM walks many tiles, so the start and end of a tile (the
  pipeline filling and the output being written) can overlap the neighbouring tiles' math;
- warp specialization: producer warps only issue copies, consumer warps only issue tensor-core
  math (wgmma), with buffers between them;
- what autotuners do: try a few configurations (tile shape, stages, schedule) on the real operands,
  each checked first, and keep the fastest for the size;
- the instructions behind all this, read from the compiled kernel: `wgmma.mma_async` (tensor cores
  fed from shared memory), `cp.async.bulk.tensor` (TMA), `cp.async` (Ampere-style copies).

The experiment: one Triton kernel with every feature a switch, turned on one step at a time at a few
sizes, each step checked against float64, timed beside cuBLAS, and predicted by a model built from
this GPU's measured ceilings (tensor-core rate, L2 and DRAM bandwidth) and a published memory latency.
"""

from __future__ import annotations

import contextvars
import functools
import math
import re
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs import matmul as mm
from labs.glossary import L2_OVER_HBM, LATENCY_CYCLES, LATENCY_SOURCE
from labs.engine.gpu import Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

DTYPES = ("bf16", "fp16")
ORDERS = ("row-major", "grouped", "hilbert")
# Tile shape of every step: 128 x 256 x 64 on 8 warps (two warpgroups), the shape the matmul lab found
# closest to cuBLAS on an H200 (labs/matmul.py). Only the switches change from step to step.
BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS = 128, 256, 64, 8


# ---------------------------------------------------------------------------------------------
# The kernel: one tile of C per call of _tile_*, the schedule around it
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tile_coords(order_ptr, tile):
    """The tile order lives in a small table (tile -> (row, column) of tiles), built on the host by
    tile_order(): the same table drives the kernel and the model's count of DRAM bytes."""
    return tl.load(order_ptr + 2 * tile), tl.load(order_ptr + 2 * tile + 1)


@triton.jit
def _tile_with_pointers(a_ptr, b_ptr, c_ptr, M, N, K, tile_m, tile_n, stride_am, stride_bk, stride_cm,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        WS: tl.constexpr, UPCAST: tl.constexpr):
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of A and C
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] columns of B and C
    ks = tl.arange(0, BLOCK_K)
    # rows of A past the edge re-read row 0 (never stored): the loads stay unmasked along M
    a_ptrs = a_ptr + tl.where(rows < M, rows, 0)[:, None] * stride_am + ks[None, :]  # [BLOCK_M, BLOCK_K]
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :]  # [BLOCK_K, BLOCK_N], contiguous along N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), warp_specialize=WS):
        k_left = K - k * BLOCK_K  # the last slice may be partial: its missing products must be zero
        a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=(ks[:, None] < k_left) & (cols[None, :] < N), other=0.0)
        if UPCAST:  # Triton's CPU interpreter cannot multiply 16-bit floats
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)  # tensor cores, FP32 accumulators in registers
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _tile_with_tma(a_desc, b_desc, c_desc, K, tile_m, tile_n,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   WS: tl.constexpr, UPCAST: tl.constexpr):
    off_m, off_n = tile_m * BLOCK_M, tile_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), warp_specialize=WS):
        a = a_desc.load([off_m, k * BLOCK_K])  # the copy engine moves the whole [BLOCK_M, BLOCK_K] slice,
        b = b_desc.load([k * BLOCK_K, off_n])  # zero-filling what lies past the edges: no masks
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))  # clipped at the edges by the engine


@triton.jit
def anatomy_pointer_kernel(a_ptr, b_ptr, c_ptr, order_ptr, M, N, K, num_tiles, stride_am, stride_bk, stride_cm,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           PERSISTENT: tl.constexpr, WS: tl.constexpr, UPCAST: tl.constexpr = False):
    """Loads by pointers (cp.async on Ampere and Hopper when num_stages > 1). Triton compiles a variant for
    sizes and strides that are multiples of 16: only then can it prove 16-byte alignment and copy 16 bytes
    at a time (cp.async cannot move a single 2-byte element)."""
    if PERSISTENT:  # one program per SM walks the tiles pid, pid + programs, pid + 2 programs, ...
        for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            tile_m, tile_n = _tile_coords(order_ptr, tile)
            _tile_with_pointers(a_ptr, b_ptr, c_ptr, M, N, K, tile_m, tile_n, stride_am, stride_bk, stride_cm,
                                BLOCK_M, BLOCK_N, BLOCK_K, WS, UPCAST)
    else:  # one program per tile; the hardware starts the next program when an SM frees up
        tile_m, tile_n = _tile_coords(order_ptr, tl.program_id(0))
        _tile_with_pointers(a_ptr, b_ptr, c_ptr, M, N, K, tile_m, tile_n, stride_am, stride_bk, stride_cm,
                            BLOCK_M, BLOCK_N, BLOCK_K, WS, UPCAST)


@triton.jit(do_not_specialize=["K", "num_tiles"])
def anatomy_tma_kernel(a_desc, b_desc, c_desc, order_ptr, K, num_tiles,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PERSISTENT: tl.constexpr, WS: tl.constexpr, UPCAST: tl.constexpr = False,
                       FLATTEN: tl.constexpr = False):
    """Loads and stores by tensor descriptors: the TMA copy engine (cp.async.bulk.tensor)."""
    if PERSISTENT:
        if FLATTEN:  # the tile loop and the K loop pipelined as one: no refill between tiles
            for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True):
                tile_m, tile_n = _tile_coords(order_ptr, tile)
                _tile_with_tma(a_desc, b_desc, c_desc, K, tile_m, tile_n, BLOCK_M, BLOCK_N, BLOCK_K, WS, UPCAST)
        else:
            for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
                tile_m, tile_n = _tile_coords(order_ptr, tile)
                _tile_with_tma(a_desc, b_desc, c_desc, K, tile_m, tile_n, BLOCK_M, BLOCK_N, BLOCK_K, WS, UPCAST)
    else:
        tile_m, tile_n = _tile_coords(order_ptr, tl.program_id(0))
        _tile_with_tma(a_desc, b_desc, c_desc, K, tile_m, tile_n, BLOCK_M, BLOCK_N, BLOCK_K, WS, UPCAST)


# ---------------------------------------------------------------------------------------------
# The switches, and the steps that turn them on one at a time
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Switches:
    tma: bool  # tensor descriptors (TMA) instead of pointer loads
    stages: int  # num_stages: slices of A and B in flight in shared memory
    persistent: bool  # one program per SM walking many tiles, instead of one program per tile
    order: str  # the order tiles are visited in: row-major, grouped, hilbert
    warp_specialize: bool  # producer and consumer warps (Triton's warp_specialize on the K loop)
    block: tuple = (BLOCK_M, BLOCK_N, BLOCK_K)  # tile rows x columns x depth of one K slice
    num_warps: int = NUM_WARPS  # warps per program (4 = one warpgroup)
    flatten: bool = False  # persistent only: one flat loop over (tile, slice), so the next tile's loads
    #                        start while this tile's output is written (Triton's tl.range(flatten=True))

    @property
    def label(self) -> str:
        return (f"{'TMA' if self.tma else 'pointers'}, {self.stages} stage{'s' if self.stages > 1 else ''}, "
                f"{'persistent' if self.persistent else 'one program per tile'}, {self.order}"
                f"{', flattened' if self.flatten else ''}{', warp-specialized' if self.warp_specialize else ''}")

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
        return tuple(mm.grouped_tile(pid, tiles_m, tiles_n, group_m) for pid in range(tiles_m * tiles_n))
    if order == "hilbert":  # the curve over the enclosing power-of-two square, cells outside skipped
        side = 1 << max(0, math.ceil(math.log2(max(tiles_m, tiles_n))))
        cells = (_hilbert_d2xy(side, d) for d in range(side * side))
        return tuple((i, j) for i, j in cells if i < tiles_m and j < tiles_n)
    raise ParamError(f"order = {order!r} is not known; choose from {', '.join(ORDERS)}.")


_ORDER_TABLES: dict = {}


def order_table(order: str, tiles_m: int, tiles_n: int, device) -> torch.Tensor:
    """tile_order() as an int32 [tiles, 2] tensor on the device (built once per shape)."""
    key = (order, tiles_m, tiles_n, str(device))
    if key not in _ORDER_TABLES:
        _ORDER_TABLES[key] = torch.tensor(tile_order(order, tiles_m, tiles_n), dtype=torch.int32, device=device)
    return _ORDER_TABLES[key]


def sm_count(device) -> int:
    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 3  # the CPU interpreter: a few programs, so each walks several tiles


def prepare(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, sw: Switches,
            block: Optional[tuple] = None, num_warps: Optional[int] = None, programs: Optional[int] = None):
    """Everything a launch needs, built once (descriptors, order table, grid): returns launch().
    The tile shape and warps are the switches' unless given (the CPU tests shrink them)."""
    (m, k), n = a.shape, b.shape[1]
    bm, bn, bk = block or sw.block
    num_warps = num_warps or sw.num_warps
    tiles_m, tiles_n = triton.cdiv(m, bm), triton.cdiv(n, bn)
    tiles = tiles_m * tiles_n
    table = order_table(sw.order, tiles_m, tiles_n, a.device)
    grid = (min(tiles, programs or sm_count(a.device)),) if sw.persistent else (tiles,)
    upcast = a.device.type == "cpu"  # the interpreter's 16-bit arithmetic is not to be trusted
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PERSISTENT=sw.persistent, WS=sw.warp_specialize,
                UPCAST=upcast, num_warps=num_warps, num_stages=sw.stages)
    if sw.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        for t in (a, b, out):
            if (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16 or t.stride(1) != 1:
                raise ParamError("TMA needs row-major matrices whose rows start on 16-byte boundaries "
                                 f"(a multiple of {16 // t.element_size()} elements); got {tuple(t.shape)}.")
        args = (TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn]),
                TensorDescriptor.from_tensor(out, [bm, bn]), table, k, tiles)
        kernel = anatomy_tma_kernel
        if sw.flatten:  # only passed when on, so the other steps compile exactly as before
            meta["FLATTEN"] = True
    else:
        args = (a, b, out, table, m, n, k, tiles, a.stride(0), b.stride(0), out.stride(0))
        kernel = anatomy_pointer_kernel
    return lambda: kernel[grid](*args, **meta)


def anatomy_matmul(a: torch.Tensor, b: torch.Tensor, sw: Switches, out: Optional[torch.Tensor] = None, **kw):
    """C = A @ B (row-major A [M, K], B [K, N]) with the switches `sw`; returns (C, compiled kernel)."""
    out = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype) if out is None else out
    compiled = prepare(a, b, out, sw, **kw)()
    return out, compiled


# ---------------------------------------------------------------------------------------------
# The reference (float64)
# ---------------------------------------------------------------------------------------------
reference = mm.reference  # A @ B in float64 of the stored values


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    sizes: tuple = param((4096, 8192), "square sizes N (M = N = K)", unit="elements", min=256, max=16384)
    dtype: str = param("bf16", "input dtype (FP32 accumulation on the tensor cores)", choices=DTYPES)
    steps: tuple = param(STEP_NAMES, "steps to measure (each turns on one more feature)", choices=STEP_NAMES)


# Load-to-use latency of device memory on Hopper from published microbenchmarks, the figure the
# glossary quotes (labs/glossary.py): the model converts it to time with the clock the FMA ceiling implies.
HBM_LATENCY_CYCLES = LATENCY_CYCLES["hbm"]


def l2_tbps(target: Target) -> tuple:
    """(L2 bandwidth, where it comes from): the memory-hierarchy lab's measured plateau for this GPU,
    else the published estimate of ~2.5x the DRAM bandwidth."""
    from labs import hierarchy

    lv = hierarchy.levels(target)
    if lv.l2_tbps:
        return lv.l2_tbps, f"L2 {lv.l2_tbps:.1f} TB/s ({lv.source})"
    est = L2_OVER_HBM * target.ceilings.copy_tbps
    return est, f"L2 ~{est:.1f} TB/s (estimate: {L2_OVER_HBM}x DRAM; run the Memory hierarchy lab to measure it)"


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


def tile_config(sw: Switches) -> mm.TileConfig:
    return mm.TileConfig(*sw.block, GROUP_M, sw.num_warps, sw.stages)


def _recorded_cublas_tflops(gpu_key: str) -> dict:
    """(dtype, N) -> cuBLAS TFLOP/s from the matmul lab's committed recording of this GPU kind (read
    again whenever a recording file changes, e.g. after a --record in this process)."""
    from labs.engine.results import RECORDED_DIR

    stamp = tuple(sorted((str(p), p.stat().st_mtime_ns) for p in RECORDED_DIR.glob("*/matmul.json")))
    return _cublas_rates(gpu_key, stamp)


@functools.lru_cache(maxsize=16)
def _cublas_rates(gpu_key: str, _stamp: tuple) -> dict:
    from labs.engine.results import list_recorded

    rates: dict = {}
    for result in reversed(list_recorded("matmul")):  # oldest first, so the newest recording wins
        if result.meta.get("gpu", {}).get("key") != gpu_key:
            continue
        for r in result.rows:
            rate = r.get("measured_tflops")
            if r.get("kernel") == "cublas" and isinstance(rate, (int, float)) and rate > 0:
                rates[(r.get("dtype"), r.get("n"))] = float(rate)
    return rates


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
    recorded = _recorded_cublas_tflops(target.key).get((dtype, n)) if n else None
    if recorded:
        return recorded, f"cuBLAS at N = {n}, recorded by the Matmul lab on this GPU kind"
    ceiling = target.ceilings.matmul_tflops.get(dtype)
    return ceiling, f"the {target.ceilings.source} {dtype} matmul ceiling"


def cublas_tflops(n: int, dtype: str, target: Target) -> Optional[float]:
    """The cuBLAS row's prediction: the tensor-core rate at this N, under the roofline's bandwidth limit."""
    rate, _ = tensor_core_tflops(n, dtype, target)
    if not rate:
        return None
    intensity = 2.0 * n / (2 * timing.element_bytes(dtype) + mm.out_bytes(dtype))  # A, B, C moved once
    return min(rate, intensity * target.ceilings.copy_tbps)


def step_times(sw: Switches, dtype: str, target: Target, n: Optional[int] = None) -> dict:
    """Seconds one SM spends per K slice and per tile (start and end), by the features on.

    - math: 2 BM BN BK FLOPs at the SM's share of the tensor-core rate at this N (tensor_core_tflops);
    - operands: the slice ((BM + BN) BK elements) written into the SM's shared memory at 128 bytes per
      clock, as the Matmul lab's model does (a one-stage pointer kernel moves it twice: into registers,
      then into shared memory). The L2 is not a limit here: it serves every SM at once, and the recorded
      steps draw more from it than the Memory hierarchy lab's streaming kernel does (see l2_tbps);
    - latency: a slice arrives one memory latency after it is asked for; with S stages, S - 1 slices
      are in flight, so a slice can be consumed every latency / (S - 1) at best (Little's law), and
      with one stage the SM waits for each slice before multiplying it;
    - tile start (pipeline fill: one latency and one slice) and end (the C tile leaving through shared
      memory at the same 128 bytes per clock; the L2 takes it, and its trip to DRAM is in the DRAM term):
      paid per tile with one program per tile; a persistent kernel overlaps the end with the next tile
      (the TMA store runs on its own), and warp specialization or a flattened loop the start too.
    """
    sms = target.sm_count
    e = timing.element_bytes(dtype)
    bm, bn, bk = sw.block
    tflops, _ = tensor_core_tflops(n, dtype, target)
    rate = (tflops or 0) * 1e12 / sms
    clock = mm.clock_hz(target)
    latency = HBM_LATENCY_CYCLES / clock
    math_s = 2 * bm * bn * bk / rate if rate else float("nan")
    through_registers = not sw.tma and sw.stages == 1  # no asynchronous copy: load, then store to shared
    operand_s = (bm + bn) * bk * e * (2 if through_registers else 1) / (mm.L1_BYTES_PER_CLOCK * clock)
    if sw.stages == 1:
        slice_s = math_s + latency + operand_s  # load, wait, multiply: nothing overlaps
    else:
        slice_s = max(math_s, operand_s, (latency + operand_s) / (sw.stages - 1))
    fill = latency + operand_s
    drain = bm * bn * e / (mm.L1_BYTES_PER_CLOCK * clock)
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
    per_sm = mm.blocks_per_sm(tile_config(sw), dtype, "tma", target.compute_capability)
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
    total = max(compute_s, dram_s) + mm.FIXED_US * 1e-6
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


def predict(params: Params, target: Target) -> list[dict]:
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
# ---------------------------------------------------------------------------------------------
# (family, regular expression) counted in the PTX and in the SASS of the compiled kernel
PTX_MARKERS = (("wgmma", r"\bwgmma\.mma_async"), ("mma.sync", r"\bmma\.sync"),
               ("cp.async.bulk.tensor", r"\bcp\.async\.bulk\.tensor"), ("cp.async", r"\bcp\.async\.(?:ca|cg)"),
               ("ld.global", r"\bld\.global"), ("mbarrier", r"\bmbarrier\."))
SASS_MARKERS = (("HGMMA", r"\bHGMMA\b"), ("HMMA", r"\bHMMA\b"), ("UTMALDG", r"\bUTMALDG\b"),
                ("UTMASTG", r"\bUTMASTG\b"), ("LDGSTS", r"\bLDGSTS\b"), ("LDG", r"\bLDG\b"))


def count_instructions(text: str, markers) -> dict:
    """How many lines of an assembly listing hold each instruction family."""
    return {name: len(re.findall(pattern, text or "")) for name, pattern in markers}


def instruction_summary(compiled) -> dict:
    """Counts of the interesting instructions in the compiled kernel's PTX (and SASS, when Triton can
    disassemble it: that needs CUDA's cuobjdump), as row columns."""
    asm = getattr(compiled, "asm", None) or {}
    row = {f"ptx_{k.replace('.', '_')}": v for k, v in count_instructions(asm.get("ptx", ""), PTX_MARKERS).items()}
    try:
        sass = asm["sass"]
    except Exception:  # noqa: BLE001 - no disassembler here: PTX alone still tells the story
        sass = ""
    if sass:
        row |= {f"sass_{k}": v for k, v in count_instructions(sass, SASS_MARKERS).items()}
    return row


def ptx_excerpt(ptx: str, lines: int = 14, width: int = 120) -> str:
    """The lines around the first tensor-core instruction of the main loop (a short, readable window)."""
    src = (ptx or "").splitlines()
    hit = next((i for i, line in enumerate(src) if re.search(r"wgmma\.mma_async|mma\.sync", line)), None)
    if hit is None:
        return ""
    lo = max(0, hit - lines // 2)
    # a wgmma line lists every accumulator register (128 of them): cut long lines
    return "\n".join(line.rstrip()[:width] + (" ..." if len(line.rstrip()) > width else "")
                     for line in src[lo:lo + lines])


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
PROBE_TMA = (517, 528, 560)  # M odd, N and K multiples of 16 elements: rows start on 16-byte boundaries
PROBE_ODD = (333, 347, 351)  # all odd: only the pointer path can take it
ASM_STEP = "3 TMA"  # the step whose PTX the page shows


def check(params: Params, target: Target) -> None:
    if not mm.tma_supported(target.compute_capability):  # first: no dtype choice makes this GPU a Hopper
        raise ParamError(f"This lab is about Hopper (compute capability 9.0 or newer: TMA, wgmma); {target.name} "
                         f"is {target.compute_capability}. The model and the recorded runs are shown instead.")
    support = mm.dtype_support(target)
    if support.get(params.dtype):
        raise ParamError(support[params.dtype])
    multiple = 16 // timing.element_bytes(params.dtype)
    odd = [n for n in params.sizes if n % multiple]
    if odd and any(sw.tma for s in params.steps for sw in step_candidates(s)):
        raise ParamError(f"The TMA steps need rows that start on 16-byte boundaries: N a multiple of {multiple} in "
                         f"{params.dtype}; {', '.join(map(str, odd))} is not. Choose other sizes or only steps 1-2.")
    free = free_memory_bytes() if target.live else target.memory_bytes
    n = max(params.sizes)
    need = mm.bytes_needed(n, params.dtype)
    if need > 0.9 * free:
        raise ParamError(f"N = {n} in {params.dtype} needs {need / 1e9:.1f} GB (A, B, C and the L2 flush buffer); "
                         f"this GPU has {free / 1e9:.1f} GB free. Choose smaller sizes.")


def probe_check(step, dtype: str, device: str = "cuda", programs: Optional[int] = None, **kw) -> float:
    """One configuration (a step name or Switches) on a small odd shape (fresh inputs, output poisoned
    with NaN) against float64. A persistent kernel gets fewer programs than tiles, so that each program
    walks several tiles (the path a flattened loop must get right)."""
    sw = STEPS[step] if isinstance(step, str) else step
    m, n, k = PROBE_TMA if sw.tma else PROBE_ODD
    a = timing.random_tensor((m, k), dtype, device)
    b = timing.random_tensor((k, n), dtype, device)
    out = torch.full((m, n), float("nan"), device=a.device, dtype=a.dtype)
    if programs is None and sw.persistent:
        programs = 3
    anatomy_matmul(a, b, sw, out, programs=programs, **kw)
    return timing.check_close(out, reference(a, b), dtype, f"{sw.config_label} ({dtype}, {m}x{n}x{k})")


def _failure_note(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def usable_configs(step: str, dtype: str, device: str = "cuda", **kw) -> tuple:
    """(the step's configurations that compile here and match float64, a note for each one that does
    not). A step's own kernel giving a wrong answer raises; a candidate of the best-configuration step
    that does is never timed, and its note says so (the search goes on without it)."""
    ok, notes = [], []
    for sw in step_candidates(step):
        try:
            probe_check(sw, dtype, device, **kw)
            ok.append(sw)
        except timing.KernelMismatch as exc:
            if step != BEST_STEP:
                raise
            notes.append(f"{sw.config_label}: WRONG RESULT, excluded ({_failure_note(exc)})")
        except Exception as exc:  # noqa: BLE001 - a feature this Triton or GPU cannot compile: say so, go on
            notes.append(f"{sw.config_label}: {_failure_note(exc)}")
    return ok, notes


SELECT_WARMUP_MS, SELECT_REP_MS = 10, 40  # a short timing per candidate; the chosen one is timed again in full


def fastest_config(configs, a, b, out, dtype: str, n: int) -> tuple:
    """Check every candidate at this size, time each briefly, keep the fastest: (Switches, what was tried).
    The chosen one is then timed again from scratch, so the row's time is not the best of several draws."""
    tried = []
    for sw in configs:
        try:
            out.fill_(float("nan"))
            launch = prepare(a, b, out, sw)
            launch()
            mm.check_sampled(out, a, b, dtype, f"{sw.config_label} ({dtype}, N={n})")
            ms = timing.graph_time_ms(launch, timer=lambda fn: timing.time_ms(fn, SELECT_WARMUP_MS, SELECT_REP_MS))
        except timing.KernelMismatch as exc:  # never timed, and said so in the row
            tried.append((float("inf"), sw, "WRONG RESULT, excluded: " + _failure_note(exc)[:80]))
            continue
        except Exception as exc:  # noqa: BLE001 - out of resources at this size: not a candidate here
            tried.append((float("inf"), sw, _failure_note(exc)[:80]))
            continue
        tried.append((ms, sw, f"{timing.tflops(2.0 * n**3, ms):.0f} TFLOP/s"))
    ms, chosen, _ = min(tried, key=lambda t: t[0])
    if ms == float("inf"):
        raise RuntimeError(f"no configuration of {BEST_STEP!r} runs at N = {n}: " +
                           "; ".join(note for _, _, note in tried))
    return chosen, "; ".join(f"{sw.config_label}: {note}" for _, sw, note in tried)


def measure(params: Params, target: Target, progress):
    dtype = params.dtype
    total = len(params.sizes) * (len(params.steps) + 1)
    done = 0
    usable = {}
    for step in params.steps:  # compile and check every configuration once, on small odd shapes
        progress(done / total, f"step {step}: compiling and checking against float64")
        ok, notes = usable_configs(step, dtype)
        if ok:
            usable[step] = ok
            for note in notes:
                yield f"Step {step!r}: the configuration {note}; the others are tried."
        else:
            yield f"Step {step!r} does not run here ({'; '.join(notes)}); it is left out."
    previous_ptx = None  # a switch the compiler ignores leaves the PTX as it was: say so
    for n in params.sizes:
        a, b = mm.operands(n, n, n, dtype, kmajor_b=False)
        out = torch.full((n, n), float("nan"), device=a.device, dtype=a.dtype)
        progress(done / total, f"N = {n}: cuBLAS")
        mm.cublas_matmul(a, b, dtype, out)
        err = mm.check_sampled(out, a, b, dtype, f"cuBLAS ({dtype}, N={n})")
        cublas_ms = timing.graph_time_ms(lambda: mm.cublas_matmul(a, b, dtype, out))
        cublas_tflops = timing.tflops(2.0 * n**3, cublas_ms)
        done += 1
        yield {"step": "cuBLAS", "n": n, "dtype": dtype, "measured_ms": cublas_ms, "measured_tflops": cublas_tflops,
               "measured_pct_of_cublas": 100.0, "check_rel_error": err}
        for step in params.steps:
            progress(done / total, f"N = {n}: step {step}")
            done += 1
            if step not in usable:
                continue
            row = {}
            sw = usable[step][0]
            if step == BEST_STEP:
                try:
                    sw, tried = fastest_config(usable[step], a, b, out, dtype, n)
                except RuntimeError as exc:  # no candidate ran at this size: say so, keep the other rows
                    yield str(exc)
                    continue
                row = {"config": sw.config_label, "tried": tried}
            out.fill_(float("nan"))
            launch = prepare(a, b, out, sw)
            compiled = launch()
            err = mm.check_sampled(out, a, b, dtype, f"{step} ({dtype}, N={n})")
            ms = timing.graph_time_ms(launch)
            tflops = timing.tflops(2.0 * n**3, ms)
            tiles = math.ceil(n / sw.block[0]) * math.ceil(n / sw.block[1])
            l2_bytes = tiles * (sw.block[0] + sw.block[1]) * n * timing.element_bytes(dtype)
            if step == BEST_STEP:  # cuBLAS again, right after: the same clocks and temperature as this row
                beside_ms = timing.graph_time_ms(lambda: mm.cublas_matmul(a, b, dtype, out))
                row["measured_pct_of_cublas_beside"] = 100.0 * beside_ms / ms
            row = {"step": step, "n": n, "dtype": dtype, "measured_ms": ms, "measured_tflops": tflops,
                   "measured_pct_of_cublas": 100.0 * tflops / cublas_tflops, "check_rel_error": err,
                   "measured_l2_request_tbps": timing.tbps(l2_bytes, ms)} | row
            row |= instruction_summary(compiled)
            row |= mm._compiled_resources(compiled)
            ptx = compiled.asm.get("ptx", "")
            if n == params.sizes[0]:
                row["ptx_changed"] = previous_ptx is None or ptx != previous_ptx
                previous_ptx = ptx
            if step == ASM_STEP and n == params.sizes[0]:
                row["ptx_excerpt"] = ptx_excerpt(compiled.asm.get("ptx", ""))
            yield row
        del a, b, out
    progress(1.0, "done")


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run at the tensor-core rate of that run's own cuBLAS rows (timed beside the steps at
    each N), not at whatever the Matmul lab's newest recording holds: a new matmul recording then cannot move this
    run's predictions (scripts/repredict.py, and the pages' recorded overlays)."""
    from labs.engine.params import from_dict

    rates = {(r.get("dtype"), r.get("n")): r["measured_tflops"] for r in recording["rows"]
             if r.get("step") == "cuBLAS" and isinstance(r.get("measured_tflops"), (int, float))}
    token = _RUN_CUBLAS.set(rates)
    try:
        return predict(from_dict(Params, recording["params"]), target)
    finally:
        _RUN_CUBLAS.reset(token)


def lesson_numbers(target: Target) -> dict:
    dtype = "bf16"
    n = 8192
    base = step_times(STEPS["1 baseline"], dtype, target, n)
    piped = step_times(STEPS["2 pipeline"], dtype, target, n)
    sms = target.sm_count
    slots = sms * max(1, mm.blocks_per_sm(tile_config(STEPS["1 baseline"]), dtype, "tma",
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

    from labs import matmul_ladder  # the warp-tiled CUDA-core kernel, the step before tensor cores

    warp = {k: v for k, v in matmul_ladder.lesson_numbers(target).items() if k.startswith("warp_")}
    return warp | {
        "fma_tflops": f"{target.ceilings.fma_tflops:.1f}",
        "fp32_matmul_pct": f"{100 * (target.ceilings.matmul_tflops.get('fp32') or 0) / target.ceilings.fma_tflops:.0f}",
        "gpu": target.name, "sms": str(sms), "tile": f"{BLOCK_M}x{BLOCK_N}x{BLOCK_K}",
        "bf16_tflops": known(target.ceilings.matmul_tflops.get(dtype), ".0f"),
        "rate_4096": known(rate_4096, ".0f"), "rate_8192": known(rate_8192, ".0f"), "rate_source": rate_source,
        "l2_plateau_tbps": f"{l2_plateau:.1f}",
        "l2_needed_tbps": f"{tma_8192.get('predicted_l2_request_tbps', 0):.1f}",
        "math_us": known(base["math_s"] * us, ".2f"),
        "operand_us": known(base["operand_s"] * us, ".2f"), "latency_us": known(base["latency_s"] * us, ".2f"),
        "latency_cycles": str(HBM_LATENCY_CYCLES), "latency_source": LATENCY_SOURCE, "l2_source": l2_source,
        "slice_1_us": known(base["slice_s"] * us, ".2f"), "slice_3_us": known(piped["slice_s"] * us, ".2f"),
        "tiles_8192": str(tiles), "waves_8192": str(math.ceil(tiles / slots)),
        "dram_row_gb": f"{row_major / 1e9:.2f}", "dram_grouped_gb": f"{grouped / 1e9:.2f}",
        "dram_hilbert_gb": f"{hilbert / 1e9:.2f}",
        "l2_request_gb": f"{tiles * (BLOCK_M + BLOCK_N) * n * 2 / 1e9:.1f}",
    }


LAB = Lab(
    name="hopper",
    title="Hopper matmul anatomy",
    summary="One Triton matmul with every Hopper feature a switch (pipeline stages, TMA, tile order, persistent "
            "kernel, warp specialization), step by step against cuBLAS and a model, with the PTX of each step.",
    terms=("tma", "wgmma", "swizzling", "thread-block-cluster", "distributed-shared-memory", "warp-specialization",
           "persistent-kernel", "ptx", "sass"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("step", "n"),
    metric="tflops",
    order=22,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What share of cuBLAS will the persistent TMA kernel (step 5) reach in bf16 at N = 8192?",
                      "% of cuBLAS", {"step": "5 persistent", "n": 8192}, "pct_of_cublas"),
)
