"""
Coalescing: the memory system hands out 32-byte sectors, not single numbers
==========================================================================

What you will learn:
- a warp's 32 loads are served together: the hardware fetches every 32-byte sector they touch,
  so threads that read neighbouring addresses share sectors and threads that read far apart do not;
- the sector model: useful bandwidth = copy bandwidth x useful bytes / fetched bytes;
- the second limit, inside each SM: the L1/shared-memory pipeline handles one 128-byte line (or one
  access per bank) per clock, so a warp instruction spread over 32 lines or hitting one bank 32
  times costs 32 clocks even when the caches spare DRAM the traffic;
- the same work can be coalesced or not (threads walking along rows or down columns);
- the transpose ladder: naive (strided writes) -> shared-memory tiles -> tiles padded against
  bank conflicts, against `x.t().contiguous()`.

The model is the lowest of its limits: DRAM bytes (what the L2 fetches, in 64-byte granules, at the
calibrated copy bandwidth), DRAM requests (reads whose elements each need their own sector reach DRAM
as separate requests, one per 128-byte line they touch; each costs what a lone request costs in a probe
measured in the same run, and a second granule of the same line streams behind it at copy bandwidth)
and the L1 (SMs x clock x useful bytes per wavefront); the transposes add the L2's request slots. The
lecture's sector model, 32-byte sectors at copy bandwidth, is kept beside it for comparison.

Three experiments:
1. stride: y[i] = x[i * s] for s = 1, 2, 4, ... 64 floats. Writes stay contiguous; reads touch a
   new sector every 32 / (4 s) elements, until s >= 8 where every float costs its own sector.
2. walk: a square matrix summed in segments; each thread walks one row (lanes 32 rows apart: 32
   sectors per warp load) or one column (lanes side by side: 4 sectors per warp load). Same loads,
   same arithmetic, same output size.
3. transpose: the CUDA C++ ladder in labs/cuda/transpose.cu.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param
CUDA_DIR = __import__("pathlib").Path(__file__).resolve().parent  # this lab's CUDA C++ sources

SECTOR_BYTES = 32  # the unit the L1/L2 fetch in: a warp's load costs every 32-byte sector it touches
# What the L2 asks DRAM for on a miss: cudaLimitMaxL2FetchGranularity reads 64 bytes by default on
# an H200 (the transpose extension's l2_fetch_granularity reports it); assumed for every GPU here.
GRANULE_BYTES = 64
WARP = 32
ELEMENT = "fp32"  # every experiment moves 4-byte floats, so a sector holds 8 of them


# ---------------------------------------------------------------------------------------------
# Kernel 1: strided read, contiguous write
# ---------------------------------------------------------------------------------------------
@triton.jit
def strided_read_kernel(x_ptr, y_ptr, n, STRIDE: tl.constexpr, BLOCK: tl.constexpr, CACHE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # this program's BLOCK consecutive outputs
    mask = offs < n
    # lane i reads element i * STRIDE: neighbouring lanes are STRIDE * 4 bytes apart (int64: the
    # input spans up to n * STRIDE elements)
    x = tl.load(x_ptr + offs.to(tl.int64) * STRIDE, mask=mask, cache_modifier=CACHE)
    tl.store(y_ptr + offs, x, mask=mask)  # the write is always contiguous (coalesced)


STRIDE_BLOCK, STRIDE_WARPS = 4096, 8  # 16 outputs per thread: 16-byte vector loads when STRIDE = 1
STRIDE_CACHE = ""  # load cache modifier ("" = the default, cached in L1 and L2)


def strided_read(x: torch.Tensor, stride: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """y[i] = x[i * stride] for i < ceil(len(x) / stride)."""
    n = triton.cdiv(x.numel(), stride)
    out = torch.empty(n, device=x.device, dtype=x.dtype) if out is None else out
    grid = (triton.cdiv(n, STRIDE_BLOCK),)
    strided_read_kernel[grid](x, out, n, STRIDE=stride, BLOCK=STRIDE_BLOCK, CACHE=STRIDE_CACHE,
                              num_warps=STRIDE_WARPS)
    return out


# The probe: one float from each 64-byte granule, granules visited in a scrambled order. Every lane
# needs its own granule and no two neighbours share a DRAM row: it measures how many separate small
# requests DRAM serves per second, with nothing streamed.
SCATTER = tl.constexpr(2654435761)  # odd, so i -> i * SCATTER mod 2^k visits every granule exactly once


@triton.jit
def scattered_read_kernel(x_ptr, y_ptr, n, GRANULE_FLOATS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    granule = (offs * SCATTER) & (n - 1)  # n is a power of two: a bijection on [0, n)
    tl.store(y_ptr + offs, tl.load(x_ptr + granule * GRANULE_FLOATS, mask=mask), mask=mask)


def scattered_granules(span_elements: int, element_bytes: int = 4) -> int:
    """Granules the probe reads from a span: the largest power of two that fits."""
    return 1 << ((span_elements * element_bytes // GRANULE_BYTES).bit_length() - 1)


def scattered_read(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    n = scattered_granules(x.numel(), x.element_size())
    out = torch.empty(n, device=x.device, dtype=x.dtype) if out is None else out
    scattered_read_kernel[(triton.cdiv(n, STRIDE_BLOCK),)](x, out, n, GRANULE_FLOATS=GRANULE_BYTES // x.element_size(),
                                                          BLOCK=STRIDE_BLOCK, num_warps=STRIDE_WARPS)
    return out


# ---------------------------------------------------------------------------------------------
# Kernel 2: walking a matrix along rows or down columns (the lecture's figure)
# ---------------------------------------------------------------------------------------------
@triton.jit
def walk_kernel(x_ptr, out_ptr, n, SEG: tl.constexpr, ALONG_ROWS: tl.constexpr, BLOCK: tl.constexpr,
                UNROLL: tl.constexpr):
    """Each of BLOCK threads sums SEG consecutive elements of its own line (row or column) of an n x n matrix."""
    lines = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # one line per thread (BLOCK = threads)
    seg = tl.program_id(1)  # which SEG-long piece of the line
    line_ok = lines < n
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j0 in range(0, SEG, UNROLL):
        for u in tl.static_range(UNROLL):  # UNROLL independent loads in flight per thread
            k = seg * SEG + j0 + u  # position along the line
            if ALONG_ROWS:
                offs = lines.to(tl.int64) * n + k  # thread i walks row i: lanes are n floats apart
            else:
                offs = k.to(tl.int64) * n + lines  # thread i walks column i: lanes are neighbours
            k_ok = (tl.zeros([BLOCK], dtype=tl.int32) + k) < n  # the last segment may run past the line's end
            acc += tl.load(x_ptr + offs, mask=line_ok & k_ok, other=0.0)
    nseg = tl.cdiv(n, SEG)
    if ALONG_ROWS:
        tl.store(out_ptr + lines * nseg + seg, acc, mask=line_ok)  # out[row, seg]
    else:
        tl.store(out_ptr + seg * n + lines, acc, mask=line_ok)  # out[seg, column]


WALK_BLOCK, WALK_WARPS, WALK_UNROLL = 128, 4, 8  # one line per thread, exactly as in the lecture's figure
WALK_SEG = 64  # elements each thread sums: n^2 / 64 threads in all, plenty to fill the GPU


def walk(x: torch.Tensor, along_rows: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """Segment sums of a square matrix: (n, nseg) row pieces if along_rows else (nseg, n) column pieces."""
    n = x.shape[0]
    nseg = triton.cdiv(n, WALK_SEG)
    shape = (n, nseg) if along_rows else (nseg, n)
    out = torch.empty(shape, device=x.device, dtype=torch.float32) if out is None else out
    grid = (triton.cdiv(n, WALK_BLOCK), nseg)
    walk_kernel[grid](x, out, n, SEG=WALK_SEG, ALONG_ROWS=along_rows, BLOCK=WALK_BLOCK, UNROLL=WALK_UNROLL,
                      num_warps=WALK_WARPS)
    return out


# ---------------------------------------------------------------------------------------------
# Kernel 3: the transpose ladder (CUDA C++, labs/cuda/transpose.cu)
# ---------------------------------------------------------------------------------------------
TRANSPOSES = ("naive", "tiled", "tiled+padded", "torch")  # the ladder, bottom to top, and the library
TILE, TILE_ROWS = 64, 8  # tile side and warps per block of the tiled rungs (fastest padded shape on an H200)
TRANSPOSE_FUNCTIONS = ("transpose_naive", "transpose_tiled", "l2_fetch_granularity")


def transpose_ext():
    """The compiled CUDA C++ extension (built once per process; ParamError if it cannot be built)."""
    from labs.engine import cuda

    return cuda.build("roofline_transpose", CUDA_DIR / "transpose.cu", cuda.source(CUDA_DIR / "transpose.cpp"), TRANSPOSE_FUNCTIONS)


def transpose(x: torch.Tensor, variant: str, out: torch.Tensor | None = None, tile: int = TILE,
              rows_per_block: int = TILE_ROWS) -> torch.Tensor:
    """out = x.T (contiguous) by one rung of the ladder."""
    if variant == "torch":
        if out is None:
            return x.t().contiguous()
        return out.copy_(x.t())
    out = torch.empty((x.shape[1], x.shape[0]), device=x.device, dtype=x.dtype) if out is None else out
    ext = transpose_ext()
    if variant == "naive":
        ext.transpose_naive(x, out)
    elif variant in ("tiled", "tiled+padded"):
        ext.transpose_tiled(x, out, tile, rows_per_block, variant == "tiled+padded")
    else:
        raise ParamError(f"unknown transpose {variant!r}; choose from {', '.join(TRANSPOSES)}")
    return out


# ---------------------------------------------------------------------------------------------
# References (float64)
# ---------------------------------------------------------------------------------------------
def strided_reference(x: torch.Tensor, stride: int) -> torch.Tensor:
    return x.to(torch.float64)[::stride]


def walk_reference(x: torch.Tensor, along_rows: bool) -> torch.Tensor:
    n = x.shape[0]
    nseg = -(-n // WALK_SEG)
    m = x.to(torch.float64)
    m = m if along_rows else m.t()  # lines are rows of m
    padded = torch.zeros((n, nseg * WALK_SEG), dtype=torch.float64, device=x.device)
    padded[:, :n] = m
    sums = padded.reshape(n, nseg, WALK_SEG).sum(dim=2)  # (line, segment)
    return sums if along_rows else sums.t()


def transpose_reference(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64).t()


def scattered_reference(x: torch.Tensor) -> torch.Tensor:
    n = scattered_granules(x.numel(), x.element_size())
    granule = (torch.arange(n, device=x.device, dtype=torch.int64) * SCATTER.value) & (n - 1)
    return x.to(torch.float64)[granule * (GRANULE_BYTES // x.element_size())]


# ---------------------------------------------------------------------------------------------
# The model: DRAM sectors and L1 wavefronts
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    strides: tuple = param((1, 2, 4, 8, 16, 32, 64), "read strides (y[i] = x[i * stride])", unit="elements",
                           min=1, max=256)
    size_mib: int = param(2048, "input span of the strided reads (the stride-1 output is as large)", unit="MiB",
                          min=1, max=65536)
    matrix_n: int = param(16384, "side of the square fp32 matrix walked and transposed", unit="elements",
                          min=64, max=65536)
    experiments: tuple = param(("stride", "walk", "transpose"), "which experiments to run",
                               choices=("stride", "walk", "transpose"))


def fetched_bytes_per_element(stride: int, element_bytes: int = 4, fetch: int = SECTOR_BYTES) -> float:
    """Bytes a strided read fetches per useful element, in units of `fetch` bytes.

    Lanes stride * element_bytes apart: below a unit, the warp's addresses cover every unit of the
    span (stride elements fetched per useful one); at a unit or beyond, each element costs a unit.
    """
    return float(min(stride * element_bytes, fetch))


def stride_efficiency(stride: int, element_bytes: int = 4, fetch: int = SECTOR_BYTES) -> float:
    """Useful bytes / fetched bytes for read-with-stride + contiguous write (one element each way),
    when the read is fetched in units of `fetch` bytes (32-byte sectors; 64-byte DRAM granules)."""
    useful = 2 * element_bytes
    fetched = fetched_bytes_per_element(stride, element_bytes, fetch) + element_bytes
    return useful / fetched


def requests_per_element(stride: int, element_bytes: int = 4) -> float:
    """Separate DRAM requests per element read. While neighbouring elements share sectors the L2 sees
    whole lines and DRAM streams them: none counted. From 32 bytes apart every element needs its own
    sector, and every 128-byte line the reads touch becomes one separate request (an L2 request never
    spans more than one line): four elements share it at stride 8, two at stride 16, and from a line
    apart on each element pays for its own."""
    gap = stride * element_bytes
    return 0.0 if gap < SECTOR_BYTES else min(1.0, gap / LINE_BYTES)


def riding_granules_per_element(stride: int, element_bytes: int = 4) -> float:
    """Granules per element that travel inside a request already paid for. A separate request brings
    every granule its line needs: the first at the request's price, the others at streaming speed
    (one more at strides 8 and 16, where a line holds two needed granules; none from stride 32 on)."""
    requests = requests_per_element(stride, element_bytes)
    if not requests:
        return 0.0
    granules = fetched_bytes_per_element(stride, element_bytes, GRANULE_BYTES) / GRANULE_BYTES
    return max(0.0, granules - requests)


def walk_sectors_per_load(along_rows: bool, element_bytes: int = 4) -> float:
    """Sectors one warp-wide load touches: 32 lanes side by side share 32 * 4 / 32 = 4; lanes on different rows 32."""
    return float(WARP) if along_rows else WARP * element_bytes / SECTOR_BYTES


def walk_efficiency(along_rows: bool, element_bytes: int = 4) -> float:
    """Useful / fetched bytes of a walk if nothing fetched is ever reused (the lecture's burst picture)."""
    return WARP * element_bytes / (walk_sectors_per_load(along_rows, element_bytes) * SECTOR_BYTES)


# The second limit: each SM's L1/shared-memory pipeline handles one 128-byte line ("wavefront") per
# clock. A warp instruction whose 32 addresses fall in k different lines (or, in shared memory, k
# accesses to the same bank) costs k clocks. Below: per warp, the useful bytes it moves through one
# round of its instructions and the wavefronts they cost.
LINE_BYTES = 128


def stride_wavefronts(stride: int, element_bytes: int = 4) -> tuple[int, int]:
    """Warp reads 32 floats spread over min(32, stride) lines, then writes 32 floats to one line."""
    lines = min(WARP, -(-WARP * element_bytes * stride // LINE_BYTES))
    return 2 * WARP * element_bytes, lines + 1


WALK_WAVEFRONTS = {"column walk": (128, 1), "row walk": (128, WARP)}  # 32 rows = 32 lines per warp load
# naive: load 1 line, store 32 lines; tiled: load 1, shared store 1, shared column load 32 (all lanes in
# one bank), store 1; padded: the column load hits 32 banks, 1 wavefront; torch: not modelled (None).
TRANSPOSE_WAVEFRONTS = {"naive": (256, 1 + WARP), "tiled": (256, 1 + 1 + WARP + 1), "tiled+padded": (256, 4),
                        "torch": None}

# The third limit, in the L2: each L2 slice handles one request per clock and moves at most 64 bytes with it
# (NVIDIA's A100 whitepaper: 5120 bytes per clock from 80 slices); the bandwidth the memory-hierarchy lab
# measures is reached with requests that carry those 64 bytes. A request for a single scattered sector costs
# the slot all the same, and a write of part of a sector costs two (the slice reads the sector to merge the
# new bytes into it, then writes it). Per element of a transpose, in 64-byte slots: the coalesced side moves
# 4 bytes of a full line (4 / 64); naive writes each element alone into a sector (2); torch's strided copy
# reads each element from its own sector (1). The tiled rungs move whole lines both ways.
L2_SLOT_BYTES = 64
TRANSPOSE_L2_SLOTS = {"naive": 2 + 4 / L2_SLOT_BYTES, "tiled": 8 / L2_SLOT_BYTES, "tiled+padded": 8 / L2_SLOT_BYTES,
                      "torch": 1 + 4 / L2_SLOT_BYTES}


def l2_request_bound_tbps(useful_bytes: float, slots: float, target: Target, l2_tbps=None) -> tuple:
    """(useful TB/s the L2's request slots allow, where the L2 bandwidth comes from); l2_tbps: a figure
    to use instead of this GPU's (a recording's own)."""
    from labs import hopper  # the memory-hierarchy lab's measured L2 bandwidth, where there is one

    l2, source = (l2_tbps, "as recorded with the run") if l2_tbps else hopper.l2_tbps(target)
    seconds = slots * L2_SLOT_BYTES / (l2 * 1e12)
    return useful_bytes / seconds / 1e12, source


def sm_clock_mhz(target: Target):
    """The attached GPU's maximum SM clock (nvidia-smi), else the datasheet boost clock, else None."""
    if target.live:
        from labs.engine.gpu import detect

        info = detect()
        if info.available and info.sm_clock_mhz:
            return info.sm_clock_mhz
    return target.datasheet.boost_clock_mhz if target.datasheet else None


def l1_bound_tbps(cost, target: Target):
    """Useful TB/s the SMs' L1 pipelines allow: SMs x clock x useful bytes per wavefront."""
    clock = sm_clock_mhz(target)
    if cost is None or not clock:
        return None
    useful, wavefronts = cost
    return target.sm_count * clock * 1e6 * useful / wavefronts / 1e12


def _bounded(row: dict, dram_tbps: float, l1_tbps, useful_bytes: float, request_tbps=None, l2_tbps=None) -> dict:
    """The model: the lowest of the limits that apply (None: no such limit)."""
    limits = {"DRAM": dram_tbps, "DRAM requests": request_tbps, "L1": l1_tbps, "L2 requests": l2_tbps}
    bound = min((name for name, rate in limits.items() if rate is not None), key=lambda name: limits[name])
    rate = limits[bound]
    row.update({"dram_bound_tbps": dram_tbps, "l1_bound_tbps": l1_tbps, "request_bound_tbps": request_tbps,
                "l2_request_bound_tbps": l2_tbps, "bound": bound, "predicted_tbps": rate,
                "predicted_ms": useful_bytes / (rate * 1e12) * 1e3})
    return row


def stride_row(params, stride: int, target: Target, requests_per_s=None) -> dict:
    """One stride's model. Before a run only the bytes and the L1 are known; the run's probe adds
    the rate of separate DRAM requests."""
    n = stride_elements(params, stride)
    sector_eff, granule_eff = stride_efficiency(stride), stride_efficiency(stride, fetch=GRANULE_BYTES)
    requests, riding = n * requests_per_element(stride), n * riding_granules_per_element(stride)
    row = {"experiment": "stride", "variant": f"stride {stride}", "stride": stride, "useful_bytes": 8 * n,
           "fetched_bytes": n * (fetched_bytes_per_element(stride, fetch=GRANULE_BYTES) + 4),
           "sector_efficiency": sector_eff, "granule_efficiency": granule_eff,
           "sector_model_tbps": target.ceilings.copy_tbps * sector_eff, "dram_requests": requests,
           "riding_granules": riding}
    request_tbps = None
    if requests_per_s and requests:
        request_tbps = 8 * n / request_seconds(requests, riding, requests_per_s, target) / 1e12
    return _bounded(row, target.ceilings.copy_tbps * granule_eff, l1_bound_tbps(stride_wavefronts(stride), target),
                    8 * n, request_tbps)


def request_seconds(requests: float, riding: float, requests_per_s: float, target: Target) -> float:
    """Time DRAM spends on separate requests: each costs what the probe's lone-granule requests cost
    (a fixed price plus its first granule), and the granules riding along stream at copy bandwidth.
    Both rates are measured, so the balance between them follows each GPU's DRAM."""
    return requests / requests_per_s + riding * GRANULE_BYTES / (target.ceilings.copy_tbps * 1e12)


def stride_elements(params: Params, stride: int) -> int:
    return -(-params.size_mib * MiB // 4 // stride)


def predict(params: Params, target: Target, l2_tbps=None) -> list[dict]:
    bw = target.ceilings.copy_tbps
    rows = []
    if "stride" in params.experiments:
        rows += [stride_row(params, s, target) for s in params.strides]
    if "walk" in params.experiments:
        n = params.matrix_n
        for along_rows, name in ((False, "column walk"), (True, "row walk")):
            # the L1 keeps each fetched sector for the thread's next steps: DRAM moves every byte once
            row = {"experiment": "walk", "variant": name, "sectors_per_warp_load": walk_sectors_per_load(along_rows),
                   "useful_bytes": 4 * n * n, "sector_efficiency": 1.0,
                   "no_reuse_tbps": bw * walk_efficiency(along_rows)}
            rows.append(_bounded(row, bw, l1_bound_tbps(WALK_WAVEFRONTS[name], target), 4 * n * n))
    if "transpose" in params.experiments:
        n = params.matrix_n
        for variant in TRANSPOSES:  # every rung moves exactly what a copy moves through DRAM
            row = {"experiment": "transpose", "variant": variant, "useful_bytes": 8 * n * n, "sector_efficiency": 1.0,
                   "l2_slots_per_element": TRANSPOSE_L2_SLOTS[variant]}
            l2, row["l2_source"] = l2_request_bound_tbps(8 * n * n, TRANSPOSE_L2_SLOTS[variant] * n * n, target,
                                                         l2_tbps)
            row["l2_tbps"] = l2_tbps or _l2(target)  # the L2 bandwidth used (kept, so a re-prediction uses it too)
            rows.append(_bounded(row, bw, l1_bound_tbps(TRANSPOSE_WAVEFRONTS[variant], target), 8 * n * n,
                                 l2_tbps=l2))
    return rows


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
CHECK_SPAN = 1_000_003  # odd sizes: the last program is partly masked
CHECK_MATRIX = (1001, 1003)  # a rectangle not a multiple of any tile


def memory_needed(params: Params) -> int:
    need = 0
    if "stride" in params.experiments:
        need = max(need, 2 * params.size_mib * MiB)  # input span + the stride-1 output
    if {"walk", "transpose"} & set(params.experiments):
        need = max(need, 2 * 4 * params.matrix_n ** 2)  # matrix + its transpose
    return need


def check(params: Params, target: Target) -> None:
    need = memory_needed(params)
    free = free_memory_bytes() if target.live else target.memory_bytes
    if need > 0.9 * free:
        raise ParamError(f"This run needs {need / 1e9:.1f} GB of GPU memory (input and output); this GPU has "
                         f"{free / 1e9:.1f} GB free. Lower size_mib (strided reads) or matrix_n (walk, transpose).")
    if "transpose" in params.experiments and target.live:
        from labs.engine import cuda

        reason = cuda.why_unavailable()
        if reason:
            raise ParamError(f"{reason} Run without the transpose: experiments=stride,walk.")


def _timed_row(experiment: str, variant: str, useful_bytes: int, ms: float, err: float, **extra) -> dict:
    return {"experiment": experiment, "variant": variant, **extra, "measured_ms": ms,
            "measured_tbps": timing.tbps(useful_bytes, ms), "check_rel_error": err}


def measure_scattered(x: torch.Tensor, probe: torch.Tensor) -> dict:
    """The probe's row: separate one-granule DRAM requests served per second."""
    out = torch.full((scattered_granules(probe.numel()),), float("nan"), device=probe.device)
    err = timing.check_close(scattered_read(probe, out), scattered_reference(probe), ELEMENT, "scattered read")
    y = torch.empty(scattered_granules(x.numel()), device=x.device)
    ms = timing.time_ms(lambda: scattered_read(x, y))
    return _timed_row("probe", "scattered granules", 8 * y.numel(), ms, err, dram_requests=y.numel(),
                      requests_per_s=y.numel() / (ms * 1e-3), granule_bytes=GRANULE_BYTES)


def measure_strides(params: Params, target: Target, progress, done: int, total: int):
    probe = timing.random_tensor((CHECK_SPAN,), ELEMENT)
    x = timing.random_tensor((params.size_mib * MiB // 4,), ELEMENT)
    progress(done / total, "probe: one float from each 64-byte granule, in a scrambled order")
    scattered = measure_scattered(x, probe)
    yield scattered
    for s in params.strides:
        progress(done / total, f"stride {s}: checking against float64")
        out = torch.full((triton.cdiv(probe.numel(), s),), float("nan"), device=probe.device)
        strided_read(probe, s, out)
        err = timing.check_close(out, strided_reference(probe, s), ELEMENT, f"strided read (stride {s})")
        progress(done / total, f"stride {s}: timing")
        y = torch.empty(triton.cdiv(x.numel(), s), device=x.device)
        ms = timing.time_ms(lambda: strided_read(x, s, y))
        done += 1
        model = stride_row(params, s, target, scattered["requests_per_s"])  # the model, now with the request rate
        yield {**model, **_timed_row("stride", f"stride {s}", 8 * y.numel(), ms, err, stride=s)}
        del y
    del x


def measure_walks(params: Params, target: Target, progress, done: int, total: int):
    probe = timing.random_tensor((CHECK_MATRIX[0],) * 2, ELEMENT)
    x = timing.random_tensor((params.matrix_n,) * 2, ELEMENT)
    for along_rows, name in ((False, "column walk"), (True, "row walk")):
        progress(done / total, f"{name}: checking against float64")
        ref = walk_reference(probe, along_rows)
        out = torch.full(ref.shape, float("nan"), device=probe.device)
        walk(probe, along_rows, out)
        err = timing.check_close(out, ref, ELEMENT, name)
        progress(done / total, f"{name}: timing")
        y = walk(x, along_rows)
        ms = timing.time_ms(lambda: walk(x, along_rows, y))
        done += 1
        yield _timed_row("walk", name, 4 * x.numel(), ms, err, sectors_per_warp_load=walk_sectors_per_load(along_rows))


def measure_transposes(params: Params, target: Target, progress, done: int, total: int):
    probe = timing.random_tensor(CHECK_MATRIX, ELEMENT)
    x = timing.random_tensor((params.matrix_n,) * 2, ELEMENT)
    y = torch.empty_like(x)
    for i, variant in enumerate(TRANSPOSES):
        note = " (compiling the CUDA C++ kernels the first time: ~30 s)" if i == 0 else ""
        progress(done / total, f"transpose, {variant}: checking against float64{note}")
        out = torch.full((probe.shape[1], probe.shape[0]), float("nan"), device=probe.device)
        transpose(probe, variant, out)
        err = timing.check_close(out, transpose_reference(probe), ELEMENT, f"transpose ({variant})")
        progress(done / total, f"transpose, {variant}: timing")
        ms = timing.time_ms(lambda: transpose(x, variant, y))
        done += 1
        yield _timed_row("transpose", variant, 8 * x.numel(), ms, err)


def measure(params: Params, target: Target, progress):
    counts = {"stride": len(params.strides), "walk": 2, "transpose": len(TRANSPOSES)}
    total = sum(counts[e] for e in params.experiments)
    done = 0
    for experiment, fn in (("stride", measure_strides), ("walk", measure_walks), ("transpose", measure_transposes)):
        if experiment in params.experiments:
            yield from fn(params, target, progress, done, total)
            done += counts[experiment]
            torch.cuda.empty_cache()
    progress(1.0, "done")


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run with the DRAM request rate its own probe measured (scripts/repredict.py)."""
    from labs.engine.params import from_dict

    params = from_dict(Params, recording["params"])
    rate = next((r.get("requests_per_s") for r in recording["rows"] if r.get("experiment") == "probe"), None)
    l2 = next((r.get("l2_tbps") for r in recording["rows"] if r.get("l2_tbps")), None)  # the run's L2 figure
    return [stride_row(params, r["stride"], target, rate) if r["experiment"] == "stride" else r
            for r in predict(params, target, l2)]


# ---------------------------------------------------------------------------------------------
# Summaries for the page and the lesson
# ---------------------------------------------------------------------------------------------
def ladder_gains(rows: list[dict]) -> list[dict]:
    """Each transpose rung's measured bandwidth, its gain over the rung below, and its share of copy bandwidth."""
    by_variant = {r["variant"]: r for r in rows if r.get("experiment") == "transpose" and r.get("measured_tbps")}
    out, below = [], None
    for variant in TRANSPOSES:
        row = by_variant.get(variant)
        if row is None:
            continue
        tbps = row["measured_tbps"]
        gain = tbps / below if below and variant != "torch" else None
        out.append({"variant": variant, "measured_tbps": tbps, "gain_over_previous": gain,
                    "fraction_of_copy": tbps / row["dram_bound_tbps"] if row.get("dram_bound_tbps") else None})
        if variant != "torch":
            below = tbps
    return out


def lesson_numbers(target: Target) -> dict:
    bw = target.ceilings.copy_tbps
    return {
        "gpu": target.name,
        "bandwidth_tbps": f"{bw:.2f}",
        "ceilings_source": target.describe_ceilings(),
        "stride2_tbps": f"{bw * stride_efficiency(2):.2f}",
        "stride8_tbps": f"{bw * stride_efficiency(8):.2f}",
        "stride8_pct": f"{100 * stride_efficiency(8):.0f}",
        "row_walk_no_reuse_tbps": f"{bw * walk_efficiency(True):.2f}",
        "row_walk_l1_tbps": _fmt(l1_bound_tbps(WALK_WAVEFRONTS["row walk"], target)),
        "tiled_l1_tbps": _fmt(l1_bound_tbps(TRANSPOSE_WAVEFRONTS["tiled"], target)),
        "naive_l1_tbps": _fmt(l1_bound_tbps(TRANSPOSE_WAVEFRONTS["naive"], target)),
        "l2_tbps": f"{_l2(target):.1f}",
        "naive_l2_tbps": f"{l2_request_bound_tbps(8, TRANSPOSE_L2_SLOTS['naive'], target)[0]:.2f}",
        "torch_l2_tbps": f"{l2_request_bound_tbps(8, TRANSPOSE_L2_SLOTS['torch'], target)[0]:.2f}",
        "sm_count": str(target.sm_count),
        "clock_mhz": str(sm_clock_mhz(target) or "?"),
    }


def _l2(target: Target) -> float:
    from labs import hopper

    return hopper.l2_tbps(target)[0]


def _fmt(x) -> str:
    return f"{x:.2f} TB/s" if x is not None else "an unknown rate (no clock figure for this GPU)"


from labs.coalescing.counters import COUNTERS  # noqa: E402  (how ncu counts this lab)

LAB = Lab(
    name="coalescing",
    title="Coalescing",
    summary="Read with a stride, walk a matrix along rows or down columns, and climb the transpose ladder: "
            "bandwidth is decided by the 32-byte sectors a warp touches.",
    terms=("coalescing", "memory-sector", "warp", "global-memory", "shared-memory", "bank-conflict", "transpose",
           "memory-bandwidth", "l2-cache", "tiling"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("experiment", "variant"),
    metric="tbps",
    order=20,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What useful bandwidth will a read with stride 8 (one float per 32-byte sector) reach?",
                      "TB/s", {"experiment": "stride", "variant": "stride 8"}, "tbps"),
    counters=COUNTERS,
)
