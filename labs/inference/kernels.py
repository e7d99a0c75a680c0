"""
The inference lab's Triton kernels: what decode runs, one token per sequence
============================================================================

What you will learn:
- a weight-streaming GEMM for small M (decode): each program streams a slab of the weight through the tensor
  cores once, multiplied by every row of the activations at once, and K is split across programs when there
  are too few of them to keep every SM's loads in flight;
- split-KV decode attention ("flash decoding"): one new query token per sequence attends to its cached keys
  and values; the context is cut into slices that run side by side, each keeping an online softmax, and a
  second kernel merges the slices with their log-sum-exps;
- the small layers of a block (RMSNorm with the residual add, SiLU(gate) * up), one program per row;
- the smallest kernel that touches memory, whose time is the fixed cost every kernel pays.

The launch plans (tile shapes, K and context slices) are in launch.py; the transformer block that chains these
kernels is in block.py.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from labs.inference.launch import ATTN, SKINNY, SKINNY_MAX_M, SUM_BLOCK, attention_splits, next_pow2, skinny_splits


@functools.lru_cache(maxsize=4)
def sm_count(device: str = "cuda") -> int:
    """SMs of the device (the CPU interpreter pretends to have 4, so tests take the same code paths)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


# Triton's CPU interpreter (3.9) gets tl.dot wrong on bf16 tiles; under it the tiles are upcast to fp32
# first (a constexpr, so the GPU kernels are unchanged).
UPCAST_DOT = os.environ.get("TRITON_INTERPRET") == "1"


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


def skinny_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, splits: int | None = None,
                  config: dict | None = None) -> torch.Tensor:
    """x[M, K] @ w[N, K]^T for M <= 64 (both contiguous). `splits` forces the K split (tests)."""
    m, k = x.shape
    n = w.shape[0]
    if m > SKINNY_MAX_M or w.shape[1] != k or not (x.is_contiguous() and w.is_contiguous()):
        raise ValueError(f"skinny_linear takes contiguous x[M<={SKINNY_MAX_M}, K] and w[N, K]; got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    c = config or SKINNY
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


def linear(x: torch.Tensor, w: torch.Tensor, kernel: str = "auto", out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T by the chosen kernel: "cublas" (torch), "triton" (skinny), "auto" (skinny up to M = 64)."""
    if kernel == "triton" or (kernel == "auto" and x.shape[0] <= SKINNY_MAX_M):
        return skinny_linear(x, w, out)
    if out is None:
        return torch.nn.functional.linear(x, w)
    return torch.matmul(x, w.t(), out=out)


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
# Kernel 4: the fixed cost of a kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def touch_kernel(x_ptr, offset):
    """The smallest kernel that touches memory: read one number, write it back plus one. Its time is the
    fixed cost every kernel pays (launch, one trip to memory, completion)."""
    tl.store(x_ptr + offset, tl.load(x_ptr + offset) + 1.0)

