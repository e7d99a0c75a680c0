"""
Coalescing's kernels: the same bytes, read so that a warp touches few sectors or many
=====================================================================================

What you will learn:
- a strided read: lane i loads element i * STRIDE, so neighbouring lanes sit STRIDE * 4 bytes apart and a
  warp's 32 loads touch 32 / (8 / STRIDE) sectors, until from STRIDE = 8 every float costs its own sector;
- a probe: one float from each 64-byte granule, in a scrambled order, to time lone DRAM requests;
- a walk of a matrix: the same loads, along rows (lanes 32 rows apart) or down columns (lanes side by side);
- the transpose ladder in CUDA C++ (transpose.cu beside this file): naive (strided writes), shared-memory
  tiles, tiles padded against bank conflicts, beside torch's `x.t().contiguous()`.
labs/coalescing/model.py counts the sectors, requests and wavefronts each of these costs.
"""

from __future__ import annotations

from pathlib import Path

import torch
import triton
import triton.language as tl

from labs.coalescing.model import GRANULE_BYTES, TRANSPOSES
from labs.engine import cuda
from labs.engine.params import ParamError

CUDA_DIR = Path(__file__).resolve().parent  # this lab's CUDA C++ sources (transpose.cu, transpose.cpp)


# ---------------------------------------------------------------------------------------------
# Kernel 1: strided read, contiguous write
# ---------------------------------------------------------------------------------------------
@triton.jit
def strided_read_kernel(x_ptr, y_ptr, n, STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # this program's BLOCK consecutive outputs
    mask = offs < n  # the last program is partial
    # lane i reads element i * STRIDE: neighbouring lanes are STRIDE * 4 bytes apart (int64: the
    # input spans up to n * STRIDE elements)
    x = tl.load(x_ptr + offs.to(tl.int64) * STRIDE, mask=mask)  # cached in L1 and L2: the sector is the unit
    tl.store(y_ptr + offs, x, mask=mask)  # the write is always contiguous (coalesced)


STRIDE_BLOCK, STRIDE_WARPS = 4096, 8  # 16 outputs per thread: 16-byte vector loads when STRIDE = 1


def strided_read(x: torch.Tensor, stride: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """y[i] = x[i * stride] for i < ceil(len(x) / stride)."""
    n = triton.cdiv(x.numel(), stride)
    out = torch.empty(n, device=x.device, dtype=x.dtype) if out is None else out
    grid = (triton.cdiv(n, STRIDE_BLOCK),)
    strided_read_kernel[grid](x, out, n, STRIDE=stride, BLOCK=STRIDE_BLOCK, num_warps=STRIDE_WARPS)
    return out


# The probe: one float from each 64-byte granule, granules visited in a scrambled order. Every lane
# needs its own granule and no two neighbours share a DRAM row: it measures how many separate small
# requests DRAM serves per second, with nothing streamed.
SCATTER = tl.constexpr(2654435761)  # odd, so i -> i * SCATTER mod 2^k visits every granule exactly once


@triton.jit
def scattered_read_kernel(x_ptr, y_ptr, n, GRANULE_FLOATS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # one output per granule read
    mask = offs < n  # the last program is partial
    granule = (offs * SCATTER) & (n - 1)  # n is a power of two: a bijection on [0, n)
    tl.store(y_ptr + offs, tl.load(x_ptr + granule * GRANULE_FLOATS, mask=mask), mask=mask)


def scattered_granules(span_elements: int, element_bytes: int = 4) -> int:
    """Granules the probe reads from a span: the largest power of two that fits."""
    return 1 << ((span_elements * element_bytes // GRANULE_BYTES).bit_length() - 1)


def scattered_read(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """y[i] = the first float of granule (i * SCATTER mod n), for the n granules scattered_granules() counts."""
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
# Kernel 3: the transpose ladder (CUDA C++, transpose.cu)
# ---------------------------------------------------------------------------------------------
TILE, TILE_ROWS = 64, 8  # tile side and warps per block of the tiled rungs (fastest padded shape on an H200)
TRANSPOSE_FUNCTIONS = ("transpose_naive", "transpose_tiled")


def transpose_ext():
    """The compiled CUDA C++ extension (built once per process; ParamError if it cannot be built)."""
    return cuda.build("roofline_transpose", CUDA_DIR / "transpose.cu", cuda.source(CUDA_DIR / "transpose.cpp"),
                      TRANSPOSE_FUNCTIONS)


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
