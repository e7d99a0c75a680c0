"""
Matmul: why throughput waves with the matrix size
=================================================

What you will learn:
- a tiled matmul kernel: each program computes one BLOCK_M x BLOCK_N tile of C, walking K in steps
  of BLOCK_K, with tensor cores doing the multiply-adds (fp16, bf16, tf32, fp8);
- tile quantization: ceil(N / BLOCK) tiles per side, so the edge tiles are partly padding;
- wave quantization: the tiles run in waves of (SMs x blocks per SM); one tile past a full wave costs
  a whole extra wave;
- the row tail: when the big tiles leave a last wave mostly empty, the rows that wave would cover go to a
  second launch of small tiles, started early (programmatic dependent launch) so that they fill the idle SMs;
- alignment: when a row of the matrix is not a multiple of 16 bytes, neither the TMA copy engine nor
  16-byte vector loads can be used, and the kernel falls back to narrow loads;
- the wavy plot of the lecture: TFLOP/s against N, points coloured by the largest power of two dividing
  N, for cuBLAS and for our Triton kernel, with the model's curve over the measured points.

The experiment: square matmuls C = A @ B (M = N = K) for a sweep of sizes from 256 to 8192, with N/N+1
pairs such as 2048/2049. Each kernel is checked against float64 before it is timed.
The ladder of hand-written kernels (naive -> shared-memory tiled -> Triton -> cuBLAS) lives in
labs/matmul_ladder.py and reuses the Triton kernel and the model defined here.
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine.gpu import KERNEL_LAUNCH_US, compute_capability_tuple, SM_SHAPES, SmShape, Target, free_memory_bytes, sm_shape  # noqa: F401
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
KERNELS = ("cublas", "triton")


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tile_of(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Launch order -> (tile row, tile column). Programs are launched in order of pid, so consecutive
    pids run at the same time: walking GROUP_M tile rows column by column makes them share row
    panels of A and column panels of B, which then come from the L2 cache instead of memory."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n  # programs in one band of GROUP_M tile rows
    first_m = (pid // per_group) * GROUP_M
    rows_here = tl.minimum(tiles_m - first_m, GROUP_M)  # the last band may be thinner
    tile_m = first_m + (pid % per_group) % rows_here
    tile_n = (pid % per_group) // rows_here
    return tile_m, tile_n


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr, FP32_MODE: tl.constexpr,
                  UPCAST: tl.constexpr = False, ALIGN: tl.constexpr = 1):
    """Pointer path: any strides. Triton knows an integer argument is a multiple of 16 when it is one
    (it compiles a variant for that case); only then can it prove that a row starts on a 16-byte
    boundary and load 16 bytes at a time. Otherwise it loads element by element, unless the launcher
    knows better: ALIGN > 1 promises that the row strides and K are multiples of ALIGN elements (N = 2056:
    8 bf16 elements, 16 bytes), and the kernel passes that on to Triton with tl.multiple_of."""
    tile_m, tile_n = _tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of C (and A) of this tile
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] columns of C (and B)
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    # Rows of A past the edge read row 0 instead: no mask along M (those results are never stored).
    # A row of A is contiguous along K, so this keeps the loads contiguous.
    a_rows = tl.where(rows < M, rows, 0) * stride_am  # [BLOCK_M] where each row of A starts
    if ALIGN > 1:
        a_rows = tl.multiple_of(a_rows, ALIGN)
    a_ptrs = a_ptr + a_rows[:, None] + ks[None, :] * stride_ak
    if B_KMAJOR:  # B stored as [N, K]: contiguous along K, so columns past the edge can read column 0
        b_cols = tl.where(cols < N, cols, 0) * stride_bn
        if ALIGN > 1:
            b_cols = tl.multiple_of(b_cols, ALIGN)
        b_ptrs = b_ptr + ks[:, None] * stride_bk + b_cols[None, :]
    else:  # B row-major: contiguous along N; keep it so (vector loads) and mask the columns past the edge
        b_rows = ks * stride_bk
        if ALIGN > 1:
            b_rows = tl.multiple_of(b_rows, ALIGN)
        b_ptrs = b_ptr + b_rows[:, None] + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # FP32 accumulators, in registers
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K  # the last step may be partial: its missing products must be zero
        col_ok = cols[None, :] < N
        if ALIGN > 1:  # masks constant over ALIGN elements: k_left and the columns left are multiples of ALIGN
            k_left = tl.multiple_of(k_left, ALIGN)
            col_ok = tl.arange(0, BLOCK_N)[None, :] < tl.multiple_of(N - tile_n * BLOCK_N, ALIGN)
        a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)  # [BLOCK_M, BLOCK_K]
        if B_KMAJOR:
            b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)  # [BLOCK_K, BLOCK_N]
        else:
            b = tl.load(b_ptrs, mask=(ks[:, None] < k_left) & col_ok, other=0.0)
        if UPCAST:  # only under Triton's CPU interpreter, whose bf16 arithmetic is broken
            a, b = a.to(tl.float32), b.to(tl.float32)
        if FP32_MODE == 1:  # fp32: true FP32 products (CUDA cores)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        elif FP32_MODE == 2:  # tf32: inputs rounded to 10-bit mantissas, tensor cores
            acc = tl.dot(a, b, acc, input_precision="tf32")
        else:  # fp16 / bf16 / fp8: tensor cores, FP32 accumulation
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_rows = rows * stride_cm
    if ALIGN > 1:
        c_rows = tl.multiple_of(c_rows, ALIGN)
    c_ptrs = c_ptr + c_rows[:, None] + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


# The same kernel with the strides along rows left unspecialized (an experiment, LANES below): Triton then cannot
# see that a row's elements are contiguous, so instead of giving each lane 16 consecutive bytes and loading them
# one element at a time (lanes 16 bytes apart: 4 L1 wavefronts per warp instruction), it gives each lane one
# element and lines the warp's 32 lanes up along the row (64 contiguous bytes per instruction).
# Measured on an H100 (scripts/matmul_gpu.py lanes; checked against float64 on odd shapes): about 3x slower at odd N
# (22 against 62 TFLOP/s at N = 2049, 30 against 94 at 1793, in 5 tile shapes): each element's address then takes its
# own multiply by the unknown stride, and the kernel spills 46-270 registers where the plain one spills 80. So off.
matmul_lanes_kernel = triton.jit(do_not_specialize=["stride_ak", "stride_bn", "stride_cn"])(matmul_kernel.fn)
LANES = False  # rows that allow no wider loads than one element take matmul_lanes_kernel


@triton.jit(do_not_specialize=["M", "N", "K"])
def matmul_tma_kernel(a_desc, b_desc, c_desc, M, N, K,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr, FP32_MODE: tl.constexpr,
                      UPCAST: tl.constexpr = False, LAUNCH_DEPENDENTS: tl.constexpr = False,
                      WAIT_PRIMARY: tl.constexpr = 0):
    """TMA path: the copy engine moves whole tiles between memory and shared memory, and fills the
    parts of a tile outside the matrix with zeros (so no masks at all). It needs every row to start
    on a 16-byte boundary. LAUNCH_DEPENDENTS: let the next kernel in the stream (launched with programmatic
    dependent launch) start its programs on SMs this one frees, once all of this one's programs have started.
    WAIT_PRIMARY (for the kernel so launched): before it ends, wait for the kernel before it to finish, so that
    whatever comes next in the stream finds both done (PTX's griddepcontrol.wait; CUDA does not promise that
    work queued after a dependent launch also waits for the kernel the dependent overlapped). 1: every program
    waits; 2: only the last program waits (a kernel ends when all its programs have, so that is enough, and the
    others free their SM for the next program at once instead of idling on it until the earlier kernel is done)."""
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    tile_m, tile_n = _tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = tile_m * BLOCK_M
    off_n = tile_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K])  # [BLOCK_M, BLOCK_K]
        if B_KMAJOR:  # B stored transposed (N x K): load [BLOCK_N, BLOCK_K], use its transpose
            b = b_desc.load([off_n, k * BLOCK_K]).T
        else:
            b = b_desc.load([k * BLOCK_K, off_n])  # [BLOCK_K, BLOCK_N]
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        if FP32_MODE == 1:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        elif FP32_MODE == 2:
            acc = tl.dot(a, b, acc, input_precision="tf32")
        else:
            acc = tl.dot(a, b, acc)
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))  # the engine clips the tile at the edges
    if WAIT_PRIMARY == 1:
        tl.extra.cuda.gdc_wait()
    elif WAIT_PRIMARY == 2:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tl.extra.cuda.gdc_wait()


@triton.jit
def _wait_for_primary(WAIT_PRIMARY: tl.constexpr):
    """The end of a kernel launched with programmatic dependent launch (see matmul_tma_kernel's WAIT_PRIMARY: 1 every
    program waits for the kernel before it, 2 only the last one). matmul_tma_kernel spells this out itself: it is the
    recorded default kernel, left as it was recorded."""
    if WAIT_PRIMARY == 1:
        tl.extra.cuda.gdc_wait()
    elif WAIT_PRIMARY == 2:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tl.extra.cuda.gdc_wait()


@triton.jit(do_not_specialize=["M", "N", "K"])
def matmul_band_kernel(a_desc, b_desc, c_desc, ax_desc, bx_desc, cx_desc, M, N, K,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                       EXTRA: tl.constexpr, EXTRA_ROWS: tl.constexpr, TRANS: tl.constexpr = True,
                       UPCAST: tl.constexpr = False, LAUNCH_DEPENDENTS: tl.constexpr = False,
                       WAIT_PRIMARY: tl.constexpr = 0):
    """A band of whole tiles (the last tile row or column of the interior) that also computes the thin edge beside
    it from the tiles it loads anyway. EXTRA_ROWS: each program adds the EXTRA rows of C below the band in its
    columns, from a tile of those rows of A (ax_desc) and the B tile already in shared memory; TRANS computes that
    as (B^T A_x^T) so that the tensor-core instruction's long side is the tile's BLOCK_N, not EXTRA. Otherwise
    each program adds the EXTRA columns right of the band in its rows, from the A tile it has and a thin tile of
    B (bx_desc). The edge then costs no second pass over A or B. Early start as in matmul_tma_kernel."""
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    tile_m, tile_n = _tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = tile_m * BLOCK_M
    off_n = tile_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if EXTRA_ROWS:
        accx = tl.zeros((BLOCK_N, EXTRA) if TRANS else (EXTRA, BLOCK_N), dtype=tl.float32)
    else:
        accx = tl.zeros((BLOCK_M, EXTRA), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K])  # [BLOCK_M, BLOCK_K]
        b = b_desc.load([k * BLOCK_K, off_n])  # [BLOCK_K, BLOCK_N]
        if EXTRA_ROWS:
            x = ax_desc.load([0, k * BLOCK_K])  # [EXTRA, BLOCK_K]: the rows of A below the band
        else:
            x = bx_desc.load([k * BLOCK_K, 0])  # [BLOCK_K, EXTRA]: the columns of B right of the band
        if UPCAST:
            a, b, x = a.to(tl.float32), b.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(a, b, acc)
        if EXTRA_ROWS:
            if TRANS:
                accx = tl.dot(b.T, x.T, accx)  # [BLOCK_N, EXTRA]
            else:
                accx = tl.dot(x, b, accx)  # [EXTRA, BLOCK_N]
        else:
            accx = tl.dot(a, x, accx)  # [BLOCK_M, EXTRA]
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
    if EXTRA_ROWS:
        cx_desc.store([0, off_n], (accx.T if TRANS else accx).to(cx_desc.dtype))  # clipped to the rows that exist
    else:
        cx_desc.store([off_m, 0], accx.to(cx_desc.dtype))
    _wait_for_primary(WAIT_PRIMARY)


@triton.jit(do_not_specialize=["M", "N", "K", "ROWS", "COLS"])
def matmul_spread_kernel(a_desc, b_desc, c_desc, ae_desc, be_desc, cb_desc, cr_desc, M, N, K, ROWS, COLS,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                         EDGE: tl.constexpr, UPCAST: tl.constexpr = False, LAUNCH_DEPENDENTS: tl.constexpr = False,
                         WAIT_PRIMARY: tl.constexpr = 0):
    """Interior + edge in one launch, the edge spread over every program: each program computes one whole tile of
    the interior ([0, ROWS) x [0, COLS)) and, in the same K loop, one EDGE-wide piece of each thin strip: the bottom
    strip's columns [pid EDGE, pid EDGE + EDGE) (rows ROWS..M) and the right strip's rows [pid EDGE, pid EDGE + EDGE)
    (columns COLS..N). Each piece adds two small loads and a small product per K step, so the strips' reads of A and
    B ride along the interior's instead of following it. The piece outputs go through descriptors over C's bottom
    rows (cb_desc) and over its interior rows (cr_desc), so the copy engine clips them where the strips end. Early
    start as in matmul_tma_kernel (a corner no piece covers is launched first, see _spread_matmul)."""
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    tile_m, tile_n = _tile_of(pid, ROWS, COLS, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = tile_m * BLOCK_M
    off_n = tile_n * BLOCK_N
    edge_at = pid * EDGE  # this program's columns of the bottom strip, and its rows of the right strip
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_bottom = tl.zeros((EDGE, EDGE), dtype=tl.float32)
    acc_right = tl.zeros((EDGE, EDGE), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K
        a = a_desc.load([off_m, kk])  # [BLOCK_M, BLOCK_K]: the interior tile's operands
        b = b_desc.load([kk, off_n])  # [BLOCK_K, BLOCK_N]
        a_below = ae_desc.load([ROWS, kk])  # [EDGE, BLOCK_K]: the rows under the interior (zeros past M)
        b_mine = be_desc.load([kk, edge_at])  # [BLOCK_K, EDGE]: this program's columns of B
        a_mine = ae_desc.load([edge_at, kk])  # [EDGE, BLOCK_K]: this program's rows of A
        b_right = be_desc.load([kk, COLS])  # [BLOCK_K, EDGE]: the columns right of the interior (zeros past N)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
            a_below, b_mine, a_mine, b_right = (a_below.to(tl.float32), b_mine.to(tl.float32),
                                                a_mine.to(tl.float32), b_right.to(tl.float32))
        acc = tl.dot(a, b, acc)
        acc_bottom = tl.dot(a_below, b_mine, acc_bottom)
        acc_right = tl.dot(a_mine, b_right, acc_right)
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
    cb_desc.store([0, edge_at], acc_bottom.to(cb_desc.dtype))  # C[ROWS:], clipped at M rows and N columns
    cr_desc.store([edge_at, 0], acc_right.to(cr_desc.dtype))  # C[:ROWS, COLS:], clipped at ROWS and N
    _wait_for_primary(WAIT_PRIMARY)


# ---------------------------------------------------------------------------------------------
# Composite tiles: a tile whose sides are sums of power-of-two pieces (192 = 128 + 64)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _piece_dot(a, b, acc, FP32_MODE: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b on the tensor cores (or, for FP32_MODE 1, in true FP32), as in matmul_tma_kernel."""
    if UPCAST:
        a, b = a.to(tl.float32), b.to(tl.float32)
    if FP32_MODE == 1:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    elif FP32_MODE == 2:
        acc = tl.dot(a, b, acc, input_precision="tf32")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _piece_b(b_desc, k, off_n, B_KMAJOR: tl.constexpr):
    """One column piece of B for K step k: [BLOCK_K, piece] (B k-major: the transpose of a [piece, BLOCK_K] load)."""
    if B_KMAJOR:
        return b_desc.load([off_n, k]).T
    else:
        return b_desc.load([k, off_n])


@triton.jit(do_not_specialize=["M", "N", "K"])
def matmul_pieces_kernel(a0_desc, a1_desc, a2_desc, b0_desc, b1_desc, c00_desc, c01_desc, c10_desc, c11_desc,
                         c20_desc, c21_desc, M, N, K, one,
                         BM0: tl.constexpr, BM1: tl.constexpr, BM2: tl.constexpr, BN0: tl.constexpr,
                         BN1: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr,
                         FP32_MODE: tl.constexpr, UPCAST: tl.constexpr = False,
                         LAUNCH_DEPENDENTS: tl.constexpr = False, WAIT_PRIMARY: tl.constexpr = 0,
                         A_REGS: tl.constexpr = 0):
    """TMA path with a composite tile: (BM0 + BM1 + BM2) rows x (BN0 + BN1) columns of C, each side a sum of
    power-of-two pieces (a piece of 0 is absent), because a Triton block must be a power of two but a tile need not
    be: 192 x 192 tiles make 11 x 11 = 121 tiles at N = 2056, one wave on 132 SMs, where 128 x 256 makes 153. Each
    K step loads every row piece of A and every column piece of B once and multiplies each pair into its own FP32
    accumulator, so a piece of A is shared by all the column pieces and a piece of B by all the row pieces, as one
    big tile's loads would be. The copy engine zero-fills pieces past the matrix edge and clips their stores.
    A_REGS (a variant): 1 multiplies the row pieces after the first, 2 every row piece, by `one` (1.0, exact), so that
    the compiler keeps them in registers and the tensor cores read only B from shared memory for those products
    (otherwise each instruction re-reads its piece of A there, which costs most where the column piece is narrow).
    Measured, not chosen by default: slower than the lab's schedules except at N = 2056 (see PIECES_A_REGS below)."""
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    tile_m, tile_n = _tile_of(tl.program_id(0), M, N, BM0 + BM1 + BM2, BN0 + BN1, GROUP_M)
    m0 = tile_m * (BM0 + BM1 + BM2)  # first row of each row piece: m0, m0 + BM0, m0 + BM0 + BM1
    n0 = tile_n * (BN0 + BN1)  # first column of each column piece: n0, n0 + BN0
    acc00 = tl.zeros((BM0, BN0), dtype=tl.float32)
    if BN1 > 0:
        acc01 = tl.zeros((BM0, BN1), dtype=tl.float32)
    if BM1 > 0:
        acc10 = tl.zeros((BM1, BN0), dtype=tl.float32)
        if BN1 > 0:
            acc11 = tl.zeros((BM1, BN1), dtype=tl.float32)
    if BM2 > 0:
        acc20 = tl.zeros((BM2, BN0), dtype=tl.float32)
        if BN1 > 0:
            acc21 = tl.zeros((BM2, BN1), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K
        b0 = _piece_b(b0_desc, kk, n0, B_KMAJOR)  # [BLOCK_K, BN0]
        if BN1 > 0:
            b1 = _piece_b(b1_desc, kk, n0 + BN0, B_KMAJOR)  # [BLOCK_K, BN1]
        a0 = a0_desc.load([m0, kk])  # [BM0, BLOCK_K]
        if A_REGS == 2 and not UPCAST:  # (the interpreter cannot multiply bf16 values)
            a0 = (a0 * one).to(a0.dtype)
        acc00 = _piece_dot(a0, b0, acc00, FP32_MODE, UPCAST)
        if BN1 > 0:
            acc01 = _piece_dot(a0, b1, acc01, FP32_MODE, UPCAST)
        if BM1 > 0:
            a1 = a1_desc.load([m0 + BM0, kk])  # [BM1, BLOCK_K]
            if A_REGS > 0 and not UPCAST:
                a1 = (a1 * one).to(a1.dtype)
            acc10 = _piece_dot(a1, b0, acc10, FP32_MODE, UPCAST)
            if BN1 > 0:
                acc11 = _piece_dot(a1, b1, acc11, FP32_MODE, UPCAST)
        if BM2 > 0:
            a2 = a2_desc.load([m0 + BM0 + BM1, kk])  # [BM2, BLOCK_K]
            if A_REGS > 0 and not UPCAST:
                a2 = (a2 * one).to(a2.dtype)
            acc20 = _piece_dot(a2, b0, acc20, FP32_MODE, UPCAST)
            if BN1 > 0:
                acc21 = _piece_dot(a2, b1, acc21, FP32_MODE, UPCAST)
    c00_desc.store([m0, n0], acc00.to(c00_desc.dtype))  # the engine clips each piece at the edges
    if BN1 > 0:
        c01_desc.store([m0, n0 + BN0], acc01.to(c01_desc.dtype))
    if BM1 > 0:
        c10_desc.store([m0 + BM0, n0], acc10.to(c10_desc.dtype))
        if BN1 > 0:
            c11_desc.store([m0 + BM0, n0 + BN0], acc11.to(c11_desc.dtype))
    if BM2 > 0:
        c20_desc.store([m0 + BM0 + BM1, n0], acc20.to(c20_desc.dtype))
        if BN1 > 0:
            c21_desc.store([m0 + BM0 + BM1, n0 + BN0], acc21.to(c21_desc.dtype))
    _wait_for_primary(WAIT_PRIMARY)


# ---------------------------------------------------------------------------------------------
# Stream-K: the same tiles, but the K steps of the awkward tiles shared out evenly among the SMs
# ---------------------------------------------------------------------------------------------
@triton.jit
def _k_steps(a_desc, b_desc, off_m, off_n, k_lo, k_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, B_KMAJOR: tl.constexpr, FP32_MODE: tl.constexpr, UPCAST: tl.constexpr):
    """K steps k_lo .. k_hi - 1 of one tile, through TMA, into a fresh FP32 accumulator."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi):
        a = a_desc.load([off_m, k * BLOCK_K])  # [BLOCK_M, BLOCK_K]
        acc = _piece_dot(a, _piece_b(b_desc, k * BLOCK_K, off_n, B_KMAJOR), acc, FP32_MODE, UPCAST)
    return acc


@triton.jit
def _parts_sum(part_ptr, tile, first_p, last_p, total, progs, k_steps, MAX_SEG, strip, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, SHARERS: tl.constexpr, RED_N: tl.constexpr):
    """Columns strip * RED_N ... of the FP32 parts of one tile, added up. The loop is unrolled, so the loads
    of every part (at most SHARERS, from programs first_p .. last_p) are in flight together."""
    r = tl.arange(0, BLOCK_M)
    cs = strip * RED_N + tl.arange(0, RED_N)
    summed = tl.zeros((BLOCK_M, RED_N), dtype=tl.float32)
    for j in tl.static_range(SHARERS):
        q = first_p + j
        q_slot = q * MAX_SEG + tile - (q * total // progs) // k_steps  # program q's slot for this tile
        summed += tl.load(part_ptr + q_slot * (BLOCK_M * BLOCK_N) + r[:, None] * BLOCK_N + cs[None, :],
                          mask=(r[:, None] * 0 + q) <= last_p, other=0.0, cache_modifier=".cg")
    return summed


@triton.jit
def _add_parts(acc, part_ptr, tile, first_p, last_p, me, total, progs, k_steps, MAX_SEG, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, SHARERS: tl.constexpr):
    """acc plus the FP32 parts that the other programs sharing this tile (first_p .. last_p, all but `me`)
    left in their scratch slots."""
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N // 2)
    # the tile in two halves of columns, so that a half of a part (not a whole one) sits in registers beside acc
    lo, hi = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
    for j in tl.static_range(SHARERS):
        q = first_p + j
        if (q != me) & (q <= last_p):
            q_slot = q * MAX_SEG + tile - (q * total // progs) // k_steps  # program q's slot for this tile
            ptrs = part_ptr + q_slot * (BLOCK_M * BLOCK_N) + r[:, None] * BLOCK_N + c[None, :]
            lo += tl.load(ptrs, cache_modifier=".cg")
            tl.debug_barrier()  # keeps the second half's loads from being hoisted above the first half's adds
            hi += tl.load(ptrs + BLOCK_N // 2, cache_modifier=".cg")
            tl.debug_barrier()
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BLOCK_M, BLOCK_N))


@triton.jit(do_not_specialize=["M", "N", "K", "SK_TILES", "MAX_SEG"])
def matmul_streamk_kernel(a_desc, b_desc, c_desc, c_ptr, part_ptr, count_ptr, M, N, K, stride_cm, SK_TILES, MAX_SEG,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, SHARERS: tl.constexpr, RED_N: tl.constexpr, B_KMAJOR: tl.constexpr,
                          FP32_MODE: tl.constexpr, UPCAST: tl.constexpr = False, FIXUP: tl.constexpr = 1,
                          REVERSED: tl.constexpr = False):
    """Persistent TMA kernel, one program per slot (SM x programs per SM). The first SK_TILES tiles (the
    partial wave, and one full wave before it) are cut along K: their SK_TILES x K_STEPS steps are dealt out
    evenly, a contiguous run to each program, so a run may end one tile and start the next. A program that
    holds only part of a tile writes its FP32 partial sum to its own scratch slot (MAX_SEG slots a program)
    and counts itself in on the tile's counter; the last one to arrive adds up the parts, writes the tile of
    C and resets the counter. No program ever waits for another.
    FIXUP = 1 (the owner's shortcut): the program holding a tile's first K step (its owner) reaches that part
    at the very end of its run, while the programs after it did theirs at the start of theirs; so the owner
    looks at the counter first, and when every other part is in, it adds them to its own accumulators in
    registers and stores the tile through TMA, without writing or re-reading its own part. Whoever arrives
    last also adds the others' parts to its own registers. FIXUP = 0: the last to arrive re-reads every part,
    its own too, RED_N columns at a time (the first version, kept for comparison).
    Then every program takes whole tiles, one in each `progs`, as the plain kernel does. REVERSED numbers the
    programs backwards (the tests use it: the CPU interpreter runs programs one after another, in order)."""
    progs = tl.num_programs(0)
    pid = progs - 1 - tl.program_id(0) if REVERSED else tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles = tiles_m * tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    total = SK_TILES * k_steps  # K steps shared out (the host makes this >= progs: nobody gets none)
    start = pid * total // progs  # this program's run of steps: [start, end)
    end = (pid + 1) * total // progs
    first_tile = start // k_steps
    r = tl.arange(0, BLOCK_M)
    for tile in range(first_tile, (end + k_steps - 1) // k_steps):  # empty when SK_TILES = 0
        t0 = tile * k_steps  # the tile's first step in the shared-out numbering
        k_lo = tl.maximum(start, t0) - t0
        k_hi = tl.minimum(end, t0 + k_steps) - t0
        tile_m, tile_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _k_steps(a_desc, b_desc, tile_m * BLOCK_M, tile_n * BLOCK_N, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K,
                       B_KMAJOR, FP32_MODE, UPCAST)
        if (k_lo == 0) & (k_hi == k_steps):  # the whole tile is ours
            c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(c_desc.dtype))
        elif FIXUP == 1:
            first_p = ((t0 + 1) * progs - 1) // total  # the programs whose runs cover this tile
            last_p = ((t0 + k_steps) * progs - 1) // total
            others = last_p - first_p
            last = pid < 0  # False, as a tensor
            if k_lo == 0:  # the owner: are all the other parts in already?
                last = tl.atomic_add(count_ptr + tile, 0, sem="acquire", scope="gpu") == others
            if not last:
                slot = part_ptr + (pid * MAX_SEG + tile - first_tile) * (BLOCK_M * BLOCK_N)
                tl.store(slot + r[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :], acc)
                tl.debug_barrier()  # every thread's part is written before the count below releases it
                last = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") == others
            if last:  # every other part is in: add them to ours, store the tile, reset the counter
                acc = _add_parts(acc, part_ptr, tile, first_p, last_p, pid, total, progs, k_steps, MAX_SEG,
                                 BLOCK_M, BLOCK_N, SHARERS)
                c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(c_desc.dtype))
                tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch
        else:
            slot = part_ptr + (pid * MAX_SEG + tile - first_tile) * (BLOCK_M * BLOCK_N)
            tl.store(slot + r[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :], acc)
            tl.debug_barrier()  # every thread's part is written before the count below releases it
            first_p = ((t0 + 1) * progs - 1) // total  # the programs whose runs cover this tile
            last_p = ((t0 + k_steps) * progs - 1) // total
            arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == last_p - first_p:  # the last part is in: add them up, RED_N columns at a time
                rows = tile_m * BLOCK_M + r
                ahead = _parts_sum(part_ptr, tile, first_p, last_p, total, progs, k_steps, MAX_SEG, 0,
                                   BLOCK_M, BLOCK_N, SHARERS, RED_N)
                for strip in tl.static_range(BLOCK_N // RED_N):
                    summed = ahead
                    if strip + 1 < BLOCK_N // RED_N:  # the next strip's loads go out before this strip's store
                        ahead = _parts_sum(part_ptr, tile, first_p, last_p, total, progs, k_steps, MAX_SEG, strip + 1,
                                           BLOCK_M, BLOCK_N, SHARERS, RED_N)
                    cols = tile_n * BLOCK_N + strip * RED_N + tl.arange(0, RED_N)
                    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], summed.to(c_ptr.dtype.element_ty),
                             mask=(rows[:, None] < M) & (cols[None, :] < N))
                tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch
    for tile in range(SK_TILES + pid, tiles, progs):  # the full waves: whole tiles
        tile_m, tile_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _k_steps(a_desc, b_desc, tile_m * BLOCK_M, tile_n * BLOCK_N, 0, k_steps, BLOCK_M, BLOCK_N, BLOCK_K,
                       B_KMAJOR, FP32_MODE, UPCAST)
        c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(c_desc.dtype))


# ---------------------------------------------------------------------------------------------
# Split-K tail: full waves of whole tiles, then the leftover tiles cut along K across the idle SMs
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["M", "N", "K", "DP_TILES", "SPLIT"])
def matmul_splittail_kernel(a_desc, b_desc, c_desc, ws_ptr, count_ptr, M, N, K, DP_TILES, SPLIT,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr, FP32_MODE: tl.constexpr,
                            UPCAST: tl.constexpr = False, LAUNCH_DEPENDENTS: tl.constexpr = False,
                            WAIT_PRIMARY: tl.constexpr = 0):
    """One program per tile, as the plain TMA kernel, for the first DP_TILES tiles (the full waves). The
    tiles after them (the partial wave) are each cut into SPLIT pieces along K, one program per piece, so
    that the partial wave keeps about every SM busy for 1 / SPLIT of a tile instead of a few SMs for a
    whole one. Every program runs a single K loop, like the plain kernel (its load pipeline fills once).
    A piece adds its FP32 sum into the tile's slot of a workspace with atomic adds (done in the L2, no
    program waits), then counts itself in on the tile's counter; the last piece to arrive reads the
    finished sum, stores the tile of C, and leaves the slot and the counter at zero for the next launch.
    With DP_TILES = 0 every tile is cut (the split edge strips). LAUNCH_DEPENDENTS and WAIT_PRIMARY: the early start,
    as in matmul_tma_kernel."""
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    k_steps = tl.cdiv(K, BLOCK_K)
    tile = pid
    k_lo = 0
    k_hi = k_steps
    if pid >= DP_TILES:  # a piece of a tail tile: consecutive programs share the tile (and its panels)
        q = pid - DP_TILES
        tile = DP_TILES + q // SPLIT
        part = q % SPLIT
        k_lo = part * k_steps // SPLIT
        k_hi = (part + 1) * k_steps // SPLIT
    tile_m, tile_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = _k_steps(a_desc, b_desc, tile_m * BLOCK_M, tile_n * BLOCK_N, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K,
                   B_KMAJOR, FP32_MODE, UPCAST)
    if pid < DP_TILES:
        c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(c_desc.dtype))
    else:
        slot = tile - DP_TILES
        r = tl.arange(0, BLOCK_M)
        c = tl.arange(0, BLOCK_N)
        ws = ws_ptr + slot * (BLOCK_M * BLOCK_N) + r[:, None] * BLOCK_N + c[None, :]
        tl.atomic_add(ws, acc, sem="relaxed", scope="gpu")
        tl.debug_barrier()  # every thread's adds are issued before the count below releases them
        arrived = tl.atomic_add(count_ptr + slot, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:  # the last piece: the sum is complete
            total = tl.load(ws, cache_modifier=".cg")  # from the L2, where the adds were done
            c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], total.to(c_desc.dtype))
            tl.store(ws, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + slot, 0)  # ready for the next launch
    _wait_for_primary(WAIT_PRIMARY)


# ---------------------------------------------------------------------------------------------
# Launching it: tile shapes, operand layout, and which load path a size takes
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TileConfig:
    block_m: int  # tile rows (of C) per program
    block_n: int  # tile columns per program
    block_k: int  # depth of one step along K
    group_m: int = 8  # tile rows per band of the launch order (L2 reuse)
    num_warps: int = 8  # warps per program (4 warps = one warpgroup on Hopper)
    num_stages: int = 3  # tiles of A and B in flight in shared memory (software pipelining)
    streamk: bool = False  # persistent stream-K schedule (TMA path only): the partial wave's K steps shared out
    split_tail: bool = False  # split-K tail (TMA path only): the partial wave's tiles cut along K (splittail_plan)
    row_tail: bool = False  # row tail (TMA path only): the full waves' tile rows, then the rest in ROW_TAIL_TILE
    edge: bool = False  # interior + edge (TMA path only): whole tiles inside, thin strips of EDGE tiles at the edges
    row_pieces: tuple = ()  # composite tile (TMA path only): block_m as power-of-two row pieces, e.g. (128, 64)
    col_pieces: tuple = ()  # and block_n as column pieces (empty: one piece); see matmul_pieces_kernel

    @property
    def composite(self) -> bool:
        return bool(self.row_pieces or self.col_pieces)

    @property
    def label(self) -> str:
        pieces = (f" P{'+'.join(map(str, self.row_pieces or (self.block_m,)))}"
                  f"x{'+'.join(map(str, self.col_pieces or (self.block_n,)))}") if self.composite else ""
        return (f"{self.block_m}x{self.block_n}x{self.block_k} G{self.group_m} "
                f"w{self.num_warps} s{self.num_stages}" + (" SK" if self.streamk else "")
                + (" ST" if self.split_tail else "") + (" RT" if self.row_tail else "") + (" EG" if self.edge else "")
                + pieces)


# Fixed configs per dtype, chosen from measurements on an H200 (scripts/matmul_gpu.py; Triton 3.6):
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
# Per-size choice for the 16-bit dtypes (measured on an H100 against cuBLAS, scripts/models_gpu.py matmul):
# a 128x256 tile leaves SMs idle when the matrix has fewer tiles than SMs (N = 1024: 32 tiles for 132 SMs,
# 0.59x cuBLAS), so smaller N takes the largest tile that still gives about every SM one (64x128: 0.86-0.96x
# at N = 1024-1280; 64x64: 0.89-0.96x at N <= 768), with the deepest pipeline (6, 4 or 3 stages) whose programs
# per SM still hold every tile at once (N = 1536: 288 tiles of 64x128; 4 stages fit 2 programs an SM, 264 slots,
# 0.79x; 3 stages fit 3, 396 slots, 0.84x. N = 1024: 128 tiles, one program an SM with 6 stages, 0.97x against
# 0.87x with 4). Where the big tile's last wave is less than half full (N = 2056-3072, 5120) the row tail takes
# over (ROW_TAIL_TILE below; it replaced a 128x128 tile there: 0.86x -> 1.04x at 2304, 0.75x -> 0.90x at 3072,
# 0.53x -> 0.61x at 2056, 0.61x -> 0.69x at 2064, and 0.88-0.92x -> 0.99x at 5120 on an H100). Between 128x256 and
# 128x128 otherwise, the one whose last wave is fuller wins when it fills the waves by a tenth more. With the early start
# (EARLY_START below), N a little over a multiple of the big tile (2056, 2064) takes interior + edge (edge_applies), and
# where the big tile gives too few SMs a tile but 128x128 makes one full wave and a small last one (1536), a row tail
# of 128x128 tiles replaces the small tiles.
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


def out_dtype(dtype: str) -> torch.dtype:
    """fp8 products are written in bf16 (as torch._scaled_mm does); the others in their own dtype."""
    return torch.bfloat16 if dtype == "fp8" else timing.torch_dtype(dtype)


def out_bytes(dtype: str) -> int:
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


def _fp32_mode(dtype: str) -> int:
    return {"fp32": 1, "tf32": 2}.get(dtype, 0)


def operands(m: int, n: int, k: int, dtype: str, device: Optional[str] = None, kmajor_b: Optional[bool] = None):
    """Fresh random A [m, k] and B [k, n] (B a transposed view of an [n, k] tensor when k-major)."""
    kmajor_b = dtype in KMAJOR_B if kmajor_b is None else kmajor_b
    a = timing.random_tensor((m, k), dtype, device)
    b = timing.random_tensor((n, k), dtype, device).t() if kmajor_b else timing.random_tensor((k, n), dtype, device)
    return a, b


SK_EXTRA_WAVE = True  # share out one full wave more than the partial one (see streamk_plan)
SK_MAX_SHARERS = 8  # at most this many programs share one tile (fewer programs for very few, very deep tiles)
SK_FIXUP = 1  # 1: the tile's owner adds the other parts in registers (see matmul_streamk_kernel); 0: the first version


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


# The split-K tail is measured, not chosen by default: its atomic adds ran at about 1 TB/s on an H100, so the fix-up
# cost about what the split saved (N = 3072: 0.83x cuBLAS against 0.75x plain, 0.90x for the row tail; N = 2048 with
# every tile cut in two: 0.49x against 0.99x).
SPLIT_MAX = 8  # at most this many pieces per tail tile (each adds a whole tile of FP32 sums in the L2)


def splittail_plan(tiles: int, k_steps: int, slots: int, split: Optional[int] = None) -> dict:
    """How the split-K tail kernel cuts the work (the launcher and the model both use this).

    `slots` programs run at once. The full waves stay whole tiles; the tiles of the partial wave (all of
    them when there is less than one wave) are each cut into `split` pieces along K, as many as the slots
    can hold side by side: slots // tail tiles, at most SPLIT_MAX and K_STEPS. With more tail tiles than
    half the slots, split is 1 and the kernel is the plain one. Returns the grid, the whole tiles (dp_tiles),
    the tail tiles, the split and the K steps of the longest piece."""
    tail = tiles % slots
    if split is None:
        split = max(1, min(SPLIT_MAX, k_steps, slots // tail)) if tail else 1
    if split <= 1:
        return {"grid": tiles, "dp_tiles": tiles, "tail_tiles": 0, "split": 1, "piece_steps": k_steps}
    return {"grid": tiles - tail + tail * split, "dp_tiles": tiles - tail, "tail_tiles": tail, "split": split,
            "piece_steps": -(-k_steps // split)}


# The rows after the full waves: short tiles (measured on an H100 against 64x128 with 4, 5 and 6 stages: at 3072,
# 0.90x cuBLAS against 0.82-0.88x; at 2304, 1.04x against 0.86-0.97x). Under the dependent launch below, a 64x64
# program (64 KiB of shared memory) fits on an SM beside a 128x256 one (144 KiB) that is still finishing.
ROW_TAIL_TILE = TileConfig(64, 64, 64, 8, 4, 4)
ROW_TAIL_FILL = 0.5  # the row tail replaces the big tile's last wave when that wave is less than half full
# The later launches of the row tail and of interior + edge (below) are programmatic dependent launches (Hopper):
# their programs may start on the SMs the earlier kernel leaves idle or frees, instead of after it has drained (the
# parts write different elements of C), and the last program of each waits for the kernel before it just before it
# ends (WAIT_PRIMARY), because CUDA promises that the next work in the stream waits for the earlier kernel only if the
# later one does. On an H100 (scripts/matmul_gpu.py earlycheck and early: each part checked element by element against
# float64 right after direct launches and graph replays, then timed beside cuBLAS in the same run) the early start with
# only the last program waiting was faster than stream order for every schedule that uses it (the row tail, interior +
# edge, the 128 x 128 row tail below). With every program waiting it gained nothing for the row tail: a tail program
# that has finished then holds its SM until the big kernel is done, and the tail programs still queued wait for it.
EARLY_START = True
EARLY_WAIT = 2  # which programs of a later kernel wait for the one before it: 1 every one, 2 the last (see the kernel)
# A kernel's programs can share an SM with another kernel's only if the SM's split between L1 and shared memory
# (its carveout) leaves room for both. SHARED_CARVEOUT, when set, asks for a split for the kernels of a chain
# (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, in percent of the most shared memory an SM can have; -1 lets
# the driver choose). Asking for 100 % changed nothing beyond run-to-run noise on an H100 (same runs), so by default
# it is not set.
SHARED_CARVEOUT = None
_CARVED: dict = {}  # kernel handle -> (carveout asked for, the driver's result code: 0 = done)


def _prefer_shared(compiled) -> None:
    """Set the preferred shared-memory carveout of a compiled Triton kernel to SHARED_CARVEOUT (when it changes). A
    failure only costs the sharing of SMs, not correctness: its result code is kept in _CARVED."""
    handle = getattr(compiled, "function", None)
    if SHARED_CARVEOUT is None or not handle or _CARVED.get(handle, (None,))[0] == SHARED_CARVEOUT:
        return
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        code = int(lib.cuFuncSetAttribute(ctypes.c_void_p(handle), 9, ctypes.c_int(SHARED_CARVEOUT)))
    except OSError:  # no CUDA driver library (the CPU interpreter has no compiled kernel anyway)
        code = -1
    _CARVED[handle] = (SHARED_CARVEOUT, code)


_PDL_WORKS: dict = {}  # "ok": whether this Triton launched one (a failure turns it off for the process)


def row_tail_rows(m: int, n: int, config: TileConfig, slots: int) -> int:
    """Rows of C the big tile covers under the row-tail schedule: the whole tile rows that fit in the full waves
    (0 when there is no full wave, M when the waves are all full). The rest go to ROW_TAIL_TILE in a second launch,
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
EDGE_FIRST = False  # launch the strips before the interior (a variant: slower than after it on an H100)
# Split edge strips: each strip tile's K steps cut into pieces, one program per piece, the pieces' FP32 sums added
# with atomic adds into a small workspace (the strips are thin: a few hundred KiB of partial sums) and the last piece
# to arrive writing the tile (matmul_splittail_kernel with no whole tiles). Where the strips' programs are short, they
# spread over every SM as soon as the interior frees them instead of queueing on the few it leaves idle. Measured on an
# H100 at N = 2056 and 2064 (scripts/matmul_gpu.py splitcheck split: every element checked against float64, timed beside
# cuBLAS in the same run), with the rule's pieces and with 2, 4 or 8: no faster than whole strip tiles, so off. The
# strips' cost is not a few long K loops left running after the interior: they read all of A and B once more, beside an
# interior that already keeps the L2 busy.
EDGE_SPLIT = False


def edge_split(strip_tiles: int, k_steps: int, tile: TileConfig, dtype: str, sm_count: int,
               compute_capability: str = "9.0") -> int:
    """Pieces per strip tile: as many as give every program slot of the GPU (SMs x the strip tile's programs per SM)
    one piece, counting the tiles of both strips, at most SPLIT_MAX and no more than the K steps."""
    slots = sm_count * max(1, blocks_per_sm(tile, dtype, "tma", compute_capability))
    return max(1, min(SPLIT_MAX, k_steps, slots // max(1, strip_tiles)))


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


_SCRATCH: dict = {}


def _scratch_for(purpose: str, device, elems: int, tiles: int):
    """FP32 scratch and one int32 counter per tile for `purpose`, kept from call to call and grown when a call needs
    more, so that a CUDA graph can replay the launch. The counters start at zero and every kernel that uses them
    leaves them at zero; each purpose has its own pair ("streamk": partial tiles, which that kernel leaves dirty;
    "splittail": the split-K tail's workspace, which it leaves clean)."""
    key = (purpose, str(device))
    buf, counts = _SCRATCH.get(key, (None, None))
    if buf is None or buf.numel() < elems:
        buf = torch.zeros(max(elems, 1), device=device, dtype=torch.float32)
    if counts is None or counts.numel() < tiles:
        counts = torch.zeros(max(tiles, 1), device=device, dtype=torch.int32)
    _SCRATCH[key] = (buf, counts)
    return buf, counts


def sm_count_of(device) -> int:
    if getattr(device, "type", str(device)) != "cuda":
        return 4  # the CPU interpreter: a few programs, so that tiles are shared out among them
    return torch.cuda.get_device_properties(device).multi_processor_count


def triton_matmul(a: torch.Tensor, b: torch.Tensor, dtype: str, out: Optional[torch.Tensor] = None,
                  config: Optional[TileConfig] = None, tma: str = "auto", autotune: bool = False,
                  programs: Optional[int] = None, reversed_order: bool = False, split: Optional[int] = None,
                  tail_config: Optional[TileConfig] = None, extra_meta: Optional[dict] = None):
    """C = A @ B with the Triton kernel. Returns (C, path, compiled kernel or None). With a stream-K
    config on the TMA path, `programs` programs run at once (default: one per SM); `reversed_order` numbers
    them backwards (for tests: the interpreter runs them one by one). With a split-tail config, `programs`
    is likewise the slots of a wave and `split` overrides the plan's pieces per tail tile. With a row-tail
    config, `programs` is the slots of the big tile's waves and `tail_config` overrides ROW_TAIL_TILE.
    `extra_meta`: more launch arguments of the plain kernels (the row tail's programmatic dependent launch)."""
    (m, k), n = a.shape, b.shape[1]
    config = config or DEFAULT_CONFIGS[dtype]
    out = torch.empty((m, n), device=a.device, dtype=out_dtype(dtype)) if out is None else out
    if config.row_tail and not autotune:
        return _row_tail_matmul(a, b, dtype, out, config, tma, programs, tail_config or ROW_TAIL_TILE)
    if config.edge and not autotune:
        if SPREAD and spread_applies(m, n, config) and _tma_slices_ok(a, b, out, tma) and b.stride(1) == 1:
            return _spread_matmul(a, b, dtype, out, config, extra_meta)
        return _edge_matmul(a, b, dtype, out, config, tma)
    if config.composite and not autotune:
        if _tma_slices_ok(a, b, out, tma):
            return _pieces_matmul(a, b, dtype, out, config, extra_meta)
        # off the TMA path a tile must be a power of two: the dtype's default tile instead
        config = dataclasses.replace(DEFAULT_CONFIGS[dtype], group_m=config.group_m)
    kmajor_b = b.stride(0) == 1 and b.stride(1) != 1
    cc = _device_cc(a.device)
    e = a.element_size()
    b_rows = b.t() if kmajor_b else b  # the contiguous tensor behind B
    aligned = all((t.stride(0) * e) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (a, b_rows)) and \
        (out.stride(0) * out.element_size()) % 16 == 0 and out.data_ptr() % 16 == 0
    # "auto": TMA where the GPU has it (Hopper and newer) and the rows are 16-byte aligned; "on" forces it
    # where aligned (the interpreter runs it on the CPU too); "off" always takes the pointer path.
    use_tma = aligned and (tma == "on" or (tma == "auto" and tma_supported(cc)))
    upcast = a.device.type == "cpu" and dtype == "bf16"  # the interpreter cannot multiply bf16 values
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm, bn, bk = config.block_m, config.block_n, config.block_k
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        b_desc = TensorDescriptor.from_tensor(b_rows, [bn, bk] if kmajor_b else [bk, bn])
        c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
        args = (a_desc, b_desc, c_desc, m, n, k)
        kernel = _autotuned("tma", e) if autotune else matmul_tma_kernel
        meta = dict(B_KMAJOR=kmajor_b, FP32_MODE=_fp32_mode(dtype), UPCAST=upcast)
        path = "tma"
        if config.streamk and not autotune:
            tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
            slots = programs or sm_count_of(a.device) * max(1, blocks_per_sm(config, dtype, "tma", cc))
            plan = streamk_plan(tiles, triton.cdiv(k, bk), slots)
            parts, counts = _scratch_for("streamk", a.device, plan["grid"] * plan["max_seg"] * bm * bn, tiles)
            sharers = 1 << max(0, plan["max_sharers"] - 1).bit_length()  # rounded up to a power of two
            # registers for the parts in flight: about 48 a thread (SHARERS x BLOCK_M x RED_N FP32 values)
            red_n = max(16, min(bn, 1 << ((48 * 32 * config.num_warps) // (sharers * bm)).bit_length() - 1))
            compiled = matmul_streamk_kernel[(plan["grid"],)](
                a_desc, b_desc, c_desc, out, parts, counts, m, n, k, out.stride(0), plan["sk_tiles"],
                plan["max_seg"], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.group_m, SHARERS=sharers,
                RED_N=red_n, FIXUP=SK_FIXUP, REVERSED=reversed_order, num_warps=config.num_warps,
                num_stages=config.num_stages, **meta)
            return out, path, compiled
        if config.split_tail and not autotune:
            tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
            slots = programs or sm_count_of(a.device) * max(1, blocks_per_sm(config, dtype, "tma", cc))
            plan = splittail_plan(tiles, triton.cdiv(k, bk), slots, split)
            ws, counts = _scratch_for("splittail", a.device, plan["tail_tiles"] * bm * bn, plan["tail_tiles"])
            compiled = matmul_splittail_kernel[(plan["grid"],)](
                a_desc, b_desc, c_desc, ws, counts, m, n, k, plan["dp_tiles"], plan["split"], BLOCK_M=bm,
                BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.group_m, num_warps=config.num_warps,
                num_stages=config.num_stages, **meta)
            return out, path, compiled
    else:
        args = (a, b, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))
        # Loads as wide as the rows' alignment allows: where every count is a multiple of 16 Triton sees it
        # itself (ALIGN 1, the kernel as it always was); otherwise the launcher promises what divides them all.
        counts = (n, k, a.stride(0), b_rows.stride(0), out.stride(0))
        bases = all(t.data_ptr() % 16 == 0 for t in (a, b_rows, out))  # Triton assumes less of other pointers
        align = vector_elems(e, *counts) if bases else 1
        sixteen = all(x % 16 == 0 for x in counts)
        meta = dict(B_KMAJOR=kmajor_b, FP32_MODE=_fp32_mode(dtype), UPCAST=upcast, ALIGN=1 if sixteen else align)
        path = f"vec{align * e}"
        kernel = _autotuned("ptr", e) if autotune else (matmul_lanes_kernel if LANES and align == 1 else matmul_kernel)
    if autotune:
        grid = lambda META: (triton.cdiv(m, META["BLOCK_M"]) * triton.cdiv(n, META["BLOCK_N"]),)
        compiled = kernel[grid](*args, **meta)
    else:
        grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
        compiled = kernel[grid](*args, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                                GROUP_M=config.group_m, num_warps=config.num_warps, num_stages=config.num_stages,
                                **{**meta, **(extra_meta or {})})  # extra_meta may override (ALIGN, for experiments)
    return out, path, compiled


# Composite tiles are a measured alternative, not chosen by default (no rule in tuned_config picks them). What cuBLAS
# runs at these sizes (torch.profiler, H100 and H200): 192 x 176 tiles at N = 2056 and 2064 (11 x 12 = 132 tiles, one
# wave on 132 SMs), 192 x 192 at 3072 (256 tiles, two waves) and 192 x 96 at 1536 (128 tiles). Ours, on an H100
# (scripts/matmul_gpu.py pieces, 2026-11-23, bf16; every variant checked against float64 on odd shapes, then each size
# checked and timed beside cuBLAS in the same run; three runs), as speed relative to cuBLAS: 192 x 192 as
# (128 + 64) x (128 + 64), 8 warps, 3 stages: 0.75-0.76 at N = 2056 (the lab's interior + edge: 0.68-0.69), 0.76-0.77
# at 2064 (0.83-0.84), 0.82-0.83 at 3072 (row tail 0.91-0.92), 0.79-0.80 at 2048 and 0.75-0.76 at 4096 (128 x 256:
# 0.97-0.98 and 0.94-0.96), 0.58 at 1536 (64 tiles). No variant was faster where it matters: 4 stages the same; BLOCK_K
# 32 (6 stages) 0.60-0.78, BLOCK_K 128 (2 stages) 0.52-0.57, GROUP_M 16 the same, three 64-row pieces 0.53-0.76;
# 192 x 256 (128 + 64 rows) 0.90 at 4096 but 0.69-0.72 at 2056-2064 (99 larger tiles); 192 x 128 0.55-0.86. The cut
# goes into the tensor-core instructions: Triton gives each of the 2 warpgroups 64 rows of a 128-row piece at its full
# width, but half the width of a 64-row piece, so 192 x 192 issues m64n128, m64n64 and m64n32 instructions (the PTX)
# where 128 x 256 issues only m64n256. Each instruction reads its 64 x 16 slice of A from shared memory again, so per
# K step of 64 the two warpgroups read 136 KiB of operands for 4.7 MFLOP, about 121 bytes a clock at the tensor cores'
# rate (4096 FLOP per clock per SM), against 80 KiB for 4.2 MFLOP (80 bytes a clock) for 128 x 256: near the 128 bytes a
# clock of an SM's shared memory (an estimate; not measured with counters). Keeping row pieces of A in registers
# (PIECES_A_REGS 1 or 2) was slower still, 0.30-0.66 for every such variant and size (192 x 192: 0.45-0.56 at N =
# 2056-3072): the PTX shows the register-operand instructions and a wgmma.wait_group after each of them (8 or 16 waits
# in the loop against 1), so the waits and the copies of A into registers cost more than the shared-memory reads saved
# (not measured apart). 12 warps (3 warpgroups, as cuBLAS's 192-row tiles use) is refused: Triton needs a power of two.
PIECES_A_REGS = 0  # matmul_pieces_kernel's A_REGS for 16-bit inputs (0: every operand from shared memory)


def _pieces_matmul(a, b, dtype, out, config, extra_meta=None):
    """A composite tile (matmul_pieces_kernel): one TMA descriptor per distinct piece shape of A, B and C (pieces of
    the same shape share one, since a descriptor holds the box shape, not where it is read)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    (m, k), n = a.shape, b.shape[1]
    rows, cols = config.row_pieces or (config.block_m,), config.col_pieces or (config.block_n,)
    assert sum(rows) == config.block_m and sum(cols) == config.block_n and len(rows) <= 3 and len(cols) <= 2, \
        f"pieces {rows} x {cols} do not make a {config.block_m} x {config.block_n} tile (at most 3 x 2 pieces)"
    bk = config.block_k
    kmajor_b = b.stride(0) == 1 and b.stride(1) != 1
    b_rows = b.t() if kmajor_b else b
    a_d = {r: TensorDescriptor.from_tensor(a, [r, bk]) for r in set(rows)}
    b_d = {c: TensorDescriptor.from_tensor(b_rows, [c, bk] if kmajor_b else [bk, c]) for c in set(cols)}
    c_d = {(r, c): TensorDescriptor.from_tensor(out, [r, c]) for r in set(rows) for c in set(cols)}
    rs, cs = rows + (0,) * (3 - len(rows)), cols + (0,) * (2 - len(cols))
    a_of = [a_d[r or rows[0]] for r in rs]  # an absent piece gets any descriptor: the kernel never touches it
    b_of = [b_d[c or cols[0]] for c in cs]
    c_of = [c_d[(r or rows[0], c or cols[0])] for r in rs for c in cs]
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
    compiled = matmul_pieces_kernel[grid](
        *a_of, *b_of, *c_of, m, n, k, 1.0, BM0=rs[0], BM1=rs[1], BM2=rs[2], BN0=cs[0], BN1=cs[1], BLOCK_K=bk,
        GROUP_M=config.group_m, B_KMAJOR=kmajor_b, FP32_MODE=_fp32_mode(dtype),
        UPCAST=a.device.type == "cpu" and dtype == "bf16", num_warps=config.num_warps, num_stages=config.num_stages,
        A_REGS=PIECES_A_REGS if a.element_size() == 2 else 0, **(extra_meta or {}))
    return out, "tma", compiled


def _row_tail_matmul(a, b, dtype, out, config, tma, programs, tail_config):
    """The row-tail schedule: two launches of the plain kernel on row slices of A and C (B is shared), the big
    tile on the rows of the full waves, then the short tile on the rest. Falls back to one launch of the big tile
    off the TMA path (the per-size choices were measured there)."""
    (m, k), n = a.shape, b.shape[1]
    big = dataclasses.replace(config, row_tail=False)
    cc = _device_cc(a.device)
    slots = programs or sm_count_of(a.device) * max(1, blocks_per_sm(big, dtype, "tma", cc))
    rows = row_tail_rows(m, n, big, slots)
    if rows in (0, m):
        return triton_matmul(a, b, dtype, out, big if rows else tail_config, tma)
    if not _tma_slices_ok(a, b, out, tma):  # the slices cannot take the TMA path: do it all in one launch
        return triton_matmul(a, b, dtype, out, big, tma)
    return _launch_chain([(a[:rows], b, out[:rows], big), (a[rows:], b, out[rows:], tail_config)], dtype, tma, out)


def _edge_matmul(a, b, dtype, out, config, tma, row_edge=None, col_edge=None, split=None, band=None):
    """Interior + edge: the big tile on the whole tiles inside the matrix (rows and columns up to the last multiple
    of the tile), then the thin strips left at the bottom (all columns) and on the right (the interior's rows) in
    narrow tiles, each its own launch, started early where the GPU allows it (see _launch_chain)."""
    (m, k), n = a.shape, b.shape[1]
    big = dataclasses.replace(config, edge=False)
    rows, cols = edge_interior(m, n, big)
    if rows == 0 or cols == 0 or (rows, cols) == (m, n) or not _tma_slices_ok(a, b, out, tma):
        return triton_matmul(a, b, dtype, out, big, tma)
    band = EDGE_BAND if band is None else band
    b_kmajor = b.stride(0) == 1 and b.stride(1) != 1
    if band and not b_kmajor and rows >= big.block_m and cols >= big.block_n and m - rows <= BAND_EXTRA \
            and n - cols <= BAND_EXTRA:
        return _launch_chain(_band_parts(a, b, out, big, band, row_edge, col_edge), dtype, tma, out)
    parts = []
    if rows < m:  # the bottom strip: the last rows, every column
        parts.append((a[rows:], b, out[rows:], row_edge or EDGE_ROW_TILE))
    if cols < n:  # the right strip: the interior's rows, the last columns
        parts.append((a[:rows], b[:, cols:], out[:rows, cols:], col_edge or EDGE_COL_TILE))
    split = EDGE_SPLIT if split is None else split
    if split:  # cut every strip tile along K (split True: by the rule; an int: that many pieces)
        tiles = sum(triton.cdiv(p[2].shape[0], p[3].block_m) * triton.cdiv(p[2].shape[1], p[3].block_n) for p in parts)
        for i, (pa, pb, pout, cfg) in enumerate(parts):
            pieces = split if split is not True else edge_split(
                tiles, triton.cdiv(k, cfg.block_k), cfg, dtype, sm_count_of(a.device), _device_cc(a.device))
            parts[i] = (pa, pb, pout, dataclasses.replace(cfg, split_tail=True),
                        {"split": pieces, "scratch": f"edge{i}"})
    interior = (a[:rows], b[:, :cols], out[:rows, :cols], big)
    return _launch_chain(parts + [interior] if EDGE_FIRST else [interior] + parts, dtype, tma, out)


# Spread edge (matmul_spread_kernel): every interior program also computes one EDGE-wide piece of each strip in its own
# K loop. It applies where the strips are at most EDGE thick and there are enough programs for one piece each. Measured
# on an H100 (scripts/matmul_gpu.py spread, whole outputs checked against float64): correct, but 58.7 us at N = 2064
# against 35.9 for strips in their own launches and 30.7 for the interior alone (66.8 against 46.8 at 2056): with the
# two small products in its loop the kernel needs 222 registers a thread instead of 154 and its K loop runs at about
# half speed, much as the bands' did. So off.
SPREAD_EDGE = 16
SPREAD_CORNER_TILE = TileConfig(16, 16, 64, 1, 4, 3)  # the corner, when no bottom piece reaches it: one program
SPREAD = False  # interior + edge sizes take the spread kernel instead of strips in their own launches


def spread_applies(m: int, n: int, big: TileConfig) -> bool:
    rows, cols = edge_interior(m, n, big)
    if not (0 < rows < m and 0 < cols < n) or m - rows > SPREAD_EDGE or n - cols > SPREAD_EDGE:
        return False
    programs = (rows // big.block_m) * (cols // big.block_n)
    return programs * SPREAD_EDGE >= max(rows, cols)


def _spread_matmul(a, b, dtype, out, config, extra_meta=None):
    """Interior + edge as one launch of matmul_spread_kernel (plus, first, a one-program launch for the corner below
    and right of the interior when the bottom pieces do not reach it), started early as in _launch_chain."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    (m, k), n = a.shape, b.shape[1]
    big = dataclasses.replace(config, edge=False)
    rows, cols = edge_interior(m, n, big)
    bm, bn, bk, e = big.block_m, big.block_n, big.block_k, SPREAD_EDGE
    programs = (rows // bm) * (cols // bn)
    meta = dict(extra_meta or {})
    pdl = EARLY_START and _PDL_WORKS.get("ok", True) and a.device.type == "cuda"
    if programs * e < n and rows < m:  # the corner [rows, m) x [cols, n): its own small launch, first
        corner_meta = {"LAUNCH_DEPENDENTS": True} if pdl else None
        triton_matmul(a[rows:], b[:, cols:], dtype, out[rows:, cols:], SPREAD_CORNER_TILE, "on", extra_meta=corner_meta)
        if pdl:
            meta.update(launch_pdl=True, WAIT_PRIMARY=EARLY_WAIT)
    descs = [TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn]),
             TensorDescriptor.from_tensor(out, [bm, bn]), TensorDescriptor.from_tensor(a, [e, bk]),
             TensorDescriptor.from_tensor(b, [bk, e]), TensorDescriptor.from_tensor(out[rows:], [e, e]),
             TensorDescriptor.from_tensor(out[:rows, cols:], [e, e])]
    compiled = matmul_spread_kernel[(programs,)](
        *descs, m, n, k, rows, cols, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=big.group_m, EDGE=e,
        UPCAST=a.device.type == "cpu" and dtype == "bf16", num_warps=big.num_warps, num_stages=big.num_stages, **meta)
    return out, "tma", compiled


# Bands: the interior's last tile row and column compute the strips beside them from the tiles they load anyway, so the
# strips cost no second pass over A and B. Measured on an H100 (same runs as EDGE_SPLIT): correct, but slower than
# separate strips at 2056 and 2064, for both strips and for the right one alone, and with the bottom strip's product
# written either way round: the band programs, one per SM beside the plain ones, took much longer than their extra
# tensor-core work accounts for, and every other program then waited on them. So off.
EDGE_BAND = None  # None: strips in their own launches; "both": both strips computed by the interior's last tile row and
# column (matmul_band_kernel); "right": only the right strip so, the bottom one in its own launch
EDGE_BAND_TRANS = True  # the bottom strip as (B^T A_x^T) in the band kernel (see the kernel)
BAND_EXTRA = 16  # rows or columns of edge one band program adds (the strips are at most this thick)


def _band_parts(a, b, out, big, band, row_edge=None, col_edge=None):
    """The chain of interior + edge with bands: (A, B, C, config[, extra]) parts that cover C exactly once. With r x c
    the whole tiles and r0 = r - BLOCK_M, c0 = c - BLOCK_N: "both": the last tile row [r0, r) x [0, c) plus the rows
    [r, m) below it; the last tile column [0, r0) x [c0, c) plus the columns [c, n); the rest of the interior
    [0, r0) x [0, c0) in plain tiles; the corner [r0, m) x [c, n) in narrow tiles. "right": the last tile column
    [0, r) x [c0, c) plus [c, n); the interior [0, r) x [0, c0); the bottom strip [r, m) x [0, n) in narrow tiles."""
    (m, k), n = a.shape, b.shape[1]
    r, c = edge_interior(m, n, big)
    bm, bn = big.block_m, big.block_n
    r0, c0 = r - bm, c - bn
    row_edge, col_edge = row_edge or EDGE_ROW_TILE, col_edge or EDGE_COL_TILE
    parts = []
    rows = r0 if band == "both" else r  # the rows of the right band
    if band == "both":
        if m > r:
            parts.append((a[r0:r], b[:, :c], out[r0:r, :c], big, {"band": (a[r:], None, out[r:, :c])}))
        else:
            parts.append((a[r0:r], b[:, :c], out[r0:r, :c], big))
    if rows > 0:
        if n > c:
            parts.append((a[:rows], b[:, c0:c], out[:rows, c0:c], big, {"band": (None, b[:, c:], out[:rows, c:])}))
        else:
            parts.append((a[:rows], b[:, c0:c], out[:rows, c0:c], big))
        if c0 > 0:
            parts.append((a[:rows], b[:, :c0], out[:rows, :c0], big))
    if band == "both" and n > c:
        parts.append((a[r0:], b[:, c:], out[r0:, c:], col_edge))
    if band != "both" and m > r:
        parts.append((a[r:], b, out[r:], row_edge))
    return parts


def _band_launch(a, b, dtype, out, config, extra, extra_meta=None):
    """One band part: matmul_band_kernel with the thin operand and output of its edge (extra = (A rows below, None,
    C rows below) or (None, B columns to the right, C columns to the right))."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    (m, k), n = a.shape, b.shape[1]
    bm, bn, bk, e = config.block_m, config.block_n, config.block_k, BAND_EXTRA
    ax, bx, cx = extra
    rows = ax is not None
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    x_desc = TensorDescriptor.from_tensor(ax, [e, bk]) if rows else TensorDescriptor.from_tensor(bx, [bk, e])
    cx_desc = TensorDescriptor.from_tensor(cx, [e, bn] if rows else [bm, e])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    compiled = matmul_band_kernel[grid](
        a_desc, b_desc, c_desc, x_desc, x_desc, cx_desc, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        GROUP_M=config.group_m, EXTRA=e, EXTRA_ROWS=rows, TRANS=EDGE_BAND_TRANS,
        UPCAST=a.device.type == "cpu" and dtype == "bf16", num_warps=config.num_warps, num_stages=config.num_stages,
        **(extra_meta or {}))
    return out, "tma", compiled


def _split_strip(a, b, dtype, out, config, tma, split, scratch, extra_meta=None):
    """Every tile of this (thin) product cut into `split` pieces along K: matmul_splittail_kernel with no whole tiles,
    its FP32 workspace and counters under the scratch name `scratch` (one per strip: the strips may run at once)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    (m, k), n = a.shape, b.shape[1]
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    kmajor_b = b.stride(0) == 1 and b.stride(1) != 1
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split = max(1, min(int(split), triton.cdiv(k, bk)))
    ws, counts = _scratch_for(scratch, a.device, tiles * bm * bn, tiles)
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b.t() if kmajor_b else b, [bn, bk] if kmajor_b else [bk, bn])
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    compiled = matmul_splittail_kernel[(tiles * split,)](
        a_desc, b_desc, c_desc, ws, counts, m, n, k, 0, split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        GROUP_M=config.group_m, B_KMAJOR=kmajor_b, FP32_MODE=_fp32_mode(dtype),
        UPCAST=a.device.type == "cpu" and dtype == "bf16", num_warps=config.num_warps, num_stages=config.num_stages,
        **(extra_meta or {}))
    return out, "tma", compiled


def _tma_slices_ok(a, b, out, tma) -> bool:
    """Whether row and column slices of these operands can take the TMA path: the whole tensors can (16-byte rows
    and starts), and the GPU has it. Slices at multiples of 16 elements then start on 16-byte boundaries too."""
    b_rows = b.t() if (b.stride(0) == 1 and b.stride(1) != 1) else b
    aligned = all((t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (a, b_rows, out))
    return aligned and (tma == "on" or (tma == "auto" and tma_supported(_device_cc(a.device))))


def _launch_chain(parts, dtype, tma, out):
    """Launch the plain kernel on each (A, B, C, config) part in turn (they write different parts of C). With
    EARLY_START on a GPU: each launch lets the next one start as soon as all of its own programs have started
    (programmatic dependent launch), so the later parts' programs take SMs the earlier ones leave idle or share
    SMs with them; each later kernel waits for the one before it just before it ends (WAIT_PRIMARY), so the whole
    chain is done when its last kernel is, as the next work in the stream expects. Returns the first part's
    (C, path, compiled kernel) with C the whole output."""
    pdl = EARLY_START and _PDL_WORKS.get("ok", True) and parts[0][0].device.type == "cuda"
    if pdl:
        try:
            first = None
            for i, part in enumerate(parts):
                meta = {"LAUNCH_DEPENDENTS": i + 1 < len(parts)}
                if i:
                    meta.update(launch_pdl=True, WAIT_PRIMARY=EARLY_WAIT)
                res = _launch_part(part, dtype, tma, meta)
                _prefer_shared(res[2])
                first = first or res
            _PDL_WORKS["ok"] = True
            return out, first[1], first[2]
        except Exception:  # a Triton without programmatic dependent launch: plain launches from now on
            if _PDL_WORKS.get("ok"):
                raise
            _PDL_WORKS["ok"] = False
    first = None
    for part in parts:
        res = _launch_part(part, dtype, tma, None)
        first = first or res
    return out, first[1], first[2]


def _launch_part(part, dtype, tma, meta):
    """One part of a chain: (A, B, C, config), or (A, B, C, config, {"split", "scratch"}) for a split strip."""
    pa, pb, pout, cfg = part[:4]
    if len(part) > 4 and "band" in part[4]:
        return _band_launch(pa, pb, dtype, pout, cfg, part[4]["band"], meta)
    if len(part) > 4:
        return _split_strip(pa, pb, dtype, pout, cfg, tma, part[4]["split"], part[4]["scratch"], meta)
    return triton_matmul(pa, pb, dtype, pout, cfg, tma, extra_meta=meta)


_AUTOTUNED: dict = {}


def _autotuned(kind: str, element_bytes: int):
    """The kernel wrapped in triton.autotune over the handful of configs for this element size."""
    key = (kind, element_bytes)
    if key not in _AUTOTUNED:
        def set_blocks(nargs):  # TMA descriptors carry the tile shape: set it for the config being tried
            bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
            nargs["a_desc"].block_shape = [bm, bk]
            nargs["b_desc"].block_shape = [bn, bk] if nargs["B_KMAJOR"] else [bk, bn]
            nargs["c_desc"].block_shape = [bm, bn]

        configs = [triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k,
                                  "GROUP_M": c.group_m}, num_warps=c.num_warps, num_stages=c.num_stages,
                                 pre_hook=set_blocks if kind == "tma" else None)
                   for c in AUTOTUNE_CONFIGS[element_bytes]]
        base = matmul_tma_kernel if kind == "tma" else matmul_kernel
        _AUTOTUNED[key] = triton.autotune(configs=configs, key=["M", "N", "K"])(base)
    return _AUTOTUNED[key]


def chosen_config(kernel) -> Optional[str]:
    """The config an autotuned kernel settled on (after a call), as a label."""
    best = getattr(kernel, "best_config", None)
    if best is None:
        return None
    kw = best.kwargs
    return TileConfig(kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], kw["GROUP_M"], best.num_warps,
                      best.num_stages).label


_ONES: dict = {}


def cublas_matmul(a: torch.Tensor, b: torch.Tensor, dtype: str, out: Optional[torch.Tensor] = None):
    """The library call a user would otherwise make (cuBLAS through torch)."""
    if dtype == "fp8":
        one = _ONES.setdefault(str(a.device), torch.ones((), device=a.device))  # unit scales, made once
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return torch.matmul(a, b, out=out)


_cc = compute_capability_tuple


def _device_cc(device) -> str:
    if getattr(device, "type", str(device)) != "cuda":
        return "0.0"
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


# ---------------------------------------------------------------------------------------------
# The reference (float64)
# ---------------------------------------------------------------------------------------------
def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A @ B in float64 (of the values actually stored in the inputs)."""
    return a.to(torch.float64) @ b.to(torch.float64)


def check_sampled(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dtype: str, what: str, samples: int = 48,
                  tol: Optional[float] = None) -> float:
    """Check a large product cheaply: every element must be finite (so all were written), and a sample
    of rows x columns (always including the last row and column, which cross the edge tiles) must match
    float64."""
    m, n = out.shape
    if not torch.isfinite(out).all():
        raise timing.KernelMismatch(f"{what}: the output holds NaN or Inf (an element was not written)")
    g = torch.Generator(device="cpu").manual_seed(m * 7919 + n)
    rows = torch.unique(torch.cat([torch.randint(0, m, (samples,), generator=g), torch.tensor([0, m - 1])]))
    cols = torch.unique(torch.cat([torch.randint(0, n, (samples,), generator=g), torch.tensor([0, n - 1])]))
    rows, cols = rows.to(out.device), cols.to(out.device)
    ref = a.index_select(0, rows).to(torch.float64) @ b.index_select(1, cols).to(torch.float64)
    return timing.check_close(out.index_select(0, rows).index_select(1, cols), ref, dtype, what, tol)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
L1_BYTES_PER_CLOCK = 128  # one SM's L1/shared memory moves 128 bytes (one wavefront) per clock
LSU_INSTR_PER_CLOCK = 1.0  # one warp-wide load/store instruction issued per clock per SM
LAYOUT_BYTES_PER_THREAD = 16  # Triton's load layout gives each thread 16 consecutive bytes of a row
FIXED_US = KERNEL_LAUNCH_US  # per launch: the kernel's start, the first tiles' trip from memory, the last store


def clock_hz(target: Target) -> float:
    """The SM clock the FMA ceiling implies: FMA TFLOP/s = SMs x lanes x 2 FLOPs x clock."""
    shape = sm_shape(target.compute_capability)
    return target.ceilings.fma_tflops * 1e12 / (target.sm_count * 2 * shape.fp32_lanes)


def matmul_flop_per_clock(target: Target, dtype: str) -> Optional[float]:
    """Multiply-add FLOPs per clock per SM at the measured matmul ceiling of this dtype."""
    peak = target.ceilings.matmul_tflops.get(dtype)
    if not peak:
        return None
    return peak * 1e12 / (target.sm_count * clock_hz(target))


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


def probe_floor_us(target: Target) -> float:
    """Time our kernel on one 64 x 64 x 64 fp16 product, the way kernel_ms times the sweep: the launch, the
    first tiles' trip from memory (the L2 was just flushed), one step on the tensor cores and the store of
    C, which every product pays once whatever its size. Then the same tile with LATENCY_STEPS more K steps:
    one program alone keeps num_stages - 1 loads in flight, so each extra step takes a load's latency over
    num_stages - 1 (its tensor-core work is a fraction of that), which gives the latency."""
    a, b = operands(64, 64, 64 * (1 + LATENCY_STEPS), "fp16")  # A [64, 576], B [576, 64]
    out = torch.empty((64, 64), device=a.device, dtype=torch.float16)
    a1, b1 = a[:, :64], b[:64]
    one = kernel_ms(lambda: triton_matmul(a1, b1, "fp16", out, FLOOR_TILE)) * 1e3
    more = kernel_ms(lambda: triton_matmul(a, b, "fp16", out, FLOOR_TILE)) * 1e3
    _FLOOR_PROBED[target.key] = one
    _LATENCY_PROBED[target.key] = max(0.0, more - one) / LATENCY_STEPS * (FLOOR_TILE.num_stages - 1)
    return one


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
    step_of = _step_of(config, step_cycles(config, dtype, path, flop_per_clock), target)
    rounds = math.ceil(tiles / target.sm_count)
    waves_sm = math.ceil(rounds / r)
    return k_steps * ((waves_sm - 1) * step_of(r) + step_of(rounds - (waves_sm - 1) * r))


def _parts_cycles(first: float, later: list, k: int, dtype: str, path: str, target: Target,
                  flop_per_clock: float) -> float:
    """Clocks of the busiest SM for a chain of launches (_launch_chain): `first` for the first part, then each
    (rows, columns, config) of `later`. In plain stream order they add up. With the early start, the later parts'
    programs run beside the first one's, on every SM: their K steps (at their own cost per step) spread over all
    SMs add to the first part's time, but no part ends before its own busiest SM has done its share."""
    # a split strip (a fourth entry: pieces per tile) runs pieces x its tiles programs of K / pieces steps each
    own = [_grid_cycles(m * (p[0] if p else 1), n, cfg, dtype, path, target, flop_per_clock,
                        k=math.ceil(math.ceil(k / cfg.block_k) / (p[0] if p else 1)) * cfg.block_k)
           for m, n, cfg, *p in later]
    if not EARLY_START:
        return first + sum(own)
    spread = 0.0
    for m, n, cfg, *_ in later:
        if m > 0 and n > 0:
            tiles = math.ceil(m / cfg.block_m) * math.ceil(n / cfg.block_n)
            step = step_cycles(cfg, dtype, path, flop_per_clock)["step"]
            spread += tiles * math.ceil(k / cfg.block_k) * step / target.sm_count
    return max([first + spread] + own)


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
                _grid_cycles(rows, n, config, dtype, path, target, flop_per_clock),
                [(tail_rows, n, ROW_TAIL_TILE)], n, dtype, path, target, flop_per_clock)
    if config.edge and path == "tma":  # whole tiles inside, then the strips at the bottom and on the right
        rows, cols = edge_interior(n, n, config)
        if 0 < rows and 0 < cols and (rows, cols) != (n, n):
            edge_rows = n - rows
            strips = [(n - rows, n, EDGE_ROW_TILE), (rows, n - cols, EDGE_COL_TILE)]
            if EDGE_SPLIT:  # each strip tile cut along K by the rule (edge_split)
                tiles_e = sum(math.ceil(m_ / c.block_m) * math.ceil(n_ / c.block_n) for m_, n_, c in strips)
                strips = [(m_, n_, c, edge_split(tiles_e, math.ceil(n / c.block_k), c, dtype, target.sm_count,
                                                 target.compute_capability)) for m_, n_, c in strips]
            first = _grid_cycles(rows, cols, config, dtype, path, target, flop_per_clock, k=n)
            if EDGE_BAND and n - rows <= BAND_EXTRA and n - cols <= BAND_EXTRA:
                # the bands' programs do BAND_EXTRA more rows (or columns) of tensor-core work per step than the
                # others: the bottom band's BAND_EXTRA rows for BLOCK_M, the right band's columns for BLOCK_N
                first *= 1 + BAND_EXTRA / (config.block_m if EDGE_BAND == "both" else config.block_n)
                strips = [(config.block_m + n - rows, n - cols, EDGE_COL_TILE)] if EDGE_BAND == "both" else \
                    [(n - rows, n, EDGE_ROW_TILE)]
            busy_cycles = _parts_cycles(first, strips, n, dtype, path, target, flop_per_clock)
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


def streamk_fixup_cycles(config: TileConfig, dtype: str, plan: dict, fixup: Optional[int] = None) -> float:
    """Clocks the busiest stream-K program spends on partial sums, all through its SM's L1 at L1_BYTES_PER_CLOCK.
    With the owner's shortcut (fixup 1) a program writes the FP32 part of at most one tile (the one its run starts
    in) and, as the owner of the tile its run ends in, reads the other parts of it (max_sharers - 1) and writes
    the tile of C. The first version (fixup 0) wrote a part of up to two tiles and, as the last to arrive, read
    every part back, its own too."""
    if not plan["sk_tiles"]:
        return 0.0
    fixup = SK_FIXUP if fixup is None else fixup
    part = config.block_m * config.block_n * 4
    written, read = (1, plan["max_sharers"] - 1) if fixup == 1 else (2, plan["max_sharers"])
    moved = (written + read) * part + config.block_m * config.block_n * out_bytes(dtype)
    return moved / L1_BYTES_PER_CLOCK


def roofline_tflops(n: int, dtype: str, target: Target) -> Optional[float]:
    """min(peak, intensity x bandwidth) with each matrix moved once: 2N^3 FLOPs over (2 e_in + e_out) N^2 bytes."""
    peak = target.ceilings.matmul_tflops.get(dtype)
    if not peak:
        return None
    intensity = 2.0 * n / (2 * timing.element_bytes(dtype) + out_bytes(dtype))
    return min(peak, intensity * target.ceilings.copy_tbps)


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
    the lesson's "Why the model misses" gives for its kind of point."""
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
        elif " RT" in str(r.get("config", "")) and err > 0:
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
# Parameters, checks, prediction
# ---------------------------------------------------------------------------------------------
DEFAULT_SIZES = (256, 512, 768, 1024, 1280, 1536, 1792, 1793, 2048, 2049, 2050, 2052, 2056, 2064, 2304, 2560,
                 3072, 3584, 4096, 4097, 4608, 5120, 6144, 7168, 8192)


@dataclass(frozen=True)
class Params:
    dtypes: tuple = param(("bf16",), "input dtypes (FP32 accumulation; tf32 = fp32 storage on tensor cores)",
                          choices=DTYPES)
    sizes: tuple = param(DEFAULT_SIZES, "square sizes N (M = N = K)", unit="elements", min=16, max=32768)
    kernels: tuple = param(KERNELS, "kernels to time", choices=KERNELS)
    block_m: int = param(0, "Triton BLOCK_M: tile rows per program (0 = the tuned default)",
                         choices=(0, 16, 32, 64, 128, 256))
    block_n: int = param(0, "Triton BLOCK_N: tile columns per program (0 = default)", choices=(0, 16, 32, 64, 128, 256))
    block_k: int = param(0, "Triton BLOCK_K: depth of one K step (0 = default)", choices=(0, 16, 32, 64, 128, 256))
    group_m: int = param(8, "GROUP_M: tile rows per band of the launch order (1 = row by row)", min=1, max=64)
    num_warps: int = param(0, "warps per program (0 = default)", choices=(0, 2, 4, 8, 16))
    num_stages: int = param(0, "tiles in flight in shared memory (0 = default)", choices=(0, 1, 2, 3, 4, 5, 6))
    tma: str = param("auto", "use the TMA copy engine where the GPU (Hopper+) and the strides allow it",
                     choices=("auto", "off"))
    streamk: str = param("off", "stream-K: share out the K steps of the partial last wave among all SMs (TMA path, "
                                "the big tile unless set)", choices=("off", "on"))
    autotune: bool = param(False, "let Triton time a handful of configs at each size and keep the best (slower)")


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
    if config is not big and EARLY_START and row_tail_applies(n, NARROW_TILE, dtype, sm_count, compute_capability):
        return dataclasses.replace(NARROW_TILE, row_tail=True)  # one full wave of 128 x 128 tiles, short tiles after
    if config is not big:
        return _deepest_in_one_wave(n, config, dtype, sm_count, compute_capability)
    if edge_applies(n, big, dtype, sm_count, compute_capability):
        return dataclasses.replace(big, edge=True)
    if row_tail_applies(n, big, dtype, sm_count, compute_capability):
        return dataclasses.replace(big, row_tail=True)
    narrow_gain = wave_fill(n, NARROW_TILE, dtype, sm_count, compute_capability) - \
        wave_fill(n, big, dtype, sm_count, compute_capability)
    return NARROW_TILE if narrow_gain >= WAVE_GAIN else big


def _deepest_in_one_wave(n: int, config: TileConfig, dtype: str, sm_count: int,
                         compute_capability: str) -> TileConfig:
    """`config` with the most stages (SMALL_STAGES) whose programs per SM still run every tile in one wave: a
    deeper pipeline hides more of a load's latency, but a second wave for a few tiles costs a whole tile's time."""
    for stages in SMALL_STAGES.get((config.block_m, config.block_n), ()):
        deeper = dataclasses.replace(config, num_stages=stages)
        if tiles_of(n, deeper) <= sm_count * blocks_per_sm(deeper, dtype, "tma", compute_capability):
            return deeper
    return config


def row_tail_applies(n: int, big: TileConfig, dtype: str, sm_count: int, compute_capability: str = "9.0") -> bool:
    """The row tail is worth its second launch when the big tile makes at least one full wave and a last wave
    less than ROW_TAIL_FILL full (the SMs of the last wave would mostly idle)."""
    slots = sm_count * max(1, blocks_per_sm(big, dtype, "tma", compute_capability))
    tiles = tiles_of(n, big)
    return tiles > slots and 0 < tiles % slots < ROW_TAIL_FILL * slots


def config_for(params: Params, dtype: str, n: Optional[int] = None, sm_count: Optional[int] = None,
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
    """TileConfig.label read back ("128x256x64 G8 w8 s3", " SK" for stream-K); None if it is not one."""
    try:
        parts = label.split()
        bm, bn, bk = (int(x) for x in parts[0].split("x"))
        pieces = next((p[1:].split("x") for p in parts[4:] if p.startswith("P")), None)
        rows, cols = (tuple(tuple(int(x) for x in side.split("+")) for side in pieces) if pieces else ((), ()))
        rows, cols = (rows if len(rows) > 1 else ()), (cols if len(cols) > 1 else ())  # one piece: written as ()
        return TileConfig(bm, bn, bk, int(parts[1][1:]), int(parts[2][1:]), int(parts[3][1:]), "SK" in parts[4:],
                          "ST" in parts[4:], "RT" in parts[4:], "EG" in parts[4:], rows, cols)
    except (AttributeError, IndexError, ValueError):
        return None


FLOOR_NOTE = ("The smallest product (one 64 x 64 tile, one K step), timed like the others, took {:.1f} us: the model's "
              "floor. With 8 more K steps it took {:.2f} us more, so a tile's load takes about {:.2f} us to arrive.")


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


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run (scripts/repredict.py): with the floor and load latency that run probed
    (older runs: the floor alone), and for each point the tile config the kernel actually ran (its `config`
    column), as the live run predicts it."""
    from labs.engine.params import from_dict

    params = from_dict(Params, {k: v for k, v in recording["params"].items()
                                if k in {f.name for f in dataclasses.fields(Params)}})
    ran = {(r.get("dtype"), r.get("n")): parse_label(r.get("config")) for r in recording["rows"]
           if r.get("kernel") == "triton"}
    floor = recorded_floor_us(recording)
    latency = next((float(r["load_latency_us"]) for r in recording["rows"] if r.get("load_latency_us") is not None),
                   None)
    before = _FLOOR_PROBED.get(target.key), _LATENCY_PROBED.get(target.key)
    early_before = EARLY_START
    _set_early_start(any(r.get("early_start") for r in recording["rows"]))  # older runs: plain stream order
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
        _set_early_start(early_before)
        for probed, value in zip((_FLOOR_PROBED, _LATENCY_PROBED), before):
            if value is None:
                probed.pop(target.key, None)
            else:
                probed[target.key] = value


def _set_early_start(on: bool) -> None:
    global EARLY_START
    EARLY_START = bool(on)


def predict(params: Params, target: Target) -> list[dict]:
    return [predict_point(n, dtype, config_for(params, dtype, n, target.sm_count, target.compute_capability), target,
                          params.tma)
            for dtype in params.dtypes for n in params.sizes if "triton" in params.kernels]


def bytes_needed(n: int, dtype: str) -> int:
    """A, B and one output, plus the 256 MB buffer do_bench clears the L2 with."""
    return 2 * n * n * timing.element_bytes(dtype) + n * n * out_bytes(dtype) + 256 * 2**20


def check(params: Params, target: Target) -> None:
    """Refuse, before allocating anything, dtypes this GPU lacks and sizes that do not fit."""
    support = dtype_support(target)
    for dtype in params.dtypes:
        if support.get(dtype):
            raise ParamError(support[dtype])
    free = free_memory_bytes() if target.live else target.memory_bytes
    for dtype in params.dtypes:
        n = max(params.sizes)
        need = bytes_needed(n, dtype)
        if need > 0.9 * free:
            largest = max(s for s in range(16, 32769, 16) if bytes_needed(s, dtype) <= 0.9 * free) \
                if bytes_needed(16, dtype) <= 0.9 * free else 0
            raise ParamError(f"N = {n} in {dtype} needs {need / 1e9:.1f} GB (A, B, C and the L2 flush buffer); "
                             f"this GPU has {free / 1e9:.1f} GB free. Choose sizes up to {largest}.")
    for dtype in params.dtypes:
        cfg = config_for(params, dtype, compute_capability=target.compute_capability)
        if blocks_per_sm(cfg, dtype, "vec16", target.compute_capability) == 0:
            raise ParamError(f"Tile {cfg.label} needs {shared_bytes(cfg, dtype, 'vec16') // 1024} KiB of shared "
                             f"memory in {dtype}; an SM of {target.name} has "
                             f"{sm_shape(target.compute_capability).smem_bytes // 1024} KiB. "
                             "Choose smaller blocks or fewer stages.")


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
PROBE_TMA = (517, 528, 560)  # M odd; N and K multiples of 16 elements so the TMA path applies
PROBE_ROW_TAIL_SLOTS = 7  # 15 big tiles of PROBE_TMA in 2 waves of 7: rows 0-511 big, the other 5 in the tail
PROBE_ODD = (333, 347, 351)  # all odd: the pointer path, element by element, every edge partial


def kernel_ms(fn) -> float:
    """Median time of one call replayed from a CUDA graph (do_bench on the replay, L2 flushed before
    each): a Triton launch with TMA descriptors costs tens of microseconds of Python, which would
    otherwise show up in place of the kernel's own time at small N. cuBLAS is timed the same way."""
    return timing.graph_time_ms(fn)


def probe_check(dtype: str, params: Params, path_kind: str, device: str = "cuda",
                config: Optional[TileConfig] = None) -> float:
    """Check the Triton kernel (with `config`, default: the dtype's) on small odd shapes against a full
    float64 product."""
    m, n, k = PROBE_TMA if path_kind == "tma" else PROBE_ODD
    a, b = operands(m, n, k, dtype, device)
    out = torch.full((m, n), float("nan"), device=a.device, dtype=out_dtype(dtype))
    config = config or config_for(params, dtype, compute_capability=_device_cc(a.device))
    # a row-tail config on a few slots, so that this small shape runs both of its launches
    triton_matmul(a, b, dtype, out, config, params.tma if path_kind == "tma" else "off", params.autotune,
                  programs=PROBE_ROW_TAIL_SLOTS if config.row_tail else None)
    return timing.check_close(out, reference(a, b), dtype,
                             f"Triton matmul ({dtype}, {m}x{n}x{k}, {path_kind}, {config.label})")


def measure(params: Params, target: Target, progress):
    total = len(params.dtypes) * len(params.sizes) * len(params.kernels)
    done = 0
    cc = target.compute_capability
    if "triton" in params.kernels and target.key not in _FLOOR_PROBED:
        progress(0.0, "probe: the time of the smallest product (the floor under every point)")
        floor = probe_floor_us(target)
        lat = load_latency_us(target)
        yield FLOOR_NOTE.format(floor, lat * LATENCY_STEPS / (FLOOR_TILE.num_stages - 1), lat)
    for dtype in params.dtypes:
        if "triton" in params.kernels:
            # every (load path, tile config) the sweep uses, checked on small odd shapes first
            kinds = {("tma" if load_path(n, dtype, cc, params.tma) == "tma" else "ptr",
                      config_for(params, dtype, n, target.sm_count, cc)) for n in params.sizes}
            for kind, config in sorted(kinds, key=lambda kc: (kc[0], kc[1].label)):
                progress(done / total, f"{dtype}: compiling and checking the Triton kernel ({kind} path, "
                                       f"{config.label}) against float64")
                probe_check(dtype, params, kind, config=config)
        for n in params.sizes:
            a, b = operands(n, n, n, dtype)
            out = torch.full((n, n), float("nan"), device=a.device, dtype=out_dtype(dtype))
            for kernel in params.kernels:
                progress(done / total, f"{dtype}, N = {n}: {kernel}")
                row = {"kernel": kernel, "dtype": dtype, "n": n, "pow2": pow2_dividing(n, 256)}
                done += 1
                if kernel == "cublas":
                    if dtype == "fp8" and n % 16:
                        row["note"] = "cuBLAS fp8 (torch._scaled_mm) needs N divisible by 16"
                        yield row
                        continue
                    with timing.tf32(dtype == "tf32"):
                        c = cublas_matmul(a, b, dtype, None if dtype == "fp8" else out.fill_(float("nan")))
                        err = check_sampled(c, a, b, dtype, f"cuBLAS ({dtype}, N={n})")
                        ms = kernel_ms(lambda: cublas_matmul(a, b, dtype, None if dtype == "fp8" else out))
                    del c
                else:
                    config = config_for(params, dtype, n, target.sm_count, cc)
                    out.fill_(float("nan"))
                    _, path, compiled = triton_matmul(a, b, dtype, out, config, params.tma, params.autotune)
                    err = check_sampled(out, a, b, dtype, f"Triton ({dtype}, N={n}, {path})")
                    ms = kernel_ms(lambda: triton_matmul(a, b, dtype, out, config, params.tma, params.autotune))
                    row.update({"path": path, "config": (chosen_config(_autotuned("tma" if path == "tma" else "ptr",
                                                                                  a.element_size()))
                                                         if params.autotune else config.label)})
                    row.update(_compiled_resources(compiled))
                    row["early_start"] = EARLY_START  # how the row tail's / edge's launches ran (for re-predicting)
                    row["floor_us"] = fixed_us(target)  # the probed figures the model used (for re-predicting)
                    row["load_latency_us"] = load_latency_us(target)
                row.update({"measured_ms": ms, "measured_tflops": timing.tflops(2.0 * n**3, ms),
                            "check_rel_error": err})
                yield row
            del a, b, out
    progress(1.0, "done")


def _compiled_resources(compiled) -> dict:
    """Registers per thread and shared memory of the compiled kernel, where Triton reports them."""
    try:
        return {"kernel_regs": int(compiled.n_regs), "kernel_smem_bytes": int(compiled.metadata.shared)}
    except (AttributeError, TypeError, ValueError):
        return {}


# ---------------------------------------------------------------------------------------------
# Lesson numbers
# ---------------------------------------------------------------------------------------------
# Issue 15's bar for our kernel: at least this share of cuBLAS's speed at every TMA-aligned N from 1024 on (below
# 1024 a launch is mostly fixed cost; unaligned rows take the slower pointer path by design)
LIBRARY_TARGET = 0.9
LIBRARY_TARGET_FROM_N = 1024


def library_ratios(rows: list) -> list[dict]:
    """Our Triton kernel against cuBLAS in the same run, one row per (dtype, N) where both were timed: the speed
    ratio is cuBLAS's time over ours (1.0 = as fast, above 1 faster), with the target where the issue sets one
    (labs/repredict.py gathers these from every recording for the scorecard)."""
    times = {(r["dtype"], r["n"], r["kernel"]): r["measured_ms"] for r in rows
             if r.get("kernel") in KERNELS and r.get("measured_ms")}
    paths = {(r["dtype"], r["n"]): r.get("path") for r in rows if r.get("kernel") == "triton"}
    out = []
    for (dtype, n), path in sorted(paths.items()):
        ours, library = times.get((dtype, n, "triton")), times.get((dtype, n, "cublas"))
        if not (ours and library):
            continue
        aligned = path == "tma"
        out.append({"case": f"{dtype} N = {n}" + ("" if aligned else " (unaligned)"), "ours": "Triton",
                    "library": "cuBLAS", "speed_ratio": library / ours,
                    "target": LIBRARY_TARGET if aligned and n >= LIBRARY_TARGET_FROM_N else None})
    return out


def lesson_numbers(target: Target) -> dict:
    """Numbers for the lesson text, for this GPU (SM count, ceilings, the lecture's 1792/1793 puzzle)."""
    bf16 = DEFAULT_CONFIGS["bf16"]
    g1792 = tile_grid(1792, 1792, 256, 128, target.sm_count)
    g1793 = tile_grid(1793, 1793, 256, 128, target.sm_count)
    p2048 = predict_point(2048, "bf16", bf16, target)
    p2304 = predict_point(2304, "bf16", bf16, target)
    peak = target.ceilings.matmul_tflops.get("bf16") or 0.0
    e = timing.element_bytes("bf16")
    return {
        "gpu": target.name,
        "sms": str(target.sm_count),
        "bf16_tflops": f"{peak:.0f}",
        "copy_tbps": f"{target.ceilings.copy_tbps:.2f}",
        "ridge_n_bf16": f"{peak / target.ceilings.copy_tbps * (3 * e) / 2:.0f}" if peak else "?",
        "tile": f"{bf16.block_m}x{bf16.block_n}",
        "block_k": str(bf16.block_k),
        "tiles_1792": str(g1792["tiles"]), "tiles_1793": str(g1793["tiles"]),
        "waves_1792": str(g1792["waves"]), "waves_1793": str(g1793["waves"]),
        "util_1793": f"{100 * g1793['wave_util']:.0f}",
        "tiles_2048": str(p2048.get("tiles", "?")), "waves_2048": str(p2048.get("waves", "?")),
        "tiles_2304": str(p2304.get("tiles", "?")), "waves_2304": str(p2304.get("waves", "?")),
        "util_2304": f"{100 * p2304.get('last_wave_util', 0):.0f}",
        "pred_2048": f"{p2048.get('predicted_tflops', 0):.0f}", "pred_2304": f"{p2304.get('predicted_tflops', 0):.0f}",
        "ceilings_source": target.describe_ceilings(),
    } | _row_tail_numbers(target) | _edge_numbers(target) | _ladder_numbers(target)


def _row_tail_numbers(target: Target, n: int = 3072) -> dict:
    """The row tail at N = 3072 on this GPU: big tiles, full waves, the rows left over and their short tiles."""
    big = DEFAULT_CONFIGS["bf16"]
    slots = target.sm_count * max(1, blocks_per_sm(big, "bf16", "tma", target.compute_capability))
    tiles = tiles_of(n, big)
    rows = row_tail_rows(n, n, big, slots)
    tail = ROW_TAIL_TILE
    return {"rt_tiles": str(tiles), "rt_full_waves": str(tiles // slots), "rt_last_wave": str(tiles % slots),
            "rt_big_rows": str(rows), "rt_tail_rows": str(n - rows),
            "rt_tail_tile": f"{tail.block_m}x{tail.block_n}",
            "rt_tail_tiles": str(math.ceil((n - rows) / tail.block_m) * math.ceil(n / tail.block_n))}


def _edge_numbers(target: Target, n: int = 2064) -> dict:
    """Interior + edge at N = 2064 on this GPU: tiles over all of C against whole tiles inside, and the strips."""
    big = DEFAULT_CONFIGS["bf16"]
    slots = target.sm_count * max(1, blocks_per_sm(big, "bf16", "tma", target.compute_capability))
    rows, cols = edge_interior(n, n, big)
    inner = (rows // big.block_m) * (cols // big.block_n)
    bottom = math.ceil((n - rows) / EDGE_ROW_TILE.block_m) * math.ceil(n / EDGE_ROW_TILE.block_n)
    right = math.ceil(rows / EDGE_COL_TILE.block_m) * math.ceil((n - cols) / EDGE_COL_TILE.block_n)
    return {"eg_tiles": str(tiles_of(n, big)), "eg_waves": str(math.ceil(tiles_of(n, big) / slots)),
            "eg_inner": str(inner), "eg_inner_waves": str(math.ceil(inner / slots)), "eg_rows": str(rows),
            "eg_strip": str(n - rows), "eg_edge_tiles": str(bottom + right),
            "eg_row_tile": f"{EDGE_ROW_TILE.block_m}x{EDGE_ROW_TILE.block_n}",
            "eg_col_tile": f"{EDGE_COL_TILE.block_m}x{EDGE_COL_TILE.block_n}",
            "eg_applies": "yes" if edge_applies(n, big, "bf16", target.sm_count, target.compute_capability) else "no",
            "eg_share": f"{100 * (1 - rows * cols / n**2):.1f}"}


def _ladder_numbers(target: Target) -> dict:
    from labs import matmul_ladder  # the ladder's lesson lives in this lab's Markdown too

    return {f"ladder_{k}": v for k, v in matmul_ladder.lesson_numbers(target).items()}


from labs.matmul.counters import COUNTERS  # noqa: E402  (how ncu counts this lab)

LAB = Lab(
    name="matmul",
    title="Matmul: tiles, waves and alignment",
    summary="Sweep square matmuls from 256 to 8192 and watch throughput climb the roofline, split into lines "
            "by divisibility and dip at wave boundaries, for cuBLAS and a Triton kernel, against a model.",
    terms=("matmul", "tiling", "tile-quantization", "wave-quantization", "tensor-core", "sm", "cublas", "triton",
           "tma", "coalescing", "shared-memory", "l2-cache", "bf16", "fp16", "tf32", "fp8", "roofline",
           "arithmetic-intensity", "occupancy"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("kernel", "dtype", "n"),
    metric="tflops",
    order=20,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What TFLOP/s will the Triton kernel reach in bf16 at N = 2304, just 12% above N = 2048?",
                      "TFLOP/s", {"kernel": "triton", "dtype": "bf16", "n": 2304}, "tflops"),
    counters=COUNTERS,
)
