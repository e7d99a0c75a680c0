"""
FlashAttention: tiling, the online softmax and recomputation in one kernel
==========================================================================

What you will learn:
- why naive attention is memory-bound and memory-hungry: it writes the N x N scores S = QK^T and
  probabilities P = softmax(S) to device memory and reads them back, so its memory grows as N^2;
- the online softmax: a row's softmax can be computed tile by tile, keeping only a running max,
  a running sum and a rescaled partial output, so S and P never leave the chip;
- recomputation: the backward pass keeps only the log-sum-exp of each row (N numbers, not N^2) and
  recomputes P tile by tile, trading cheap arithmetic for expensive memory;
- what then limits the speed: the matrix multiplies on the tensor cores *plus* the exponentials on
  the special-function units, which in this schedule do not overlap.

The file reads top to bottom: the online softmax in numpy (the idea), the tile picture, the
Triton kernels (forward, then backward), the Python launchers with autograd, the references
(float64, naive PyTorch, PyTorch SDPA), the model (FLOPs, bytes, memory, time) and the measurement.

Conventions: q is (B, H, Lq, d) or (B, Lq, d); k and v are (B, H, Lk, d) or (B, Lk, d). With
causal=True and Lq != Lk the mask is aligned to the bottom right, as in FlashAttention-2: query i
sees key j when j <= i + (Lk - Lq), so the last query sees every key. A query that sees no key
(possible when Lq > Lk) gets output 0 and log-sum-exp -inf.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine.gpu import Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

try:  # host-side TMA descriptors (Triton >= 3.3); without them the kernels use pointer loads
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the hardware has a fast exp2
LN2 = 0.6931471805599453
HEAD_DIMS = (16, 32, 64, 128)
LSE_ALIGN = 128  # the log-sum-exp rows are padded to this (the largest query tile) so tiles need no mask


# ---------------------------------------------------------------------------------------------
# 1. The idea, in numpy: the online softmax of one row of scores
# ---------------------------------------------------------------------------------------------
def online_softmax_steps(scores, values, tile: int) -> list[dict]:
    """Process one query's scores tile by tile, as the kernel does; return the state after each tile.

    scores: (L,) one row of scaled scores s_j; values: (L, dv) the value vectors v_j; tile: keys per step.
    Each step holds the running max m, the running sum l = sum_j exp(s_j - m), the unnormalised partial
    output o = sum_j exp(s_j - m) v_j, and alpha = exp(m_old - m_new), the factor that rescales the old
    l and o when a larger score arrives. After the last step o / l equals softmax(scores) @ values.
    """
    s = np.asarray(scores, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64).reshape(len(s), -1)
    if tile < 1:
        raise ParamError("tile must be at least 1 key.")
    m, l, o = -np.inf, 0.0, np.zeros(v.shape[1])
    steps = []
    for start in range(0, len(s), tile):
        block = s[start:start + tile]
        m_new = max(m, float(block.max()))
        alpha = math.exp(m - m_new) if m > -np.inf else 0.0  # rescales what was summed under the old max
        p = np.exp(block - m_new)  # this tile's unnormalised probabilities, all <= 1
        l = l * alpha + float(p.sum())
        o = o * alpha + p @ v[start:start + tile]
        m = m_new
        steps.append({"step": len(steps), "start": start, "stop": start + len(block), "tile_max": float(block.max()),
                      "m": m, "alpha": alpha, "l": l, "lse": m + math.log(l), "o": o.copy(), "output": o / l,
                      "p_tile": p.copy()})
    return steps


def softmax_at_once(scores, values) -> dict:
    """The textbook computation that the steps must end equal to: softmax over the whole row, then @ values."""
    s = np.asarray(scores, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64).reshape(len(s), -1)
    p = np.exp(s - s.max())
    p = p / p.sum()
    return {"p": p, "output": p @ v, "m": float(s.max()), "l": float(np.exp(s - s.max()).sum()),
            "lse": float(s.max() + np.log(np.exp(s - s.max()).sum()))}


# ---------------------------------------------------------------------------------------------
# 2. The tile picture: which tiles one program of the forward kernel visits
# ---------------------------------------------------------------------------------------------
def visible_range(m0: int, rows: int, lq: int, lk: int, block_n: int, causal: bool) -> tuple[int, int, int]:
    """For the query tile [m0, m0 + rows): (full_end, hi, shift).

    Key tiles [0, full_end) are visible to every row and run without a mask; [full_end, hi) need the
    mask (the causal diagonal or the end of the keys); keys from hi on are never visited.
    """
    shift = lk - lq
    if causal:
        hi = max(0, min(lk, m0 + rows + shift))  # past the last row's diagonal: skipped
        full = max(0, min(lk, m0 + 1 + shift))  # keys the first row already sees: every row sees them
    else:
        hi, full = lk, lk
    return (full // block_n) * block_n, hi, shift


def tile_map(lq: int, lk: int, block_m: int, block_n: int, causal: bool) -> list[list[str]]:
    """state[i][j] of query tile i and key tile j: 'full' (no mask), 'masked' (diagonal or ragged end),
    'skipped' (never loaded: every score in it is masked out by causality)."""
    n_m, n_n = max(1, -(-lq // block_m)), max(1, -(-lk // block_n))
    grid = []
    for i in range(n_m):
        full_end, hi, _ = visible_range(i * block_m, block_m, lq, lk, block_n, causal)
        row = []
        for j in range(n_n):
            start = j * block_n
            row.append("full" if start < full_end else "masked" if start < hi else "skipped")
        grid.append(row)
    return grid


def tile_counts(lq: int, lk: int, block_m: int, block_n: int, causal: bool) -> dict:
    """How many tiles of the map are full, masked and skipped (one row of tiles at a time, no map built)."""
    n_m, n_n = max(1, -(-lq // block_m)), max(1, -(-lk // block_n))
    full = masked = 0
    for i in range(n_m):
        full_end, hi, _ = visible_range(i * block_m, block_m, lq, lk, block_n, causal)
        visited = -(-hi // block_n)
        full += full_end // block_n
        masked += visited - full_end // block_n
    return {"full": full, "masked": masked, "skipped": n_m * n_n - full - masked, "tiles": n_m * n_n}


def stepper_example(length: int = 24, seed: int = 0, dv: int = 2) -> tuple:
    """A row of scores for the stepper: mostly small, with a few large ones arriving late, so the running
    max jumps and the rescaling shows. Returns (scores (length,), values (length, dv))."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(0.0, 1.0, length)
    late = rng.choice(np.arange(length // 3, length), size=max(1, length // 8), replace=False)
    scores[late] += rng.uniform(2.0, 4.0, len(late))
    return np.round(scores, 2), np.round(rng.normal(0.0, 1.0, (length, dv)), 2)


# ---------------------------------------------------------------------------------------------
# 3. The forward kernel (FlashAttention-2: one program per query tile, K and V streamed through SRAM)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _load_tile(ptr, desc, head_row, row0, rows_valid, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
               USE_TMA: tl.constexpr, MASK_ROWS: tl.constexpr):
    """Rows [row0, row0 + ROWS) of one head's (L, d) matrix: `ptr` points at the head's first row, which
    is row `head_row` of the flattened (B*H*L, d) tensor that `desc` describes.

    With TMA the copy engine fetches the whole tile (rows past this head's end are the next head's
    rows, or zeros at the very end of the tensor: every caller masks or ignores them). Without TMA
    each thread loads its part; rows past the end read as zeros when MASK_ROWS is set.
    """
    if USE_TMA:
        return desc.load([head_row + row0, 0])
    offs = tl.arange(0, ROWS)
    ptrs = ptr + (row0 + offs)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    if MASK_ROWS:
        return tl.load(ptrs, mask=(offs < rows_valid)[:, None], other=0.0)
    return tl.load(ptrs)


@triton.jit
def _mma(a, b, acc, PREC: tl.constexpr):
    """a @ b (+ acc) on the tensor cores, accumulated in fp32.

    PREC is "ieee" for fp32 inputs (exact fp32 products, not TF32), "tf32" otherwise (ignored for 16-bit
    inputs); "upcast" multiplies 16-bit inputs as fp32, which gives the same exact products: Triton's CPU
    interpreter needs it because its bf16 dot is wrong.
    """
    if PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _fwd_key_tiles(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, offs_m, lo, hi, qk_scale, LK, SHIFT,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                   USE_TMA: tl.constexpr, PREC: tl.constexpr, WS: tl.constexpr, LAZY: tl.constexpr):
    """Stream key tiles [lo, hi) past one query tile, updating the online-softmax state (acc, l_i, m_i).

    Scores are kept in log2 units (qk_scale = scale * log2 e) so that every exponential is one exp2.
    WS asks Triton to warp-specialize the loop: producer warps issue the tile loads while consumer
    warps run the matrix multiplies and the softmax. LAZY rescales the output only when the running max
    grows a lot (FlashAttention-4's trick): one multiply per output element less on most tiles, and off
    the path between the two matrix multiplies.
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_tile(k_base, k_desc, kv_row, start_n, LK - start_n, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
        qk = _mma(q, tl.trans(k), None, PREC)  # (BLOCK_M, BLOCK_N) scores, fp32, never leave the chip
        if MASKED:  # the causal diagonal or the ragged end of the keys: masked scores are -inf
            cols = start_n + offs_n
            keep = cols[None, :] < LK
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + SHIFT)
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: no NaN
            p = tl.math.exp2(qk - m_use[:, None])
        else:  # every score is valid: one fused multiply-add per score, no mask
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            if LAZY:  # keep the old max (and skip rescaling acc) unless a row's max grew by over 8, i.e. 256x
                if tl.max(m_new - m_i, 0) > 8.0:
                    grow = tl.math.exp2(m_i - m_new)
                    l_i = l_i * grow
                    acc = acc * grow[:, None]
                    m_i = m_new
                m_new = m_i  # p <= 2^8 under a stale max: exact in float32, and the final o / l is unchanged
            m_use = m_new
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one MUFU.EX2 per score: the SFU's work
        if LAZY and not MASKED:
            l_i = l_i + tl.sum(p, 1)
        else:
            alpha = tl.math.exp2(m_i - m_use)  # how much the old running sum and output shrink under the new max
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
        v = _load_tile(v_base, v_desc, kv_row, start_n, LK - start_n, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
        acc = _mma(p.to(v.dtype), v, acc, PREC)  # partial output += P_tile @ V_tile
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_key_tiles_prefetch(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, lo, hi, qk_scale, LK,
                            HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr, PREC: tl.constexpr):
    """The unmasked key tiles [lo, hi) (hi > lo), with the next tile's scores issued before this tile's softmax.

    FlashAttention-3's overlap inside one program: S_{j+1} = Q K_{j+1}^T is handed to the tensor cores first,
    then the exponentials of S_j run on the SFUs while it computes; two score tiles are live at once (more
    registers). The last tile has no successor and runs after the loop.
    """
    k = _load_tile(k_base, k_desc, kv_row, lo, LK - lo, BLOCK_N, HEAD_DIM, USE_TMA, False)
    qk = _mma(q, tl.trans(k), None, PREC)  # S_lo
    for start_n in tl.range(lo, hi - BLOCK_N, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_tile(k_base, k_desc, kv_row, start_n + BLOCK_N, LK - start_n - BLOCK_N, BLOCK_N, HEAD_DIM,
                       USE_TMA, False)
        qk_next = _mma(q, tl.trans(k), None, PREC)  # S_{j+1}: in flight during the softmax of S_j
        acc, l_i, m_i = _softmax_then_pv(acc, l_i, m_i, qk, qk_scale, v_base, v_desc, kv_row, start_n, LK,
                                         HEAD_DIM, BLOCK_N, USE_TMA, PREC)
        qk = qk_next
    last = hi - BLOCK_N  # the last tile: its scores are already computed
    return _softmax_then_pv(acc, l_i, m_i, qk, qk_scale, v_base, v_desc, kv_row, last, LK, HEAD_DIM, BLOCK_N,
                            USE_TMA, PREC)


@triton.jit
def _softmax_then_pv(acc, l_i, m_i, qk, qk_scale, v_base, v_desc, kv_row, start_n, LK, HEAD_DIM: tl.constexpr,
                     BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr, PREC: tl.constexpr):
    """One unmasked online-softmax step of the prefetching loop: the tile's scores qk -> probabilities under the
    new running max, the old sum and output rescaled, then output += P @ V_tile. Returns (acc, l_i, m_i)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = _load_tile(v_base, v_desc, kv_row, start_n, LK - start_n, BLOCK_N, HEAD_DIM, USE_TMA, False)
    acc = _mma(p.to(v.dtype), v, acc, PREC)
    return acc, l_i, m_new


@triton.jit(do_not_specialize=["LQ", "LK"])
def attention_fwd_kernel(Q, K, V, O, LSE, q_desc, k_desc, v_desc, qk_scale, LQ, LK, LQ_PAD,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, PREC: tl.constexpr, WS: tl.constexpr,
                         LAZY: tl.constexpr, PREFETCH: tl.constexpr = False, ONE_LOOP: tl.constexpr = False,
                         MASK_ALL: tl.constexpr = True):
    # grid = (query tiles, batch * heads); consecutive programs share a head, so its K and V stay in L2
    pid_m = tl.program_id(0)
    if CAUSAL:  # causal tiles near the end see the most keys: launch them first so the last wave is short
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    m0 = pid_m * BLOCK_M
    kv_row = bh * LK  # first row of this head in the flattened (B*H*L, d) tensors
    q_base = Q + bh.to(tl.int64) * LQ * HEAD_DIM
    k_base = K + bh.to(tl.int64) * LK * HEAD_DIM
    v_base = V + bh.to(tl.int64) * LK * HEAD_DIM
    offs_m = m0 + tl.arange(0, BLOCK_M)

    q = _load_tile(q_base, q_desc, bh * LQ, m0, LQ - m0, BLOCK_M, HEAD_DIM, USE_TMA, True)  # stays on chip throughout
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running unnormalised output

    # key tiles [0, full_end) need no mask; [full_end, hi) are the diagonal or the ragged end; the rest is skipped
    SHIFT = LK - LQ
    if CAUSAL:
        hi = tl.maximum(0, tl.minimum(LK, m0 + BLOCK_M + SHIFT))
        full_end = tl.maximum(0, tl.minimum(LK, m0 + 1 + SHIFT))
    else:
        hi = LK
        full_end = LK
    full_end = (full_end // BLOCK_N) * BLOCK_N
    if ONE_LOOP:  # every key tile in one loop, masked where MASK_ALL (causal or ragged keys): Triton 3.6's Hopper
        # warp specialization splits one loop per kernel into a loading warp group and two consumer warp groups
        # of BLOCK_M / 2 rows each (FlashAttention-3's shape); a second loop after it fails to compile
        acc, l_i, m_i = _fwd_key_tiles(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, offs_m, 0, hi,
                                       qk_scale, LK, SHIFT, HEAD_DIM, BLOCK_N, CAUSAL, MASK_ALL, USE_TMA, PREC, WS,
                                       False)
    elif PREFETCH:  # the next tile's scores overlap this tile's exponentials (FlashAttention-3's schedule)
        if full_end > 0:
            acc, l_i, m_i = _fwd_key_tiles_prefetch(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, 0,
                                                    full_end, qk_scale, LK, HEAD_DIM, BLOCK_N, USE_TMA, PREC)
    else:
        acc, l_i, m_i = _fwd_key_tiles(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, offs_m, 0, full_end,
                                       qk_scale, LK, SHIFT, HEAD_DIM, BLOCK_N, CAUSAL, False, USE_TMA, PREC, WS, LAZY)
    if not ONE_LOOP:
        acc, l_i, m_i = _fwd_key_tiles(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, offs_m, full_end,
                                       hi, qk_scale, LK, SHIFT, HEAD_DIM, BLOCK_N, CAUSAL, True, USE_TMA, PREC, False,
                                       False)

    # epilogue: normalise once; the log-sum-exp (natural log) is all the backward pass needs
    empty = l_i == 0.0  # a query that sees no key (causal with Lq > Lk)
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc * (1.0 / l_safe)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(LSE + bh * LQ_PAD + offs_m, lse)  # padded rows: written, never read as valid
    o_ptrs = O + bh.to(tl.int64) * LQ * HEAD_DIM + offs_m[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(offs_m < LQ)[:, None])


# ---------------------------------------------------------------------------------------------
# 4. The backward kernels: recompute P tile by tile from Q, K and the saved log-sum-exp
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["LQ"])
def attention_bwd_prep_kernel(O, DO, LSE, DELTA, LSE2, LQ, LQ_PAD, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """delta_i = sum_d dO_i * O_i (the softmax backward's row term), and the log-sum-exp in log2 units.

    Rows past the end, and queries that saw no key, get lse2 = +inf so that exp2(s - lse2) = 0 there:
    the main kernels then need no mask for them.
    """
    bh = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < LQ
    ptrs = bh.to(tl.int64) * LQ * HEAD_DIM + offs[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(O + ptrs, mask=valid[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + ptrs, mask=valid[:, None], other=0.0).to(tl.float32)
    lse = tl.load(LSE + bh * LQ_PAD + offs)
    ok = valid & (lse != float("-inf"))
    tl.store(DELTA + bh * LQ_PAD + offs, tl.where(valid, tl.sum(o * do, 1), 0.0))
    tl.store(LSE2 + bh * LQ_PAD + offs, tl.where(ok, lse * 1.4426950408889634, float("inf")))


@triton.jit
def _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, q_desc, do_desc, LSE2, DELTA, q_row, lse_row, offs_n, lo, hi,
                      qk_scale, LQ, SHIFT, dq_base, dq_desc,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, USE_TMA: tl.constexpr,
                      ATOMIC_DQ: tl.constexpr, DQ_TMA: tl.constexpr, PREC: tl.constexpr, WS: tl.constexpr = False):
    """Stream query tiles [lo, hi) past one key tile: dV += P^T dO, dK += dS^T Q (and dQ += dS K atomically).

    With DQ_TMA the dQ share of this key tile is added to the float32 accumulator by the copy engine in one
    bulk reduction per tile (cp.reduce.async.bulk.tensor, as FlashAttention-3 does); otherwise one atomic add
    per element.
    """
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=WS):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_tile(q_base, q_desc, q_row, start_m, LQ - start_m, BLOCK_M, HEAD_DIM, USE_TMA, True)
        lse2 = tl.load(LSE2 + lse_row + offs_m)  # padded: +inf past the end
        qkT = _mma(k, tl.trans(q), None, PREC)  # (BLOCK_N, BLOCK_M): S^T recomputed
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])  # P^T, exact (lse is the row's true normaliser)
        if MASKED:  # causal diagonal: key n is visible to query m when n <= m + shift
            pT = tl.where(offs_n[:, None] <= offs_m[None, :] + SHIFT, pT, 0.0)
        do = _load_tile(do_base, do_desc, q_row, start_m, LQ - start_m, BLOCK_M, HEAD_DIM, USE_TMA, True)
        dv = _mma(pT.to(do.dtype), do, dv, PREC)
        delta = tl.load(DELTA + lse_row + offs_m)
        dpT = _mma(v, tl.trans(do), None, PREC)  # dP^T = V dO^T
        dsT = pT * (dpT - delta[None, :])  # softmax backward: dS = P * (dP - rowsum(dO * O))
        dk = _mma(dsT.to(q.dtype), q, dk, PREC)
        if ATOMIC_DQ:  # FlashAttention-2's original: every key tile adds its share of dQ
            dq = _mma(tl.trans(dsT.to(q.dtype)), k, None, PREC)
            if DQ_TMA:
                dq_desc.atomic_add([lse_row + start_m, 0], dq)  # rows past LQ add zeros: P is 0 there
            else:
                tl.atomic_add(dq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], dq, sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=["LQ", "LK"])
def attention_bwd_dkdv_kernel(Q, K, V, DO, DK, DV, DQ_ACC, LSE2, DELTA, q_desc, k_desc, v_desc, do_desc, dq_desc,
                              scale, qk_scale, LQ, LK, LQ_PAD,
                              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                              DQ_TMA: tl.constexpr, PREC: tl.constexpr, WS: tl.constexpr = False,
                              ONE_LOOP: tl.constexpr = False):
    # grid = (key tiles, batch * heads): one program owns dK and dV of BLOCK_N keys
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = Q + bh.to(tl.int64) * LQ * HEAD_DIM
    do_base = DO + bh.to(tl.int64) * LQ * HEAD_DIM
    kv_off = bh.to(tl.int64) * LK * HEAD_DIM
    k = _load_tile(K + kv_off, k_desc, bh * LK, n0, LK - n0, BLOCK_N, HEAD_DIM, USE_TMA, True)
    v = _load_tile(V + kv_off, v_desc, bh * LK, n0, LK - n0, BLOCK_N, HEAD_DIM, USE_TMA, True)
    if ATOMIC_DQ:  # keys past the end must add nothing to dQ: zero their rows of K
        k = tl.where((offs_n < LK)[:, None], k, 0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    # query tiles that see these keys: causal ones from the diagonal on; those past it see all BLOCK_N keys
    SHIFT = LK - LQ
    hi = tl.cdiv(LQ, BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = tl.minimum(hi, (tl.maximum(0, n0 - SHIFT) // BLOCK_M) * BLOCK_M)
        full = tl.minimum(hi, tl.maximum(lo, tl.cdiv(tl.maximum(0, n0 + BLOCK_N - 1 - SHIFT), BLOCK_M) * BLOCK_M))
    else:
        lo = 0
        full = 0
    dq_base = DQ_ACC + bh.to(tl.int64) * LQ_PAD * HEAD_DIM
    if ONE_LOOP:  # one loop (causal: every tile masked) that Triton 3.6 can warp-specialize, as in the forward
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, q_desc, do_desc, LSE2, DELTA, bh * LQ, bh * LQ_PAD,
                                   offs_n, lo, hi, qk_scale, LQ, SHIFT, dq_base, dq_desc, HEAD_DIM, BLOCK_M, CAUSAL,
                                   USE_TMA, ATOMIC_DQ, DQ_TMA, PREC, WS)
    else:
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, q_desc, do_desc, LSE2, DELTA, bh * LQ, bh * LQ_PAD,
                                   offs_n, lo, full, qk_scale, LQ, SHIFT, dq_base, dq_desc, HEAD_DIM, BLOCK_M, True,
                                   USE_TMA, ATOMIC_DQ, DQ_TMA, PREC)
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, q_desc, do_desc, LSE2, DELTA, bh * LQ, bh * LQ_PAD,
                                   offs_n, full, hi, qk_scale, LQ, SHIFT, dq_base, dq_desc, HEAD_DIM, BLOCK_M, False,
                                   USE_TMA, ATOMIC_DQ, DQ_TMA, PREC)
    ptrs = kv_off + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DV + ptrs, dv.to(DV.dtype.element_ty), mask=(offs_n < LK)[:, None])
    tl.store(DK + ptrs, (dk * scale).to(DK.dtype.element_ty), mask=(offs_n < LK)[:, None])


@triton.jit
def _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, kv_row, offs_m, lo, hi, qk_scale, LK, SHIFT,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                  USE_TMA: tl.constexpr, PREC: tl.constexpr):
    """Stream key tiles [lo, hi) past one query tile: dQ += dS K."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_tile(k_base, k_desc, kv_row, start_n, LK - start_n, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
        v = _load_tile(v_base, v_desc, kv_row, start_n, LK - start_n, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
        qk = _mma(q, tl.trans(k), None, PREC)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            cols = start_n + offs_n
            keep = cols[None, :] < LK
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + SHIFT)
            p = tl.where(keep, p, 0.0)
        dp = _mma(do, tl.trans(v), None, PREC)
        ds = p * (dp - delta[:, None])
        dq = _mma(ds.to(k.dtype), k, dq, PREC)
    return dq


@triton.jit(do_not_specialize=["LQ", "LK"])
def attention_bwd_dq_kernel(Q, K, V, O, DO, DQ, LSE, LSE2, DELTA, q_desc, k_desc, v_desc, do_desc, scale, qk_scale,
                            LQ, LK, LQ_PAD,
                            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, PREC: tl.constexpr):
    # grid = (all LQ_PAD rows in query tiles, batch * heads): one program owns dQ of BLOCK_M queries (no atomics).
    # It runs before the dK/dV kernel and also writes the rows' delta and log2-unit log-sum-exp that kernel
    # reads (the prep kernel's work, without its launch); tiles wholly past LQ only write those.
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q_off = bh.to(tl.int64) * LQ * HEAD_DIM
    kv_off = bh.to(tl.int64) * LK * HEAD_DIM
    q = _load_tile(Q + q_off, q_desc, bh * LQ, m0, LQ - m0, BLOCK_M, HEAD_DIM, USE_TMA, True)
    do = _load_tile(DO + q_off, do_desc, bh * LQ, m0, LQ - m0, BLOCK_M, HEAD_DIM, USE_TMA, True)
    valid = offs_m < LQ
    o = tl.load(O + q_off + offs_m[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], mask=valid[:, None],
                other=0.0)
    delta = tl.where(valid, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), 0.0)  # rowsum(dO * O)
    lse = tl.load(LSE + bh * LQ_PAD + offs_m)
    lse2 = tl.where(valid & (lse != float("-inf")), lse * 1.4426950408889634, float("inf"))  # +inf: P = 0 there
    tl.store(DELTA + bh * LQ_PAD + offs_m, delta)
    tl.store(LSE2 + bh * LQ_PAD + offs_m, lse2)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    SHIFT = LK - LQ
    if CAUSAL:
        hi = tl.maximum(0, tl.minimum(LK, m0 + BLOCK_M + SHIFT))
        full_end = tl.maximum(0, tl.minimum(LK, m0 + 1 + SHIFT))
    else:
        hi = LK
        full_end = LK
    hi = tl.where(m0 < LQ, hi, 0)  # a tile of padding rows visits no key
    full_end = tl.minimum((full_end // BLOCK_N) * BLOCK_N, hi)
    dq = _dq_key_tiles(dq, q, do, lse2, delta, K + kv_off, V + kv_off, k_desc, v_desc, bh * LK, offs_m, 0, full_end,
                       qk_scale, LK, SHIFT, HEAD_DIM, BLOCK_N, CAUSAL, False, USE_TMA, PREC)
    dq = _dq_key_tiles(dq, q, do, lse2, delta, K + kv_off, V + kv_off, k_desc, v_desc, bh * LK, offs_m, full_end, hi,
                       qk_scale, LK, SHIFT, HEAD_DIM, BLOCK_N, CAUSAL, True, USE_TMA, PREC)
    o_ptrs = DQ + q_off + offs_m[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(o_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=(offs_m < LQ)[:, None])


# ---------------------------------------------------------------------------------------------
# 5. Launchers: tile sizes, shapes, and autograd
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tiles:
    block_m: int  # queries per tile
    block_n: int  # keys per tile
    warps: int  # num_warps
    stages: int  # num_stages: how many tiles ahead the loads run (software pipelining)

    def __post_init__(self):
        # tl.dot needs at least 16 rows; the padded log-sum-exp rows (LSE_ALIGN) must hold whole query tiles
        for size in (self.block_m, self.block_n):
            if size not in (16, 32, 64, 128):
                raise ValueError(f"tile sizes must be 16, 32, 64 or 128; got {self.block_m} x {self.block_n}")


@dataclass(frozen=True)
class FlashConfig:
    fwd: Tiles
    dkdv: Tiles
    dq: Tiles
    use_tma: bool = False  # load tiles with the Hopper copy engine (TMA descriptors)
    # dQ by atomic adds inside the dK/dV kernel instead of its own kernel (5 matrix multiplies per tile pair
    # instead of 7). On the H100 (issue 15) it tied or lost: with d = 128 the program holds dK, dV, K, V and
    # the dQ tile in registers and spills (15.2 ms against 12.6 at N = 8192); FlashAttention-3 keeps K, V
    # and dQ in shared memory, which Triton does not let us choose.
    atomic_dq: bool = False
    # forward: every key tile in one loop (masked where causal or ragged), the shape Triton 3.6 warp-specializes on
    # Hopper with TMA loads (4 warps asked: one warp group loads, two consumer warp groups of block_m / 2 rows each
    # multiply and exponentiate, 12 warps in all); the request itself goes to Triton only with TRY_WARP_SPECIALIZE.
    # Triton ignores it for 8-warp programs and fails to compile a kernel with two loops.
    warp_specialize: bool = False
    dkdv_warp_specialize: bool = False  # the same for the dK/dV kernel (its key tile split between the consumers)
    tma_reduce: bool = True  # with atomic_dq and TMA: add each dQ tile by one bulk reduction of the copy engine
    lazy_rescale: bool = False  # forward: rescale the running output only when a row's max grows over 256x
    # forward: issue the next tile's Q K^T before this tile's exponentials (FlashAttention-3's overlap within a
    # program, at the price of a second score tile in registers). Triton 3.6 on the H100 ran it slower than the
    # plain loop for every tile shape tried but one (scripts/attention_gpu.py, phase r5), so it is off.
    prefetch_scores: bool = False


# Triton 3.6 compiles the one-loop kernels warp-specialized for sm_90 (12 warps, setmaxnreg), but on the H100 none of
# them finished: forward and dK/dV, d = 64 and 128, full and causal, lengths up to 1024, each still running after
# 75 s where the plain kernels' checks took 8 s (issue 15, round five: scripts/attention_gpu.py ws). So the lab runs
# the one-loop kernels without the request unless this is set (for trying a later Triton).
TRY_WARP_SPECIALIZE = False


def _has_tma(device: torch.device) -> bool:
    if TensorDescriptor is None:
        return False
    if device.type != "cuda":
        return True  # the interpreter implements descriptors: tests exercise both paths
    return _capability(device.index)[0] >= 9


@functools.lru_cache(maxsize=None)
def _capability(index) -> tuple:
    return torch.cuda.get_device_capability(index)


# Launching: at short sequences the GPU finishes a kernel sooner than Python prepares the next launch, so
# the launch path is part of the speed (issue 15: on the H100's slower host our forward call took several times
# the CPU time of SDPA's, and the timer showed it). Triton's `kernel[grid](...)` binds and specializes
# every argument on each call; once it has compiled a kernel for a given kind of arguments, `_launch` calls
# that compiled kernel directly. The key holds everything Triton specializes on (dtypes, 16-byte alignment
# of pointers, integers equal to 1 or divisible by 16, descriptor shapes and blocks, the constexprs and
# launch options), so a cached kernel is only reused where Triton would have chosen the same one. Our
# launchers pass a cheaper key of their own (`key=`): the shapes and dtypes every integer and descriptor
# argument derives from, and the pointers' alignment; without one, the key is read off every argument.
FAST_LAUNCH = True
LEAN_LAUNCH = True  # False: round four's launch (key read off every argument, through compiled[grid]), for timing
# Round six: a cached kernel is launched by calling Triton's C launch function itself, with the CUDA stream, the
# kernel handle and the packed metadata read once, and every tensor passed as its address (an int). Through
# compiled[grid] each launch also builds a closure, looks up the device and stream, builds launch metadata for
# hooks nobody set, calls two empty hook chains, and, for each tensor, calls data_ptr() and asks the driver
# whether the address is device memory (cuPointerGetAttribute): 9 tensors for each backward kernel.
# scripts/attention_gpu.py r6 times both. False: through compiled[grid] as in round five.
DIRECT_LAUNCH = True
_COMPILED: dict = {}
# Our launchers go one step further on the pointer-load path (no descriptors to encode per call): once a kind of call
# has run, everything about its launch but the addresses and scalars is fixed by its shapes, dtypes, tiles and mask,
# so _launch records it as a plan under that key (_PLANS), and the next call with all its tensors 16-byte aligned
# passes the addresses straight to the recorded launcher. No keyword arguments, descriptors, alignment tuples or
# launch keys are built, and the backward pass takes the addresses of delta and lse2 from one buffer without views.
_PLANS: dict = {}
_COMPILED_MAX = 4096  # kinds of call remembered (each shape is one): forgotten all at once past this


def _arg_kind(x):
    if isinstance(x, torch.Tensor):
        return x.dtype, x.data_ptr() % 16 == 0
    if x is None or isinstance(x, bool):
        return x
    if isinstance(x, int):
        return x == 1, x % 16 == 0, -2**31 <= x < 2**31
    if isinstance(x, float):
        return float
    if TensorDescriptor is not None and isinstance(x, TensorDescriptor):
        return (x.base.dtype, x.base.data_ptr() % 16 == 0, tuple(x.shape), tuple(x.strides), tuple(x.block_shape),
                getattr(x, "padding", None), getattr(x, "round_f32_to_tf32", None))  # fields differ by version
    return type(x), repr(x)


def _aligned(*tensors) -> tuple:
    """The 16-byte alignment of each tensor's first element: what Triton specializes pointers on."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors)


def _direct(compiled):
    """(launch, function handle, cooperative, pdl, packed metadata) of a compiled kernel whose C launch function
    this Triton exposes the way 3.6 does (CompiledKernel.run is a launcher whose .launch takes the grid, the stream,
    the function, two flags, two scratch buffers, the packed metadata, the launch metadata and two hooks, then every
    parameter); None where it does not, or where the kernel needs scratch memory allocated per launch."""
    try:
        from triton import knobs
        run = compiled.run
        if run.global_scratch_size or run.profile_scratch_size or run.num_ctas != 1:
            return None
        if knobs.runtime.launch_enter_hook.calls or knobs.runtime.launch_exit_hook.calls:
            return None  # a profiler listens to launches: let Triton call it
        return (run.launch, compiled.function, bool(run.launch_cooperative_grid), bool(run.launch_pdl),
                compiled.packed_metadata)
    except AttributeError:  # another Triton's interface
        return None


def _plan_key(kind: str, cfg: "FlashConfig", causal: bool, q4, k4) -> tuple:
    """The key of a recorded launch: the configuration by identity (hashing its fields costs more than the launch
    saves; the recorded plan holds the configuration, so its id cannot be reused while the plan lives), the mask,
    the shapes, the dtype and the device; everything else that Triton specializes on follows from these."""
    return kind, id(cfg), causal, q4.shape, k4.shape, q4.dtype, q4.get_device()


def _run_plan(hit, args) -> None:
    """Launch the plan `hit` (a _PLANS entry) with `args`: every parameter in order, tensors as their addresses."""
    launch, function, cooperative, pdl, packed, grid3, device, constexprs, _ = hit
    launch(*grid3, torch._C._cuda_getCurrentRawStream(device), function, cooperative, pdl, None, None, packed, None,
           None, None, *args, *constexprs)


def _launch(kernel, grid: tuple, *args, key=None, plan=None, owner=None, **meta):
    """kernel[grid](*args, **meta), through the compiled kernel directly when this kind of call ran before.
    key: what Triton specializes these arguments on, where the caller knows it (default: read off each one).
    plan: a key (_plan_key) under which to record this launch in _PLANS, given only where every tensor is 16-byte
    aligned and every other argument's specialization follows from the key; owner: the configuration it names."""
    global FAST_LAUNCH, DIRECT_LAUNCH
    if not (FAST_LAUNCH and args[0].is_cuda):
        kernel[grid](*args, **meta)
        return
    if not LEAN_LAUNCH:
        key = None
    device = args[0].get_device()
    key = (kernel, device, tuple(map(_arg_kind, args)) if key is None else key, tuple(meta.items()))
    hit = _COMPILED.get(key)
    if hit is not None:
        compiled, constexprs, direct = hit
        grid3 = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        if plan is not None and direct is not None and DIRECT_LAUNCH and LEAN_LAUNCH:
            if len(_PLANS) >= _COMPILED_MAX:  # a caller making a new configuration object per call: stay bounded
                _PLANS.clear()
            _PLANS[plan] = (*direct, grid3, device, constexprs, owner)
        if direct is not None and DIRECT_LAUNCH and LEAN_LAUNCH:
            launch, function, cooperative, pdl, packed = direct
            try:  # tensors as addresses: the launcher then neither calls data_ptr() nor asks the driver about them
                launch(*grid3, torch._C._cuda_getCurrentRawStream(device), function, cooperative, pdl, None, None,
                       packed, None, None, None,
                       *[a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args], *constexprs)
                return
            except (TypeError, SystemError, AttributeError) as exc:  # another launcher: through compiled[grid]
                import warnings
                warnings.warn(f"direct call of Triton's launcher failed ({exc!r}); using compiled[grid] instead")
                DIRECT_LAUNCH = False
        try:  # every parameter in order, as Triton's own launch passes them (the launcher skips the constexprs)
            compiled[grid3](*args, *constexprs)
            return
        except (TypeError, IndexError, AttributeError) as exc:  # another Triton's interface: the slow path from now on
            import warnings
            warnings.warn(f"direct launch of a compiled Triton kernel failed ({exc!r}); using kernel[grid] instead")
            FAST_LAUNCH = False
    compiled = kernel[grid](*args, **meta)
    rest = kernel.arg_names[len(args):]
    if hasattr(compiled, "function") and all(name in meta for name in rest):
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
            _PLANS.clear()
        _COMPILED[key] = hit = (compiled, tuple(meta[name] for name in rest), _direct(compiled))
        if plan is not None and hit[2] is not None and DIRECT_LAUNCH and LEAN_LAUNCH:
            _PLANS[plan] = (*hit[2], (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1),
                            device, hit[1], owner)


def _has_tma_reduce(device: torch.device) -> bool:
    """Bulk reductions through a descriptor (tensor_descriptor.atomic_add): compiled on Hopper, not in the
    interpreter, which takes the per-element atomics instead."""
    return device.type == "cuda" and _has_tma(device) and hasattr(tl.tensor_descriptor, "atomic_add")


# The forward's 128-query tiles of a causal mask carry unequal work (the triangle): with few of them per
# SM slot (two programs per SM), the last wave leaves SMs idle, and 64-query tiles balance better. Below
# this many waves of 128-query tiles, causal d = 128 takes 64-query tiles (H100, issue 15: 64 rows won at
# 3.9 and 7.8 waves, by 5-10 %; 128 rows at 15.5 and 31, by 5-7 %; round six: at 1.9 waves over pointer loads,
# the forward+backward path's, by 20 %).
CAUSAL_SPLIT_WAVES = 8
# A forward and backward through autograd launches three kernels and builds eleven TMA descriptors, which
# the launcher encodes on the CPU at every call. Where the GPU work is short, that host time is the call's
# time, and pointer loads (no descriptors) are faster: on the H100 at N = 1024 and 2048, forward+backward
# took 0.41-0.69 ms with pointer loads against 0.62-0.90 ms with TMA, while at d = 128, N = 2048 (1e9 forward
# FLOPs per SM) TMA won. Below this much forward work per SM, forward+backward uses pointer loads. A forward
# call alone makes about a quarter of that CPU work (one launch and three descriptors against three launches,
# eleven descriptors and the autograd engine: scripts/attention_gpu.py r5host measures both), so it takes
# pointer loads below a quarter of the work.
HOST_BOUND_FLOPS_PER_SM = {"fwd+bwd": 1e9, "fwd": 1e9 / 4}
# Lazy rescaling (FlashAttention-4) lost on the H100 at every size but one (0.57-0.95x cuDNN against
# 0.79-1.08x without it): the block-wide max it needs costs more than the multiplies it saves.
LAZY_RESCALE = {64: False, 128: False}


def tiles_for(head_dim: int, dtype: str, cc: tuple, *, causal: bool = False, seq_len: Optional[int] = None,
              batch_heads: Optional[int] = None, sm_count: Optional[int] = None, mode: str = "fwd") -> FlashConfig:
    """Tile sizes by GPU generation, head dim and dtype and, where it matters, the mask, the mode ("fwd" or
    "fwd+bwd") and how much work there is against the SMs; chosen from sweeps on an H200 and an H100
    (scripts/attention_gpu.py).

    On Hopper two programs of 4 warps share an SM: while one waits on its exponentials, the other's
    matrix multiplies run, which beat one program of 8 warps in every sweep. Without seq_len, batch_heads
    and sm_count the choice is the one for long sequences.
    """
    if dtype == "fp32":  # exact fp32 products run on the CUDA cores: small tiles fit the shared memory
        return FlashConfig(Tiles(64, 32, 4, 2), Tiles(32, 64, 4, 2), Tiles(64, 32, 4, 2), use_tma=cc[0] >= 9)
    if cc[0] >= 9:
        lazy = LAZY_RESCALE.get(head_dim, False)
        sized = bool(seq_len and batch_heads and sm_count)
        tma = True
        if sized and mode in HOST_BOUND_FLOPS_PER_SM:
            flops_per_sm = 4.0 * batch_heads * seq_len * seq_len * head_dim * (0.5 if causal else 1.0) / sm_count
            tma = flops_per_sm >= HOST_BOUND_FLOPS_PER_SM[mode]
        if head_dim <= 64:
            return FlashConfig(Tiles(64, 128, 4, 2), Tiles(64, 64, 4, 3), Tiles(64, 64, 4, 3), use_tma=tma,
                               lazy_rescale=lazy)
        fwd = Tiles(128, 64, 4, 2)
        waves = batch_heads * -(-seq_len // 128) / (2 * sm_count) if sized else math.inf  # of 128-query tiles
        if causal and waves < CAUSAL_SPLIT_WAVES:
            # over pointer loads as over TMA: at N = 1024 on the H100 the forward kernel took 61 us with 64-query
            # tiles against 76 us with 128-query ones (issue 15, round six: scripts/attention_gpu.py r6). A forward
            # call alone takes TMA loads for them even where it is short: at N = 1024 they beat the 128-query tiles
            # over pointer loads on the H100 (round five)
            if mode == "fwd":
                tma = True
            fwd = Tiles(64, 64, 4, 3)
        return FlashConfig(fwd, Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2), use_tma=tma, lazy_rescale=lazy)
    # Ampere and Ada (not measured here): no TMA, smaller shared memory
    if head_dim <= 64:
        return FlashConfig(Tiles(128, 64, 4, 3), Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2))
    return FlashConfig(Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2))


INTERPRETER_CONFIG = FlashConfig(Tiles(32, 32, 4, 1), Tiles(32, 32, 4, 1), Tiles(32, 32, 4, 1))


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


def default_config(head_dim: int, dtype: torch.dtype, device: torch.device, *, causal: bool = False,
                   seq_len: Optional[int] = None, batch_heads: Optional[int] = None, mode: str = "fwd") -> FlashConfig:
    if device.type != "cuda":  # Triton's interpreter: fewer, bigger tiles mean fewer slow Python-level steps
        return INTERPRETER_CONFIG
    return _cuda_config(head_dim, dtype, device.index, causal, seq_len, batch_heads, mode,
                        tuple(sorted(HOST_BOUND_FLOPS_PER_SM.items())))


@functools.lru_cache(maxsize=1024)
def _cuda_config(head_dim, dtype, index, causal, seq_len, batch_heads, mode, host_bound) -> FlashConfig:
    """tiles_for on this GPU, remembered: a call of flash_attention at a short length lasts tens of microseconds
    on the GPU, and the choice is the same for every call of the same shape (host_bound: part of the key, so
    that a script that changes HOST_BOUND_FLOPS_PER_SM gets a fresh choice)."""
    return tiles_for(head_dim, _dtype_name(dtype), _capability(index), causal=causal, seq_len=seq_len,
                     batch_heads=batch_heads, sm_count=_sm_count(index), mode=mode)


@functools.lru_cache(maxsize=None)
def _sm_count(index) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _as_bhld(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dim() == 3:
        return x.unsqueeze(1)
    if x.dim() != 4:
        raise ValueError(f"{name} must be (batch, heads, seq, dim) or (batch, seq, dim); got shape {tuple(x.shape)}")
    return x


def _prepare(q, k, v, scale):
    q4, k4, v4 = _as_bhld(q, "q"), _as_bhld(k, "k"), _as_bhld(v, "v")
    if q.dim() != k.dim() or k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape and as many dims as q; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    b, h, _, d = q4.shape
    if k4.shape[0] != b or k4.shape[1] != h or k4.shape[3] != d:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, heads or head dim")
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim {d} is not supported; use one of {HEAD_DIMS}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"q, k, v must share one dtype among float32, float16, bfloat16; got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not scale > 0:
        raise ValueError(f"scale must be positive; got {scale}")
    return _tma_ready(q4), _tma_ready(k4), _tma_ready(v4), scale


def _tma_ready(x: torch.Tensor) -> torch.Tensor:
    """x contiguous and, on a GPU, starting on a 16-byte boundary, as TMA descriptors require (a view that starts
    a few elements into its storage is copied once; a fresh tensor always starts aligned)."""
    x = x.contiguous()
    return x.clone() if x.is_cuda and x.data_ptr() % 16 else x


def _descriptor(x: torch.Tensor, rows: int, use_tma: bool):
    """A TMA descriptor over x viewed as (batch*heads*seq, d), with `rows` rows per tile (None without TMA)."""
    if not use_tma:
        return None
    d = x.shape[-1]
    return TensorDescriptor(x, shape=[x.numel() // d, d], strides=[d, 1], block_shape=[rows, d])


def _prec(x: torch.Tensor) -> str:
    if x.dtype == torch.float32:
        return "ieee"  # fp32 inputs: exact fp32 products, not TF32
    return "upcast" if x.device.type != "cuda" else "tf32"


def _lq_pad(lq: int) -> int:
    return max(1, -(-lq // LSE_ALIGN)) * LSE_ALIGN


def _forward(q4, k4, v4, causal: bool, scale: float, cfg: FlashConfig, out=None, lse=None):
    """Launch the forward kernel on (B, H, L, d) contiguous inputs; returns (out, lse padded to LSE_ALIGN rows)."""
    b, h, lq, d = q4.shape
    lk = k4.shape[2]
    out = torch.empty_like(q4) if out is None else out
    lse = q4.new_empty((b, h, _lq_pad(lq)), dtype=torch.float32) if lse is None else lse
    plan = None
    if not cfg.use_tma and q4.is_cuda and out.dtype == q4.dtype:  # pointer loads: a recorded plan takes addresses
        ptrs = (q4.data_ptr(), k4.data_ptr(), v4.data_ptr(), out.data_ptr(), lse.data_ptr())
        if not (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15 and lq and b * h:
            plan = _plan_key("fwd", cfg, causal, q4, k4)
            hit = _PLANS.get(plan) if DIRECT_LAUNCH else None
            if hit is not None:
                _run_plan(hit, (*ptrs, None, None, None, scale * LOG2E, lq, lk, lse.shape[-1]))
                return out, lse
    t = cfg.fwd
    use_tma = cfg.use_tma and _has_tma(q4.device)
    if lq == 0 or b * h == 0:
        return out, lse
    grid = (-(-lq // t.block_m), b * h)  # (triton.cdiv is a constexpr function: slow to call from the host)
    _launch(attention_fwd_kernel, grid,
            q4, k4, v4, out, lse, _descriptor(q4, t.block_m, use_tma), _descriptor(k4, t.block_n, use_tma),
            _descriptor(v4, t.block_n, use_tma), scale * LOG2E, lq, lk, lse.shape[-1],
            HEAD_DIM=d, BLOCK_M=t.block_m, BLOCK_N=t.block_n, CAUSAL=causal, USE_TMA=use_tma,
            PREC=_prec(q4), WS=cfg.warp_specialize and TRY_WARP_SPECIALIZE and q4.is_cuda and use_tma, LAZY=cfg.lazy_rescale,
            PREFETCH=cfg.prefetch_scores, ONE_LOOP=cfg.warp_specialize, MASK_ALL=causal or lk % t.block_n != 0,
            num_warps=t.warps, num_stages=t.stages, plan=plan, owner=cfg,
            key=(q4.dtype, k4.dtype, out.dtype, lse.dtype, q4.shape, k4.shape, _aligned(q4, k4, v4, out, lse)))
    return out, lse


def _backward(q4, k4, v4, out, lse, do4, causal: bool, scale: float, cfg: FlashConfig, dq=None, dk=None, dv=None):
    """dQ, dK, dV from the saved output and log-sum-exp: P is recomputed tile by tile, never stored.

    lse: (B, H, padded Lq) as _forward returns it, or (3, B, H, padded Lq) with the log-sum-exp in its first plane
    and room for delta and lse2 in the other two (what the autograd path allocates in one go, forward)."""
    b, h, lq, d = q4.shape
    lk = k4.shape[2]
    do4 = _tma_ready(do4)
    dq = torch.empty_like(q4) if dq is None else dq
    dk = torch.empty_like(k4) if dk is None else dk
    dv = torch.empty_like(v4) if dv is None else dv
    if lq == 0 or lk == 0 or b * h == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    pad = lse.shape[-1]
    # delta and lse2, one float of each per padded query: in the planes after lse's, or allocated here
    rows = lse if lse.dim() == 4 else q4.new_empty((3, b, h, pad), dtype=torch.float32)
    plan_q = plan_kv = None
    if not (cfg.use_tma or cfg.atomic_dq) and q4.is_cuda and do4.dtype == dq.dtype == q4.dtype:  # recorded plans
        pq, pk, pv, po, pdo = q4.data_ptr(), k4.data_ptr(), v4.data_ptr(), out.data_ptr(), do4.data_ptr()
        pdq, pdk, pdv, plse, prows = dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), lse.data_ptr(), rows.data_ptr()
        if not (pq | pk | pv | po | pdo | pdq | pdk | pdv | plse | prows) & 15:
            pdelta, plse2 = prows + b * h * pad * 4, prows + 2 * b * h * pad * 4  # rows[1], rows[2]
            plan_q, plan_kv = _plan_key("dq", cfg, causal, q4, k4), _plan_key("dkdv", cfg, causal, q4, k4)
            hit_q, hit_kv = (_PLANS.get(plan_q), _PLANS.get(plan_kv)) if DIRECT_LAUNCH else (None, None)
            if hit_q is not None and hit_kv is not None:
                _run_plan(hit_q, (pq, pk, pv, po, pdo, pdq, plse, plse2, pdelta, None, None, None, None, scale,
                                  scale * LOG2E, lq, lk, pad))
                _run_plan(hit_kv, (pq, pk, pv, pdo, pdk, pdv, pdelta, plse2, pdelta, None, None, None, None, None,
                                   scale, scale * LOG2E, lq, lk, pad))
                return dq, dk, dv
    use_tma = cfg.use_tma and _has_tma(q4.device)
    lse_in, delta, lse2 = rows.unbind(0)
    lse = lse_in if lse.dim() == 4 else lse
    prec = _prec(q4)
    shapes = (q4.dtype, k4.dtype, out.dtype, do4.dtype, lse.dtype, q4.shape, k4.shape, pad)  # the launch keys
    if not cfg.atomic_dq:  # dQ first: its kernel also writes delta and lse2 for the dK/dV kernel
        t = cfg.dq
        _launch(attention_bwd_dq_kernel, (pad // t.block_m, b * h),
                q4, k4, v4, out, do4, dq, lse, lse2, delta, _descriptor(q4, t.block_m, use_tma),
                _descriptor(k4, t.block_n, use_tma), _descriptor(v4, t.block_n, use_tma),
                _descriptor(do4, t.block_m, use_tma), scale, scale * LOG2E, lq, lk, pad,
                HEAD_DIM=d, BLOCK_M=t.block_m, BLOCK_N=t.block_n, CAUSAL=causal, USE_TMA=use_tma, PREC=prec,
                num_warps=t.warps, num_stages=t.stages, plan=plan_q, owner=cfg,
                key=shapes + (dq.dtype, _aligned(q4, k4, v4, out, do4, dq, lse, lse2, delta)))
    else:
        _launch(attention_bwd_prep_kernel, (pad // 64, b * h), out, do4, lse, delta, lse2, lq, pad, HEAD_DIM=d,
                BLOCK=64)
    t = cfg.dkdv
    dq_acc = torch.zeros((b, h, pad, d), device=q4.device, dtype=torch.float32) if cfg.atomic_dq else delta
    dq_tma = cfg.atomic_dq and cfg.tma_reduce and use_tma and _has_tma_reduce(q4.device)
    _launch(attention_bwd_dkdv_kernel, (-(-lk // t.block_n), b * h),
            q4, k4, v4, do4, dk, dv, dq_acc, lse2, delta, _descriptor(q4, t.block_m, use_tma),
            _descriptor(k4, t.block_n, use_tma), _descriptor(v4, t.block_n, use_tma),
            _descriptor(do4, t.block_m, use_tma), _descriptor(dq_acc, t.block_m, dq_tma), scale, scale * LOG2E, lq, lk,
            pad, HEAD_DIM=d, BLOCK_M=t.block_m, BLOCK_N=t.block_n, CAUSAL=causal, USE_TMA=use_tma,
            ATOMIC_DQ=cfg.atomic_dq, DQ_TMA=dq_tma, PREC=prec,
            WS=cfg.dkdv_warp_specialize and TRY_WARP_SPECIALIZE and q4.is_cuda and use_tma,
            ONE_LOOP=cfg.dkdv_warp_specialize, num_warps=t.warps, num_stages=t.stages, plan=plan_kv, owner=cfg,
            key=shapes + (dk.dtype, dv.dtype, dq_acc.dtype, _aligned(q4, k4, v4, do4, dk, dv, dq_acc, lse2, delta)))
    if cfg.atomic_dq:
        torch.mul(dq_acc[:, :, :lq], scale, out=dq)  # one pass: scale and round the float32 sums to q's dtype
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, config, mode):
        q4, k4, v4, scale = _prepare(q, k, v, scale)
        cfg = config or default_config(q4.shape[-1], q4.dtype, q4.device, causal=causal, seq_len=q4.shape[2],
                                       batch_heads=q4.shape[0] * q4.shape[1], mode=mode)
        b, h, lq, _ = q4.shape
        rows = q4.new_empty((3, b, h, _lq_pad(lq)), dtype=torch.float32)  # lse; delta and lse2 for the backward
        out, _ = _forward(q4, k4, v4, causal, scale, cfg, lse=rows)  # (one allocation fewer per call)
        ctx.save_for_backward(q4, k4, v4, out, rows)  # O(N) memory: the output and three numbers per query
        ctx.causal, ctx.scale, ctx.cfg, ctx.shapes = causal, scale, cfg, (q.shape, k.shape)
        return out if q.dim() == 4 else out.view(q.shape)  # (a view costs CPU time too: only where needed)

    @staticmethod
    def backward(ctx, grad_out):
        q4, k4, v4, out, lse = ctx.saved_tensors
        q_shape, k_shape = ctx.shapes
        if len(q_shape) == 4:
            dq, dk, dv = _backward(q4, k4, v4, out, lse, grad_out, ctx.causal, ctx.scale, ctx.cfg)
            return dq, dk, dv, None, None, None, None
        dq, dk, dv = _backward(q4, k4, v4, out, lse, grad_out.reshape(out.shape), ctx.causal, ctx.scale, ctx.cfg)
        return dq.view(q_shape), dk.view(k_shape), dv.view(k_shape), None, None, None, None


def flash_attention(q, k, v, causal: bool = False, scale: Optional[float] = None, *, config=None) -> torch.Tensor:
    """softmax(q k^T * scale [+ causal mask]) v, differentiable; scale defaults to 1/sqrt(d)."""
    backward_follows = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if backward_follows:
        return _FlashAttention.apply(q, k, v, causal, scale, config, "fwd+bwd")
    # inference: no autograd record to make, so no autograd.Function (its bookkeeping is CPU time per call)
    q4, k4, v4, scale = _prepare(q, k, v, scale)
    cfg = config or default_config(q4.shape[-1], q4.dtype, q4.device, causal=causal, seq_len=q4.shape[2],
                                   batch_heads=q4.shape[0] * q4.shape[1], mode="fwd")
    out = _forward(q4, k4, v4, causal, scale, cfg)[0]
    return out if q.dim() == 4 else out.view(q.shape)


def flash_attention_forward(q, k, v, causal: bool = False, scale: Optional[float] = None, *, config=None):
    """(output, lse): lse = natural-log logsumexp of each query's scaled scores, shape q.shape[:-1]."""
    q4, k4, v4, scale = _prepare(q, k, v, scale)
    cfg = config or default_config(q4.shape[-1], q4.dtype, q4.device, causal=causal, seq_len=q4.shape[2],
                                   batch_heads=q4.shape[0] * q4.shape[1])
    out, lse = _forward(q4, k4, v4, causal, scale, cfg)
    return out.view(q.shape), lse[..., : q4.shape[2]].reshape(q.shape[:-1])


# ---------------------------------------------------------------------------------------------
# 6. References: float64 (the truth), naive PyTorch (what flash replaces), PyTorch SDPA (what you'd use)
# ---------------------------------------------------------------------------------------------
def causal_visible(lq: int, lk: int, device=None) -> torch.Tensor:
    """(Lq, Lk) bool: query i sees key j when j <= i + (Lk - Lq) (bottom-right aligned)."""
    i = torch.arange(lq, device=device)[:, None]
    j = torch.arange(lk, device=device)[None, :]
    return j <= i + (lk - lq)


def reference(q, k, v, causal: bool = False, scale: Optional[float] = None):
    """(output, lse) in float64, differentiable; queries that see no key give output 0 and lse -inf."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q64, k64, v64 = (x.to(torch.float64) for x in (q, k, v))
    s = (q64 @ k64.transpose(-2, -1)) * scale
    lq, lk = s.shape[-2], s.shape[-1]
    if causal:
        visible = causal_visible(lq, lk, s.device)
        empty = ~visible.any(-1)  # rows that see nothing: softmax of them would be 0/0
        s = s.masked_fill(~visible, float("-inf")).masked_fill(empty[:, None], 0.0)
        lse = torch.logsumexp(s, -1).masked_fill(empty, float("-inf"))
        p = torch.softmax(s, -1) * (~empty)[:, None].to(s.dtype)
    else:
        lse = torch.logsumexp(s, -1)
        p = torch.softmax(s, -1)
    return p @ v64, lse


def naive_attention(q, k, v, causal: bool = False, scale: Optional[float] = None) -> torch.Tensor:
    """Attention as three PyTorch ops: S = QK^T and P = softmax(S) are materialised, (B, H, Lq, Lk) each."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.matmul(q * scale, k.transpose(-2, -1))  # (B, H, Lq, Lk) scores: written to HBM
    if causal:
        s.masked_fill_(~causal_visible(s.shape[-2], s.shape[-1], s.device), float("-inf"))
    p = torch.softmax(s, dim=-1)  # (B, H, Lq, Lk) probabilities: read S, write P
    del s
    if causal and q.shape[-2] > k.shape[-2]:  # queries that see no key: softmax gave 0/0
        p = p.nan_to_num(0.0)
    return torch.matmul(p, v)  # read P again


SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION"}


def sdpa(q, k, v, causal: bool, backend: str):
    """torch.nn.functional.scaled_dot_product_attention restricted to one backend (SDPA_BACKENDS key)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


# ---------------------------------------------------------------------------------------------
# 7. The model: FLOPs, exponentials, bytes, memory, time
# ---------------------------------------------------------------------------------------------
IMPLS = ("naive", "ours", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
MODES = ("fwd", "fwd+bwd")
MASKS = ("full", "causal")
# special-function units (exp2, log2, rcp) per FP32 lane of an SM, by compute capability (CUDA C
# Programming Guide, arithmetic instruction throughput): 16 per SM per clock against 64 FP32 lanes on
# V100 and A100, 128 on every later GPU. The exp rate is then the measured FMA rate times this ratio.
SFU_PER_FP32_LANE = {"7.0": 16 / 64, "8.0": 16 / 64}


def _sum_clamped(t0: int, t1: int, hi: int) -> int:
    """sum over t = t0..t1 of min(max(t, 0), hi)."""
    if t1 < t0:
        return 0
    a, b = max(t0, 1), min(t1, hi)
    total = (a + b) * (b - a + 1) // 2 if b >= a else 0
    return total + max(0, t1 - max(t0, hi + 1) + 1) * hi


def visible_pairs(lq: int, lk: int, causal: bool) -> int:
    """(query, key) pairs whose score counts: Lq*Lk, or about half of it with the causal mask."""
    if not causal:
        return lq * lk
    return _sum_clamped(lk - lq + 1, lk, lk)  # query i sees clamp(i + Lk - Lq + 1, 0, Lk) keys


def attention_flops(mode: str, b: int, h: int, lq: int, lk: int, d: int, causal: bool) -> float:
    """The conventional count: 4*B*H*pairs*d forward (QK^T and PV), 2.5 times that backward."""
    fwd = 4.0 * b * h * visible_pairs(lq, lk, causal) * d
    return fwd if mode == "fwd" else 3.5 * fwd


def exp_rate(target: Target) -> float:
    """Exponentials per second: the FP32 lane rate (half the FMA FLOP rate) times the SFU share."""
    ratio = SFU_PER_FP32_LANE.get(str(target.compute_capability), 16 / 128)
    return target.ceilings.fma_tflops * 1e12 / 2 * ratio


def matmul_rate(target: Target, dtype: str) -> float:
    rates = target.ceilings.matmul_tflops
    return (rates.get(dtype) or rates.get("fp16") or target.ceilings.fma_tflops) * 1e12


def _nbytes(dtype: str) -> int:
    return {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]


@dataclass(frozen=True)
class Shape:
    b: int
    h: int
    lq: int
    lk: int
    d: int
    causal: bool
    dtype: str

    @property
    def e(self) -> int:
        return _nbytes(self.dtype)

    @property
    def q_bytes(self) -> int:  # also dO, O, dQ
        return self.b * self.h * self.lq * self.d * self.e

    @property
    def kv_bytes(self) -> int:  # one of K, V, dK, dV
        return self.b * self.h * self.lk * self.d * self.e

    @property
    def s_bytes(self) -> int:  # one (B, H, Lq, Lk) matrix in the input dtype
        return self.b * self.h * self.lq * self.lk * self.e

    @property
    def lse_bytes(self) -> int:  # one float32 per query, rows padded to LSE_ALIGN
        return self.b * self.h * _lq_pad(self.lq) * 4


def _cc(target: Target) -> tuple:
    try:
        return tuple(int(x) for x in str(target.compute_capability).split(".")[:2])
    except ValueError:
        return (9, 0)


def _tile_elements(shape: Shape, t: Tiles) -> int:
    """Scores computed by the tensor cores: every visited tile in full (masked diagonal tiles included)."""
    c = tile_counts(shape.lq, shape.lk, t.block_m, t.block_n, shape.causal)
    return shape.b * shape.h * (c["full"] + c["masked"]) * t.block_m * t.block_n


def _kernel_time(mma_flops: float, exps: float, hbm_bytes: float, shape: Shape, target: Target) -> dict:
    """One kernel: tensor-core time plus exponential time (they do not overlap in this schedule),
    or the memory time if that is longer."""
    mma_s = mma_flops / matmul_rate(target, shape.dtype)
    exp_s = exps / exp_rate(target)
    mem_s = hbm_bytes / (target.ceilings.copy_tbps * 1e12)
    return {"mma_s": mma_s, "exp_s": exp_s, "mem_s": mem_s, "s": max(mma_s + exp_s, mem_s)}


def _kv_rereads(shape: Shape, t: Tiles, target: Target) -> tuple[float, float]:
    """(bytes of K and V the query tiles request, bytes that reach HBM).

    Every query tile streams the K and V rows it sees. Consecutive programs work on the same head, so
    the L2 serves the repeats when the heads in flight fit in it; then K and V come from HBM once.
    """
    elems = _tile_elements(shape, t)
    requested = 2 * elems / t.block_m * shape.d * shape.e  # each visited tile loads BLOCK_N rows of K and of V
    q_tiles = -(-shape.lq // t.block_m)
    heads_in_flight = max(1, -(-target.sm_count // q_tiles))
    fits = heads_in_flight * 2 * shape.lk * shape.d * shape.e <= target.l2_bytes
    return requested, (2 * shape.kv_bytes if fits else requested)


def flash_model(shape: Shape, mode: str, target: Target, cfg: Optional[FlashConfig] = None) -> dict:
    """Predicted time, HBM bytes and peak memory of our kernels, with the tiles they pick for this point on `target`
    (tiles_for: by head dim, mask, mode and how much work there is against the SMs)."""
    cfg = cfg or tiles_for(shape.d, shape.dtype, _cc(target), causal=shape.causal, seq_len=shape.lq,
                           batch_heads=shape.b * shape.h, sm_count=target.sm_count, mode=mode)
    d = shape.d
    elems = _tile_elements(shape, cfg.fwd)
    requested, kv_hbm = _kv_rereads(shape, cfg.fwd, target)
    fwd_bytes = 2 * shape.q_bytes + kv_hbm + shape.lse_bytes  # Q in, O out, K and V, lse out
    k_fwd = _kernel_time(2 * 2 * d * elems, elems, fwd_bytes, shape, target)
    out = {"predicted_hbm_bytes": fwd_bytes, "predicted_l2_request_bytes": requested + 2 * shape.q_bytes,
           "predicted_mma_ms": k_fwd["mma_s"] * 1e3, "predicted_exp_ms": k_fwd["exp_s"] * 1e3,
           "predicted_mem_ms": k_fwd["mem_s"] * 1e3, "predicted_ms": k_fwd["s"] * 1e3,
           "predicted_last_kernel_ms": k_fwd["s"] * 1e3,  # the kernel launched last in a call
           "predicted_peak_bytes": shape.q_bytes + shape.lse_bytes}
    if mode == "fwd":
        return out
    e_kv = _tile_elements(shape, cfg.dkdv)
    matmuls = 5 if cfg.atomic_dq else 4  # S^T, dV, dP^T, dK (and dQ)
    _, kv_hbm_b = _kv_rereads(shape, cfg.dkdv, target)
    kv_bytes = 2 * shape.q_bytes + 2 * shape.kv_bytes * 2 + 2 * shape.lse_bytes  # Q, dO; K, V in, dK, dV out
    k_kv = _kernel_time(matmuls * 2 * d * e_kv, e_kv, kv_bytes, shape, target)
    t_s = k_kv["s"]
    mma_s, exp_s = k_kv["mma_s"], k_kv["exp_s"]
    hbm = fwd_bytes + kv_bytes
    prep_bytes = 2 * shape.q_bytes + 3 * shape.lse_bytes  # delta = rowsum(dO * O) and lse2: read O, dO and lse
    prep_s = 0.0
    if not cfg.atomic_dq:  # the dQ kernel runs first and also writes delta and lse2 for the dK/dV kernel
        e_q = _tile_elements(shape, cfg.dq)
        q_bytes = 2 * shape.q_bytes + kv_hbm_b + prep_bytes  # Q in, dQ out, K and V, O, dO and lse
        k_q = _kernel_time(3 * 2 * d * e_q, e_q, q_bytes, shape, target)  # S, dP, dQ
        t_s += k_q["s"]
        mma_s, exp_s = mma_s + k_q["mma_s"], exp_s + k_q["exp_s"]
        hbm += q_bytes
    else:  # a small prep kernel, then dQ by atomic adds inside the dK/dV kernel
        prep_s = prep_bytes / (target.ceilings.copy_tbps * 1e12)
        hbm += prep_bytes
    out.update({"predicted_ms": (k_fwd["s"] + t_s + prep_s) * 1e3, "predicted_hbm_bytes": hbm,
                "predicted_last_kernel_ms": k_kv["s"] * 1e3,  # dK/dV runs last
                "predicted_mma_ms": (k_fwd["mma_s"] + mma_s) * 1e3, "predicted_exp_ms": (k_fwd["exp_s"] + exp_s) * 1e3,
                "predicted_peak_bytes": flash_peak_bytes(shape, mode, cfg)})
    return out


def flash_peak_bytes(shape: Shape, mode: str, cfg: Optional[FlashConfig] = None) -> int:
    """Memory our kernels allocate beyond the inputs (and dO): grows as N, never N^2."""
    fwd = shape.q_bytes + shape.lse_bytes  # O and the log-sum-exp
    if mode == "fwd":
        return fwd
    cfg = cfg or tiles_for(shape.d, shape.dtype, (9, 0))
    extra = 0
    if cfg.atomic_dq:  # the float32 dQ accumulator and its scaled copy
        extra = shape.b * shape.h * (_lq_pad(shape.lq) + shape.lq) * shape.d * 4
    return fwd + 2 * shape.lse_bytes + shape.q_bytes + 2 * shape.kv_bytes + extra  # delta, lse2, dQ, dK, dV


# PyTorch's own kernels that naive attention runs over the N x N matrices, and the rate each streams them at.
# Read from torch's kernels (torch.profiler on an H100, scripts/naive_models_gpu.py): the matrix multiplies, the
# softmax backward, the product dP * P before it and the copies run near the copy rate; the softmax forward (one
# thread block or one warp per row, several passes over the row) and masked_fill with the (N, N) mask broadcast
# over batch and heads (a generic strided kernel: one 2-byte element per access, index arithmetic for each) do
# not. Their rates are probed in every run (NAIVE_PROBES, on a slice of rows) and fall back to the copy rate.
NAIVE_PROBES = ("softmax", "softmax-causal", "masked-fill")
NAIVE_PROBE_BYTES = 512 * 2**20  # each probe streams a (heads', N, N) slice of about this many bytes


def naive_ops(shape: Shape, mode: str) -> list[dict]:
    """The kernels of naive attention with their FLOPs, bytes (read + written) and the kernel class whose rate
    they run at: "matmul" (the roofline), "copy", or one of NAIVE_PROBES."""
    q, kv, s, mm = shape.q_bytes, shape.kv_bytes, shape.s_bytes, 2.0 * shape.b * shape.h * shape.lq * shape.lk * shape.d
    mask = shape.lq * shape.lk  # one bool per (query, key)
    softmax = "softmax-causal" if shape.causal else "softmax"  # rows that end in -inf run slower (measured)
    ops = [{"op": "q * scale", "flops": 0, "bytes": 2 * q, "kernel": "copy"},
           {"op": "S = Q K^T", "flops": mm, "bytes": q + kv + s, "kernel": "matmul"}]
    if shape.causal:
        ops += [{"op": "mask = ~(j <= i)", "flops": 0, "bytes": 3 * mask, "kernel": "copy"},
                {"op": "S.masked_fill_(mask, -inf)", "flops": 0, "bytes": 2 * s, "kernel": "masked-fill"}]
    ops += [{"op": "P = softmax(S)", "flops": 0, "bytes": 2 * s, "kernel": softmax},
            {"op": "O = P V", "flops": mm, "bytes": s + kv + q, "kernel": "matmul"}]
    if mode == "fwd":
        return ops
    ops += [{"op": "dP = dO V^T", "flops": mm, "bytes": q + kv + s, "kernel": "matmul"},
            {"op": "dV = P^T dO", "flops": mm, "bytes": s + q + kv, "kernel": "matmul"},
            {"op": "dP * P", "flops": 0, "bytes": 3 * s, "kernel": "copy"},  # torch's softmax backward forms it first
            {"op": "dS = dP * P - P * rowsum(dP * P)", "flops": 0, "bytes": 3 * s, "kernel": "copy"}]
    if shape.causal:  # masked_fill's backward is out of place: a copy of dS, then masked_fill_ on the copy
        ops += [{"op": "dS.clone()", "flops": 0, "bytes": 2 * s, "kernel": "copy"},
                {"op": "dS.masked_fill_(mask, 0)", "flops": 0, "bytes": 2 * s, "kernel": "masked-fill"}]
    ops += [{"op": "dQ = dS K", "flops": mm, "bytes": s + kv + q, "kernel": "matmul"},
            {"op": "dK = dS^T Q", "flops": mm, "bytes": s + q + kv, "kernel": "matmul"},
            {"op": "dq * scale", "flops": 0, "bytes": 2 * q, "kernel": "copy"}]
    return ops


def naive_peak_bytes(shape: Shape, mode: str) -> int:
    """Memory naive attention allocates beyond its inputs.

    Forward (no autograd record): S and P, both alive while the softmax reads one and writes the other.
    Forward and backward: the peak is in the softmax's backward pass, where P (saved), dP, dS and the
    temporary dP * P that PyTorch's CUDA softmax backward forms first are alive together: four N x N
    matrices, beside q * scale (saved), the output and dV; and the causal mask (one byte per pair).
    """
    if mode == "fwd":
        return 2 * shape.s_bytes
    mask = shape.lq * shape.lk if shape.causal else 0
    return 4 * shape.s_bytes + 2 * shape.q_bytes + shape.kv_bytes + mask


def naive_rates_for(rates: Optional[dict], n: int, dtype: str) -> dict:
    """{probe kernel: TB/s} for row length n from probed rates keyed (kernel, n, dtype); a row length the run did
    not probe takes the nearest one probed (the kernel torch picks changes with the row length)."""
    out = {}
    for kernel in NAIVE_PROBES:
        known = [(abs(math.log(m / n)), tbps) for (k, m, t), tbps in (rates or {}).items()
                 if k == kernel and t == dtype and tbps]
        if known:
            out[kernel] = min(known)[1]
    return out


def naive_model(shape: Shape, mode: str, target: Target, rates: Optional[dict] = None) -> dict:
    """Each kernel on its own roofline; the kernels in `rates` ({probe kernel: TB/s}) at their probed rate."""
    ops = naive_ops(shape, mode)
    peak, bw = matmul_rate(target, shape.dtype), target.ceilings.copy_tbps * 1e12
    rates = rates or {}

    def seconds(o):
        rate = rates.get(o["kernel"], 0) * 1e12 or bw
        return max(o["flops"] / peak, o["bytes"] / rate)

    return {"predicted_ms": sum(seconds(o) for o in ops) * 1e3, "predicted_hbm_bytes": sum(o["bytes"] for o in ops),
            "predicted_last_kernel_ms": seconds(ops[-1]) * 1e3,
            "predicted_mma_ms": sum(o["flops"] for o in ops) / peak * 1e3,
            "predicted_mem_ms": sum(o["bytes"] for o in ops) / bw * 1e3,
            "predicted_probed_ms": sum(seconds(o) for o in ops if o["kernel"] in rates) * 1e3,
            "predicted_peak_bytes": naive_peak_bytes(shape, mode)}


# ---------------------------------------------------------------------------------------------
# 8. The lab: parameters, prediction, measurement
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    seq_lens: tuple = param((1024, 2048, 4096, 8192, 16384), "sequence lengths N (queries = keys)", unit="tokens",
                            min=1, max=262144)
    head_dims: tuple = param((64, 128), "head dimension d", choices=HEAD_DIMS)
    masks: tuple = param(("full", "causal"), "attention masks", choices=MASKS)
    dtypes: tuple = param(("bf16",), "input dtype (accumulation is fp32)", choices=("bf16", "fp16", "fp32"))
    impls: tuple = param(IMPLS, "implementations", choices=IMPLS)
    modes: tuple = param(MODES, "forward alone, or forward and backward", choices=MODES)
    batch: int = param(4, "batch size B", min=1, max=1024)
    heads: int = param(16, "heads H", min=1, max=1024)


def _shape(params: Params, n: int, d: int, mask: str, dtype: str) -> Shape:
    return Shape(params.batch, params.heads, n, n, d, mask == "causal", dtype)


def _row_key(impl, mode, mask, dtype, d, n) -> dict:
    return {"impl": impl, "mode": mode, "causal": mask == "causal", "dtype": dtype, "head_dim": d, "seq_len": n}


def predict(params: Params, target: Target, naive_rates: Optional[dict] = None) -> list[dict]:
    """The model of every point. naive_rates: probed rates of torch's kernels keyed (kernel, N, dtype) in TB/s;
    by default those of the newest recording of this GPU kind (the copy rate where there is none)."""
    if naive_rates is None and "naive" in params.impls:
        naive_rates = recorded_naive_rates(target.key)
    rows = []
    for dtype in params.dtypes:
        for d in params.head_dims:
            for mask in params.masks:
                for n in params.seq_lens:
                    shape = _shape(params, n, d, mask, dtype)
                    for mode in params.modes:
                        flops = attention_flops(mode, shape.b, shape.h, n, n, d, shape.causal)
                        for impl in ("naive", "ours"):
                            if impl not in params.impls:
                                continue
                            if impl == "naive":
                                m = naive_model(shape, mode, target, naive_rates_for(naive_rates, n, dtype))
                            else:
                                m = flash_model(shape, mode, target)
                            rows.append(_row_key(impl, mode, mask, dtype, d, n) | {"flops": flops} | m |
                                        {"predicted_tflops": flops / (m["predicted_ms"] * 1e-3) / 1e12})
    return rows


PROBE_IMPL = "naive-probe"  # the `impl` of the rows that carry a probed rate (mode = the probed kernel)


def probed_naive_rates(rows: list) -> dict:
    """{(kernel, N, dtype): TB/s} from the probe rows of a run."""
    return {(r["mode"], r["seq_len"], r["dtype"]): r["measured_tbps"] for r in rows
            if isinstance(r, dict) and r.get("impl") == PROBE_IMPL and r.get("measured_tbps")}


@functools.lru_cache(maxsize=16)
def _recorded_naive_rates(gpu_key: str) -> tuple:
    from labs.collectives import recorded_rows

    return tuple(probed_naive_rates(recorded_rows("attention", gpu_key)).items())


def recorded_naive_rates(gpu_key: str) -> dict:
    """The probed rates of the newest committed recording of this GPU kind (read once a process)."""
    return dict(_recorded_naive_rates(gpu_key))


CHECK_LQ, CHECK_LK = 1000, 1000  # odd sizes: the last tiles are ragged
CHECK_BH = (1, 2)


def _free_bytes(target: Target) -> int:
    return free_memory_bytes() if target.live else target.memory_bytes


def _available_bytes() -> int:
    """Free device memory plus what PyTorch's allocator holds cached but unused (it reuses that first)."""
    return free_memory_bytes() + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


def check(params: Params, target: Target) -> None:
    """Refuse what cannot run at all: a dtype this GPU lacks, or inputs that do not fit even for flash."""
    if "bf16" in params.dtypes and target.live and not torch.cuda.is_bf16_supported():
        raise ParamError("This GPU has no bf16 support: choose fp16 or fp32.")
    n, d = max(params.seq_lens), max(params.head_dims)
    e = max(_nbytes(t) for t in params.dtypes)
    shape = Shape(params.batch, params.heads, n, n, d, False, "fp32" if e == 4 else "bf16")
    need = 4 * shape.q_bytes + flash_peak_bytes(shape, "fwd+bwd", tiles_for(d, shape.dtype, _cc(target)))
    free = _free_bytes(target)
    if need > 0.9 * free:
        raise ParamError(f"N = {n} with B = {params.batch}, H = {params.heads}, d = {d} needs {need / 1e9:.1f} GB "
                         f"even for FlashAttention (Q, K, V, dO and the gradients); this GPU has {free / 1e9:.1f} GB "
                         f"free. Choose a smaller N, batch or heads.")


# Memory a timed point needs beyond its own tensors: triton's do_bench allocates 256 MB to clear the L2,
# and a share of free memory stays reserved for the CUDA libraries' workspaces (cuBLAS, cuDNN plans).
TIMER_BYTES = 256 * 10**6
FREE_SHARE = 0.8  # on an 80 GB H100, naive N = 16384 (68.7 GB) passed a 0.9 test and then ran out of memory
LIBRARY_PEAK_FACTOR = 2  # the SDPA backends keep float32 copies and workspaces: measured 1.0-2.0x ours


def point_peak_bytes(impl: str, shape: Shape, mode: str) -> int:
    """Memory one point allocates beyond its inputs while it runs: the models above for naive and ours;
    for a library backend, twice ours (a bound, so a point is never refused for it on a GPU that fits)."""
    if impl == "naive":
        return naive_peak_bytes(shape, mode)
    peak = flash_peak_bytes(shape, mode)
    return peak if impl == "ours" else LIBRARY_PEAK_FACTOR * peak


def fits(need_bytes: int, free_bytes: int) -> bool:
    """Will a point that allocates need_bytes (plus the timer's buffer) run in free_bytes of free memory?"""
    return need_bytes + TIMER_BYTES <= FREE_SHARE * free_bytes


def skip_note(impl: str, need_bytes: int, free_bytes: int) -> str:
    """Why a point does not run, in the terms of fits(): what it needs against the share of free memory a point
    may use (the rest stays with the CUDA libraries' workspaces)."""
    what = "its N x N matrices" if impl == "naive" else "outputs"
    return (f"skipped: {impl} would need {need_bytes / 1e9:.1f} GB ({what} and workspace) plus "
            f"{TIMER_BYTES / 1e9:.2f} GB for the timer; of the {free_bytes / 1e9:.1f} GB free a point may use "
            f"{100 * FREE_SHARE:.0f} % ({FREE_SHARE * free_bytes / 1e9:.1f} GB), the rest is left to the CUDA "
            "libraries' workspaces")


def plan_points(params: "Params", free_bytes: int) -> list[dict]:
    """Every point of a run with its predicted peak memory and whether it fits, decided before anything is
    allocated. free_bytes: the device's free memory before the inputs (Q, K, V, dO) of the largest N."""
    plan = []
    for dtype in params.dtypes:
        for d in params.head_dims:
            for n in params.seq_lens:
                inputs = 4 * _shape(params, n, d, "full", dtype).q_bytes  # Q, K, V and dO of this N
                for mask in params.masks:
                    shape = _shape(params, n, d, mask, dtype)
                    for impl in params.impls:
                        for mode in params.modes:
                            need = point_peak_bytes(impl, shape, mode)
                            plan.append(_row_key(impl, mode, mask, dtype, d, n) |
                                        {"peak_bytes": need, "fits": fits(need, free_bytes - inputs)})
    return plan


def _free_for_point() -> int:
    """Free device memory now, after handing cached blocks back: a large block carved up by small tensors
    from an earlier size cannot hold an N x N matrix, so cached memory does not count as free."""
    torch.cuda.empty_cache()
    return _available_bytes()


OUR_KERNELS = {"fwd": 1, "fwd+bwd": 3}  # launches per call: forward; forward, dQ (with delta), dK/dV
HOST_FLOOR_BELOW_MS = 2.0  # the CPU's time per call is measured only where the GPU model is shorter than this


HOST_FLOOR_IMPLS = ("ours", "naive")  # launched from Python (ours) or op by op through autograd (naive)


def _needs_host_floor(shape: Shape, mode: str, target: Target, impl: str = "ours") -> bool:
    """Short calls only: a launch costs tens of microseconds, it cannot be what limits a call of milliseconds.
    Naive attention launches a dozen or two of torch's kernels per call (its forward and, through autograd, its
    backward), so a short one can wait on the CPU just as ours does."""
    model = flash_model(shape, mode, target) if impl == "ours" else naive_model(shape, mode, target)
    return model["predicted_ms"] <= HOST_FLOOR_BELOW_MS


TIMER_FLUSH_BYTES = 256 * 2**20  # what the lab's timer (recompute.time_with_host_ms, as do_bench) writes per call


def timer_flush_ms(target: Target) -> float:
    """How long the timer's L2-clearing write takes: its bytes at the measured copy rate (0.09 ms on an H100,
    0.06 ms on an H200)."""
    return TIMER_FLUSH_BYTES / (target.ceilings.copy_tbps * 1e12) * 1e3


def host_floor_row(row: dict, shape: Shape, mode: str, host_ms: float, target: Target) -> dict:
    """`row` predicted with a measured CPU time per call (also what scripts/repredict.py redoes offline).

    The floor is the CPU's whole time per call, and the model the larger of that and the GPU's time. Strictly, the
    timer starts its clock (a CUDA event) when its L2-clearing write ends on the GPU while the CPU starts preparing
    the call as soon as it has queued that write, and the call ends when its last kernel does: the CPU's time less
    the write's plus the last kernel's (refined_host_floor_ms). With the kernels' profiled GPU times that came within
    0.01 ms of the causal calls timed on the H100 at N = 1024 (scripts/attention_gpu.py r6, r6final). But the GPU
    model is optimistic for these short kernels (a program's fixed start and end are not in it), so with the model's
    last kernel the refined floor fell short where the whole CPU time did not: on the H200 run of 20:09 UTC 84 %
    of the points within 15 % against 87 %, on the earlier H200 run 88 % against 91 %, the same on the H100 run."""
    return _with_host_floor(row, flash_model(shape, mode, target), shape, mode, host_ms, target)


def naive_host_floor_row(row: dict, shape: Shape, mode: str, host_ms: float, target: Target, rates: dict) -> dict:
    """The same floor for naive attention: its GPU model with the rates the run probed, its last kernel (the
    scaling of dQ after a backward pass, the P V product after a forward one)."""
    model = naive_model(shape, mode, target, naive_rates_for(rates, shape.lq, shape.dtype))
    return _with_host_floor(row, model, shape, mode, host_ms, target)


def refined_host_floor_ms(host_ms: float, model: dict, target: Target) -> float:
    """The CPU's time less the timer's write (done on the GPU while the CPU prepares the call), plus the last
    kernel, which starts only once the CPU has launched it: exact with measured kernel times, not with the model's
    (see host_floor_row); shown beside each short point for comparison."""
    return host_ms - timer_flush_ms(target) + model["predicted_last_kernel_ms"]


def _with_host_floor(row: dict, model: dict, shape: Shape, mode: str, host_ms: float, target: Target) -> dict:
    gpu_ms = model["predicted_ms"]
    floor_ms = host_ms
    ms = max(gpu_ms, floor_ms)
    flops = attention_flops(mode, shape.b, shape.h, shape.lq, shape.lk, shape.d, shape.causal)
    return row | {"host_ms": host_ms, "gpu_model_ms": gpu_ms, "predicted_ms": ms,
                  "refined_floor_ms": refined_host_floor_ms(host_ms, model, target),
                  "predicted_tflops": flops / (ms * 1e-3) / 1e12, "limited_by": "CPU" if floor_ms > gpu_ms else "GPU"}


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run: naive attention with the rates that run probed, our kernels' short points with
    the CPU times it measured."""
    from labs.engine.params import from_dict

    params = from_dict(Params, recording["params"])
    host = {tuple(r.get(k) for k in LAB.key): r["host_ms"] for r in recording["rows"] if r.get("host_ms") is not None}
    rates = probed_naive_rates(recording["rows"])
    rows = []
    for row in predict(params, target, rates or None):
        key = tuple(row.get(k) for k in LAB.key)
        if key in host:
            shape = _shape(params, row["seq_len"], row["head_dim"], "causal" if row["causal"] else "full", row["dtype"])
            row = naive_host_floor_row(row, shape, row["mode"], host[key], target, rates) if row["impl"] == "naive" \
                else host_floor_row(row, shape, row["mode"], host[key], target)
        rows.append(row)
    return rows


def naive_probe_heads(n: int, dtype: str, heads: int) -> int:
    """How many (N, N) matrices a probe takes: about NAIVE_PROBE_BYTES, and at least two where the run has two,
    because masked_fill takes its fast contiguous path when the mask is not broadcast (measured: 2.45 TB/s for
    one matrix of N = 16384 against 1.35 TB/s broadcast over two or more, on an H100)."""
    return min(heads, max(2, NAIVE_PROBE_BYTES // (n * n * _nbytes(dtype))))


def probe_naive_kernels(n: int, dtype: str, heads: int, causal: bool) -> list[dict]:
    """Rows with the rate (TB/s, bytes read + written) at which torch's softmax and masked_fill stream an N x N
    matrix of row length n, timed on a slice of `heads` rows-of-matrices of about NAIVE_PROBE_BYTES (the kernel
    torch picks depends on the row length, not on how many rows there are). The L2 is emptied by a read before
    each call, so no dirty lines of the flush are written back during the probe."""
    h = naive_probe_heads(n, dtype, heads)
    e = _nbytes(dtype)
    s = timing.random_tensor((h, n, n), dtype)  # scores: what the softmax reads in naive attention
    fns = {"softmax": lambda: torch.softmax(s, dim=-1)}
    if causal:
        hidden = ~causal_visible(n, n, s.device)
        s_causal = s.masked_fill(hidden, float("-inf"))
        fns["softmax-causal"] = lambda: torch.softmax(s_causal, dim=-1)
        fns["masked-fill"] = lambda: s.masked_fill_(hidden, float("-inf"))  # last: it overwrites s
    rows = []
    for kernel, fn in fns.items():
        ms = timing.time_ms_clean_l2(fn, warmup_ms=5, rep_ms=25)
        moved = 2 * h * n * n * e
        rows.append({"impl": PROBE_IMPL, "mode": kernel, "causal": None, "dtype": dtype, "head_dim": None,
                     "seq_len": n, "probe_bytes": moved, "measured_ms": ms, "measured_tbps": timing.tbps(moved, ms)})
    return rows


def _naive_prediction(shape: Shape, mode: str, target: Target, rates: dict) -> dict:
    m = naive_model(shape, mode, target, naive_rates_for(rates, shape.lq, shape.dtype))
    flops = attention_flops(mode, shape.b, shape.h, shape.lq, shape.lk, shape.d, shape.causal)
    return m | {"predicted_tflops": flops / (m["predicted_ms"] * 1e-3) / 1e12}


def _poisoned(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan"))


def point_config(shape: Shape, mode: str, device: torch.device) -> FlashConfig:
    """The configuration flash_attention picks for this point (tiles, TMA or pointer loads)."""
    return default_config(shape.d, timing.torch_dtype(shape.dtype), device, causal=shape.causal,
                          seq_len=shape.lq, batch_heads=shape.b * shape.h, mode=mode)


def _check_ours(dtype: str, d: int, causal: bool, mode: str, cfg: Optional[FlashConfig] = None) -> float:
    """Our kernels with configuration `cfg` (default: the long-sequence one) on fresh random input of odd
    length, outputs poisoned with NaN, against float64: on a GPU twice, so that the launch path of the timed
    calls (the compiled kernel called directly, or the recorded plan) is checked as well as the compiling one."""
    b, h = CHECK_BH
    q, k, v = (timing.random_tensor((b, h, n, d), dtype) for n in (CHECK_LQ, CHECK_LK, CHECK_LK))
    ref_out, ref_lse = reference(q, k, v, causal)
    cfg = cfg or default_config(d, q.dtype, q.device)
    what = f"our FlashAttention ({dtype}, d={d}, {'causal' if causal else 'full'})"
    fin = torch.isfinite(ref_lse)
    if mode == "fwd+bwd":
        do = timing.random_tensor(q.shape, dtype)
        qr, kr, vr = (x.detach().to(torch.float64).requires_grad_() for x in (q, k, v))
        refs = torch.autograd.grad(reference(qr, kr, vr, causal)[0], (qr, kr, vr), do.to(torch.float64))
    err = 0.0
    for _ in range(2 if q.is_cuda else 1):  # on the GPU twice: the second call launches as the timed calls do
        out, lse = _poisoned(q), torch.full((b, h, _lq_pad(CHECK_LQ)), float("nan"), device=q.device)
        _forward(q, k, v, causal, 1 / math.sqrt(d), cfg, out, lse)
        err = max(err, timing.check_close(out, ref_out, dtype, f"{what} output"))
        err = max(err, timing.check_close(lse[..., :CHECK_LQ][fin], ref_lse[fin], dtype, f"{what} log-sum-exp"))
        if mode == "fwd+bwd":
            grads = _backward(q, k, v, out, lse, do, causal, 1 / math.sqrt(d), cfg,
                              _poisoned(q), _poisoned(k), _poisoned(v))
            for name, g, r in zip(("dQ", "dK", "dV"), grads, refs):
                err = max(err, timing.check_close(g, r, dtype, f"{what} {name}"))
    return err


def _impl_fn(impl: str, causal: bool):
    if impl == "ours":
        return lambda q, k, v: flash_attention(q, k, v, causal)
    if impl == "naive":
        return lambda q, k, v: naive_attention(q, k, v, causal)
    return lambda q, k, v: sdpa(q, k, v, causal, impl)


def _check_reference_impl(impl: str, dtype: str, d: int, causal: bool, mode: str) -> float:
    """A library implementation against float64 (its outputs are its own: they cannot be poisoned)."""
    b, h = CHECK_BH
    q, k, v = (timing.random_tensor((b, h, CHECK_LQ, d), dtype).requires_grad_() for _ in range(3))
    fn = _impl_fn(impl, causal)
    out = fn(q, k, v)
    ref = reference(q, k, v, causal)[0]
    what = f"{impl} ({dtype}, d={d}, {'causal' if causal else 'full'})"
    err = timing.check_close(out, ref, dtype, what)
    if mode == "fwd+bwd":
        do = timing.random_tensor(q.shape, dtype)
        grads = torch.autograd.grad(out, (q, k, v), do)
        refs = torch.autograd.grad(ref, (q, k, v), do.to(torch.float64))
        for name, g, r in zip(("dQ", "dK", "dV"), grads, refs):
            err = max(err, timing.check_close(g, r.to(g.dtype), dtype, f"{what} {name}"))
    return err


def _runner(fn, mode: str, q, k, v, do):
    """One call to time: inference forward (no autograd record), or forward and backward."""
    def forward():
        with torch.no_grad():
            return fn(q, k, v)

    def forward_backward():
        return torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    return forward if mode == "fwd" else forward_backward


# Timing budget (the default run must finish in a minute, compile time included). A point's first call compiles,
# builds library plans and takes workspaces; the second gives its peak memory and, timed with events after an L2
# flush, how long a call is. A call of LONG_CALL_MS or more (milliseconds of streaming gigabytes or of hundreds of
# GFLOPs, nothing a launch or a clock step moves by much) is timed as the median of LONG_CALL_REPS such calls (that
# second one included), where do_bench would spend five calls estimating, one warming up and one or more timing. A shorter call is timed by do_bench (median, L2
# flushed before each call) with SHORT_WARMUP_MS of warm-up and SHORT_REP_MS of timed calls: 25 samples or more
# of any call under a millisecond.
LONG_CALL_MS = 5.0
LONG_CALL_REPS = 3
SHORT_WARMUP_MS, SHORT_REP_MS = 5, 25
FLUSH_BYTES = 256 * 2**20  # what do_bench writes to empty the L2 (TIMER_BYTES accounts for it)


def timer_cost(call_ms: float, flush_ms: float, host_ms: float = 0.0) -> tuple[int, float]:
    """(calls, GPU ms) that timing one point costs under the rules above, for a call of call_ms on the GPU and
    host_ms on the CPU, and an L2 flush of flush_ms: a bound on a run's time that needs no GPU."""
    if call_ms >= LONG_CALL_MS:
        return 1 + LONG_CALL_REPS, call_ms + LONG_CALL_REPS * (call_ms + flush_ms)
    step = call_ms + flush_ms  # do_bench: one call, 5 to estimate, then the warm-up and the timed calls
    warm, rep = max(1, int(SHORT_WARMUP_MS / step)), max(1, int(SHORT_REP_MS / step))
    calls = 2 + 1 + 5 + warm + rep
    return calls, 2 * call_ms + flush_ms + call_ms + 5 * step + warm * max(call_ms, host_ms) + rep * max(step, host_ms)


def _flush_l2() -> None:
    torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda").zero_()


def _event_ms(run) -> float:
    """One call of `run` between CUDA events, the L2 emptied by a 256 MiB write before it (as do_bench does)."""
    _flush_l2()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = run()
    end.record()
    torch.cuda.synchronize()
    del result
    return start.elapsed_time(end)


def _peak_and_ms(run) -> tuple[int, float]:
    """(bytes `run` allocates at its peak beyond what was allocated before, its time between CUDA events with an
    emptied L2)."""
    _flush_l2()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = run()
    end.record()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return int(peak), start.elapsed_time(end)


def _peak_bytes(fn) -> int:
    """Bytes `fn` allocates at its peak beyond what was allocated before (scripts/attention_gpu.py uses it)."""
    return _peak_and_ms(fn)[0]


def _time_point(run, with_host: bool = False):
    """(peak bytes, median ms, CPU ms per call or None) of one point, or None if it ran out of memory: a point
    the prediction let through must not end the sweep (the allocator's fragmentation and the libraries'
    workspaces are not in the model), so its tensors are released and the next point runs. with_host: the
    CPU's time is measured inside the timed calls themselves (recompute.time_with_host_ms)."""
    from labs.recompute import time_with_host_ms

    try:
        run()  # compile, cuDNN plans, cuBLAS workspace: before the memory baseline
        peak, first_ms = _peak_and_ms(run)
        if with_host:
            return (peak, *time_with_host_ms(run, warmup_ms=SHORT_WARMUP_MS, rep_ms=SHORT_REP_MS))
        if first_ms >= LONG_CALL_MS:
            times = sorted([first_ms] + [_event_ms(run) for _ in range(LONG_CALL_REPS - 1)])
            return peak, times[len(times) // 2], None
        return peak, timing.time_ms(run, warmup_ms=SHORT_WARMUP_MS, rep_ms=SHORT_REP_MS), None
    except torch.cuda.OutOfMemoryError:
        pass  # leaving the handler drops the traceback, and with it the frames holding the N x N matrices
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return None


def _unavailable_reason(impl: str, dtype: str, d: int, causal: bool) -> Optional[str]:
    """Why a library backend cannot run this case (None if it can): asked on a tiny input."""
    if impl in ("naive", "ours"):
        return None
    try:
        q = timing.random_tensor((1, 1, 128, d), dtype)
        sdpa(q, q, q, causal, impl)
        return None
    except RuntimeError as exc:
        return str(exc).split("\n")[0][:160]


# Checking before timing. Every configuration the run times is checked against float64 first, all of them before
# the first point is timed, CHECK_THREADS at a time: a check's first call compiles its Triton kernels (or builds
# the library's plans), and Triton and cuDNN do most of that work with Python's lock released, so the compiles of
# a run's 25 kernels overlap instead of queueing (Triton 3.6, compiling this file's kernels for sm_90 on a CPU:
# 0.4 to 1.9 s each, 22 s in a row, and a Python thread kept 96 % of its speed while they compiled; Triton's own
# AsyncCompileMode rests on the same property). The library backends are checked one after another in one of
# those threads, because torch's sdpa_kernel switches the backend for the whole process, and cuDNN keeps the plans
# it builds per thread: those of the checks' odd sizes are never used again, so building them aside costs nothing.
CHECK_THREADS = 8


def planned_config(shape: Shape, mode: str, target: Target) -> FlashConfig:
    """The configuration our kernels take for this point on `target` (point_config's choice, without a GPU)."""
    return tiles_for(shape.d, shape.dtype, _cc(target), causal=shape.causal, seq_len=shape.lq,
                     batch_heads=shape.b * shape.h, sm_count=target.sm_count, mode=mode)


def check_keys(params: Params, config_of) -> list[tuple]:
    """Every configuration a run can time, once each, as (impl, dtype, d, causal, mode, cfg): naive attention and
    the library backends by case (cfg None), ours by the tiles it takes at each N (config_of(shape, mode))."""
    keys = {}
    for dtype in params.dtypes:
        for d in params.head_dims:
            for mask in params.masks:
                for impl in params.impls:
                    for mode in params.modes:
                        for n in params.seq_lens:
                            cfg = config_of(_shape(params, n, d, mask, dtype), mode) if impl == "ours" else None
                            keys[(impl, dtype, d, mask == "causal", mode, cfg)] = None
    return list(keys)


def triton_kernels(keys: list) -> set:
    """The distinct Triton kernels (kernel, head dim, mask, tiles, TMA) that checking `keys` compiles."""
    kernels = set()
    for impl, dtype, d, causal, mode, cfg in keys:
        if impl == "ours":
            kernels.add(("fwd", dtype, d, causal, cfg.fwd, cfg.use_tma, cfg.lazy_rescale, cfg.warp_specialize,
                         cfg.prefetch_scores))
            if mode == "fwd+bwd":
                kernels.add(("dq", dtype, d, causal, cfg.dq, cfg.use_tma))
                kernels.add(("dkdv", dtype, d, causal, cfg.dkdv, cfg.use_tma, cfg.atomic_dq, cfg.dkdv_warp_specialize))
    return kernels


def _check(key: tuple) -> float:
    impl, dtype, d, causal, mode, cfg = key
    if impl == "ours":
        return _check_ours(dtype, d, causal, mode, cfg)
    return _check_reference_impl(impl, dtype, d, causal, mode)


def in_parallel(jobs: dict, threads: int) -> dict:
    """{name: job()}, the jobs spread over `threads` threads. A job that fails in a thread runs again alone in this
    one, so that a real failure (a KernelMismatch, say) is raised here just as it would be without threads."""
    from concurrent.futures import ThreadPoolExecutor

    results = {}
    if threads > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(min(threads, len(jobs))) as pool:
            futures = {name: pool.submit(job) for name, job in jobs.items()}
            for name, future in futures.items():
                try:
                    results[name] = future.result()
                except Exception:  # noqa: BLE001 - run again below, alone, where it raises for real
                    pass
    for name, job in jobs.items():
        if name not in results:
            results[name] = job()
    return results


def _run_checks(keys: list, device: torch.device) -> tuple[dict, dict]:
    """(relative error by check key, why each library case cannot run or None) for every key."""
    threads = CHECK_THREADS if device.type == "cuda" else 1  # the CPU interpreter patches triton as it runs
    index = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        for kernel in (attention_fwd_kernel, attention_bwd_dq_kernel, attention_bwd_dkdv_kernel):
            try:  # each kernel's per-device cache made here, so that no two threads create it at once
                kernel.device_caches[index]
            except Exception:  # noqa: BLE001 - another Triton: the threads create it, at worst compiling twice
                pass

    def on_device(job):
        def run():
            if device.type == "cuda":
                torch.cuda.set_device(index)
            return job()
        return run

    library = [k for k in keys if k[0] in SDPA_BACKENDS]

    def library_checks():
        why, errors = {}, {}
        for key in library:
            case = key[:4]
            if case not in why:
                why[case] = _unavailable_reason(*case)
            if not why[case]:
                errors[key] = _check(key)
        return why, errors

    jobs = {"library": on_device(library_checks)} if library else {}
    jobs |= {key: on_device(functools.partial(_check, key)) for key in keys if key[0] not in SDPA_BACKENDS}
    results = in_parallel(jobs, threads)
    if device.type == "cuda":
        torch.cuda.synchronize()
    why, library_errors = results.pop("library", ({}, {}))
    return results | library_errors, why


def measure(params: Params, target: Target, progress):
    cases = [(dtype, d, mask) for dtype in params.dtypes for d in params.head_dims for mask in params.masks]
    total = len(cases) * len(params.seq_lens) * len(params.impls) * len(params.modes)
    done, skipped, rates = 0, [], {}
    device = torch.device("cuda", torch.cuda.current_device())
    keys = check_keys(params, lambda shape, mode: point_config(shape, mode, device))
    progress(0.0, f"checking {len(keys)} configurations against float64, {CHECK_THREADS} at a time "
                  f"(their kernels compile meanwhile)")
    checked, unavailable = _run_checks(keys, device)
    for dtype in params.dtypes:
        for d in params.head_dims:
            for n in params.seq_lens:
                torch.cuda.empty_cache()  # the inputs must not pin the large blocks an earlier N left cached
                probe_bytes = naive_probe_heads(n, dtype, params.batch * params.heads) * n * n * _nbytes(dtype)
                if "naive" in params.impls and (n, dtype) not in {(m, t) for _, m, t in rates} \
                        and fits(4 * probe_bytes + n * n, _available_bytes()):
                    progress(done / total, f"N={n}, {dtype}: probing the rates of torch's softmax and masked_fill")
                    for probe_row in probe_naive_kernels(n, dtype, params.batch * params.heads, "causal" in params.masks):
                        rates[(probe_row["mode"], n, dtype)] = probe_row["measured_tbps"]
                        yield probe_row
                    torch.cuda.empty_cache()
                q, k, v, do = (timing.random_tensor((params.batch, params.heads, n, d), dtype) for _ in range(4))
                q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
                for mask in params.masks:
                    causal = mask == "causal"
                    shape = _shape(params, n, d, mask, dtype)
                    for impl in params.impls:
                        if (impl, dtype, d, causal) not in unavailable:
                            unavailable[(impl, dtype, d, causal)] = _unavailable_reason(impl, dtype, d, causal)
                        for mode in params.modes:
                            key = _row_key(impl, mode, mask, dtype, d, n)
                            label = f"{impl} {mode}, {mask}, {dtype}, d={d}, N={n}"
                            done += 1
                            frac = (done - 1) / total
                            why = unavailable[(impl, dtype, d, causal)]
                            if why:
                                yield key | {"note": f"unavailable: {why}"}
                                continue
                            row = dict(key)
                            need = point_peak_bytes(impl, shape, mode)
                            free = _free_for_point() if need > 2**30 else _available_bytes()
                            if not fits(need, free):
                                progress(frac, f"{label}: skipped ({need / 1e9:.1f} GB needed)")
                                skipped.append(f"{impl} {mode} N={n} d={d} {mask}")
                                yield key | {"predicted_peak_bytes": need, "note": skip_note(impl, need, free)}
                                continue
                            # every configuration the run times is checked (ours picks tiles per point)
                            cfg = point_config(shape, mode, q.device) if impl == "ours" else None
                            check_key = (impl, dtype, d, causal, mode, cfg)
                            if check_key not in checked:
                                progress(frac, f"{label}: checking against float64")
                                checked[check_key] = _check(check_key)
                            run = _runner(_impl_fn(impl, causal), mode, q, k, v, do)
                            progress(frac, f"{label}: timing")
                            host_floor = impl in HOST_FLOOR_IMPLS and _needs_host_floor(shape, mode, target, impl)
                            timed = _time_point(run, with_host=host_floor)
                            if timed is None:  # predicted to fit, yet out of memory: keep going without it
                                skipped.append(f"{impl} {mode} N={n} d={d} {mask}")
                                yield key | {"predicted_peak_bytes": need,
                                             "note": f"skipped: predicted to need {need / 1e9:.1f} GB of the "
                                                     f"{free / 1e9:.1f} GB free, but ran out of memory"}
                                continue
                            peak, ms, host_ms = timed
                            flops = attention_flops(mode, shape.b, shape.h, n, n, d, causal)
                            row |= {"measured_ms": ms, "measured_tflops": timing.tflops(flops, ms),
                                    "measured_peak_bytes": peak,
                                    "check_rel_error": checked[check_key]}
                            if impl in ("naive", "ours"):
                                predicted = naive_peak_bytes(shape, mode) if impl == "naive" else \
                                    flash_peak_bytes(shape, mode)
                                row["memory_error_pct"] = 100.0 * (peak - predicted) / predicted
                            if host_floor and impl == "ours":  # short sequences: the GPU can wait for our launches
                                row = host_floor_row(row, shape, mode, host_ms, target)
                            if impl == "naive":  # with the rates this run probed
                                row = _naive_prediction(shape, mode, target, rates) | row
                                if host_floor:  # and torch's launches, op by op
                                    row = naive_host_floor_row(row, shape, mode, host_ms, target, rates)
                            yield row
                del q, k, v, do
    if skipped:
        yield (f"{len(skipped)} points were skipped because they do not fit in this GPU's free memory "
               f"(e.g. {skipped[0]}); the model still shows them. Their rows say how much each needs.")
    progress(1.0, "done")


def _tflops(shape: Shape, m: dict, mode: str = "fwd") -> float:
    flops = attention_flops(mode, shape.b, shape.h, shape.lq, shape.lk, shape.d, shape.causal)
    return flops / (m["predicted_ms"] * 1e-3) / 1e12


# Issue 15's bars for our FlashAttention: at least this share of each library's speed, from this sequence length
# (or at exactly it), at every head dim, mask and mode the lab runs
LIBRARY_TARGETS = {"sdpa-cudnn": (0.95, lambda n: n >= 2048), "sdpa-flash": (0.9, lambda n: n == 1024)}
LIBRARY_NAMES = {"sdpa-cudnn": "cuDNN (SDPA)", "sdpa-flash": "FlashAttention (SDPA)"}


def library_ratios(rows: list) -> list[dict]:
    """Our kernels against SDPA's cuDNN and flash backends in the same run, one row per (mode, mask, head dim,
    N, library) where both were timed: the library's time over ours (1.0 = as fast), with the target where the
    issue sets one (labs/repredict.py gathers these for the scorecard)."""
    times = {}
    for r in rows:
        if r.get("measured_ms") and r.get("impl") in ("ours", *LIBRARY_TARGETS) and r.get("mode") in MODES:
            times[(r["mode"], bool(r["causal"]), r["dtype"], r["head_dim"], r["seq_len"], r["impl"])] = r["measured_ms"]
    out = []
    for (mode, causal, dtype, d, n, impl), library in sorted(times.items()):
        ours = times.get((mode, causal, dtype, d, n, "ours"))
        if impl == "ours" or not ours:
            continue
        bar, applies = LIBRARY_TARGETS[impl]
        out.append({"case": f"{mode} {'causal' if causal else 'full'} {dtype} d = {d} N = {n}", "ours": "ours (Triton)",
                    "library": LIBRARY_NAMES[impl], "speed_ratio": library / ours, "target": bar if applies(n) else None})
    return out


def lesson_numbers(target: Target) -> dict:
    c = target.ceilings
    mm = matmul_rate(target, "bf16")
    ex = exp_rate(target)
    shape64 = Shape(4, 16, 8192, 8192, 64, False, "bf16")
    shape128 = Shape(4, 16, 8192, 8192, 128, False, "bf16")
    f64 = flash_model(shape64, "fwd", target)
    f128 = flash_model(shape128, "fwd", target)
    big = Shape(4, 16, 16384, 16384, 64, False, "bf16")
    return {
        "gpu": target.name,
        "ceilings_source": target.describe_ceilings(),
        "bf16_matmul_tflops": f"{mm / 1e12:.0f}",
        "exp_per_s": f"{ex / 1e12:.2f}",
        "mma_per_exp": f"{mm / ex:.0f}",
        "exp_share_d64_pct": f"{100 * f64['predicted_exp_ms'] / f64['predicted_ms']:.0f}",
        "exp_share_d128_pct": f"{100 * f128['predicted_exp_ms'] / f128['predicted_ms']:.0f}",
        "predicted_d64_tflops": f"{_tflops(shape64, f64):.0f}",
        "predicted_d128_tflops": f"{_tflops(shape128, f128):.0f}",
        "s_gb_16k": f"{big.s_bytes / 1e9:.1f}",
        "naive_fwd_gb_16k": f"{naive_peak_bytes(big, 'fwd') / 1e9:.1f}",
        "naive_train_gb_16k": f"{naive_peak_bytes(big, 'fwd+bwd') / 1e9:.1f}",
        "flash_fwd_mb_16k": f"{flash_peak_bytes(big, 'fwd', tiles_for(64, 'bf16', _cc(target))) / 1e6:.0f}",
        "memory_gb": f"{target.memory_bytes / 1e9:.0f}",
        "block_m_d64": str(tiles_for(64, "bf16", _cc(target)).fwd.block_m),
        "kv_requested_gb_8k": f"{(f64['predicted_l2_request_bytes'] - 2 * shape64.q_bytes) / 1e9:.1f}",
        "kv_once_mb_8k": f"{2 * shape64.kv_bytes / 1e6:.0f}",
        "l2_mb": f"{target.l2_bytes / 1e6:.0f}",
        "copy_tbps": f"{c.copy_tbps:.2f}",
        "timer_flush_ms": f"{timer_flush_ms(target):.2f}",
        "ridge_bf16": f"{mm / (c.copy_tbps * 1e12):.0f}",
    }


from labs.attention.counters import COUNTERS  # noqa: E402  (how ncu counts this lab)

LAB = Lab(
    name="attention",
    title="FlashAttention",
    summary="Attention without the N x N matrix: tiles, the online softmax and recomputation, in our own "
            "Triton FlashAttention-2 measured against naive PyTorch and PyTorch's SDPA backends.",
    terms=("attention", "softmax", "online-softmax", "flash-attention", "tiling", "kernel-fusion", "recomputation",
           "shared-memory", "hbm", "l2-cache", "tensor-core", "sfu", "memory-bound", "compute-bound",
           "arithmetic-intensity", "bf16", "accumulation", "triton", "tma", "training-memory", "registers",
           "ridge-point", "thread-block", "warp", "cudnn"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("impl", "mode", "causal", "dtype", "head_dim", "seq_len"),
    metric="tflops",
    order=60,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What TFLOP/s will our FlashAttention forward reach at N = 8192 (bf16, d = 64, no mask)?",
                      "TFLOP/s", {"impl": "ours", "mode": "fwd", "causal": False, "dtype": "bf16", "head_dim": 64,
                                  "seq_len": 8192}, "tflops"),
    counters=COUNTERS,
)
