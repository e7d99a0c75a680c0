"""The model of the Gluon FlashAttention-3 forward (gluon_fa3.py): what its overlap buys, from the GPU's facts.

Pure arithmetic like model.py (no torch, no Triton): it predicts for any Hopper GPU of the datasheet on a laptop.
model.py calls it with its own rates (the measured bf16 matrix rate, the SFUs' exponential rate) and a Shape.

Our FlashAttention-2 (model.py, schedule.py) pays, per tile, the tensor cores' time *plus* the exponentials', less
the half of the shorter one that the SM's second program hides. FlashAttention-3's schedule overlaps them on
purpose. Each program (one per SM, persistent) has two consumer warpgroups of 64 query rows each; they take turns
on the tensor cores. While one warpgroup's two GEMMs (S = Q K^T of the next key block, O += P V of the last) run,
the other computes its softmax. For one key block of the program's 128 queries, with g one warpgroup's GEMM time
and s its softmax (exponential) time:

    period = g + max(g, s)

warpgroup 0's GEMMs (g), then warpgroup 1's (g) while warpgroup 0 runs its softmax (s); warpgroup 0 may issue its
next GEMMs once both are done. Where s <= g the exponentials hide whole and the tensor cores never wait. A key block
also lasts at least 2s, both warpgroups' exponentials through the same special-function lanes, and at least as long
as both warpgroups' instructions take through the SM's 4 warp schedulers (fa3_issue.py).
"""

from __future__ import annotations

from labs.attention.fa3_issue import issue_seconds
from labs.attention.schedule import SIMULATED_PROGRAMS
from labs.engine.gpu import KERNEL_LAUNCH_US

# as gluon_fa3.DEFAULT_CONFIGS and WG_ROWS (tests/test_attention_gluon.py checks they agree where Gluon imports)
FA3_WG_ROWS = 64  # query rows per consumer warpgroup: one m64 wgmma
FA3_BLOCK_M = 2 * FA3_WG_ROWS  # a program's query tile: two consumer warpgroups
FA3_BLOCK_N = {64: 128, 128: 128}  # keys per block, by head dim
FA3_HEAD_DIMS = tuple(FA3_BLOCK_N)
FA3_DTYPE = "bf16"


def fa3_supports(dtype: str, head_dim: int, compute_capability: str) -> bool:
    """Where the kernel runs at all: bf16, d 64 or 128, a Hopper GPU (wgmma, setmaxnreg: compute capability 9.x)."""
    return dtype == FA3_DTYPE and head_dim in FA3_HEAD_DIMS and str(compute_capability).startswith("9.")


def key_blocks(qm0: int, lq: int, lk: int, block_n: int, causal: bool) -> int:
    """Key blocks the query tile [qm0, qm0 + FA3_BLOCK_M) visits (the kernel's _key_blocks: causal tiles stop at
    the last row's diagonal, aligned bottom right)."""
    hi = min(max(qm0 + FA3_BLOCK_M + lk - lq, 0), lk) if causal else lk
    return -(-hi // block_n)


def masked_blocks(qm0: int, lq: int, lk: int, block_n: int, causal: bool) -> int:
    """Of the key blocks the tile visits, those some row sees only in part (the kernel's _key_blocks: the causal
    diagonal and the keys' ragged end), which run the loop with a mask."""
    full_end = min(max(qm0 + 1 + lk - lq, 0), lk) if causal else lk
    return key_blocks(qm0, lq, lk, block_n, causal) - full_end // block_n


def query_tile_starts(lq: int, causal: bool) -> list[int]:
    """The first query of each query tile of one head, in the order the programs take them: causal tiles from the
    last (the most keys) to the first."""
    q_tiles = max(1, -(-lq // FA3_BLOCK_M))
    order = range(q_tiles - 1, -1, -1) if causal else range(q_tiles)
    return [qb * FA3_BLOCK_M for qb in order]


def query_tile_blocks(lq: int, lk: int, block_n: int, causal: bool) -> list[int]:
    """Key blocks of each query tile of one head, in the order the programs take them."""
    return [key_blocks(qm0, lq, lk, block_n, causal) for qm0 in query_tile_starts(lq, causal)]


def tile_blocks(lq: int, lk: int, block_n: int, causal: bool, heads: int) -> list[int]:
    """Key blocks of every (head, query tile) in the order the programs take them: query tiles in turn, every head
    at each. (The kernel walks heads in groups whose K and V fit the L2; that changes which head a tile belongs
    to, not the mix of lengths each program gets.)"""
    return [n for n in query_tile_blocks(lq, lk, block_n, causal) for _ in range(heads)]


def persistent_span(durations: list[float], programs: int) -> float:
    """When the last of `programs` persistent programs ends, program p taking tiles p, p + programs, ... of
    `durations` (seconds, in order): the kernel's static round robin, no slot taken on the fly."""
    ends = [0.0] * max(1, min(programs, len(durations)))
    for i, seconds in enumerate(durations):
        ends[i % len(ends)] += seconds
    return max(ends) if durations else 0.0


def block_seconds(d: int, block_n: int, mma_rate: float, exp_rate: float, sm_count: int) -> tuple[float, float]:
    """(g, s) for one key block on one SM: one warpgroup's two GEMMs (64 x block_n scores, 2 x 2d FLOPs each),
    and its exponentials (one a score) on the SM's special-function units."""
    scores = FA3_WG_ROWS * block_n
    return 2 * 2 * d * scores / (mma_rate / sm_count), scores / (exp_rate / sm_count)


def hbm_bytes(shape) -> int:
    """Q read and O written once; K and V once too, since the programs walk the heads in groups whose K and V fit
    the L2 (no log-sum-exp: the kernel is forward only)."""
    return 2 * shape.q_bytes + 2 * shape.kv_bytes


def block_period(d: int, block_n: int, g: float, s: float, masked: bool, clock_hz: float) -> float:
    """Seconds one SM spends on one key block of its 2 x 64 queries: the ping-pong's g + max(g, s), unless both
    warpgroups' exponentials (2s: they share the SM's special-function lanes) or instructions (through its 4
    schedulers) take longer."""
    return max(g + max(g, s), 2 * s, issue_seconds(2, FA3_WG_ROWS, d, block_n, masked, clock_hz))


def tile_durations(shape, block_n: int, periods: tuple[float, float]) -> list[float]:
    """Seconds of every (head, query tile) in the order the programs take them (tile_blocks' order), from the
    (unmasked, masked) key block periods."""
    plain, masked = periods
    one_head = []
    for qm0 in query_tile_starts(shape.lq, shape.causal):
        n = key_blocks(qm0, shape.lq, shape.lk, block_n, shape.causal)
        m = masked_blocks(qm0, shape.lq, shape.lk, block_n, shape.causal)
        one_head.append((n - m) * plain + m * masked)
    return [seconds for seconds in one_head for _ in range(shape.b * shape.h)]


def fa3_forward(shape, mma_rate: float, exp_rate: float, copy_bps: float, sm_count: int, clock_hz: float) -> dict:
    """Predicted seconds of one forward call, with its parts: the tensor cores' work spread over the SMs (mma_s),
    the exponentials' (exp_s), how much of them the ping-pong hides (hidden_s), the persistent schedule's waves
    and starts, and any block the schedulers' issue or the MUFU lanes hold up (schedule_s), and the HBM time
    (mem_s: Q, K, V read once, O written, nothing else). clock_hz: the SM's clock, for the schedulers' issue."""
    block_n = FA3_BLOCK_N[shape.d]
    g, s = block_seconds(shape.d, block_n, mma_rate, exp_rate, sm_count)
    periods = tuple(block_period(shape.d, block_n, g, s, m, clock_hz) for m in (False, True))
    durations = tile_durations(shape, block_n, periods)
    total_blocks = shape.b * shape.h * sum(query_tile_blocks(shape.lq, shape.lk, block_n, shape.causal))
    if len(durations) <= SIMULATED_PROGRAMS:
        work_s = persistent_span(durations, sm_count)
    else:  # many more tiles than programs: each program's share of the work (its tail is under 1 %)
        work_s = sum(durations) / sm_count
    start_s = KERNEL_LAUNCH_US * 1e-6  # the program's first loads and last store (and the kernel's own start)
    span = work_s + 2 * start_s
    mma_s, exp_s = total_blocks * 2 * g / sm_count, total_blocks * 2 * s / sm_count
    exposed = total_blocks * 2 * max(0.0, s - g) / sm_count  # the exponentials' part that leaves the tensor cores idle
    mem_s = hbm_bytes(shape) / copy_bps
    return {"s": max(span, mem_s), "mma_s": mma_s, "exp_s": exp_s, "hidden_s": exp_s - exposed,
            "schedule_s": span - (mma_s + exposed), "mem_s": mem_s}
