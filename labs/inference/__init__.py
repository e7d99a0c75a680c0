"""
Inference: prefill vs decode, batch size, and the KV cache
==========================================================

What you will learn:
- why generating one token at a time (decode) is memory-bound: every step streams all the weights from
  memory to do one matrix-vector product, while prompt processing (prefill) multiplies the same weights by
  thousands of tokens at once and runs near the tensor cores' peak;
- why many samples are nearly free: the time of a step stays flat as the batch grows, until the
  arithmetic intensity reaches the ridge point; tokens per second grow and cost per token falls;
- what the KV cache costs: every generated token reads the keys and values of the whole context, for
  every sequence of the batch, so long contexts make decode attention the larger part of a step;
- how far a model built from these pieces (one transformer block decode step) follows the sum of them.

The experiments:
1. `gemm`: one linear layer, M x K activations times a K x N weight (8192 x 8192 bf16 by default), for
   M = 1, 2, 4, ... 4096 rows (batch x tokens): cuBLAS (what torch calls) and a weight-streaming Triton
   kernel written for small M, against the roofline: intensity = 2MKN / (bytes of A, W and C).
2. `attention`: decode attention of one new token over a KV cache, against context and batch: the
   bytes of K and V read per step over the measured copy bandwidth (SDPA and a split-KV Triton kernel).
3. `block`: one Llama-style block's decode step (attention over a KV cache + gated MLP) at batch 1..256,
   timed as a CUDA graph, against the sum of the models of its pieces plus a fixed cost per kernel.
4. `launch`: that fixed cost, measured: an empty kernel timed alone, and one kernel node in a CUDA graph.

The memory calculator (weights, KV cache, activations, training state) lives in labs/memcalc.py.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine.gpu import MB, Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param


# Timing: timing.time_ms_clean_l2 empties the L2 by *reading* a buffer (see its docstring): a decode
# GEMM moves only ~100 MB, so the write-back of do_bench's dirty flush lines would be a large error.
time_ms = timing.time_ms_clean_l2


def graph_time_ms(fn) -> float:
    """Time of one replay of `fn` captured as a CUDA graph, timed with a clean (read-flushed) L2."""
    return timing.graph_time_ms(fn, timer=time_ms)


def attention_time_ms(fn) -> tuple[float, str]:
    """(ms, timer) of one decode-attention call: a CUDA-graph replay (see ATTENTION_TIMER below), or, should a
    backend refuse to be captured, the call timed from Python, with the row saying so."""
    try:
        return graph_time_ms(fn), "graph"
    except RuntimeError:  # not capturable here: the stream timer, named in the row
        torch.cuda.synchronize()
        return time_ms(fn), "stream"


@functools.lru_cache(maxsize=4)
def sm_count(device: str = "cuda") -> int:
    """SMs of the device (the CPU interpreter pretends to have 4, so tests take the same code paths)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


# Triton's CPU interpreter (3.9) gets tl.dot wrong on bf16 tiles; under it the tiles are upcast to fp32
# first (a constexpr, so the GPU kernels are unchanged).
UPCAST_DOT = os.environ.get("TRITON_INTERPRET") == "1"


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


# ---------------------------------------------------------------------------------------------
# Kernel 1: a weight-streaming GEMM for small M (decode)
# ---------------------------------------------------------------------------------------------
# out[M, N] = x[M, K] @ w[N, K]^T with w in torch's Linear layout. With M <= 64 the work is reading w once:
# each program streams a BLOCK_N x K_SPLIT slab of w through the tensor cores, multiplied by all M rows
# of x at once (w is the "tall" operand: out^T = w @ x^T). When N / BLOCK_N programs are too few to keep
# every SM's loads in flight, K is split across programs and a second kernel adds the partial sums.
@triton.jit(do_not_specialize=["M"])
def skinny_gemm_kernel(x_ptr, w_ptr, out_ptr, M, N, K, K_SPLIT,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PARTIAL: tl.constexpr, UPCAST: tl.constexpr):
    pid_n = tl.program_id(0)  # which BLOCK_N rows of w (= columns of out)
    pid_k = tl.program_id(1)  # which K_SPLIT slice of the reduction
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)  # all rows of x in one program (padded to 16 for the tensor cores)
    n_ok = offs_n < N
    m_ok = offs_m < M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # a tile of out^T, accumulated in fp32
    k_lo = pid_k * K_SPLIT
    for k in range(k_lo, k_lo + K_SPLIT, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K  # the last slice may run past K
        w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0, eviction_policy="evict_first")  # [BLOCK_N, BLOCK_K]: read once, never again
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)  # [BLOCK_M, BLOCK_K]: small, shared by every program (stays in L2)
        if UPCAST:
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(w, tl.trans(x), acc)  # [BLOCK_N, BLOCK_M]
    offs = offs_m[None, :] * N + offs_n[:, None]  # out is [M, N] row-major; acc holds its transpose
    mask = n_ok[:, None] & m_ok[None, :]
    if PARTIAL:  # one fp32 slab per K slice: out_ptr is [splits, M, N]
        tl.store(out_ptr + pid_k * M * N + offs, acc, mask=mask)
    else:
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sum_splits_kernel(part_ptr, out_ptr, numel, splits, BLOCK: tl.constexpr):
    """out = sum over the first axis of part[splits, numel], cast to out's dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, splits):
        acc += tl.load(part_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


SKINNY_MAX_M = 64  # the Triton kernel's range; larger M is compute work, which cuBLAS does best
# The best of eight tile shapes timed by scripts/inference_gpu.py on an H200 (8192 x 8192, M = 1..64): 3.2 TB/s
# at M = 1, where cuBLAS reaches 3.6 TB/s.
SKINNY = {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 6, "programs_per_sm": 2}
SUM_BLOCK = 1024


def skinny_config(m: int) -> dict:
    return SKINNY


def skinny_splits(m: int, n: int, k: int, sms: int, config: dict | None = None) -> tuple[int, int]:
    """(number of K slices, K per slice): enough programs to give every SM `programs_per_sm` of them."""
    c = config or skinny_config(m)
    programs = triton.cdiv(n, c["BLOCK_N"])
    want = max(1, min(triton.cdiv(c["programs_per_sm"] * sms, programs), triton.cdiv(k, c["BLOCK_K"])))
    per_split = triton.cdiv(triton.cdiv(k, want), c["BLOCK_K"]) * c["BLOCK_K"]
    return triton.cdiv(k, per_split), per_split


def skinny_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, splits: int | None = None,
                  config: dict | None = None) -> torch.Tensor:
    """x[M, K] @ w[N, K]^T for M <= 64 (both contiguous). `splits` forces the K split (tests)."""
    m, k = x.shape
    n = w.shape[0]
    if m > SKINNY_MAX_M or w.shape[1] != k or not (x.is_contiguous() and w.is_contiguous()):
        raise ValueError(f"skinny_linear takes contiguous x[M<={SKINNY_MAX_M}, K] and w[N, K]; got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    c = config or skinny_config(m)
    out = torch.empty((m, n), device=x.device, dtype=x.dtype) if out is None else out
    n_splits, per_split = skinny_splits(m, n, k, sm_count(str(x.device)), c)
    if splits is not None:
        per_split = triton.cdiv(triton.cdiv(k, splits), c["BLOCK_K"]) * c["BLOCK_K"]
        n_splits = triton.cdiv(k, per_split)
    meta = dict(BLOCK_M=max(16, next_pow2(m)), BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"],
                num_warps=c["num_warps"], num_stages=c["num_stages"], UPCAST=UPCAST_DOT)
    grid = (triton.cdiv(n, c["BLOCK_N"]), n_splits)
    if n_splits == 1:
        skinny_gemm_kernel[grid](x, w, out, m, n, k, per_split, PARTIAL=False, **meta)
    else:
        part = torch.empty((n_splits, m, n), device=x.device, dtype=torch.float32)
        skinny_gemm_kernel[grid](x, w, part, m, n, k, per_split, PARTIAL=True, **meta)
        sum_splits_kernel[(triton.cdiv(m * n, SUM_BLOCK),)](part, out, m * n, n_splits, BLOCK=SUM_BLOCK)
    return out


def skinny_launches(m: int, n: int, k: int, sms: int) -> int:
    return 1 if skinny_splits(m, n, k, sms)[0] == 1 else 2


def linear(x: torch.Tensor, w: torch.Tensor, kernel: str = "auto", out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T by the chosen kernel: "cublas" (torch), "triton" (skinny), "auto" (skinny up to M = 64)."""
    if kernel == "triton" or (kernel == "auto" and x.shape[0] <= SKINNY_MAX_M):
        return skinny_linear(x, w, out)
    if out is None:
        return torch.nn.functional.linear(x, w)
    return torch.matmul(x, w.t(), out=out)


def gemm_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64) @ w.to(torch.float64).t()  # [M, N]


# ---------------------------------------------------------------------------------------------
# Kernel 2: decode attention over a KV cache (split-KV, "flash decoding")
# ---------------------------------------------------------------------------------------------
# One new query token per sequence attends to `context` cached keys and values. A program takes one
# (sequence, K/V head) pair and one slice of the context; the GROUP query heads that share the K/V head
# ride along as the rows of the tensor-core tile, so K and V are read exactly once. Each slice keeps a
# running max and sum (the online softmax); a second kernel merges the slices with their log-sum-exps.
@triton.jit
def decode_attention_kernel(q_ptr, k_ptr, v_ptr, part_ptr, lse_ptr,
                            stride_qb, stride_kb, stride_kh, stride_kt,
                            n_kv_heads, context, tokens_per_split, n_splits, scale_log2,
                            GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                            BLOCK_T: tl.constexpr, UPCAST: tl.constexpr):
    bh = tl.program_id(0)  # (sequence, K/V head)
    split = tl.program_id(1)  # slice of the context
    b = (bh // n_kv_heads).to(tl.int64)  # 64-bit offsets: a long cache of many sequences passes 2^31 elements
    hk = bh % n_kv_heads
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    g_ok = offs_g < GROUP
    heads = hk * GROUP + offs_g  # the query heads served by this K/V head
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * HEAD_DIM + offs_d[None, :], mask=g_ok[:, None],
                other=0.0)  # [BLOCK_G, HEAD_DIM]
    if UPCAST:
        q = q.to(tl.float32)
    k_base = k_ptr + b * stride_kb + hk * stride_kh
    v_base = v_ptr + b * stride_kb + hk * stride_kh
    t_lo = split * tokens_per_split
    t_hi = tl.minimum(t_lo + tokens_per_split, context)
    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)  # running max of the scores (log2 units)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)  # running sum of exp2(score - max)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), dtype=tl.float32)
    for t in range(t_lo, t_hi, BLOCK_T):
        offs_t = t + tl.arange(0, BLOCK_T)
        t_ok = offs_t < t_hi
        kv_offs = offs_t[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(k_base + kv_offs, mask=t_ok[:, None], other=0.0)  # [BLOCK_T, HEAD_DIM]
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale_log2  # [BLOCK_G, BLOCK_T]
        s = tl.where(t_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + kv_offs, mask=t_ok[:, None], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    rows = b * n_kv_heads * GROUP + heads  # (sequence, query head) as one index
    tl.store(part_ptr + (rows[:, None] * n_splits + split) * HEAD_DIM + offs_d[None, :], acc / l_i[:, None],
             mask=g_ok[:, None])
    tl.store(lse_ptr + rows * n_splits + split, m_i + tl.log2(l_i), mask=g_ok)


@triton.jit
def merge_splits_kernel(part_ptr, lse_ptr, out_ptr, n_splits, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """out[row] = sum over slices of weight_s * part[row, s], weight_s = softmax of the slices' log-sum-exps."""
    row = tl.program_id(0)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    s_ok = offs_s < n_splits
    lse = tl.load(lse_ptr + row * n_splits + offs_s, mask=s_ok, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, 0))
    weight = weight / tl.sum(weight, 0)
    part = tl.load(part_ptr + (row * n_splits + offs_s[:, None]) * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None],
                   other=0.0)
    tl.store(out_ptr + row * HEAD_DIM + offs_d, tl.sum(part * weight[:, None], 0).to(out_ptr.dtype.element_ty))


ATTN = {"BLOCK_T": 64, "num_warps": 4, "num_stages": 3, "programs_per_sm": 4, "max_splits": 64}


def attention_splits(batch: int, n_kv_heads: int, context: int, sms: int, config: dict | None = None) -> tuple[int, int]:
    """(number of context slices, tokens per slice)."""
    c = config or ATTN
    want = triton.cdiv(c["programs_per_sm"] * sms, batch * n_kv_heads)
    splits = max(1, min(want, c["max_splits"], triton.cdiv(context, c["BLOCK_T"])))
    per_split = triton.cdiv(triton.cdiv(context, splits), c["BLOCK_T"]) * c["BLOCK_T"]
    return triton.cdiv(context, per_split), per_split


def triton_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context: int,
                            out: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """q[B, H*D] (rows may be strided), caches [B, Hkv, T_max, D]; attends to the first `context` tokens.

    Returns out[B, H*D].
    """
    c = config or ATTN
    b, n_kv, _, d = k_cache.shape
    h = q.shape[1] // d
    if q.stride(1) != 1 or k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError("decode attention wants unit-stride head dims and K, V caches of one layout")
    n_splits, per_split = attention_splits(b, n_kv, context, sm_count(str(q.device)), c)
    part = torch.empty((b * h, n_splits, d), device=q.device, dtype=torch.float32)
    lse = torch.empty((b * h, n_splits), device=q.device, dtype=torch.float32)
    out = torch.empty((b, h * d), device=q.device, dtype=q.dtype) if out is None else out
    group = h // n_kv
    decode_attention_kernel[(b * n_kv, n_splits)](
        q, k_cache, v_cache, part, lse, q.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        n_kv, context, per_split, n_splits, (1.0 / math.sqrt(d)) * 1.4426950408889634,
        GROUP=group, BLOCK_G=max(16, next_pow2(group)), HEAD_DIM=d, BLOCK_T=c["BLOCK_T"],
        num_warps=c["num_warps"], num_stages=c["num_stages"], UPCAST=UPCAST_DOT)
    merge_splits_kernel[(b * h,)](part, lse, out, n_splits, HEAD_DIM=d, BLOCK_S=max(16, next_pow2(n_splits)))
    return out


def sdpa_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context: int,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """The same with torch's scaled_dot_product_attention. The GROUP query heads of one K/V head become
    GROUP query positions (no mask: a decode token sees the whole cache), so K and V are read once."""
    b, n_kv, _, d = k_cache.shape
    h = q.shape[1] // d
    qg = q.view(b, n_kv, h // n_kv, d)
    o = torch.nn.functional.scaled_dot_product_attention(qg, k_cache[:, :, :context], v_cache[:, :, :context])
    o = o.reshape(b, h * d)
    if out is not None:
        out.copy_(o)
        return out
    return o


def attention(q, k_cache, v_cache, context, kernel: str = "triton", out=None):
    if kernel == "sdpa":
        return sdpa_decode_attention(q, k_cache, v_cache, context, out)
    return triton_decode_attention(q, k_cache, v_cache, context, out)


def attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context: int) -> torch.Tensor:
    """Softmax(q k^T / sqrt(D)) v in float64; q[B, H*D] -> [B, H*D]."""
    b, n_kv, _, d = k_cache.shape
    h = q.shape[1] // d
    qf = q.to(torch.float64).reshape(b, n_kv, h // n_kv, d)  # query heads grouped by K/V head
    k = k_cache[:, :, :context].to(torch.float64)
    v = v_cache[:, :, :context].to(torch.float64)
    p = torch.softmax(qf @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)  # [B, Hkv, G, T]
    return (p @ v).reshape(b, h * d)


# ---------------------------------------------------------------------------------------------
# Kernel 3: the small layers of a block (one program per row)
# ---------------------------------------------------------------------------------------------
@triton.jit
def rmsnorm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, xo_ptr, D, eps,
                   HAS_RESIDUAL: tl.constexpr, BLOCK_D: tl.constexpr):
    """h = RMSNorm(x [+ r]) * w; with a residual, the sum is also written to xo (the new residual stream)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    x = tl.load(x_ptr + row * D + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(r_ptr + row * D + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(xo_ptr + row * D + offs, x.to(xo_ptr.dtype.element_ty), mask=mask)
    rms = tl.sqrt(tl.sum(x * x, 0) / D + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(h_ptr + row * D + offs, (x / rms * w).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def silu_mul_kernel(gu_ptr, out_ptr, F, BLOCK: tl.constexpr):
    """out[row] = silu(gate) * up, where gu[row] = [gate (F values) | up (F values)]."""
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < F
    gate = tl.load(gu_ptr + row * 2 * F + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * 2 * F + F + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * F + offs, (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty), mask=mask)


EPS = 1e-5
SILU_BLOCK = 1024


def rmsnorm(x, w, residual=None, x_out=None):
    """(h, x_new): h = RMSNorm(x + residual) * w; x_new = x + residual (x itself without a residual)."""
    rows, d = x.shape
    h = torch.empty_like(x)
    if residual is None:
        rmsnorm_kernel[(rows,)](x, x, w, h, x, d, EPS, HAS_RESIDUAL=False, BLOCK_D=next_pow2(d))
        return h, x
    x_out = torch.empty_like(x) if x_out is None else x_out
    rmsnorm_kernel[(rows,)](x, residual, w, h, x_out, d, EPS, HAS_RESIDUAL=True, BLOCK_D=next_pow2(d))
    return h, x_out


def silu_mul(gu):
    rows, two_f = gu.shape
    f = two_f // 2
    out = torch.empty((rows, f), device=gu.device, dtype=gu.dtype)
    silu_mul_kernel[(rows, triton.cdiv(f, SILU_BLOCK))](gu, out, f, BLOCK=SILU_BLOCK)
    return out


# ---------------------------------------------------------------------------------------------
# One transformer block, decoding one token per sequence
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockShape:
    d_model: int
    heads: int
    kv_heads: int
    d_ff: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def weight_shapes(self) -> dict:
        """[out, in] of each matrix (torch's Linear layout)."""
        return {"qkv": (self.qkv_width, self.d_model), "o": (self.d_model, self.heads * self.head_dim),
                "gate_up": (2 * self.d_ff, self.d_model), "down": (self.d_model, self.d_ff)}

    @property
    def params(self) -> int:
        return sum(a * b for a, b in self.weight_shapes.values()) + 2 * self.d_model


class DecodeBlock:
    """A Llama-style block: RMSNorm -> QKV -> append K, V to the cache -> attention -> O -> add ->
    RMSNorm -> gate/up -> SiLU(gate) * up -> down -> add. One `step` decodes one token per sequence at
    position `context` (the cache holds `context` earlier tokens)."""

    def __init__(self, shape: BlockShape, batch: int, context: int, dtype: str, device: str,
                 gemm: str = "auto", attention_kernel: str = "triton", weights: dict | None = None):
        self.shape, self.batch, self.context = shape, batch, context
        self.gemm, self.attention_kernel = gemm, attention_kernel
        self.weights = weights or make_block_weights(shape, dtype, device)
        d, hd = shape.head_dim, shape.head_dim
        self.k_cache = timing.random_tensor((batch, shape.kv_heads, context + 1, d), dtype, device)
        self.v_cache = timing.random_tensor((batch, shape.kv_heads, context + 1, hd), dtype, device)
        self.x = timing.random_tensor((batch, shape.d_model), dtype, device)

    def step(self, out: torch.Tensor | None = None) -> torch.Tensor:
        s, w, t = self.shape, self.weights, self.context
        q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
        h, _ = rmsnorm(self.x, w["norm1"])
        qkv = linear(h, w["qkv"], self.gemm)  # [B, (H + 2 Hkv) D]
        self.k_cache[:, :, t].copy_(qkv[:, q_width:q_width + kv_width].view(-1, s.kv_heads, s.head_dim))
        self.v_cache[:, :, t].copy_(qkv[:, q_width + kv_width:].view(-1, s.kv_heads, s.head_dim))
        a = attention(qkv[:, :q_width], self.k_cache, self.v_cache, t + 1, self.attention_kernel)  # [B, H D]
        o = linear(a, w["o"], self.gemm)
        h2, x1 = rmsnorm(self.x, w["norm2"], residual=o)
        act = silu_mul(linear(h2, w["gate_up"], self.gemm))  # [B, F]
        y = linear(act, w["down"], self.gemm)
        out = torch.empty_like(self.x) if out is None else out
        return torch.add(x1, y, out=out)

    def reference(self) -> torch.Tensor:
        """The same step in float64 (reads the cache as it is before the step)."""
        s, t = self.shape, self.context
        w = {k: v.to(torch.float64) for k, v in self.weights.items()}
        x = self.x.to(torch.float64)

        def norm(v, g):
            return v / torch.sqrt((v * v).mean(-1, keepdim=True) + EPS) * g

        qkv = norm(x, w["norm1"]) @ w["qkv"].t()
        q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
        k = self.k_cache.to(torch.float64).clone()
        v = self.v_cache.to(torch.float64).clone()
        k[:, :, t] = qkv[:, q_width:q_width + kv_width].view(-1, s.kv_heads, s.head_dim)
        v[:, :, t] = qkv[:, q_width + kv_width:].view(-1, s.kv_heads, s.head_dim)
        a = attention_reference(qkv[:, :q_width], k, v, t + 1)
        x1 = x + a @ w["o"].t()
        gu = norm(x1, w["norm2"]) @ w["gate_up"].t()
        gate, up = gu[:, :s.d_ff], gu[:, s.d_ff:]
        return x1 + (gate * torch.sigmoid(gate) * up) @ w["down"].t()


def make_block_weights(shape: BlockShape, dtype: str, device: str) -> dict:
    """Random weights scaled by 1/sqrt(fan-in), so activations keep unit size through the block."""
    weights = {}
    for name, (rows, cols) in shape.weight_shapes.items():
        weights[name] = (torch.randn((rows, cols), device=device) / math.sqrt(cols)).to(timing.torch_dtype(dtype))
    for name in ("norm1", "norm2"):
        weights[name] = (1 + 0.1 * torch.randn((shape.d_model,), device=device)).to(timing.torch_dtype(dtype))
    return weights


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENTS = ("gemm", "attention", "block")


@dataclass(frozen=True)
class Params:
    experiments: tuple = param(EXPERIMENTS, "what to run (the launch cost is always measured)", choices=EXPERIMENTS)
    dtype: str = param("bf16", "weights, activations and KV cache", choices=("bf16", "fp16"))
    gemm_k: int = param(8192, "GEMM: inner size K (d_model of the layer)", min=16, max=32768)
    gemm_n: int = param(8192, "GEMM: output size N (width of the weight)", min=16, max=65536)
    gemm_m: tuple = param(tuple(2**i for i in range(13)), "GEMM: rows M (batch x tokens)", min=1, max=16384)
    gemm_kernels: tuple = param(("cublas", "triton"), "GEMM kernels (triton: the weight-streaming kernel, "
                                f"M <= {SKINNY_MAX_M} only)", choices=("cublas", "triton"))
    d_model: int = param(4096, "attention and block: model width", min=16, max=16384)
    heads: int = param(32, "query heads (head dim = d_model / heads, a power of two from 16 to 256)", min=1, max=256)
    kv_heads: int = param(8, "K/V heads (must divide heads; fewer = grouped-query attention)", min=1, max=256)
    attn_context: tuple = param((512, 2048, 8192, 32768), "attention: cached tokens", unit="tokens", min=1,
                                max=1_048_576)
    attn_batch: tuple = param((1, 8, 64), "attention: sequences", min=1, max=4096)
    attn_kernels: tuple = param(("triton", "sdpa"), "attention kernels", choices=("triton", "sdpa"))
    d_ff: int = param(14336, "block: MLP hidden size", min=16, max=65536)
    block_context: int = param(1024, "block: cached tokens per sequence", unit="tokens", min=1, max=1_048_576)
    block_batch: tuple = param(tuple(2**i for i in range(9)), "block: sequences decoded at once", min=1, max=4096)
    block_gemm: str = param("cublas", f"block: GEMM kernel (triton: batch <= {SKINNY_MAX_M} only; auto: triton "
                            "up to 64, then cuBLAS)", choices=("cublas", "triton", "auto"))
    block_attention: str = param("triton", "block: attention kernel", choices=("triton", "sdpa"))
    usd_per_gpu_hour: float = param(2.5, "rent of one GPU, for the cost per token", unit="$/h", min=0.0, max=1000.0)

    @property
    def block_shape(self) -> BlockShape:
        return BlockShape(self.d_model, self.heads, self.kv_heads, self.d_ff)


def check_shapes(p: Params) -> None:
    """Refuse shapes the kernels cannot run, with what to change."""
    if p.d_model % p.heads:
        raise ParamError(f"heads = {p.heads} does not divide d_model = {p.d_model}: each head gets d_model / heads "
                         "dimensions, which must be a whole number.")
    hd = p.d_model // p.heads
    if hd < 16 or hd > 256 or hd & (hd - 1):
        raise ParamError(f"head dim = d_model / heads = {hd}; the attention kernels take a power of two from 16 to 256 "
                         f"(for d_model = {p.d_model}, try heads = {max(1, p.d_model // 128)}).")
    if p.heads % p.kv_heads:
        raise ParamError(f"kv_heads = {p.kv_heads} does not divide heads = {p.heads}: each K/V head serves a whole "
                         "group of query heads.")
    if "block" in p.experiments and p.block_gemm == "triton" and max(p.block_batch) > SKINNY_MAX_M:
        raise ParamError(f"block_gemm = triton handles batch <= {SKINNY_MAX_M}; use auto (cuBLAS above it) or "
                         "smaller block_batch values.")


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
# The fixed cost of a kernel, measured with scripts/inference_gpu.py on an H200 (3.49 to 3.55 us and 1.32 us)
# and re-measured by every run (the `launch` rows): the smallest kernel that touches memory (it reads one
# number that is not in the L2 and writes one back) timed alone by `time_ms`, and each extra such kernel
# inside a CUDA graph.
LAUNCH_ALONE_MS = 0.0035
GRAPH_NODE_MS = 0.0013


def fixed_ms(launches: int) -> float:
    """Fixed cost of one piece of work made of `launches` kernels back to back: the first as if timed alone,
    each further one as a graph node."""
    return LAUNCH_ALONE_MS + (launches - 1) * GRAPH_NODE_MS


def matmul_tflops(target: Target, dtype: str) -> float:
    rate = target.ceilings.matmul_tflops.get(dtype)
    if not rate:
        raise ParamError(f"{target.name} has no measured {dtype} matmul rate ({dtype} tensor cores unsupported?); "
                         f"choose dtype from {', '.join(d for d in ('bf16', 'fp16') if target.ceilings.matmul_tflops.get(d))}.")
    return rate


def roofline_ms(flops: float, nbytes: float, target: Target, dtype: str) -> float:
    """Time on the roofline: the slower of doing the math at the matmul peak and moving the bytes at copy speed."""
    return max(flops / (matmul_tflops(target, dtype) * 1e12), nbytes / (target.ceilings.copy_tbps * 1e12)) * 1e3


def gemm_flops(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n


def gemm_bytes(m: int, k: int, n: int, dtype: str) -> float:
    """A [M, K] and W [K, N] read once, C [M, N] written once."""
    return float(timing.element_bytes(dtype) * (m * k + k * n + m * n))


def gemm_intensity(m: int, k: int, n: int, dtype: str) -> float:
    return gemm_flops(m, k, n) / gemm_bytes(m, k, n, dtype)


def roofline_ridge_m(k: int, n: int, dtype: str, target: Target) -> float | None:
    """The M at which the GEMM's intensity reaches the ridge (peak / bandwidth), None if it never does.

    2MKN / (e (MK + KN + MN)) = R  <=>  M = R e K N / (2 K N - R e (K + N)).
    """
    r = matmul_tflops(target, dtype) / target.ceilings.copy_tbps
    e = timing.element_bytes(dtype)
    denominator = 2 * k * n - r * e * (k + n)
    return r * e * k * n / denominator if denominator > 0 else None


def gemm_kernel_launches(kernel: str, m: int, k: int, n: int, target: Target) -> int:
    if kernel == "triton" or (kernel == "auto" and m <= SKINNY_MAX_M):
        return skinny_launches(m, n, k, target.sm_count)
    return 1


def gemm_points(p: Params) -> list[tuple[str, int]]:
    return [(kernel, m) for kernel in p.gemm_kernels for m in p.gemm_m if kernel == "cublas" or m <= SKINNY_MAX_M]


def per_token(ms: float, tokens: int, usd_per_hour: float) -> dict:
    """Tokens per second and dollars per million tokens for `tokens` tokens done in `ms`."""
    return {"tokens_per_s": tokens / (ms * 1e-3), "usd_per_mtok": ms * 1e-3 / 3600 * usd_per_hour / tokens * 1e6}


def kv_bytes(batch: int, context: int, kv_heads: int, head_dim: int, dtype: str) -> float:
    """K and V of `context` tokens, one layer, `batch` sequences."""
    return 2.0 * batch * context * kv_heads * head_dim * timing.element_bytes(dtype)


def attention_cost(batch: int, context: int, p: Params) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step's attention in one layer: read K, V, q; write the output."""
    hd = p.d_model // p.heads
    e = timing.element_bytes(p.dtype)
    flops = 4.0 * batch * p.heads * context * hd  # q k^T and p v, 2 FLOPs per multiply-add
    nbytes = kv_bytes(batch, context, p.kv_heads, hd, p.dtype) + 2.0 * batch * p.heads * hd * e
    return flops, nbytes


def attention_launches(kernel: str) -> int:
    return 2  # triton: attention + merge; SDPA: attention + the copy that reshapes its output


def skinny_mma_ms(m: int, k: int, n: int, target: Target, dtype: str) -> float:
    """Tensor-core time of the weight-streaming kernel: its tile has max(16, next power of two >= M) rows, so
    M = 1 multiplies as many rows as M = 16. The kernel multiplies a tile once it has arrived rather than while
    the next one streams in, so this time adds to the bytes' time instead of hiding under it (on the H100 and the
    H200 the Triton kernel's time grows with M from 16 rows up by this much, cuBLAS's does not)."""
    rows = max(16, next_pow2(m))
    return gemm_flops(rows, k, n) / (matmul_tflops(target, dtype) * 1e12) * 1e3


def gemm_ms(kernel: str, m: int, k: int, n: int, target: Target, dtype: str) -> float:
    """One linear layer: the roofline, the fixed cost of its launches, and for the skinny kernel its tile's
    tensor-core time."""
    ms = roofline_ms(gemm_flops(m, k, n), gemm_bytes(m, k, n, dtype), target, dtype) \
        + fixed_ms(gemm_kernel_launches(kernel, m, k, n, target))
    if kernel == "triton" or (kernel == "auto" and m <= SKINNY_MAX_M):
        ms += skinny_mma_ms(m, k, n, target, dtype)
    return ms


def predict_gemm(p: Params, target: Target) -> list[dict]:
    rows = []
    k, n = p.gemm_k, p.gemm_n
    for kernel, m in gemm_points(p):
        flops, nbytes = gemm_flops(m, k, n), gemm_bytes(m, k, n, p.dtype)
        ms = gemm_ms(kernel, m, k, n, target, p.dtype)
        i = flops / nbytes
        rows.append({"experiment": "gemm", "kernel": kernel, "m": m, "k": k, "n": n,
                     "intensity_flop_per_byte": i,
                     "bound": "memory" if i < matmul_tflops(target, p.dtype) / target.ceilings.copy_tbps else "compute",
                     "flops": flops, "bytes": nbytes, "predicted_ms": ms,
                     "predicted_tflops": timing.tflops(flops, ms), "predicted_tbps": timing.tbps(nbytes, ms),
                     **{f"predicted_{key}": v for key, v in per_token(ms, m, p.usd_per_gpu_hour).items()}})
    return rows


# SDPA's decode kernel gives each (sequence, K/V head) pair one thread block, which walks the pair's whole context
# alone. With fewer pairs than SMs the step cannot be faster than one block streaming its pair's K and V, and no
# datasheet gives the rate one block streams at: every run measures it (the `sdpa-block` probe row, one pair at
# SDPA_PROBE_CONTEXT tokens, its fixed cost taken off) and the SDPA points of that run are predicted with it.
SDPA_PROBE_CONTEXT = 16384


def sdpa_block_bytes(context: int, p: Params) -> float:
    """K and V of one (sequence, K/V head) pair: what one of SDPA's thread blocks reads."""
    return kv_bytes(1, context, 1, p.d_model // p.heads, p.dtype)


def sdpa_block_ms(context: int, p: Params, block_gbps: float | None) -> float:
    """The one-block floor of an SDPA decode step: a pair's K and V at the rate one block streams (0 if unknown)."""
    return sdpa_block_bytes(context, p) / (block_gbps * 1e9) * 1e3 if block_gbps else 0.0


# A decode-attention call costs more than two launches even when it reads almost nothing: each of its kernels
# waits for its first loads from memory (the timer has just emptied the L2), the second starts only when the first
# has finished, and the split-KV kernel's partial results make one more round trip. No datasheet gives that, so
# every run measures it per kernel (the `<kernel>-fixed` probe rows: one sequence, one tile of FIXED_PROBE_CONTEXT
# tokens, checked) and the model adds it to the time of the bytes; without a probe it is two launches.
FIXED_PROBE_CONTEXT = ATTN["BLOCK_T"]


def attention_fixed_ms(kernel: str, fixed: dict | None = None) -> float:
    """The fixed cost of one decode-attention call of `kernel`: probed ({kernel: ms}) or two launches."""
    return (fixed or {}).get(kernel) or fixed_ms(attention_launches(kernel))


def attention_row(kernel: str, batch: int, context: int, p: Params, target: Target,
                  block_gbps: float | None = None, fixed: dict | None = None) -> dict:
    """One attention point: the roofline (bytes at the copy rate) and, for SDPA, the one-block floor when the
    block rate is known; plus the fixed cost of a call (probed in the run, or two launches)."""
    hd = p.d_model // p.heads
    flops, nbytes = attention_cost(batch, context, p)
    roof_ms = roofline_ms(flops, nbytes, target, p.dtype)
    block_ms = sdpa_block_ms(context, p, block_gbps) if kernel == "sdpa" else 0.0
    fixed_call_ms = attention_fixed_ms(kernel, fixed)
    ms = max(roof_ms, block_ms) + fixed_call_ms
    row = {"experiment": "attention", "kernel": kernel, "batch": batch, "context": context,
           "kv_bytes": kv_bytes(batch, context, p.kv_heads, hd, p.dtype),
           "kv_bytes_per_token": kv_bytes(1, 1, p.kv_heads, hd, p.dtype),
           "bytes": nbytes, "predicted_ms": ms, "predicted_tbps": timing.tbps(nbytes, ms),
           "predicted_fixed_ms": fixed_call_ms}
    if kernel == "sdpa" and block_gbps:
        row |= {"sdpa_block_gbps": block_gbps, "predicted_limit": "one block" if block_ms > roof_ms else "bandwidth"}
    return row


@functools.lru_cache(maxsize=16)
def recorded_block_gbps(gpu_key: str) -> float | None:
    """The SDPA block rate from the newest recording of this GPU kind, if it has the probe (read once a process:
    the committed recordings do not change under a running app)."""
    from labs.collectives import recorded_rows

    for r in recorded_rows("inference", gpu_key):
        if r.get("experiment") == "probe" and r.get("kernel") == "sdpa-block":
            return r.get("measured_gbps")
    return None


@functools.lru_cache(maxsize=16)
def _recorded_fixed(gpu_key: str) -> tuple:
    from labs.collectives import recorded_rows

    return tuple(probed_fixed_ms(recorded_rows("inference", gpu_key)).items())


def probed_fixed_ms(rows: list) -> dict:
    """{kernel: ms} from the `<kernel>-fixed` probe rows of a run."""
    return {r["kernel"][:-len("-fixed")]: r["measured_ms"] for r in rows if isinstance(r, dict)
            and r.get("experiment") == "probe" and str(r.get("kernel", "")).endswith("-fixed") and r.get("measured_ms")}


def predict_attention(p: Params, target: Target, block_gbps: float | None = None,
                      fixed: dict | None = None) -> list[dict]:
    block_gbps = block_gbps or ("sdpa" in p.attn_kernels and recorded_block_gbps(target.key)) or None
    fixed = fixed if fixed is not None else dict(_recorded_fixed(target.key))
    return [attention_row(kernel, batch, context, p, target, block_gbps, fixed)
            for kernel in p.attn_kernels for batch in p.attn_batch for context in p.attn_context]


def block_parts(p: Params, batch: int, target: Target) -> dict:
    """The model of one decode step of the block: the sum of the models above.

    The four GEMMs and the attention as the `gemm` and `attention` experiments predict them (roofline time +
    the fixed cost of a kernel timed alone, + a graph node for each second kernel), plus the small layers
    (norms, adds, SiLU, cache writes: their bytes at copy speed + one graph node each).
    Returns ms per part (gemm, attention, small layers, fixed costs) and the number of kernels.
    """
    s, e, t = p.block_shape, timing.element_bytes(p.dtype), p.block_context
    gemm_time, fixed, kernels = 0.0, 0.0, 0
    for (n, k) in s.weight_shapes.values():
        launches = gemm_kernel_launches(p.block_gemm, batch, k, n, target)
        gemm_time += gemm_ms(p.block_gemm, batch, k, n, target, p.dtype) - fixed_ms(launches)
        fixed += fixed_ms(launches)
        kernels += launches
    flops, nbytes = attention_cost(batch, t + 1, p)
    attention_ms = roofline_ms(flops, nbytes, target, p.dtype)
    fixed += fixed_ms(attention_launches(p.block_attention))
    kernels += attention_launches(p.block_attention)
    d, f, kv = s.d_model, s.d_ff, s.kv_heads * s.head_dim
    small_bytes = e * batch * (2 * d  # RMSNorm 1: read x, write h
                               + 2 * 2 * kv  # copy the new K and V into the cache
                               + 4 * d  # add + RMSNorm 2: read x and o, write x1 and h
                               + 3 * f  # SiLU(gate) * up: read 2F, write F
                               + 3 * d)  # final add: read two, write one
    small_ms = small_bytes / (target.ceilings.copy_tbps * 1e12) * 1e3
    kernels += 6  # two norms, two cache copies, SiLU * up, the final add
    fixed += 6 * GRAPH_NODE_MS
    return {"gemm_ms": gemm_time, "attention_ms": attention_ms, "small_ms": small_ms, "fixed_ms": fixed,
            "kernels": kernels, "weight_bytes": e * s.params, "kv_bytes": kv_bytes(batch, t + 1, s.kv_heads, s.head_dim, p.dtype)}


def predict_block(p: Params, target: Target) -> list[dict]:
    rows = []
    for batch in p.block_batch:
        parts = block_parts(p, batch, target)
        ms = parts["gemm_ms"] + parts["attention_ms"] + parts["small_ms"] + parts["fixed_ms"]
        rows.append({"experiment": "block", "kernel": f"{p.block_gemm}+{p.block_attention}", "batch": batch,
                     "context": p.block_context, "kernels": parts["kernels"], "weight_bytes": parts["weight_bytes"],
                     "kv_bytes": parts["kv_bytes"], "predicted_ms": ms,
                     **{f"predicted_{k}": v for k, v in parts.items() if k.endswith("_ms")},
                     **{f"predicted_{key}": v for key, v in per_token(ms, batch, p.usd_per_gpu_hour).items()}})
    return rows


def predict_launch(p: Params, target: Target) -> list[dict]:
    return [{"experiment": "launch", "kernel": "alone", "predicted_ms": LAUNCH_ALONE_MS},
            {"experiment": "launch", "kernel": "graph-node", "predicted_ms": GRAPH_NODE_MS}]


def predict(p: Params, target: Target) -> list[dict]:
    check_shapes(p)
    rows = predict_launch(p, target)
    if "gemm" in p.experiments:
        rows += predict_gemm(p, target)
    if "attention" in p.experiments:
        rows += predict_attention(p, target)
    if "block" in p.experiments:
        rows += predict_block(p, target)
    return rows


def ridge_m(rows: list, kind: str = "measured", kernel: str = "cublas") -> float | None:
    """Where the flat part of time-vs-M meets the compute line: t(smallest M) / (t(largest M) / largest M).

    Read off `kind` = "measured" or "predicted" GEMM rows of one kernel; None without enough points.
    """
    pts = sorted((r["m"], r.get(f"{kind}_ms")) for r in rows
                 if r.get("experiment") == "gemm" and r.get("kernel") == kernel and r.get(f"{kind}_ms"))
    if len(pts) < 3:
        return None
    (_, t_flat), (m_max, t_max) = pts[0], pts[-1]
    ridge = t_flat / (t_max / m_max)
    return ridge if ridge < m_max else None


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
def memory_needed(p: Params) -> dict:
    """Bytes each experiment allocates at its peak (they run one after the other)."""
    e = timing.element_bytes(p.dtype)
    hd = p.d_model // p.heads
    need = {}
    if "gemm" in p.experiments:
        m = max(p.gemm_m)
        need["gemm"] = e * (p.gemm_k * p.gemm_n + m * p.gemm_k + 2 * m * p.gemm_n) + 4 * 8 * SKINNY_MAX_M * p.gemm_n
    if "attention" in p.experiments:
        b, t = max(p.attn_batch), max(p.attn_context)
        need["attention"] = kv_bytes(b, t, p.kv_heads, hd, p.dtype) + 8 * kv_bytes(min(b, CHECK_SEQUENCES), t,
                                                                                    p.kv_heads, hd, p.dtype) / e
    if "block" in p.experiments:
        b, s = max(p.block_batch), p.block_shape
        need["block"] = e * s.params + kv_bytes(b, p.block_context + 1, s.kv_heads, s.head_dim, p.dtype) \
            + 16 * e * b * (s.qkv_width + 3 * s.d_ff + 4 * s.d_model)
    return need


def check(p: Params, target: Target) -> None:
    """Refuse what cannot run here, before anything is allocated."""
    check_shapes(p)
    matmul_tflops(target, p.dtype)
    need = memory_needed(p)
    if not need:
        return
    name, most = max(need.items(), key=lambda kv: kv[1])
    most += timing.FLUSH_BYTES
    free = free_memory_bytes() if target.live else target.memory_bytes
    if most > 0.9 * free:
        hints = {"gemm": "smaller gemm_k, gemm_n or largest gemm_m", "attention": "shorter attn_context or "
                 "smaller attn_batch", "block": "smaller d_model, d_ff, block_context or block_batch"}
        raise ParamError(f"The {name} experiment needs {most / 1e9:.1f} GB; this GPU has {free / 1e9:.1f} GB free. "
                         f"Choose {hints[name]}.")


CHECK_SEQUENCES = 2  # attention is checked on the first sequences of the timed problem itself


@triton.jit
def touch_kernel(x_ptr, offset):
    """The smallest kernel that touches memory: read one number, write it back plus one. Its time is the
    fixed cost every kernel pays (launch, one trip to memory, completion)."""
    tl.store(x_ptr + offset, tl.load(x_ptr + offset) + 1.0)


TOUCH_STRIDE = 4096  # 16 KB apart: every kernel of a graph reads a line that no other kernel brought into the L2


def measure_launch(progress):
    x = torch.zeros(34 * TOUCH_STRIDE, device="cuda")
    progress(0.0, "fixed cost of a kernel: timing the smallest kernel that touches memory")
    alone = time_ms(lambda: touch_kernel[(1,)](x, 0))
    yield {"experiment": "launch", "kernel": "alone", "measured_ms": alone}

    def many(count):
        def run():
            for i in range(count):
                touch_kernel[(1,)](x, i * TOUCH_STRIDE)
        return run

    node = (graph_time_ms(many(33)) - graph_time_ms(many(1))) / 32
    yield {"experiment": "launch", "kernel": "graph-node", "measured_ms": node}


def measure_gemm(p: Params, target: Target, progress, done, total):
    k, n = p.gemm_k, p.gemm_n
    w = timing.random_tensor((n, k), p.dtype)  # torch's Linear layout: [out, in]
    x_all = timing.random_tensor((max(p.gemm_m), k), p.dtype)
    w_odd = timing.random_tensor((777, 1001), p.dtype)  # odd sizes: every mask in the kernel is exercised
    for kernel, m in gemm_points(p):
        progress(done / total, f"GEMM {kernel}, M = {m}: checking against float64")
        x_odd = timing.random_tensor((m, 1001), p.dtype)
        out = torch.full((m, 777), float("nan"), device="cuda", dtype=x_odd.dtype)
        linear(x_odd, w_odd, kernel, out)
        err = timing.check_close(out, gemm_reference(x_odd, w_odd), p.dtype, f"GEMM {kernel} M={m}")
        progress(done / total, f"GEMM {kernel}, M = {m}: timing")
        x = x_all[:m]
        y = torch.empty((m, n), device="cuda", dtype=x.dtype)
        ms = time_ms(lambda: linear(x, w, kernel, y))
        flops, nbytes = gemm_flops(m, k, n), gemm_bytes(m, k, n, p.dtype)
        done += 1
        yield {"experiment": "gemm", "kernel": kernel, "m": m, "k": k, "n": n, "measured_ms": ms,
               "measured_tflops": timing.tflops(flops, ms), "measured_tbps": timing.tbps(nbytes, ms),
               **{f"measured_{key}": v for key, v in per_token(ms, m, p.usd_per_gpu_hour).items()},
               "check_rel_error": err}


def measure_fixed(p: Params, kernel: str, progress, fraction: float = 0.0) -> dict:
    """The probe row of a decode-attention call's fixed cost: one sequence, FIXED_PROBE_CONTEXT tokens, checked."""
    hd = p.d_model // p.heads
    progress(fraction, f"attention probe: the fixed cost of a {kernel} call ({FIXED_PROBE_CONTEXT} tokens)")
    k_cache = timing.random_tensor((1, p.kv_heads, FIXED_PROBE_CONTEXT, hd), p.dtype)
    v_cache = timing.random_tensor((1, p.kv_heads, FIXED_PROBE_CONTEXT, hd), p.dtype)
    q = timing.random_tensor((1, p.heads * hd), p.dtype)
    out = torch.full_like(q, float("nan"))
    attention(q, k_cache, v_cache, FIXED_PROBE_CONTEXT, kernel, out)
    err = timing.check_close(out, attention_reference(q, k_cache, v_cache, FIXED_PROBE_CONTEXT), p.dtype,
                            f"{kernel} fixed-cost probe")
    ms, timer = attention_time_ms(lambda: attention(q, k_cache, v_cache, FIXED_PROBE_CONTEXT, kernel, out))
    return {"experiment": "probe", "kernel": f"{kernel}-fixed", "batch": 1, "context": FIXED_PROBE_CONTEXT,
            "measured_ms": ms, "timer": timer, "check_rel_error": err}


def block_gbps_from(probe_ms: float, p: Params, fixed_call_ms: float) -> float:
    """The rate one SDPA block streams at, from the probe's time less the fixed cost of a call."""
    return sdpa_block_bytes(SDPA_PROBE_CONTEXT, p) / (max(probe_ms - fixed_call_ms, 1e-6) * 1e-3) / 1e9


def measure_sdpa_block(p: Params, progress, fraction: float = 0.0, fixed: dict | None = None) -> dict:
    """The probe row: the rate one SDPA thread block streams K and V at (one sequence, one K/V head, checked)."""
    hd, group = p.d_model // p.heads, p.heads // p.kv_heads
    progress(fraction, f"attention probe: one SDPA thread block over {SDPA_PROBE_CONTEXT} tokens")
    k_cache = timing.random_tensor((1, 1, SDPA_PROBE_CONTEXT, hd), p.dtype)
    v_cache = timing.random_tensor((1, 1, SDPA_PROBE_CONTEXT, hd), p.dtype)
    q = timing.random_tensor((1, group * hd), p.dtype)
    out = torch.full_like(q, float("nan"))
    sdpa_decode_attention(q, k_cache, v_cache, SDPA_PROBE_CONTEXT, out)
    err = timing.check_close(out, attention_reference(q, k_cache, v_cache, SDPA_PROBE_CONTEXT), p.dtype,
                            "SDPA one-block probe")
    ms, timer = attention_time_ms(lambda: sdpa_decode_attention(q, k_cache, v_cache, SDPA_PROBE_CONTEXT, out))
    return {"experiment": "probe", "kernel": "sdpa-block", "context": SDPA_PROBE_CONTEXT, "measured_ms": ms,
            "timer": timer,
            "measured_gbps": block_gbps_from(ms, p, attention_fixed_ms("sdpa", fixed)),  # the streaming part alone
            "check_rel_error": err}


# ATTENTION_TIMER: decode-attention calls (and their probes) are timed as CUDA-graph replays, as serving engines
# run decode steps. Called from Python, the split-KV call's CPU side (two Triton launches and two allocations; one
# Triton launch took 0.08 to 0.21 ms of CPU in the attention lab's recordings) runs while the timer empties the L2
# by reading 512 MiB, which takes 512 MiB / the copy rate: 0.18 ms on an H100, 0.13 ms on an H200. Whatever the CPU
# needs beyond that read, the events count. The H200's two recordings had the Triton kernels at batch 1 and 8 with
# 512 to 8192 tokens at 16 to 55 us where the model of the GPU's work says 10 to 17 us, the H100's once 68 us for
# 13 us (batch 1, 2048 tokens), and one point moved by 2x between two runs on the same GPU kind: the CPU's speed,
# not the GPU's. SDPA's call (one C++ op, a few tens of us of CPU) never showed it. A graph replay costs the CPU a
# few microseconds, so what is timed is the GPU's work alone, on every GPU.
def measure_attention(p: Params, target: Target, progress, done, total):
    hd = p.d_model // p.heads
    block_gbps, fixed = None, {}
    for kernel in p.attn_kernels:
        probe = measure_fixed(p, kernel, progress, done / total)
        fixed[kernel] = probe["measured_ms"]
        yield probe
    if "sdpa" in p.attn_kernels:
        probe = measure_sdpa_block(p, progress, done / total, fixed)
        block_gbps = probe["measured_gbps"]
        yield probe
    for batch in p.attn_batch:
        t_max = max(p.attn_context)
        k_cache = timing.random_tensor((batch, p.kv_heads, t_max, hd), p.dtype)
        v_cache = timing.random_tensor((batch, p.kv_heads, t_max, hd), p.dtype)
        q = timing.random_tensor((batch, p.heads * hd), p.dtype)
        for kernel in p.attn_kernels:
            for context in p.attn_context:
                progress(done / total, f"attention {kernel}, batch {batch}, context {context}: checking")
                out = torch.full_like(q, float("nan"))
                attention(q, k_cache, v_cache, context, kernel, out)
                c = min(batch, CHECK_SEQUENCES)
                err = timing.check_close(out[:c], attention_reference(q[:c], k_cache[:c], v_cache[:c], context),
                                        p.dtype, f"attention {kernel} B={batch} T={context}")
                progress(done / total, f"attention {kernel}, batch {batch}, context {context}: timing")
                ms, timer = attention_time_ms(lambda: attention(q, k_cache, v_cache, context, kernel, out))
                _, nbytes = attention_cost(batch, context, p)
                done += 1
                model = attention_row(kernel, batch, context, p, target, block_gbps, fixed)  # this run's probes
                yield model | {"measured_ms": ms, "measured_tbps": timing.tbps(nbytes, ms), "timer": timer,
                               "check_rel_error": err}
        del k_cache, v_cache


CHECK_BLOCK = BlockShape(d_model=320, heads=5, kv_heads=1, d_ff=333)  # odd sizes, head dim 64, 5 heads per K/V head


def check_block(p: Params) -> float:
    """Run a small odd-sized block with the chosen kernels against its float64 reference."""
    worst = 0.0
    kernels = {"auto": ("triton", "cublas"), "triton": ("triton",), "cublas": ("cublas",)}[p.block_gemm]
    for gemm in kernels:
        block = DecodeBlock(CHECK_BLOCK, batch=3, context=77, dtype=p.dtype, device="cuda", gemm=gemm,
                            attention_kernel=p.block_attention)
        ref = block.reference()
        out = torch.full_like(block.x, float("nan"))
        block.step(out)
        worst = max(worst, timing.check_close(out, ref, p.dtype, f"block step ({gemm}, {p.block_attention})"))
    return worst


def measure_block(p: Params, target: Target, progress, done, total):
    progress(done / total, "block: checking one step against float64")
    err = check_block(p)
    weights = make_block_weights(p.block_shape, p.dtype, "cuda")
    for batch in p.block_batch:
        progress(done / total, f"block decode step, batch {batch}: timing (CUDA graph)")
        block = DecodeBlock(p.block_shape, batch, p.block_context, p.dtype, "cuda", p.block_gemm,
                            p.block_attention, weights)
        out = torch.empty_like(block.x)
        ms = graph_time_ms(lambda: block.step(out))
        done += 1
        yield {"experiment": "block", "kernel": f"{p.block_gemm}+{p.block_attention}", "batch": batch,
               "context": p.block_context, "measured_ms": ms,
               **{f"measured_{key}": v for key, v in per_token(ms, batch, p.usd_per_gpu_hour).items()},
               "check_rel_error": err}
        del block


def measure(p: Params, target: Target, progress):
    check_shapes(p)
    total = 2 + ("gemm" in p.experiments) * len(gemm_points(p)) \
        + ("attention" in p.experiments) * (len(p.attn_kernels) * (len(p.attn_batch) * len(p.attn_context) + 1)
                                            + ("sdpa" in p.attn_kernels)) \
        + ("block" in p.experiments) * len(p.block_batch)
    done = 0
    for row in measure_launch(progress):
        done += 1
        yield row
    steps = {"gemm": measure_gemm, "attention": measure_attention, "block": measure_block}
    for name in EXPERIMENTS:
        if name in p.experiments:
            for row in steps[name](p, target, progress, done, total):
                done += 1
                yield row
    progress(1.0, "done")


# ---------------------------------------------------------------------------------------------
def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run, its SDPA points with the block rate its own probe measured (scripts/repredict.py;
    a recording made before the probe existed gets the roofline alone there)."""
    from labs.engine.params import from_dict

    p = from_dict(Params, recording["params"])
    fixed = probed_fixed_ms(recording["rows"])
    block = next((r for r in recording["rows"] if r.get("kernel") == "sdpa-block"), {})
    gbps = block_gbps_from(block["measured_ms"], p, fixed["sdpa"]) if block and "sdpa" in fixed \
        else block.get("measured_gbps")
    rows = [r for r in predict(p, target) if r["experiment"] != "attention"]
    return rows + (predict_attention(p, target, gbps, fixed) if "attention" in p.experiments else [])


def lesson_numbers(target: Target) -> dict:
    # the default dtype, or fp16 on a GPU without bf16 tensor cores (a T4), so the lesson has numbers everywhere
    dtype = next((d for d in ("bf16", "fp16") if target.ceilings.matmul_tflops.get(d)), "bf16")
    p = Params(dtype=dtype)
    c = target.ceilings
    peak = matmul_tflops(target, p.dtype)
    k, n = p.gemm_k, p.gemm_n
    m1 = predict_gemm(Params(dtype=dtype, gemm_m=(1, 64, 4096), gemm_kernels=("cublas",)), target)
    ridge = roofline_ridge_m(k, n, p.dtype, target)
    hd = p.d_model // p.heads
    block = {r["batch"]: r for r in predict_block(Params(dtype=dtype, block_batch=(1, 64)), target)}
    return {
        "gpu": target.name,
        "ceilings_source": target.describe_ceilings(),
        "bandwidth_tbps": f"{c.copy_tbps:.2f}",
        "bf16_tflops": f"{peak:.0f}",
        "ridge_flop_per_byte": f"{peak / c.copy_tbps:.0f}",
        "ridge_m": f"{ridge:.0f}" if ridge else "never",
        "weight_mb": f"{gemm_bytes(0, k, n, p.dtype) / MB:.0f}",
        "m1_us": f"{1e3 * m1[0]['predicted_ms']:.1f}",
        "m1_tflops": f"{m1[0]['predicted_tflops']:.1f}",
        "m64_us": f"{1e3 * m1[1]['predicted_ms']:.1f}",
        "m4096_us": f"{1e3 * m1[2]['predicted_ms']:.0f}",
        "launch_us": f"{1e3 * LAUNCH_ALONE_MS:.1f}",
        "node_us": f"{1e3 * GRAPH_NODE_MS:.1f}",
        "kv_kib_per_token": f"{kv_bytes(1, 1, p.kv_heads, hd, p.dtype) / 1024:.0f}",
        "kv_mb_64x8192": f"{kv_bytes(64, 8192, p.kv_heads, hd, p.dtype) / MB:.0f}",
        "block_weight_mb": f"{block[1]['weight_bytes'] / MB:.0f}",
        "block_b1_us": f"{1e3 * block[1]['predicted_ms']:.0f}",
        "block_b64_us": f"{1e3 * block[64]['predicted_ms']:.0f}",
        "block_kernels": str(block[1]["kernels"]),
        "sdpa_probe_context": str(SDPA_PROBE_CONTEXT),
        "fixed_probe_context": str(FIXED_PROBE_CONTEXT),
    }


LAB = Lab(
    name="inference",
    title="Inference: prefill vs decode",
    summary="Sweep a linear layer from one token (decode) to 4096 (prefill), read a KV cache, time a transformer "
            "block's decode step, and work out how much GPU memory a model needs.",
    terms=("prefill", "decode", "kv-cache", "batch-size", "arithmetic-intensity", "roofline", "ridge-point",
           "memory-bound", "compute-bound", "matmul", "attention", "launch-overhead", "cuda-graph", "cublas",
           "inference-memory", "training-memory", "bf16", "tensor-core"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("experiment", "kernel", "m", "batch", "context"),
    metric="ms",
    order=60,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What TFLOP/s will cuBLAS reach on an 8192 x 8192 bf16 layer with M = 1 row (one decoded token)?",
                      "TFLOP/s", {"experiment": "gemm", "kernel": "cublas", "m": 1}, "tflops"),
)
