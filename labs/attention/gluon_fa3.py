"""
FlashAttention-3's schedule in Gluon: a producer warp, consumer warpgroups that take turns
==========================================================================================

What you will learn:
- how FlashAttention-3 (Shah et al., 2024) splits one program's warps by job: a *producer* warp only issues TMA
  copies of Q, K and V into shared memory, and two or three *consumer* warpgroups (4 warps each) only run the two
  matrix multiplies (`wgmma`) and the softmax, each for its own 64 rows of the program's 128 or 192 queries;
- where the barriers are: every buffer has a `ready` mbarrier (armed by the producer with a byte count, completed
  by the copy engine) and an `empty` one (every consumer arrives once its wgmma has read it), and the consumers
  pass a *turn* round through one more mbarrier each;
- what ping-pong buys: the tensor cores are shared by the whole SM. With the turns, warpgroup 0 issues its two
  GEMMs (S = Q K^T of the next key block and O += P V of the last one), then warpgroup 1 issues its two while
  warpgroup 0 computes its softmax (exponentials on the special-function units, which the tensor cores do not
  wait for), and so on round. The exponentials of one warpgroup hide under the GEMMs of another;
- the overlap inside one warpgroup: S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued together (`is_async`),
  the warpgroup waits for S_j only, and computes the softmax of block j while the P V product still runs;
- the overlap between tiles: Q has two buffers, so the producer loads the next tile's Q and first K blocks while
  the consumers finish this one; the output can leave through shared memory and a TMA copy that runs on while
  the next tile starts;
- the register budget: P feeds the P V wgmma from registers, or from shared memory when three consumers (160
  registers a thread each) leave too few to hold S, O and two P's at once;
- persistence: one program per SM walks (head, query block) tiles from a table built on the host, causal tiles
  longest first, heads in groups whose K and V fit the L2 cache;
- the tail: where the last round of tiles would leave most SMs idle (unmasked), its tiles are cut along the keys
  into one piece a program, and the warpgroup that stores a tile's last piece adds the pieces up with their
  log-sum-exps (gluon_fa3_store.store_piece: a fence, a barrier and one atomic counter say which one is last).

Conventions as in kernels.py: q is (B, H, Lq, d), k and v are (B, H, Lk, d), bf16, d = 64 or 128; the causal mask
is aligned to the bottom right (query i sees key j when j <= i + Lk - Lq); scores are kept in base-2 units
(qk_scale = d^-1/2 * log2 e) so that every exponential is one `exp2`. A query that sees no key gets 0.
Lengths need not be multiples of the tiles: the TMA reads rows past the tensor's end as zeros, key columns
past Lk are masked to -inf, and the output rows past Lq are not stored. This module needs a Triton with Gluon
and a Hopper GPU: labs/hopper/gluon_support.py says whether this machine has both.
"""

from __future__ import annotations

import functools
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from labs.attention.fa3_model import query_tile_blocks
from labs.attention.fa3_plan import (DEFAULT_CONFIGS, WG_ROWS, FA3Config, check_inputs, config_for,  # noqa: F401
                                     register_budget, smem_bytes, walk_group, work_table)
from labs.attention.gluon_fa3_store import store_lse, store_piece, store_rows
from labs.attention.launch import aligned, launch, record_encoded, replay, tensors_key
from labs.attention.tiles import lq_pad
from labs.engine.gpu import device_sm_count
from labs.hopper.gluon_support import GluonUnavailable, attention_unavailable_reason, device_capability
from labs.hopper.gluon_ws import SMEM_BYTES, tma_load

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2 e)
WG0, WG1, WG2 = gl.constexpr(0), gl.constexpr(1), gl.constexpr(2)  # the consumer warpgroups' indices
CONSUMER_WARPS = gl.constexpr(4)  # one warpgroup per consumer
PRODUCER_WARPS = gl.constexpr(1)  # one warp issues every copy


@gluon.constexpr_function
def wgmma_layout(n):
    """Where a [64, n] FP32 accumulator lives in one warpgroup: 4 warps stacked along the rows (16 each), one
    wgmma instruction as wide as the tile (m16 x n x k16 for bf16)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[CONSUMER_WARPS.value, 1], instr_shape=[16, n, 16])


# ---------------------------------------------------------------------------------------------
# 1. The work table: which key blocks each item visits (the host's, so the producer and every consumer agree)
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _full_blocks(row0, LQ, LK, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Key blocks [0, full) that every one of the rows from row0 on sees whole, with no mask; later ones are the
    causal diagonal or the keys' ragged end (tiles.visible_range's rule). How many blocks a tile visits, the host
    counts the same way (fa3_model.key_blocks) and writes in the work table."""
    if CAUSAL:
        full_end = gl.minimum(gl.maximum(row0 + 1 + LK - LQ, 0), LK)  # keys the first row already sees
    else:
        full_end = LK
    return full_end // BLOCK_N


@gluon.jit
def _item_at(order_ptr, item):
    """(flattened batch*head, query block, first key block, end key block, slot) of a work item, from the host's
    table (fa3_plan.work_table): a whole tile (slot -1), or a piece of a last-round tile cut along its keys, whose
    partial rows go to `slot` of the pieces' buffer."""
    row = order_ptr + 5 * item
    return gl.load(row), gl.load(row + 1), gl.load(row + 2), gl.load(row + 3), gl.load(row + 4)


# ---------------------------------------------------------------------------------------------
# 2. The producer: one warp that only issues copies
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _producer(q_desc, k_desc, v_desc, order_ptr, num_tiles, LQ, LK, q_smem, k_ring, v_ring,
              q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, CONSUMERS: gl.constexpr,
              Q_BUFFERS: gl.constexpr):
    M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    STAGES: gl.constexpr = k_ring.type.shape[0]
    count = 0  # key blocks issued over every tile: ring slot count % STAGES, its use count // STAGES
    tiles_done = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        bh, qb, lo, hi, _ = _item_at(order_ptr, tile)
        qm0 = qb * (CONSUMERS * M)
        # each consumer's 64 query rows, in buffer set tiles_done % Q_BUFFERS: wait until that set's last tile has
        # finished its S GEMMs (a fresh barrier counts as having completed the phase before phase 0). With two
        # sets this wait is long over: the next tile's Q and K arrive while the consumers finish this one
        q_set = tiles_done % Q_BUFFERS
        for wg in gl.static_range(CONSUMERS):
            q_buf = q_set * CONSUMERS + wg
            mbarrier.wait(q_empty.index(q_buf), ((tiles_done // Q_BUFFERS) & 1) ^ 1)
            mbarrier.expect(q_ready.index(q_buf), q_desc.block_type.nbytes)
            tma_load(q_desc, [bh * LQ + qm0 + wg * M, 0], q_ready.index(q_buf), q_smem.index(q_buf))  # [64, d]
        # K and V in separate rings, K first: the consumers' S GEMM needs K_j before their P V GEMM needs V_j
        for j in range(lo, hi):  # the tile's key blocks (fa3_model.key_blocks), or a piece's
            slot = count % STAGES
            free_phase = ((count // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(slot), free_phase)  # every consumer has finished S with this slot
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            tma_load(k_desc, [bh * LK + j * BLOCK_N, 0], k_ready.index(slot), k_ring.index(slot))  # [BLOCK_N, d]
            mbarrier.wait(v_empty.index(slot), free_phase)  # ... and P V
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            tma_load(v_desc, [bh * LK + j * BLOCK_N, 0], v_ready.index(slot), v_ring.index(slot))
            count += 1
        tiles_done += 1


# ---------------------------------------------------------------------------------------------
# 3. The consumers: two or three warpgroups, each the online softmax of kernels.py for its 64 rows
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _wait_turn(turn, turns, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Wait until the warpgroup before us (in a round: 0, 1, then 2 if there is one) has issued its GEMMs.
    Warpgroup 0 goes first: its first wait asks for the phase before phase 0, which a fresh barrier has completed;
    the others' n-th wait is for the n-th pass of the one before them."""
    if PINGPONG:
        if WG == 0:
            mbarrier.wait(turn.index(WG), (turns + 1) & 1)
        else:
            mbarrier.wait(turn.index(WG), turns & 1)
    return turns + 1


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Our GEMMs are issued (they run on, asynchronously): the next warpgroup may issue its own."""
    if PINGPONG:
        CONSUMERS: gl.constexpr = turn.type.shape[0]
        mbarrier.arrive(turn.index((WG + 1) % CONSUMERS))


@gluon.jit
def _softmax(s, m_i, l_i, start_n, row0, qk_scale, LQ, LK, s_layout: gl.constexpr,
             CAUSAL: gl.constexpr, MASKED: gl.constexpr):
    """Fold one block of scores into the running max and sum; returns P (FP32), the new max, the new sum and
    alpha, the factor the output accumulated so far shrinks by under the new max. All in base-2 units."""
    if MASKED:  # the causal diagonal or the keys' ragged end: masked scores are -inf
        M: gl.constexpr = s.shape[0]
        BLOCK_N: gl.constexpr = s.shape[1]
        # one compare a score: the row's first key it may not see, counted from the block's first key
        ends = gl.full([M], LK - start_n, gl.int32, gl.SliceLayout(1, s_layout))  # [M]
        if CAUSAL:
            rows = row0 + gl.arange(0, M, layout=gl.SliceLayout(1, s_layout))
            ends = gl.minimum(ends, rows + (LK - LQ) + 1 - start_n)
        cols = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0)  # [1, N]
        s = gl.where(cols < gl.expand_dims(ends, 1), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)  # the scale is positive: the max commutes with it
    if MASKED:
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: no NaN
    else:
        m_use = m_new
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_use, 1))  # one fused multiply-add and one exp2 (MUFU.EX2) a score
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _stage_p(p, p_slot, o_layout: gl.constexpr, P_SMEM: gl.constexpr):
    """P (FP32, the S accumulator's layout) as the A operand of the P V wgmma: bf16 registers in the layout wgmma
    reads A from (no data moves: the accumulator's and the operand's layouts hold the same elements per thread),
    or, with P_SMEM, written to the consumer's [64, BLOCK_N] slot of shared memory, which frees its registers."""
    if P_SMEM:
        p_slot.store(p.to(gl.bfloat16))
        fence_async_shared()  # the generic-proxy writes before the wgmma (async proxy) reads them
        return p_slot
    else:
        # one cvt.rn.bf16x2 a pair of neighbouring scores, packed as wgmma reads them; p.to(gl.bfloat16) converted
        # each score alone and ptxas packed the pairs with one byte permute (PRMT) more each: 8% of the key loop
        packed = gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [p], dtype=gl.bfloat16,
                                           is_pure=True, pack=2)
        return gl.convert_layout(packed, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))


@gluon.jit
def _wait_pv(acc, p, P_SMEM: gl.constexpr):
    """Wait for every wgmma we issued (the P V product last): then acc is final and P's registers are free."""
    if P_SMEM:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    else:
        acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
    return acc, p


@gluon.jit
def _no_p(p_slot, M: gl.constexpr, BLOCK_N: gl.constexpr, o_layout: gl.constexpr, P_SMEM: gl.constexpr):
    """P before any block (loops carry P from tile to tile): never multiplied."""
    if P_SMEM:
        return p_slot
    else:
        return gl.zeros([M, BLOCK_N], gl.bfloat16, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))


@gluon.jit
def _rescale(acc, alpha):
    """The output so far, shrunk to the new running max."""
    return acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout)), 1)


@gluon.jit
def _key_block(q_tile, rings, turn, p_slot, acc, p, m_i, l_i, count, turns, start_n, row0, qk_scale, LQ, LK,
               WG: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, MASKED: gl.constexpr,
               P_SMEM: gl.constexpr):
    """Key block j (its K in ring slot `count + 1`): issue S_j = Q K_j^T beside O += P_{j-1} V_{j-1}, then the
    softmax of S_j while the P V product still runs. `count` is block j-1's place in the rings. Block j-1 may be
    the previous tile's last (then m_i and l_i are fresh and acc is that tile's finished output). Returns acc
    not yet rescaled, and alpha to rescale it by."""
    k_ring, v_ring, k_ready, k_empty, v_ready, v_empty = rings
    STAGES: gl.constexpr = k_ring.type.shape[0]
    M: gl.constexpr = q_tile.type.shape[0]
    BLOCK_N: gl.constexpr = k_ring.type.shape[1]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    k_count = count + 1
    k_slot = k_count % STAGES
    v_slot = count % STAGES
    turns = _wait_turn(turn, turns, WG, PINGPONG)  # ---- our turn on the tensor cores
    mbarrier.wait(k_ready.index(k_slot), (k_count // STAGES) & 1)  # K_j has landed
    s = warpgroup_mma(q_tile, k_ring.index(k_slot).permute((1, 0)), gl.zeros([M, BLOCK_N], gl.float32, s_layout),
                      use_acc=False, is_async=True)  # S_j = Q K_j^T, [64, BLOCK_N] FP32, both from shared memory
    mbarrier.wait(v_ready.index(v_slot), (count // STAGES) & 1)  # V_{j-1} has landed
    acc = warpgroup_mma(p, v_ring.index(v_slot), acc, is_async=True)  # O += P_{j-1} V_{j-1}
    _pass_turn(turn, WG, PINGPONG)  # ---- the other warpgroup's GEMMs queue behind ours; we go on to the softmax
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))  # S_j is done (the older P V may still run)
    mbarrier.arrive(k_empty.index(k_slot))  # our S no longer reads K_j
    p_new, m_i, l_i, alpha = _softmax(s, m_i, l_i, start_n, row0, qk_scale, LQ, LK, s_layout, CAUSAL, MASKED)
    acc, p = _wait_pv(acc, p, P_SMEM)  # P V is done: P_{j-1}'s registers (or shared memory) are free
    mbarrier.arrive(v_empty.index(v_slot))
    p = _stage_p(p_new, p_slot, wgmma_layout(acc.shape[1]), P_SMEM)
    return acc, p, m_i, l_i, alpha, k_count, turns


@gluon.jit
def _key_blocks_from(first, q_tile, rings, turn, p_slot, acc, p, m_i, l_i, count, turns, n_full, n_blocks, row0,
                     qk_scale, LQ, LK, WG: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                     P_SMEM: gl.constexpr):
    """Blocks [first, n_blocks) of a tile: those every row of ours sees whole without a mask, then the causal
    diagonal and the ragged end with one (a piece may end before either)."""
    BLOCK_N: gl.constexpr = rings[0].type.shape[1]
    for start_n in range(first * BLOCK_N, gl.minimum(n_full, n_blocks) * BLOCK_N, BLOCK_N):
        acc, p, m_i, l_i, alpha, count, turns = _key_block(q_tile, rings, turn, p_slot, acc, p, m_i, l_i, count,
                                                           turns, start_n, row0, qk_scale, LQ, LK, WG, CAUSAL,
                                                           PINGPONG, False, P_SMEM)
        acc = _rescale(acc, alpha)
    for start_n in range(gl.maximum(n_full, first) * BLOCK_N, n_blocks * BLOCK_N, BLOCK_N):
        acc, p, m_i, l_i, alpha, count, turns = _key_block(q_tile, rings, turn, p_slot, acc, p, m_i, l_i, count,
                                                           turns, start_n, row0, qk_scale, LQ, LK, WG, CAUSAL,
                                                           PINGPONG, True, P_SMEM)
        acc = _rescale(acc, alpha)
    return acc, p, m_i, l_i, count, turns


@gluon.jit
def _first_block(q_tile, rings, turn, p_slot, m_i, l_i, count, turns, lo, n_full, row0, qk_scale, LQ, LK,
                 WG: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, P_SMEM: gl.constexpr):
    """A tile's prologue with nothing before it: S of its first key block (0, or a piece's `lo`) alone, then its
    softmax (masked unless every row of ours sees the whole block). Returns that P staged for the P V wgmma."""
    k_ring, v_ring, k_ready, k_empty, v_ready, v_empty = rings
    STAGES: gl.constexpr = k_ring.type.shape[0]
    M: gl.constexpr = q_tile.type.shape[0]
    BLOCK_N: gl.constexpr = k_ring.type.shape[1]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    turns = _wait_turn(turn, turns, WG, PINGPONG)
    slot = count % STAGES
    mbarrier.wait(k_ready.index(slot), (count // STAGES) & 1)
    s = warpgroup_mma(q_tile, k_ring.index(slot).permute((1, 0)), gl.zeros([M, BLOCK_N], gl.float32, s_layout),
                      use_acc=False, is_async=True)
    _pass_turn(turn, WG, PINGPONG)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    mbarrier.arrive(k_empty.index(slot))
    if n_full > lo:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, lo * BLOCK_N, row0, qk_scale, LQ, LK, s_layout, CAUSAL, False)
    else:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, lo * BLOCK_N, row0, qk_scale, LQ, LK, s_layout, CAUSAL, True)
    return _stage_p(p, p_slot, wgmma_layout(q_tile.type.shape[1]), P_SMEM), m_i, l_i, turns


@gluon.jit
def _last_pv(rings, turn, acc, p, count, turns, WG: gl.constexpr, PINGPONG: gl.constexpr, P_SMEM: gl.constexpr):
    """A tile's last GEMM when no next tile's S_0 goes beside it: the last P V alone."""
    k_ring, v_ring, k_ready, k_empty, v_ready, v_empty = rings
    STAGES: gl.constexpr = v_ring.type.shape[0]
    turns = _wait_turn(turn, turns, WG, PINGPONG)
    slot = count % STAGES
    mbarrier.wait(v_ready.index(slot), (count // STAGES) & 1)
    acc = warpgroup_mma(p, v_ring.index(slot), acc, is_async=True)
    _pass_turn(turn, WG, PINGPONG)
    acc, p = _wait_pv(acc, p, P_SMEM)
    mbarrier.arrive(v_empty.index(slot))
    return acc, count + 1, turns


@gluon.jit
def _consumer(q_desc, k_desc, o_desc, o_ptr, lse_ptr, parts, LQ_PAD, order_ptr, num_tiles, LQ, LK, qk_scale, q_smem,
              rings, p_smem, o_smem, q_ready, q_empty, turn, WG: gl.constexpr, CAUSAL: gl.constexpr,
              PINGPONG: gl.constexpr, Q_BUFFERS: gl.constexpr, P_SMEM: gl.constexpr, O_TMA: gl.constexpr,
              WRITE_LSE: gl.constexpr, CUT: gl.constexpr):
    M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    CONSUMERS: gl.constexpr = turn.type.shape[0]
    p_slot = p_smem.index(WG)  # used only with P_SMEM
    o_slot = o_smem.index(WG)  # used only with O_TMA
    count = 0  # key blocks consumed over every tile: the producer's sequence
    turns = 0  # GEMM turns taken: every consumer takes the same number, in turn
    tiles_done = 0
    acc = gl.zeros([M, HEAD_DIM], gl.float32, o_layout)  # running unnormalised output, 64 x d FP32
    p = _no_p(p_slot, M, BLOCK_N, o_layout, P_SMEM)
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        bh, qb, lo, hi, slot = _item_at(order_ptr, tile)  # key blocks [lo, hi): every consumer's turns
        qm0 = qb * (CONSUMERS * M)
        row0 = qm0 + WG * M  # our first query row in the head
        n_full = _full_blocks(row0, LQ, LK, BLOCK_N, CAUSAL)  # ours: our later rows see more blocks whole
        q_buf = (tiles_done % Q_BUFFERS) * CONSUMERS + WG
        q_tile = q_smem.index(q_buf)  # our 64 rows of Q stay in shared memory for the whole tile
        mbarrier.wait(q_ready.index(q_buf), (tiles_done // Q_BUFFERS) & 1)  # ... once they have landed
        if hi > lo:
            m_i = gl.full([M], float("-inf"), gl.float32, gl.SliceLayout(1, wgmma_layout(BLOCK_N)))  # running max
            l_i = gl.zeros([M], gl.float32, gl.SliceLayout(1, wgmma_layout(BLOCK_N)))  # running sum of exp2(s - max)
            p, m_i, l_i, turns = _first_block(q_tile, rings, turn, p_slot, m_i, l_i, count, turns, lo, n_full,
                                              row0, qk_scale, LQ, LK, WG, CAUSAL, PINGPONG, P_SMEM)
            acc = gl.zeros([M, HEAD_DIM], gl.float32, o_layout)
            acc, p, m_i, l_i, count, turns = _key_blocks_from(lo + 1, q_tile, rings, turn, p_slot, acc, p, m_i, l_i,
                                                              count, turns, n_full, hi, row0, qk_scale, LQ, LK, WG,
                                                              CAUSAL, PINGPONG, P_SMEM)
            mbarrier.arrive(q_empty.index(q_buf))  # every S GEMM of this tile is done: the producer may reuse Q
            acc, count, turns = _last_pv(rings, turn, acc, p, count, turns, WG, PINGPONG, P_SMEM)
            if CUT and slot >= 0:  # a piece: the last of a tile's pieces adds them up and stores the rows
                store_piece(o_ptr, lse_ptr, parts, acc, m_i, l_i, bh, row0, slot, LQ, LQ_PAD, WG, CONSUMERS * M,
                            WRITE_LSE)
            else:
                store_rows(o_desc, o_ptr, o_slot, acc, l_i, bh, row0, LQ, O_TMA)
                if WRITE_LSE:  # a training call: the backward recomputes P from it
                    store_lse(lse_ptr, m_i, l_i, bh, row0, LQ, LQ_PAD)
        else:  # a tile that sees no key (causal, Lq > Lk): Q is never read, its rows are 0
            mbarrier.arrive(q_empty.index(q_buf))
            zeros = gl.zeros([M, HEAD_DIM], gl.float32, o_layout)
            no_sum = gl.zeros([M], gl.float32, gl.SliceLayout(1, wgmma_layout(BLOCK_N)))
            store_rows(o_desc, o_ptr, o_slot, zeros, no_sum, bh, row0, LQ, O_TMA)
            if WRITE_LSE:
                store_lse(lse_ptr, no_sum, no_sum, bh, row0, LQ, LQ_PAD)
        tiles_done += 1
    if O_TMA:
        tma.store_wait(pendings=0)


# ---------------------------------------------------------------------------------------------
# 4. The kernel: allocate the buffers and barriers, then fork into the consumers and the producer
# ---------------------------------------------------------------------------------------------
@gluon.jit(do_not_specialize=["pieces", "num_tiles", "LQ", "LK", "LQ_PAD"])
def fa3_forward_kernel(q_desc, k_desc, v_desc, o_desc, o_ptr, lse_ptr, part_ptr, part_lse_ptr, counter_ptr, pieces,
                       order_ptr, num_tiles, LQ, LK, LQ_PAD, qk_scale,
                       CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, STAGES: gl.constexpr,
                       CONSUMERS: gl.constexpr, Q_BUFFERS: gl.constexpr, P_SMEM: gl.constexpr, O_TMA: gl.constexpr,
                       CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, WRITE_LSE: gl.constexpr = False,
                       CUT: gl.constexpr = False):
    dtype: gl.constexpr = q_desc.dtype
    Q_SLOTS: gl.constexpr = Q_BUFFERS * CONSUMERS  # one [64, d] block of Q per consumer per buffer set
    q_smem = gl.allocate_shared_memory(dtype, [Q_SLOTS] + q_desc.block_type.shape, q_desc.layout)  # [., 64, d]
    k_ring = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)  # [S, N, d]
    v_ring = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)  # [S, N, d]
    if P_SMEM:  # each consumer's P, [64, BLOCK_N], for the P V wgmma to read from shared memory
        P_BLOCK: gl.constexpr = [q_desc.block_type.shape[0], k_desc.block_type.shape[0]]
        p_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + P_BLOCK,
                                           gl.NVMMASharedLayout.get_default_for(P_BLOCK, dtype))
    else:
        p_smem = q_smem  # never read or written: P stays in registers
    if O_TMA:  # each consumer's output rows on their way to global memory
        o_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + o_desc.block_type.shape, o_desc.layout)
    else:
        o_smem = q_smem  # never read or written: the output goes straight from registers
    q_ready = gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())  # turn[w]: w may issue
    for i in gl.static_range(Q_SLOTS):
        mbarrier.init(q_ready.index(i), count=1)  # the producer's expect, then the bytes
        mbarrier.init(q_empty.index(i), count=1)  # its consumer, after the tile's last S GEMM
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(turn.index(i), count=1)  # the consumer before it, once it has issued its GEMMs
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)  # every consumer reads every K and V block
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    # the default partition (first) runs on the kernel's 4 warps: consumer 0; the workers get their own warps
    rings = (k_ring, v_ring, k_ready, k_empty, v_ready, v_empty)  # the K and V rings with their barriers
    parts = (part_ptr, part_lse_ptr, counter_ptr, pieces)  # where a tile is cut: its pieces' rows, who is last
    if CONSUMERS == 3:
        gl.warp_specialize([
            (_consumer, (q_desc, k_desc, o_desc, o_ptr, lse_ptr, parts, LQ_PAD, order_ptr, num_tiles, LQ, LK, qk_scale,
                         q_smem, rings, p_smem, o_smem, q_ready, q_empty, turn, WG0, CAUSAL, PINGPONG, Q_BUFFERS,
                         P_SMEM, O_TMA, WRITE_LSE, CUT)),
            (_consumer, (q_desc, k_desc, o_desc, o_ptr, lse_ptr, parts, LQ_PAD, order_ptr, num_tiles, LQ, LK, qk_scale,
                         q_smem, rings, p_smem, o_smem, q_ready, q_empty, turn, WG1, CAUSAL, PINGPONG, Q_BUFFERS,
                         P_SMEM, O_TMA, WRITE_LSE, CUT)),
            (_consumer, (q_desc, k_desc, o_desc, o_ptr, lse_ptr, parts, LQ_PAD, order_ptr, num_tiles, LQ, LK, qk_scale,
                         q_smem, rings, p_smem, o_smem, q_ready, q_empty, turn, WG2, CAUSAL, PINGPONG, Q_BUFFERS,
                         P_SMEM, O_TMA, WRITE_LSE, CUT)),
            (_producer, (q_desc, k_desc, v_desc, order_ptr, num_tiles, LQ, LK, q_smem, k_ring, v_ring, q_ready, q_empty,
                         k_ready, k_empty, v_ready, v_empty, CONSUMERS, Q_BUFFERS)),
        ], [CONSUMER_WARPS, CONSUMER_WARPS, PRODUCER_WARPS], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (q_desc, k_desc, o_desc, o_ptr, lse_ptr, parts, LQ_PAD, order_ptr, num_tiles, LQ, LK, qk_scale,
                         q_smem, rings, p_smem, o_smem, q_ready, q_empty, turn, WG0, CAUSAL, PINGPONG, Q_BUFFERS,
                         P_SMEM, O_TMA, WRITE_LSE, CUT)),
            (_consumer, (q_desc, k_desc, o_desc, o_ptr, lse_ptr, parts, LQ_PAD, order_ptr, num_tiles, LQ, LK, qk_scale,
                         q_smem, rings, p_smem, o_smem, q_ready, q_empty, turn, WG1, CAUSAL, PINGPONG, Q_BUFFERS,
                         P_SMEM, O_TMA, WRITE_LSE, CUT)),
            (_producer, (q_desc, k_desc, v_desc, order_ptr, num_tiles, LQ, LK, q_smem, k_ring, v_ring, q_ready, q_empty,
                         k_ready, k_empty, v_ready, v_empty, CONSUMERS, Q_BUFFERS)),
        ], [CONSUMER_WARPS, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    for i in gl.static_range(Q_SLOTS):
        mbarrier.invalidate(q_ready.index(i))
        mbarrier.invalidate(q_empty.index(i))
    for i in gl.static_range(CONSUMERS):
        mbarrier.invalidate(turn.index(i))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(i))
        mbarrier.invalidate(k_empty.index(i))
        mbarrier.invalidate(v_ready.index(i))
        mbarrier.invalidate(v_empty.index(i))


# ---------------------------------------------------------------------------------------------
# 5. The launcher: descriptors, the tile order (fa3_plan.py), the register budget
# ---------------------------------------------------------------------------------------------
def gluon_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, config: FA3Config = None,
                    out: torch.Tensor = None, programs: int = None, return_kernel: bool = False,
                    lse: torch.Tensor = None):
    """softmax(q k^T / sqrt(d)) v with FlashAttention-3's schedule: q (B, H, Lq, d), k and v (B, H, Lk, d), bf16.
    Runs `config` (by default fa3_plan.config_for's for these inputs) on one program per SM (or `programs`: fewer
    makes each walk more tiles, as the tests want). Returns the
    output (B, H, Lq, d), and the compiled kernel (its .asm holds the PTX) with return_kernel. With `lse` (float32,
    (B, H, tiles.lq_pad(Lq)), contiguous) it also writes each row's natural-log log-sum-exp there, for the backward
    (gluon_fa3_bwd.py); rows past Lq are left as they are."""
    out = torch.empty_like(q) if out is None else out
    call = None if return_kernel else _call_key(q, k, v, out, causal, config, programs, lse)
    recorded = _RECORDED.get(call)
    if recorded is not None:  # the same tensors (addresses, shapes) as a call before: checked and encoded then
        replay(recorded)
        return out
    batch, heads, lq, d, lk = runnable_shapes(q, k, v)
    config = config or config_for(d, bool(causal), lq)
    if smem_bytes(d, config) > SMEM_BYTES:
        raise ValueError(f"{config.label} at d = {d} needs {smem_bytes(d, config) // 1024} KiB of shared memory; "
                         f"a Hopper block has {SMEM_BYTES // 1024} KiB")
    q, k, v = (t.contiguous() for t in (q, k, v))
    if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError("out must be a contiguous bf16 tensor of q's shape")

    def descriptor(t, rows):  # the head's rows follow each other: one (B*H*L, d) matrix, [rows, d] boxes
        return TensorDescriptor.from_tensor(t.view(-1, d), [rows, d], _smem_layout(rows, d))

    if lse is not None and (lse.shape != (batch, heads, lq_pad(lq)) or lse.dtype != torch.float32 or
                            not lse.is_contiguous()):
        raise ValueError(f"lse must be a contiguous float32 tensor of shape ({batch}, {heads}, {lq_pad(lq)})")
    q_blocks = -(-lq // config.block_m)
    slots = programs or device_sm_count(q.device, 1)
    lengths = tuple(query_tile_blocks(lq, lk, config.block_n, bool(causal), config.block_m))
    group = walk_group(batch * heads, lengths, bool(causal), lk, d, q.device, slots)
    order, cut, pieces = work_table(batch * heads, q_blocks, bool(causal), group, str(q.device), slots, lengths)
    programs = min(order.shape[0], slots)
    parts = _piece_buffers(cut, pieces, config.block_m, d, q.device)  # where the last round's tiles are cut
    args = (descriptor(q, WG_ROWS), descriptor(k, config.block_n), descriptor(v, config.block_n),
            descriptor(out, WG_ROWS), out, out if lse is None else lse, *parts, pieces, order, order.shape[0], lq, lk,
            0 if lse is None else lse.shape[-1], LOG2E / math.sqrt(d))
    meta = dict(CAUSAL=bool(causal), PINGPONG=config.pingpong, STAGES=config.stages, CONSUMERS=config.consumers,
                Q_BUFFERS=config.q_buffers, P_SMEM=config.p_smem, O_TMA=config.o_tma,
                CONSUMER_REGS=config.consumer_regs, PRODUCER_REGS=config.producer_regs, WRITE_LSE=lse is not None,
                CUT=pieces > 0,  # a kernel without the pieces' code where no tile is cut (causal: never)
                num_warps=CONSUMER_WARPS.value, maxnreg=register_budget(config))
    if return_kernel:  # the compiled kernel itself (its PTX): through Triton's own launch
        kernel = fa3_forward_kernel[(programs, )](*args, **meta)
        return out, kernel
    # the lab times short calls with the CPU's share: Triton binds and specializes every argument on each
    # kernel[grid](...) call (about 0.25 ms a call on an H100's host, more than the GPU's time at N = 2048), so
    # after the first call of a kind the compiled kernel's C launcher is called directly (labs/attention/launch.py)
    key = (q.shape, k.shape, config, programs, lse is not None, pieces > 0, aligned(*args[4:9], order))
    launch(fa3_forward_kernel, (programs, ), *args, **meta, key=key)
    if call is not None:  # the next call on these tensors skips the checks and the descriptors' encoding
        if len(_RECORDED) >= _RECORDED_MAX:
            _RECORDED.clear()
        recorded = record_encoded(fa3_forward_kernel, (programs, ), args, key, meta, keep=(config, order, parts))
        if recorded is not None:
            _RECORDED[call] = recorded
    return out


def _piece_buffers(tiles: int, pieces: int, tile_rows: int, head_dim: int, device) -> tuple:
    """Where the last round's tiles are cut (`tiles` of them, `pieces` each): FP32 room for every piece's rows and
    their log-sum-exps, and a counter for every 64 rows of a cut tile (zero; the last piece sets it back). Where
    nothing is cut, stand-ins that the kernel never reads or writes, made once a device."""
    if not tiles:
        key = str(device)
        if key not in _NO_PIECES:
            _NO_PIECES[key] = (torch.empty(1, 1, device=device, dtype=torch.float32),
                               torch.empty(1, device=device, dtype=torch.float32),
                               torch.zeros(1, device=device, dtype=torch.int32))
        return _NO_PIECES[key]
    rows = tiles * pieces * tile_rows
    return (torch.empty(rows, head_dim, device=device, dtype=torch.float32),
            torch.empty(rows, device=device, dtype=torch.float32),
            torch.zeros(tiles * tile_rows // WG_ROWS, device=device, dtype=torch.int32))


_NO_PIECES: dict = {}  # the stand-ins of _piece_buffers, by device


def runnable_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    """(B, H, Lq, d, Lk) of inputs this machine's GPU and Triton can run the Gluon kernels on (GluonUnavailable
    says why not; ValueError where the inputs are not what the kernels take)."""
    reason = attention_unavailable_reason(device_capability(q.device))
    if reason:
        raise GluonUnavailable(reason)
    check_inputs(q, k, v)
    return (*q.shape, k.shape[2])


# Calls recorded whole, their TMA descriptors encoded (labs/attention/launch.py record_encoded): each of Q, K, V
# and O needs a CUtensorMap, and encoding four of them on every launch took more CPU time than the GPU's whole call
# at N = 1024 (0.145 ms a call on an H200's host against 0.045 ms of GPU time, in the recording of 193a091).
_RECORDED: dict = {}
_RECORDED_MAX = 256  # calls remembered (a run reuses a few buffers per shape): forgotten all at once past this


def _call_key(q, k, v, out, causal, config, programs, lse=None):
    """What a recorded call's arguments follow from: every tensor's address, shape, dtype and device (tensors_key),
    the mask, the configuration (by identity: the record keeps it alive) and the program count. None where a tensor
    is not contiguous (the call then copies it, and records nothing)."""
    tensors = tensors_key(q, k, v, out) if lse is None else tensors_key(q, k, v, out, lse)
    return None if tensors is None else (id(config), bool(causal), programs, *tensors)


@functools.lru_cache(maxsize=16)
def _smem_layout(rows: int, d: int):
    return gl.NVMMASharedLayout.get_default_for([rows, d], gl.bfloat16)
