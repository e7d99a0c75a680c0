"""The model of the Gluon FlashAttention-3 backward (gluon_fa3_bwd.py): a block's multiplies, then its chain.

Pure arithmetic like fa3_model.py (no torch, no Triton): model.py calls it with the tensor cores' peak bf16 rate, the
SM's clock and a Shape.

One program owns 128 keys of one head (two consumer warpgroups of 64) and walks the query blocks of 64 that see
them. A step of the walk is five multiplies of 64 x 128 x d (S^T, dP^T, dV, dK, dQ: 10 x 64 x 128 x d FLOPs) and,
in each consumer warp, a chain of dependent instructions: the accumulators' seeds, the exponentials, dS, the
conversions to bf16, the dS store, the barriers and the wgmma bookkeeping (bwd_warp_instructions).

The forward's schedule (fa3_model.py) hides one warpgroup's softmax under the other's multiplies with turns. The
backward has none: each warpgroup's next multiply waits for its own chain, and the two warpgroups, which start
together and do the same work, run their chains at about the same time. Both need both halves of dS before either
can multiply dQ; the kernel multiplies each block's dQ a step late, so they need not meet at that barrier every
step, and starts warpgroup 1 one chain after warpgroup 0. The model adds the two: a step lasts its multiplies at
the tensor cores' peak (model.peak_matmul_rate: the datasheet's dense rate) plus one warp's chain at
DEPENDENT_ISSUE_CLOCKS an instruction. Nothing is hidden, and Nsight Compute agrees: on an H200 (N 4096, d 128, no
mask) the tensor pipe was busy about 2,650 cycles a step, where the five multiplies need 2,560, and idle about
1,220, one chain's length. The measured matmul ceiling would be the wrong rate here: it is cuBLAS's, at the lower
clock the GPU holds when its tensor cores never rest, and the H200's calibration read it 13 % under what cuBLAS
reaches in the Hopper lab (content/labs/attention.md, "Why the backward hides nothing").

The programs are not persistent (grid: key blocks x heads, one program an SM for its shared memory): they go to the
SMs in launch order as SMs free up (schedule.kernel_seconds), and under the causal mask a key block near the start
sees the most query blocks (schedule.dkdv_tiles, the same bounds as the kernel's _query_range). Two small Triton
kernels run before and after: the prep (delta = rowsum(dO O), the log-sum-exp over the scale, dQ's FP32 copy
zeroed) and the cast of dQ to bf16; both stream memory.
"""

from __future__ import annotations

from labs.attention.fa3_issue import DEPENDENT_ISSUE_CLOCKS, WARPGROUP_THREADS
from labs.attention.schedule import dkdv_tiles, kernel_seconds
from labs.attention.tiles import Tiles
from labs.engine.gpu import KERNEL_LAUNCH_US

# as gluon_fa3_bwd.BWD_KEYS and BWD_QUERIES (tests/test_gluon_fa3_bwd.py checks they agree where Gluon imports)
BWD_KEYS = 128  # keys a program: 64 a consumer warpgroup
BWD_QUERIES = 64  # queries a step
WG_KEYS = BWD_KEYS // 2
MULTIPLIES = 5  # S^T, dP^T, dV, dK, dQ

# per score a consumer thread holds (64 x 64 of them a warpgroup): S^T's and dP^T's seeds (2 FADD), the exponent's
# scale and exp2 (FMUL, MUFU.EX2), dS = P (dP - delta) (FMUL), P and dS to bf16 (half a cvt.rn.bf16x2 each), and an
# eighth of an stmatrix for the dS store
PER_SCORE = 6.125
PER_MASKED_SCORE = 2  # the causal diagonal or a ragged key block: compare and select
STATS_LOADS = 16  # the block's lse / scale and delta for the thread's 16 query columns, two at a time
# a barrier wait or arrive behind the warpgroup's bar.sync (about 5 instructions); a step has q_ready's and ds_free's
# waits, ds_ready's arrive and wait (at d = 64 the wait only every other step: the warpgroup whose dQ it is), ds_free's
# and q_empty's arrives, and dq_free's wait and dq_ready's arrive (at d = 64 every other step)
PER_BARRIER = 5
GROUP_BOOKKEEPING = 3  # each multiply's fence, commit and wait


def barriers(head_dim: int) -> float:
    """Barrier operations a consumer warp issues a step: at d = 128 it waits for dS and hands dQ to the writer warp
    (dq_free's wait, dq_ready's arrive) every step, at d = 64 every other step."""
    return 8 if head_dim >= 128 else 6.5


def wgmma_instructions(head_dim: int) -> float:
    """wgmma (k16) a consumer warp issues a step: S^T and dP^T (d / 16 each), dV and dK (64 queries / 16 each), and
    dQ over 128 keys (128 / 16): at d = 128 each warpgroup takes half of dQ's columns every step, at d = 64 the whole
    of it every other step."""
    dq = BWD_KEYS // 16 if head_dim >= 128 else BWD_KEYS // 16 / 2
    return 2 * head_dim // 16 + 2 * BWD_QUERIES // 16 + dq


def dq_instructions(head_dim: int) -> float:
    """Getting a step's dQ out of the registers to shared memory for the writer warp: a thread's 32 FP32 values
    (16 st.shared.v2) every step at d = 128 (half the columns), every other step at d = 64 (the whole block)."""
    return 16 if head_dim >= 128 else 16 / 2


def bwd_warp_instructions(head_dim: int, masked: bool) -> float:
    """Instructions one consumer warp issues for one step (its 64 keys against 64 queries)."""
    scores = WG_KEYS * BWD_QUERIES / WARPGROUP_THREADS  # 32 a thread
    per_score = PER_SCORE + (PER_MASKED_SCORE if masked else 0)
    return (scores * per_score + STATS_LOADS + dq_instructions(head_dim) + wgmma_instructions(head_dim)
            + MULTIPLIES * GROUP_BOOKKEEPING + barriers(head_dim) * PER_BARRIER)


def step_seconds(head_dim: int, mma_rate: float, clock_hz: float, sm_count: int) -> tuple[float, float]:
    """(multiplies, chain) of one unmasked step on one SM: the five multiplies at the SM's share of the matrix rate,
    and one consumer warp's chain at DEPENDENT_ISSUE_CLOCKS an instruction."""
    flops = MULTIPLIES * 2 * BWD_QUERIES * BWD_KEYS * head_dim
    chain = bwd_warp_instructions(head_dim, masked=False) * DEPENDENT_ISSUE_CLOCKS / clock_hz
    return flops / (mma_rate / sm_count), chain


def side_kernel_bytes(shape) -> tuple[int, int]:
    """HBM bytes of the prep kernel (reads O and dO and the log-sum-exp; writes two floats a row and zeroes dQ's FP32
    copy, twice dQ's bytes) and of the cast (reads the FP32 copy, writes dQ)."""
    return 2 * shape.q_bytes + 3 * shape.lse_bytes + 2 * shape.q_bytes, 2 * shape.q_bytes + shape.q_bytes


def main_kernel_bytes(shape) -> int:
    """HBM bytes of the backward kernel itself: Q, dO, K and V read (each program reads its K and V once, and the
    programs of a head find Q and dO in the L2), dK and dV written, and dQ's FP32 copy, which the atomic adds build
    in the L2, written back once."""
    return 2 * shape.q_bytes + 2 * shape.kv_bytes + 2 * shape.kv_bytes + 2 * shape.q_bytes


def peak_bytes(shape) -> int:
    """What the training call allocates beyond its inputs: the forward's O and log-sum-exp, then dQ, dK, dV, two
    floats a row and dQ's FP32 copy (twice dQ's bytes), all alive at the cast."""
    return shape.q_bytes + shape.lse_bytes + shape.q_bytes + 2 * shape.kv_bytes + 2 * shape.lse_bytes \
        + 2 * shape.q_bytes


def fa3_backward(shape, mma_rate: float, copy_bps: float, sm_count: int, clock_hz: float) -> dict:
    """Predicted seconds of one backward call (prep, the Gluon kernel, cast), with its parts: the multiplies spread
    over the SMs (mma_s), the chains (exp_s), none of them hidden (hidden_s 0), the waves, starts and masked steps
    (schedule_s), and the memory time of the whole call (mem_s)."""
    mma, chain = step_seconds(shape.d, mma_rate, clock_hz, sm_count)
    steps = dkdv_tiles(shape.lq, shape.lk, Tiles(BWD_QUERIES, BWD_KEYS, 4, 2), shape.causal)
    kernel = kernel_seconds(steps, shape.b * shape.h, mma, chain, sm_count, per_sm=1)
    prep_bytes, cast_bytes = side_kernel_bytes(shape)
    side_s = (prep_bytes + cast_bytes) / copy_bps + 2 * KERNEL_LAUNCH_US * 1e-6
    work = kernel["mma_s"] + kernel["exp_s"]
    mem_s = (prep_bytes + cast_bytes + main_kernel_bytes(shape)) / copy_bps
    return {"s": kernel["s"] + side_s, "mma_s": kernel["mma_s"], "exp_s": kernel["exp_s"], "hidden_s": 0.0,
            "schedule_s": kernel["s"] - work, "mem_s": mem_s, "side_s": side_s,
            "hbm_bytes": prep_bytes + cast_bytes + main_kernel_bytes(shape)}
