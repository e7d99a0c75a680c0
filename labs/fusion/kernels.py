"""
Kernel fusion's kernels: every step of a computation while the data is on the chip
==================================================================================

What you will learn:
- a fused elementwise kernel: sin(x)^2 + cos(x)^2 with one read and one write per element, the sin, cos,
  squares and sum in registers (against eager PyTorch's five kernels, each a round trip to device memory);
- a chain of k multiply-adds in one kernel, with a run-time trip count: one compiled kernel for every k,
  and enough arithmetic at large k that the fused kernel becomes compute-bound;
- the online softmax: one program per row, a running max and a running sum over chunks of a long row,
  rescaled when the max grows, so the row is never re-read to find its max (FlashAttention's building block);
- the eager versions beside them: what a first draft in PyTorch looks like, and what it launches.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

try:  # the GPU's fast sin/cos (special function units); absent from Triton's CPU interpreter
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - every supported Triton has it
    libdevice = None

# Launch shape of the elementwise kernels, measured on an H200 while the lab was tuned: small programs
# (1024 elements, 4 warps: 8 per thread, two 16-byte loads) came closest to the byte floor, within 1 %.
BLOCK, NUM_WARPS = 1024, 4
UNROLL = 8  # multiply-adds per loop trip in the chain kernel


# ---------------------------------------------------------------------------------------------
# 1. The fused kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def sin2_cos2_kernel(x_ptr, y_ptr, n, b, BLOCK: tl.constexpr, FAST: tl.constexpr):
    """y = sin(x)^2 + b cos(x)^2: one read, one write; sin, cos, squares and sum stay in registers."""
    pid = tl.program_id(0).to(tl.int64)  # 64-bit offsets: tensors may hold more than 2^31 elements
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n  # the last program may run past the end
    x = tl.load(x_ptr + offs, mask=mask)  # the only read
    if FAST:  # the special function units' approximations (sin.approx / cos.approx): a few instructions
        s = libdevice.fast_sinf(x)
        c = libdevice.fast_cosf(x)
    else:  # the accurate library versions (tens of instructions each); also what the interpreter runs
        s = tl.sin(x)
        c = tl.cos(x)
    tl.store(y_ptr + offs, s * s + b * (c * c), mask=mask)  # the only write


@triton.jit
def affine_chain_kernel(x_ptr, y_ptr, n, ops, a, b, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """y = f(f(...f(x))) with f(y) = a*y + b applied `ops` times, all in registers."""
    pid = tl.program_id(0).to(tl.int64)  # 64-bit offsets, as above
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(x_ptr + offs, mask=mask)  # the only read
    for _ in range(ops // UNROLL):  # a run-time trip count: one compiled kernel serves every chain length
        for _u in tl.static_range(UNROLL):  # unrolled: the loop counter is paid once per UNROLL FMAs
            y = y * a + b  # one fused multiply-add
    for _ in range(ops % UNROLL):  # the remainder
        y = y * a + b
    tl.store(y_ptr + offs, y, mask=mask)  # the only write


@triton.jit
def online_softmax_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    """Softmax of one row per program. Short rows live in registers; long rows are read in CHUNKS
    chunks with a running max and a running sum (the online softmax), then normalised."""
    row = tl.program_id(0).to(tl.int64)  # one program per row
    x_row = x_ptr + row * stride_x  # the row's first element
    y_row = y_ptr + row * stride_y
    cols = tl.arange(0, BLOCK)  # a power of two >= the row (or the chunk) length
    if CHUNKS == 1:  # the whole row fits in registers: exactly one read and one write per element
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))  # masked lanes: exp(-inf) = 0
        tl.store(y_row + cols, e / tl.sum(e, axis=0), mask=mask)
    else:
        # Pass 1, online: a running max m and a running sum l of exp(x - m) over the chunks. When a
        # chunk raises the max, the sum so far is rescaled by exp(m_old - m_new): nothing is re-read.
        m = tl.full([], -float("inf"), tl.float32)
        l = tl.full([], 0.0, tl.float32)
        for c in range(CHUNKS):
            offs = c * BLOCK + cols
            x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf"),
                        eviction_policy="evict_last").to(tl.float32)  # ask the L2 to keep it for pass 2
            m_new = tl.maximum(m, tl.max(x, axis=0))
            l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        row_max = m
        row_sum = l
        # Pass 2: normalise. Newest chunks first, since they are the likeliest still in the L2.
        for c in range(CHUNKS):
            offs = (CHUNKS - 1 - c) * BLOCK + cols
            mask = offs < n_cols
            x = tl.load(x_row + offs, mask=mask, other=-float("inf"), eviction_policy="evict_first").to(tl.float32)
            tl.store(y_row + offs, tl.exp(x - row_max) / row_sum, mask=mask)


# The launchers: allocate (or take) the output, pick the grid, launch.
def sin2_cos2(x: torch.Tensor, b: float = 1.0, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The fused kernel for sin(x)^2 + b cos(x)^2 (b = 1 is the lesson's identity)."""
    out = torch.empty_like(x) if out is None else out
    grid = (triton.cdiv(x.numel(), BLOCK),)
    sin2_cos2_kernel[grid](x, out, x.numel(), b, BLOCK=BLOCK, FAST=x.is_cuda, num_warps=NUM_WARPS)
    return out


A, B = -1.0, 0.5  # f(y) = 0.5 - y: values stay bounded for any chain length; run-time a, b keep FMAs real
B_SCALAR = torch.tensor(B)  # b as a 0-dim CPU tensor: eager PyTorch passes it to its kernels as a scalar


def affine_chain(x: torch.Tensor, ops: int, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The fused chain: `ops` multiply-adds per element in one kernel."""
    out = torch.empty_like(x) if out is None else out
    grid = (triton.cdiv(x.numel(), BLOCK),)
    affine_chain_kernel[grid](x, out, x.numel(), ops, A, B, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=NUM_WARPS)
    return out


# Measured on an H200 while the lab was tuned (runs since dropped): a row held whole in registers,
# up to 32 values per thread, reads at 0.93-0.97x the copy bandwidth. Longer rows are streamed in
# chunks and each chunk is read twice (the second time from the L2 when the row still fits there):
# with 32768-column chunks a 65536-column row reached 0.86x, with 16384-column chunks 0.76x.
SOFTMAX_ROW_MAX = 32768  # rows up to this many columns are held in registers
SOFTMAX_CHUNK = 32768  # longer rows are streamed in chunks of this many columns
SOFTMAX_CHUNK_WARPS = 16


def softmax_config(n_cols: int, row_max: int = SOFTMAX_ROW_MAX, chunk: int = SOFTMAX_CHUNK) -> tuple:
    """(BLOCK, CHUNKS, num_warps) for rows of n_cols columns."""
    block = triton.next_power_of_2(n_cols)
    if block <= row_max:
        return block, 1, min(32, max(4, block // 512))  # 4 warps for 1024 columns ... 32 for 16384 and up
    return chunk, triton.cdiv(n_cols, chunk), SOFTMAX_CHUNK_WARPS


def online_softmax(x: torch.Tensor, out: Optional[torch.Tensor] = None, row_max: int = SOFTMAX_ROW_MAX,
                   chunk: int = SOFTMAX_CHUNK) -> torch.Tensor:
    """Softmax over the last dimension of a 2-D tensor, one kernel, one program per row."""
    rows, n_cols = x.shape
    out = torch.empty_like(x) if out is None else out
    block, chunks, warps = softmax_config(n_cols, row_max, chunk)
    online_softmax_kernel[(rows,)](x, out, n_cols, x.stride(0), out.stride(0), BLOCK=block, CHUNKS=chunks,
                                   num_warps=warps)
    return out


# ---------------------------------------------------------------------------------------------
# 2. Eager versions (what a first draft in PyTorch looks like)
# ---------------------------------------------------------------------------------------------
def sincos_eager(x: torch.Tensor) -> torch.Tensor:
    """Five kernels: sin, square, cos, square, add; each reads and writes device memory."""
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def chain_eager(x: torch.Tensor, ops: int) -> torch.Tensor:
    """`ops` kernels: each computes b + a*y (one torch.add with alpha) and writes y back."""
    y = x
    for _ in range(ops):
        y = torch.add(B_SCALAR, y, alpha=A)  # b + a*y in one kernel
    return y


def softmax_decomposed(x: torch.Tensor) -> torch.Tensor:
    """Softmax as five eager passes over the (rows, n_cols) input."""
    m = x.amax(dim=1, keepdim=True)  # pass 1: read x              -> (rows, 1)
    z = x - m  # pass 2: read x, write z
    e = torch.exp(z)  # pass 3: read z, write e
    s = e.sum(dim=1, keepdim=True)  # pass 4: read e              -> (rows, 1)
    return e / s  # pass 5: read e, write y
