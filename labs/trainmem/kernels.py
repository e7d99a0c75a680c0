"""
The training-memory lab's real thing: a small Llama-style model, trained in bf16 with fp32 master weights and Adam.

What you will learn here:
- one block as autograd sees it (norms, attention, the gated MLP), written so that what autograd keeps is exactly
  what the model counts (model.py, labs/memcalc);
- activation checkpointing with torch.utils.checkpoint: each block's input kept, the block rebuilt in backward;
- a mixed-precision Adam that updates fp32 master weights one parameter at a time (two fp32 temporaries).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

EPS = 1e-6


def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x / rms(x) * w, in the activations' dtype (so what autograd keeps is exactly what the model counts)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def block(x: torch.Tensor, w: dict, n_heads: int) -> torch.Tensor:
    """One Llama-style block (no rotary embedding: it changes no memory). x: (B, S, d)."""
    b, s, d = x.shape
    qkv = rmsnorm(x, w["norm1"]) @ w["qkv"]  # (B, S, 3d)
    q, k, v = qkv.view(b, s, 3, n_heads, d // n_heads).unbind(2)  # views: (B, S, H, D) each
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    o2 = o.transpose(1, 2).reshape(b, s, d).clone()  # always a fresh (B, S, d) copy, whatever o's layout
    x = x + o2 @ w["o"]
    gate, up = (rmsnorm(x, w["norm2"]) @ w["gu"]).chunk(2, dim=-1)  # (B, S, ff) each, views of one tensor
    return x + (F.silu(gate) * up) @ w["down"]


def make_model(p, device, dtype=torch.bfloat16, seed: int = 0) -> dict:
    """The weights as leaf tensors, scaled so activations stay near unit size."""
    g = torch.Generator(device=device).manual_seed(seed)

    def weight(*dims):
        return (torch.randn(*dims, generator=g, device=device) / math.sqrt(dims[0])).to(dtype).requires_grad_()

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype, requires_grad=True)

    d, ff = p.d_model, p.d_ff
    blocks = [{"norm1": ones(d), "qkv": weight(d, 3 * d), "o": weight(d, d), "norm2": ones(d),
               "gu": weight(d, 2 * ff), "down": weight(ff, d)} for _ in range(p.n_layers)]
    return {"embed": weight(p.vocab, d), "blocks": blocks, "norm": ones(d), "head": weight(d, p.vocab)}


def parameters(model: dict) -> list:
    return [model["embed"], *(t for b in model["blocks"] for t in b.values()), model["norm"], model["head"]]


def loss_of(model: dict, ids: torch.Tensor, targets: torch.Tensor, n_heads: int, checkpointing: bool):
    from torch.utils.checkpoint import checkpoint

    x = F.embedding(ids, model["embed"])  # (B, S, d)
    for w in model["blocks"]:
        x = checkpoint(block, x, w, n_heads, use_reentrant=False) if checkpointing else block(x, w, n_heads)
    logits = rmsnorm(x, model["norm"]) @ model["head"]  # (B, S, V), bf16
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # fp32 log-softmax


class MixedPrecisionAdam:
    """Adam on fp32 master weights; the bf16 weights are copies of them. One parameter at a time, so the
    temporaries are two fp32 tensors of the largest parameter, and each gradient is freed once used."""

    def __init__(self, params: list, lr: float = 1e-4, betas=(0.9, 0.95)):
        self.params, self.lr, self.betas, self.t = params, lr, betas, 0
        self.master = [p.detach().float() for p in params]
        self.m = [torch.zeros_like(w) for w in self.master]
        self.v = [torch.zeros_like(w) for w in self.master]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, w, m, v in zip(self.params, self.master, self.m, self.v):
            g = p.grad.float()
            p.grad = None
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            del g
            w.addcdiv_(m, v.div(c2).sqrt_().add_(1e-8), value=-self.lr / c1)
            p.copy_(w)
