"""
Adding up the pieces of a cut tile: the second kernel of the Gluon forward's tail
=================================================================================

What you will learn:
- why a persistent kernel cuts its last round of tiles: T tiles on P programs leave the last round T mod P tiles,
  and every other program waits for them (at N 2048, d 64: 44 of 132 SMs run a sixth 192-query tile). Cut along
  the keys into P // (T mod P) pieces (fa3_model.tail_pieces), those tiles keep every SM busy for a fraction of
  a tile's time;
- how pieces of one row's softmax combine exactly: each piece i returns its output o_i normalised by its own sum,
  and its log-sum-exp L_i = m_i + log2(l_i) in base 2. The whole row's sum is sum_i 2^L_i, so the output is
  o = sum_i 2^(L_i - L) o_i with L = log2(sum_i 2^L_i): weights from the log-sum-exps, shifted by their maximum
  so that no exp2 overflows (the online softmax's rule, once more). One program takes a few rows of a tile and
  every piece of them at once: their loads go out together instead of one piece after another;
- what it costs: one more launch, and each piece's rows read once in FP32 (fa3_model.combine_bytes).

The forward kernel (gluon_fa3_store.py, store_piece) writes the pieces' rows; the host's table (fa3_plan.work_table)
says which tile each piece belongs to. Any GPU, or Triton's CPU interpreter (TRITON_INTERPRET=1), runs this one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labs.attention.launch import aligned, launch

COMBINE_ELEMENTS = 8192  # piece-row-column elements one program holds at once (four warps, 64 registers a thread)


@triton.jit(do_not_specialize=["LQ", "LQ_PAD"])
def combine_pieces_kernel(PART_O, PART_LSE, SPLIT, OUT, LSE, LQ, LQ_PAD, TILE_ROWS: tl.constexpr,
                          HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, PIECES: tl.constexpr, WRITE_LSE: tl.constexpr):
    # which cut tile, and which ROWS of its rows: (flattened batch*head, query block, first slot, pieces)
    entry = SPLIT + 4 * tl.program_id(0)
    bh, qb, first, pieces = tl.load(entry), tl.load(entry + 1), tl.load(entry + 2), tl.load(entry + 3)
    r = tl.program_id(1) * ROWS + tl.arange(0, ROWS)  # rows within the tile
    cols = tl.arange(0, HEAD_DIM)
    piece = tl.arange(0, PIECES)  # every piece at once (PIECES: their number rounded up to a power of two)
    real = piece < pieces
    row = (first + piece).to(tl.int64)[:, None] * TILE_ROWS + r[None, :]  # [PIECES, ROWS] in the pieces' buffers
    # the weights: 2^(L_i - max L), 0 for a piece that saw none of the row's keys (or a padding piece)
    lse_i = tl.load(PART_LSE + row, mask=real[:, None], other=float("-inf"))
    m = tl.max(lse_i, 0)
    m_use = tl.where(m == float("-inf"), 0.0, m)  # no key in any piece: no NaN
    weight = tl.exp2(lse_i - m_use[None, :])
    total = tl.sum(weight, 0)
    o_i = tl.load(PART_O + row[:, :, None] * HEAD_DIM + cols[None, None, :], mask=real[:, None, None], other=0.0)
    out = tl.sum(o_i * weight[:, :, None], 0) / tl.where(total == 0.0, 1.0, total)[:, None]  # no key: 0, as before
    rows = qb * TILE_ROWS + r  # in the head; rows past Lq belong to no one
    inside = rows < LQ
    tl.store(OUT + (bh.to(tl.int64) * LQ + rows)[:, None] * HEAD_DIM + cols[None, :], out.to(OUT.dtype.element_ty),
             mask=inside[:, None])
    if WRITE_LSE:  # natural-log units, as the forward's store_lse
        lse = tl.where(total > 0.0, (m_use + tl.log2(tl.where(total > 0.0, total, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        tl.store(LSE + bh.to(tl.int64) * LQ_PAD + rows, lse, mask=inside)


def piece_buffers(tiles: int, pieces: int, tile_rows: int, head_dim: int, device) -> tuple:
    """(rows, log-sum-exps): FP32 room for the tile_rows rows of `pieces` pieces of each of `tiles` cut tiles, or
    None where no tile is cut."""
    if not tiles * pieces:
        return None
    return (torch.empty(tiles * pieces * tile_rows, head_dim, device=device, dtype=torch.float32),
            torch.empty(tiles * pieces * tile_rows, device=device, dtype=torch.float32))


def add_pieces(parts: tuple, split: torch.Tensor, pieces: int, out: torch.Tensor, lse, lq: int,
               tile_rows: int) -> None:
    """Write each cut tile's rows of `out` (B, H, Lq, d) from its pieces (`pieces` for a tile at most), and their
    log-sum-exps into `lse` (B, H, Lq_pad) unless it is None."""
    head_dim = out.shape[-1]
    per_tile = triton.next_power_of_2(pieces)
    rows = max(1, min(64, COMBINE_ELEMENTS // (per_tile * head_dim)))  # a power of two that divides 128 and 192
    target = out if lse is None else lse
    launch(combine_pieces_kernel, (split.shape[0], triton.cdiv(tile_rows, rows)), parts[0], parts[1], split, out,
           target, lq, 0 if lse is None else lse.shape[-1], TILE_ROWS=tile_rows, HEAD_DIM=head_dim, ROWS=rows,
           PIECES=per_tile, WRITE_LSE=lse is not None, num_warps=4,
           key=(out.dtype, aligned(out, target, *parts, split)))
