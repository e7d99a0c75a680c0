"""Tiles: how one attention call is cut into programs, and which tile sizes each GPU gets.

Pure arithmetic (no torch, no GPU): the model (model.py) predicts with the same tiles that the launchers
(kernels.py) launch, and the page draws the tile picture from the same rules as the kernels' loops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

HEAD_DIMS = (16, 32, 64, 128)  # the head dims the kernels take
LSE_ALIGN = 128  # the log-sum-exp rows are padded to this (the largest query tile) so tiles need no mask


def lq_pad(lq: int) -> int:
    """Rows of the padded log-sum-exp (and delta, lse2) of Lq queries: a whole number of LSE_ALIGN blocks."""
    return max(1, -(-lq // LSE_ALIGN)) * LSE_ALIGN


# ---------------------------------------------------------------------------------------------
# The tile picture: which tiles one program of the forward kernel visits
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


# ---------------------------------------------------------------------------------------------
# Tile sizes by GPU
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
    fwd: Tiles  # the forward kernel's
    dkdv: Tiles  # the dK/dV kernel's (block_n keys per program, block_m queries streamed)
    dq: Tiles  # the dQ kernel's (block_m queries per program, block_n keys streamed)
    use_tma: bool = False  # load tiles with the Hopper copy engine (TMA descriptors)


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
# eleven descriptors and the autograd engine), so it takes pointer loads below a quarter of the work.
HOST_BOUND_FLOPS_PER_SM = {"fwd+bwd": 1e9, "fwd": 1e9 / 4}


def tiles_for(head_dim: int, dtype: str, cc: tuple, *, causal: bool = False, seq_len: Optional[int] = None,
              batch_heads: Optional[int] = None, sm_count: Optional[int] = None, mode: str = "fwd") -> FlashConfig:
    """Tile sizes by GPU generation, head dim and dtype and, where it matters, the mask, the mode ("fwd" or
    "fwd+bwd") and how much work there is against the SMs; chosen from sweeps on an H200 and an H100.

    On Hopper two programs of 4 warps share an SM: while one waits on its exponentials, the other's
    matrix multiplies run, which beat one program of 8 warps in every sweep. Without seq_len, batch_heads
    and sm_count the choice is the one for long sequences.
    """
    if dtype == "fp32":  # exact fp32 products run on the CUDA cores: small tiles fit the shared memory
        return FlashConfig(Tiles(64, 32, 4, 2), Tiles(32, 64, 4, 2), Tiles(64, 32, 4, 2), use_tma=cc[0] >= 9)
    if cc[0] >= 9:
        sized = bool(seq_len and batch_heads and sm_count)
        tma = True
        if sized and mode in HOST_BOUND_FLOPS_PER_SM:
            flops_per_sm = 4.0 * batch_heads * seq_len * seq_len * head_dim * (0.5 if causal else 1.0) / sm_count
            tma = flops_per_sm >= HOST_BOUND_FLOPS_PER_SM[mode]
        if head_dim <= 64:
            return FlashConfig(Tiles(64, 128, 4, 2), Tiles(64, 64, 4, 3), Tiles(64, 64, 4, 3), use_tma=tma)
        fwd = Tiles(128, 64, 4, 2)
        waves = batch_heads * -(-seq_len // 128) / (2 * sm_count) if sized else math.inf  # of 128-query tiles
        if causal and waves < CAUSAL_SPLIT_WAVES:
            # over pointer loads as over TMA: at N = 1024 on the H100 the forward kernel took 61 us with 64-query
            # tiles against 76 us with 128-query ones (issue 15, round six). A forward call alone takes TMA loads
            # for them even where it is short: at N = 1024 they beat the 128-query tiles over pointer loads on the
            # H100 (round five)
            if mode == "fwd":
                tma = True
            fwd = Tiles(64, 64, 4, 3)
        return FlashConfig(fwd, Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2), use_tma=tma)
    # Ampere and Ada (not measured here): no TMA, smaller shared memory
    if head_dim <= 64:
        return FlashConfig(Tiles(128, 64, 4, 3), Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2))
    return FlashConfig(Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2))


# Triton's CPU interpreter: fewer, bigger tiles mean fewer slow Python-level steps
INTERPRETER_CONFIG = FlashConfig(Tiles(32, 32, 4, 1), Tiles(32, 32, 4, 1), Tiles(32, 32, 4, 1))
