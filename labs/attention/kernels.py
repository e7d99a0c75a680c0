"""
Our FlashAttention-2 in Triton: the forward kernel, the two backward kernels and their launchers
================================================================================================

What you will learn:
- how one program keeps its tile of queries on chip and streams the keys and values past it, folding each
  tile of scores into a running max, a running sum and a rescaled partial output (the online softmax of
  online_softmax.py, on the chip);
- why the scores are kept in base-2 units: every exponential is then one `exp2`, one instruction of the
  special-function units;
- how the mask costs only where it applies: key tiles that every query of the tile sees run without one, the
  causal diagonal and the ragged end with one, and tiles above the diagonal are never loaded (tiles.py);
- recomputation: the backward pass keeps one number per query (the log-sum-exp) and recomputes P tile by tile;
- what a launcher does around a kernel: shapes, tile choice, TMA descriptors, autograd.

Conventions: q is (B, H, Lq, d) or (B, Lq, d); k and v are (B, H, Lk, d) or (B, Lk, d). With causal=True and
Lq != Lk the mask is aligned to the bottom right, as in FlashAttention-2: query i sees key j when
j <= i + (Lk - Lq), so the last query sees every key. A query that sees no key (possible when Lq > Lk) gets
output 0 and log-sum-exp -inf.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import triton
import triton.language as tl

from labs.attention.launch import PLANS, aligned, launch, plan_key, run_plan
from labs.attention.tiles import HEAD_DIMS, INTERPRETER_CONFIG, FlashConfig, lq_pad, tiles_for

try:  # host-side TMA descriptors (Triton >= 3.3); without them the kernels use pointer loads
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None


LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the hardware has a fast exp2


# ---------------------------------------------------------------------------------------------
# 1. Two helpers: load a tile (TMA or pointers), multiply on the tensor cores
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


# ---------------------------------------------------------------------------------------------
# 2. The forward kernel (one program per query tile, K and V streamed through shared memory)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fwd_key_tiles(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, offs_m, lo, hi, qk_scale, LK, SHIFT,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                   USE_TMA: tl.constexpr, PREC: tl.constexpr):
    """Stream key tiles [lo, hi) past one query tile, updating the online-softmax state (acc, l_i, m_i).

    Scores are kept in log2 units (qk_scale = scale * log2 e) so that every exponential is one exp2.
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
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
            m_use = m_new
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one MUFU.EX2 per score: the SFU's work
        alpha = tl.math.exp2(m_i - m_use)  # how much the old running sum and output shrink under the new max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = _load_tile(v_base, v_desc, kv_row, start_n, LK - start_n, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
        acc = _mma(p.to(v.dtype), v, acc, PREC)  # partial output += P_tile @ V_tile
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["LQ", "LK"])
def attention_fwd_kernel(Q, K, V, O, LSE, q_desc, k_desc, v_desc, qk_scale, LQ, LK, LQ_PAD,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, PREC: tl.constexpr):
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
    acc, l_i, m_i = _fwd_key_tiles(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, offs_m, 0, full_end,
                                   qk_scale, LK, SHIFT, HEAD_DIM, BLOCK_N, CAUSAL, False, USE_TMA, PREC)
    acc, l_i, m_i = _fwd_key_tiles(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, offs_m, full_end, hi,
                                   qk_scale, LK, SHIFT, HEAD_DIM, BLOCK_N, CAUSAL, True, USE_TMA, PREC)

    # epilogue: normalise once; the log-sum-exp (natural log) is all the backward pass needs
    empty = l_i == 0.0  # a query that sees no key (causal with Lq > Lk)
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc * (1.0 / l_safe)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(LSE + bh * LQ_PAD + offs_m, lse)  # padded rows: written, never read as valid
    o_ptrs = O + bh.to(tl.int64) * LQ * HEAD_DIM + offs_m[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(offs_m < LQ)[:, None])


# ---------------------------------------------------------------------------------------------
# 3. The backward kernels: recompute P tile by tile from Q, K and the saved log-sum-exp
# ---------------------------------------------------------------------------------------------
# dQ first (one program per query tile, no atomics); its kernel also writes each row's delta = rowsum(dO * O)
# and log2-unit log-sum-exp, which the dK/dV kernel (one program per key tile) then reads.
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


@triton.jit
def _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, q_desc, do_desc, LSE2, DELTA, q_row, lse_row, offs_n, lo, hi,
                      qk_scale, LQ, SHIFT, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                      USE_TMA: tl.constexpr, PREC: tl.constexpr):
    """Stream query tiles [lo, hi) past one key tile: dV += P^T dO, dK += dS^T Q."""
    for start_m in tl.range(lo, hi, BLOCK_M):
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
    return dk, dv


@triton.jit(do_not_specialize=["LQ", "LK"])
def attention_bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE2, DELTA, q_desc, k_desc, v_desc, do_desc,
                              scale, qk_scale, LQ, LK, LQ_PAD,
                              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, PREC: tl.constexpr):
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
    dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, q_desc, do_desc, LSE2, DELTA, bh * LQ, bh * LQ_PAD,
                               offs_n, lo, full, qk_scale, LQ, SHIFT, HEAD_DIM, BLOCK_M, True, USE_TMA, PREC)
    dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, q_desc, do_desc, LSE2, DELTA, bh * LQ, bh * LQ_PAD,
                               offs_n, full, hi, qk_scale, LQ, SHIFT, HEAD_DIM, BLOCK_M, False, USE_TMA, PREC)
    ptrs = kv_off + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DV + ptrs, dv.to(DV.dtype.element_ty), mask=(offs_n < LK)[:, None])
    tl.store(DK + ptrs, (dk * scale).to(DK.dtype.element_ty), mask=(offs_n < LK)[:, None])


# ---------------------------------------------------------------------------------------------
# 4. Launchers: tile choice, shapes, descriptors, and autograd
# ---------------------------------------------------------------------------------------------
def _has_tma(device: torch.device) -> bool:
    if TensorDescriptor is None:
        return False
    if device.type != "cuda":
        return True  # the interpreter implements descriptors: tests exercise both paths
    return _capability(device.index)[0] >= 9


@functools.lru_cache(maxsize=None)
def _capability(index) -> tuple:
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def _sm_count(index) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


def default_config(head_dim: int, dtype: torch.dtype, device: torch.device, *, causal: bool = False,
                   seq_len: Optional[int] = None, batch_heads: Optional[int] = None, mode: str = "fwd") -> FlashConfig:
    """The tiles (tiles.tiles_for) of this GPU for a call of this shape; the interpreter's on the CPU."""
    if device.type != "cuda":  # Triton's interpreter: fewer, bigger tiles mean fewer slow Python-level steps
        return INTERPRETER_CONFIG
    return _cuda_config(head_dim, dtype, device.index, causal, seq_len, batch_heads, mode)


@functools.lru_cache(maxsize=1024)
def _cuda_config(head_dim, dtype, index, causal, seq_len, batch_heads, mode) -> FlashConfig:
    """tiles_for on this GPU, remembered: a call of flash_attention at a short length lasts tens of microseconds
    on the GPU, and the choice is the same for every call of the same shape."""
    return tiles_for(head_dim, _dtype_name(dtype), _capability(index), causal=causal, seq_len=seq_len,
                     batch_heads=batch_heads, sm_count=_sm_count(index), mode=mode)


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


def _forward(q4, k4, v4, causal: bool, scale: float, cfg: FlashConfig, out=None, lse=None):
    """Launch the forward kernel on (B, H, L, d) contiguous inputs; returns (out, lse padded to tiles.LSE_ALIGN rows)."""
    b, h, lq, d = q4.shape
    lk = k4.shape[2]
    out = torch.empty_like(q4) if out is None else out
    lse = q4.new_empty((b, h, lq_pad(lq)), dtype=torch.float32) if lse is None else lse
    plan = None
    if not cfg.use_tma and q4.is_cuda and out.dtype == q4.dtype:  # pointer loads: a recorded plan takes addresses
        ptrs = (q4.data_ptr(), k4.data_ptr(), v4.data_ptr(), out.data_ptr(), lse.data_ptr())
        if not (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15 and lq and b * h:
            plan = plan_key("fwd", cfg, causal, q4, k4)
            hit = PLANS.get(plan)
            if hit is not None:
                run_plan(hit, (*ptrs, None, None, None, scale * LOG2E, lq, lk, lse.shape[-1]))
                return out, lse
    t = cfg.fwd
    use_tma = cfg.use_tma and _has_tma(q4.device)
    if lq == 0 or b * h == 0:
        return out, lse
    grid = (-(-lq // t.block_m), b * h)  # (triton.cdiv is a constexpr function: slow to call from the host)
    launch(attention_fwd_kernel, grid,
           q4, k4, v4, out, lse, _descriptor(q4, t.block_m, use_tma), _descriptor(k4, t.block_n, use_tma),
           _descriptor(v4, t.block_n, use_tma), scale * LOG2E, lq, lk, lse.shape[-1],
           HEAD_DIM=d, BLOCK_M=t.block_m, BLOCK_N=t.block_n, CAUSAL=causal, USE_TMA=use_tma, PREC=_prec(q4),
           num_warps=t.warps, num_stages=t.stages, plan=plan, owner=cfg,
           key=(q4.dtype, k4.dtype, out.dtype, lse.dtype, q4.shape, k4.shape, aligned(q4, k4, v4, out, lse)))
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
    if not cfg.use_tma and q4.is_cuda and do4.dtype == dq.dtype == q4.dtype:  # pointer loads: recorded plans
        pq, pk, pv, po, pdo = q4.data_ptr(), k4.data_ptr(), v4.data_ptr(), out.data_ptr(), do4.data_ptr()
        pdq, pdk, pdv, plse, prows = dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), lse.data_ptr(), rows.data_ptr()
        if not (pq | pk | pv | po | pdo | pdq | pdk | pdv | plse | prows) & 15:
            pdelta, plse2 = prows + b * h * pad * 4, prows + 2 * b * h * pad * 4  # rows[1], rows[2]
            plan_q, plan_kv = plan_key("dq", cfg, causal, q4, k4), plan_key("dkdv", cfg, causal, q4, k4)
            hit_q, hit_kv = PLANS.get(plan_q), PLANS.get(plan_kv)
            if hit_q is not None and hit_kv is not None:
                run_plan(hit_q, (pq, pk, pv, po, pdo, pdq, plse, plse2, pdelta, None, None, None, None, scale,
                                 scale * LOG2E, lq, lk, pad))
                run_plan(hit_kv, (pq, pk, pv, pdo, pdk, pdv, plse2, pdelta, None, None, None, None, scale,
                                  scale * LOG2E, lq, lk, pad))
                return dq, dk, dv
    use_tma = cfg.use_tma and _has_tma(q4.device)
    lse_in, delta, lse2 = rows.unbind(0)
    lse = lse_in if lse.dim() == 4 else lse
    prec = _prec(q4)
    shapes = (q4.dtype, k4.dtype, out.dtype, do4.dtype, lse.dtype, q4.shape, k4.shape, pad)  # the launch keys
    t = cfg.dq  # dQ first: its kernel also writes delta and lse2 for the dK/dV kernel
    launch(attention_bwd_dq_kernel, (pad // t.block_m, b * h),
           q4, k4, v4, out, do4, dq, lse, lse2, delta, _descriptor(q4, t.block_m, use_tma),
           _descriptor(k4, t.block_n, use_tma), _descriptor(v4, t.block_n, use_tma),
           _descriptor(do4, t.block_m, use_tma), scale, scale * LOG2E, lq, lk, pad,
           HEAD_DIM=d, BLOCK_M=t.block_m, BLOCK_N=t.block_n, CAUSAL=causal, USE_TMA=use_tma, PREC=prec,
           num_warps=t.warps, num_stages=t.stages, plan=plan_q, owner=cfg,
           key=shapes + (dq.dtype, aligned(q4, k4, v4, out, do4, dq, lse, lse2, delta)))
    t = cfg.dkdv
    launch(attention_bwd_dkdv_kernel, (-(-lk // t.block_n), b * h),
           q4, k4, v4, do4, dk, dv, lse2, delta, _descriptor(q4, t.block_m, use_tma),
           _descriptor(k4, t.block_n, use_tma), _descriptor(v4, t.block_n, use_tma),
           _descriptor(do4, t.block_m, use_tma), scale, scale * LOG2E, lq, lk, pad,
           HEAD_DIM=d, BLOCK_M=t.block_m, BLOCK_N=t.block_n, CAUSAL=causal, USE_TMA=use_tma, PREC=prec,
           num_warps=t.warps, num_stages=t.stages, plan=plan_kv, owner=cfg,
           key=shapes + (dk.dtype, dv.dtype, aligned(q4, k4, v4, do4, dk, dv, lse2, delta)))
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, config, mode):
        q4, k4, v4, scale = _prepare(q, k, v, scale)
        cfg = config or default_config(q4.shape[-1], q4.dtype, q4.device, causal=causal, seq_len=q4.shape[2],
                                       batch_heads=q4.shape[0] * q4.shape[1], mode=mode)
        b, h, lq, _ = q4.shape
        rows = q4.new_empty((3, b, h, lq_pad(lq)), dtype=torch.float32)  # lse; delta and lse2 for the backward
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

