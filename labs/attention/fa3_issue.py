"""How long one warpgroup's softmax of a key block of the Gluon FlashAttention-3 forward takes to issue: the
consumer warps' instructions, one after another.

Pure arithmetic on the GPU's facts. An SM has 4 warp schedulers; a warpgroup has one warp on each. While one
warpgroup runs its softmax, the other's warp on the same scheduler waits on its GEMMs (that is the ping-pong), so
no other warp fills the gaps between the softmax's instructions. Most of the softmax is a chain (the row max, then
the exponentials, then the row sum, then P), and a warp issues an instruction that needs the one before only once
that one has its result: 4 clocks for the FP32 pipes since Volta (NVIDIA's Volta tuning guide; Hopper kept it).
So the softmax lasts about 4 clocks an instruction, twice what both warpgroups' instructions take to issue through
the schedulers at one a clock, and the issue itself never binds. Nsight Compute on an H200 (N = 8192, d = 64 and
128) found a key block at 3.8 to 3.9 clocks per instruction of the loop beyond the warpgroup's GEMMs
(docs/gluon-fa3-h200-2026-11-27).

The instruction count comes from the kernel's loop (gluon_fa3._key_block, _softmax, _stage_p, _rescale), per
consumer thread; every warp of a warpgroup does the same. ptxas's SASS for the d = 64 loop counted 423 a warp
unmasked (H200) and 564 masked (H100): this count, the work the code asks for, is a little below that (the
compiler adds moves, predicates and loop bookkeeping it does not show).
"""

from __future__ import annotations

WARP = 32
WARPGROUP_THREADS = 4 * WARP

# per score a thread holds: the row max (FMNMX), scale and subtract the max (FFMA), exp2 (MUFU.EX2), the row sum
# (FADD), and half a conversion to bf16 (one cvt.rn.bf16x2 a pair)
PER_SCORE = 4.5
PER_MASKED_SCORE = 2  # a masked block also compares the key's column with the row's end and selects -inf
# per row a thread holds: the max and the sum across the 4 threads that share the row (2 shuffles and 2 ops
# each), the new max and its scaling, alpha = exp2(m_old - m_new) and the sum's update (about 6)
PER_ROW = 2 * 2 * 2 + 6
PER_OUTPUT = 1  # rescaling the output accumulator by alpha: one FMUL an element
# per block: 4 mbarrier waits or arrives, each behind a 4-warp bar.sync Triton adds (about 3 instructions a
# wait loop, 2 for a bar.sync and an elected arrive), the wgmma fences and waits (4)
PER_BLOCK = 4 * 5 + 4


def wgmma_instructions(head_dim: int, block_n: int) -> int:
    """S = Q K^T takes head_dim / 16 wgmma (k16 each), O += P V block_n / 16."""
    return head_dim // 16 + block_n // 16


def warp_instructions(rows: int, head_dim: int, block_n: int, masked: bool) -> float:
    """Instructions one consumer warp issues for one key block of its warpgroup's `rows` x `block_n` scores."""
    scores = rows * block_n / WARPGROUP_THREADS  # per thread: 64 at 64 x 128
    rows_held = 2  # a wgmma accumulator gives each thread 2 of the 16 rows of its warp (m64: 4 warps x 16)
    outputs = rows * head_dim / WARPGROUP_THREADS  # the output accumulator's elements per thread
    per_score = PER_SCORE + (PER_MASKED_SCORE if masked else 0)
    return (scores * per_score + rows_held * PER_ROW + outputs * PER_OUTPUT + PER_BLOCK
            + wgmma_instructions(head_dim, block_n))


DEPENDENT_ISSUE_CLOCKS = 4  # a warp's next dependent FP32 instruction issues this many clocks later (Volta onward)


def softmax_chain_seconds(rows: int, head_dim: int, block_n: int, masked: bool, clock_hz: float) -> float:
    """One warpgroup's softmax of one key block as a chain: its warp on each scheduler issues its instructions one
    result after another, nothing else to fill the gaps."""
    return warp_instructions(rows, head_dim, block_n, masked) * DEPENDENT_ISSUE_CLOCKS / clock_hz
