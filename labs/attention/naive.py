"""The references our kernels are held to and timed against: float64 (the truth), naive attention in three
PyTorch ops (what FlashAttention replaces) and PyTorch's SDPA backends (what you would otherwise call).
"""

from __future__ import annotations

import math
from typing import Optional

import torch


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

