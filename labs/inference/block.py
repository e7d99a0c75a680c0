"""One Llama-style transformer block decoding one token per sequence, built from the lab's kernels, and the
float64 references every kernel and the block are checked against.
"""

from __future__ import annotations

import math

import torch

from labs.engine import timing
from labs.inference.kernels import EPS, attention, linear, rmsnorm, silu_mul
from labs.inference.model import BlockShape


# ---------------------------------------------------------------------------------------------
# References in float64
# ---------------------------------------------------------------------------------------------
def gemm_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64) @ w.to(torch.float64).t()  # [M, N]


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
# One transformer block, decoding one token per sequence
# ---------------------------------------------------------------------------------------------
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

