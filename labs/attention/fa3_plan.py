"""The host's side of the Gluon FlashAttention-3 forward (gluon_fa3.py): its configurations, what each needs of a
Hopper SM (shared memory, registers), and the order in which the persistent programs take the (head, query block)
tiles. Pure Python and torch: it imports no Triton, so the budgets can be checked anywhere."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from labs.attention.fa3_model import fa3_consumers, tile_group, tile_sequence, work_items

WG_ROWS = 64  # query rows per consumer warpgroup: one m64 wgmma; a tile is 2 or 3 of them (128 or 192 rows)


@dataclass(frozen=True)
class FA3Config:
    block_n: int  # keys per block: a power of two (64, 128 or 256), as every register tensor's shape must be
    stages: int  # K and V blocks the producer may run ahead (each ring has this many slots)
    pingpong: bool = True  # the consumers take turns on the tensor cores
    consumer_regs: int = 240  # registers per consumer thread after setmaxnreg (S, O, two P's live at once)
    producer_regs: int = 24  # the least Hopper allows: the producer only computes addresses
    consumers: int = 2  # consumer warpgroups, 64 query rows each: a tile of 128 or 192 queries
    q_buffers: int = 2  # sets of Q blocks: with two, the next tile's Q loads while this one runs
    p_smem: bool = False  # P goes to the P V wgmma through shared memory (frees registers) instead of registers
    o_tma: bool = False  # the output rows go out through shared memory and a TMA copy that overlaps the next tile

    @property
    def block_m(self) -> int:
        return self.consumers * WG_ROWS

    @property
    def label(self) -> str:
        return (f"{self.block_m}x{self.block_n} s{self.stages} q{self.q_buffers}"
                f"{' P-smem' if self.p_smem else ''}{' O-TMA' if self.o_tma else ''}"
                f"{'' if self.pingpong else ' no-pingpong'}")


# d = 128: 2 x 32 KiB of K and V a stage, 2 x 32 KiB of Q, 32 KiB for the output rows: two stages (224 KiB of 227).
# The output rows go out through TMA: the store then runs on while the consumers start the next tile, which at
# N = 2048 (16 key blocks a tile) bought 2 to 12 % over storing from registers on an H100 and an H200
# (scripts/gluon_fa3_check.py; docs/gluon-fa3-h200-2026-11-27/README.md has the runs).
# The alternatives (that script's VARIANTS) are timed beside these on an H100 before one replaces them.
# d = 64 takes three consumer warpgroups (192 queries a tile, 160 registers a thread; ptxas 3.6 spills 2 registers
# unmasked and 22 causal): its softmax outlasts a warpgroup's GEMMs twice over, so a third warpgroup's GEMMs fill
# the tensor cores' wait. On an H100 it ran 1.00 to 1.12x cuDNN against 0.86 to 0.98 for two
# warpgroups (scripts/gluon_fa3_check.py, docs/gluon-fa3-h200-2026-11-27/README.md).
DEFAULT_CONFIGS = {64: FA3Config(block_n=128, stages=3, consumers=3, consumer_regs=160, o_tma=True),
                   128: FA3Config(block_n=128, stages=2, o_tma=True)}
# d = 64 under the causal mask up to fa3_model.SHORT_CAUSAL_LQ queries: two consumers, 128-query tiles, three stages
# (144 KiB). On an H100 that ran 1.11x and 1.05x cuDNN at N 1024 and 2048 against 0.93x for the three above
# (fa3_model.fa3_consumers has the runs)
SHORT_CAUSAL_D64 = FA3Config(block_n=128, stages=3, o_tma=True)


def config_for(head_dim: int, causal: bool, lq: int) -> FA3Config:
    """The configuration the kernel runs with for these inputs: DEFAULT_CONFIGS, or SHORT_CAUSAL_D64 where
    fa3_model.fa3_consumers takes two consumers at d = 64."""
    if head_dim == 64 and fa3_consumers(head_dim, causal, lq) == SHORT_CAUSAL_D64.consumers:
        return SHORT_CAUSAL_D64
    return DEFAULT_CONFIGS[head_dim]


def smem_bytes(head_dim: int, config: FA3Config, element_bytes: int = 2) -> int:
    """Q for every consumer in every buffer set, the K and V rings, P and the output rows when they go through
    shared memory, and the mbarriers (8 bytes each)."""
    q = config.q_buffers * config.block_m * head_dim * element_bytes
    ring = 2 * config.stages * config.block_n * head_dim * element_bytes
    p = config.block_m * config.block_n * element_bytes if config.p_smem else 0
    o = config.block_m * head_dim * element_bytes if config.o_tma else 0
    barriers = 2 * config.q_buffers * config.consumers + config.consumers + 4 * config.stages
    return q + ring + p + o + 8 * barriers


def register_budget(config: FA3Config) -> int:
    """maxnreg for the launch: every thread starts with this many registers, and the SM's 65,536 must cover the
    consumers' warpgroups and the producer's (its one warp is rounded up to four). setmaxnreg then moves registers
    from the producer to the consumers: the workers get what they ask for, the first consumer (the default
    partition) what they leave: 168 x 3 - 240 - 24 = 240 a thread with two consumers, 128 x 4 - 2 x 160 - 24 =
    168 with three."""
    groups = config.consumers + 1
    budget = min(256, (65536 // (groups * 128)) // 8 * 8)
    left = groups * budget - (config.consumers - 1) * config.consumer_regs - config.producer_regs
    if left < config.consumer_regs:
        raise ValueError(f"{config.consumer_regs} registers for each of {config.consumers} consumers and "
                         f"{config.producer_regs} for the producer leave the first consumer {left}")
    return budget


@functools.lru_cache(maxsize=64)
def work_table(heads: int, q_blocks: int, causal: bool, group: int, device: str, programs: int,
               lengths: tuple) -> tuple[torch.Tensor, int, int]:
    """The kernel's table (fa3_model.work_items, the schedule the model plays out too): int32 [items, 5] of
    (flattened batch*head, query block, first key block, end key block, slot of a piece or -1), in the order
    `programs` programs take them, given each query block's key blocks (`lengths`); then how many tiles are cut,
    and into how many pieces each (0 for none)."""
    order = tile_sequence(heads, q_blocks, causal, group, programs, lengths)
    items, split = work_items(order, lengths, programs, causal)
    return torch.tensor(items, dtype=torch.int32, device=device), len(split), max((n for *_, n in split), default=0)


def walk_group(heads: int, lengths: tuple, causal: bool, lk: int, head_dim: int, device, programs: int) -> int:
    """How many heads the programs walk at a time on this GPU (fa3_model.tile_group, given its L2's size)."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
    return tile_group(heads, lengths, causal, lk, head_dim, l2, programs)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"want q (B, H, Lq, d) and k, v (B, H, Lk, d); got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[3] not in DEFAULT_CONFIGS:
        raise ValueError(f"head dim {q.shape[3]}: this kernel takes {sorted(DEFAULT_CONFIGS)}")
    if any(t.dtype != torch.bfloat16 for t in (q, k, v)):
        raise ValueError("this kernel takes bf16 q, k and v")
