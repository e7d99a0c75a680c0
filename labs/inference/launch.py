"""How the inference lab's Triton kernels are launched: their tile configurations, and how many programs and
slices (K slices of a GEMM, context slices of a decode attention) a call gets.

Pure arithmetic (no torch, no GPU): the launchers (kernels.py) and the model (model.py), which counts a call's
kernels, read the same plan.
"""

from __future__ import annotations

SKINNY_MAX_M = 64  # the weight-streaming GEMM's range; larger M is compute work, which cuBLAS does best
# The best of eight tile shapes timed on an H200 (8192 x 8192, M = 1..64): 3.2 TB/s at M = 1, where cuBLAS
# reaches 3.6 TB/s.
SKINNY = {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 6, "programs_per_sm": 2}
SUM_BLOCK = 1024  # elements per program of the kernel that adds the K slices' partial sums
# decode attention: BLOCK_T cached tokens per step of a program, up to max_splits context slices per (sequence,
# K/V head), aiming at programs_per_sm programs on every SM
ATTN = {"BLOCK_T": 64, "num_warps": 4, "num_stages": 3, "programs_per_sm": 4, "max_splits": 64}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def skinny_splits(m: int, n: int, k: int, sms: int, config: dict | None = None) -> tuple[int, int]:
    """(number of K slices, K per slice): enough programs to give every SM `programs_per_sm` of them."""
    c = config or SKINNY
    programs = cdiv(n, c["BLOCK_N"])
    want = max(1, min(cdiv(c["programs_per_sm"] * sms, programs), cdiv(k, c["BLOCK_K"])))
    per_split = cdiv(cdiv(k, want), c["BLOCK_K"]) * c["BLOCK_K"]
    return cdiv(k, per_split), per_split


def skinny_launches(m: int, n: int, k: int, sms: int) -> int:
    """Kernels one skinny GEMM launches: one, or two where K is split (the partial sums are added after)."""
    return 1 if skinny_splits(m, n, k, sms)[0] == 1 else 2


def attention_splits(batch: int, n_kv_heads: int, context: int, sms: int, config: dict | None = None) -> tuple[int, int]:
    """(number of context slices, tokens per slice)."""
    c = config or ATTN
    want = cdiv(c["programs_per_sm"] * sms, batch * n_kv_heads)
    splits = max(1, min(want, c["max_splits"], cdiv(context, c["BLOCK_T"])))
    per_split = cdiv(cdiv(context, splits), c["BLOCK_T"]) * c["BLOCK_T"]
    return cdiv(context, per_split), per_split
