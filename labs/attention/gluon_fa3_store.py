"""The Gluon FlashAttention-3 forward's consumers' last step (gluon_fa3.py): a warpgroup's 64 rows of a tile leave
for global memory, normalised once, through a TMA copy from shared memory or straight from registers; their
log-sum-exp for the backward; or, for a piece of a tile cut along its keys, its partial rows for fa3_split.py to add
up. Needs a Triton with Gluon (labs/hopper/gluon_support.py)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from labs.hopper.gluon_ws import tma_store


@gluon.jit
def _store_masked(o_ptr, out, bh, row0, LQ):
    """Our rows straight from registers to global memory; rows past Lq (the next head's, or past the end) not."""
    M: gl.constexpr = out.shape[0]
    HEAD_DIM: gl.constexpr = out.shape[1]
    o_layout: gl.constexpr = out.type.layout
    rows = gl.expand_dims(row0 + gl.arange(0, M, layout=gl.SliceLayout(1, o_layout)), 1)  # [M, 1]
    cols = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout)), 0)  # [1, d]
    ptrs = o_ptr + (bh.to(gl.int64) * LQ + rows) * HEAD_DIM + cols
    gl.store(ptrs, out, mask=(rows < LQ) & (cols < HEAD_DIM))


@gluon.jit
def store_rows(o_desc, o_ptr, o_slot, acc, l_i, bh, row0, LQ, O_TMA: gl.constexpr):
    """Normalise once and store our 64 rows. With O_TMA, through shared memory and one TMA copy that runs on while
    the next tile starts (a ragged last block still goes the masked way: the copy would write the next head's
    rows)."""
    M: gl.constexpr = acc.shape[0]
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, acc.type.layout))
    out = (acc / gl.expand_dims(gl.where(l_o == 0.0, 1.0, l_o), 1)).to(gl.bfloat16)  # a row that saw no key: 0
    if O_TMA:
        if row0 + M <= LQ:
            tma.store_wait(pendings=0)  # our last tile's copy has finished reading the slot
            o_slot.store(out)
            fence_async_shared()  # the generic-proxy writes before the TMA (async proxy) reads them
            tma_store(o_desc, [bh * LQ + row0, 0], o_slot)
        else:
            _store_masked(o_ptr, out, bh, row0, LQ)
    else:
        _store_masked(o_ptr, out, bh, row0, LQ)


@gluon.jit
def store_lse(lse_ptr, m_i, l_i, bh, row0, LQ, LQ_PAD):
    """Our rows' log-sum-exp for the backward, in natural-log units: m and l are in base 2 (the running max of the
    scaled scores and the sum of exp2 under it), so lse = (m + log2 l) ln 2; -inf where a row saw no key. Rows past
    Lq are not stored (the backward gives them P = 0 itself)."""
    rows = row0 + gl.arange(0, m_i.shape[0], layout=m_i.type.layout)
    lse = gl.where(l_i > 0.0, (m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    gl.store(lse_ptr + bh.to(gl.int64) * LQ_PAD + rows, lse, mask=rows < LQ)


@gluon.jit
def store_piece(part_ptr, part_lse_ptr, acc, m_i, l_i, slot, WG: gl.constexpr, TILE_ROWS: gl.constexpr):
    """A piece's result for fa3_split.py to add up: our 64 rows of the output over the piece's keys alone (FP32,
    normalised by the piece's own sum), and their base-2 log-sum-exp (-inf where a row saw none of its keys), in
    rows slot * TILE_ROWS + 64 WG onwards of the pieces' buffers."""
    M: gl.constexpr = acc.shape[0]
    HEAD_DIM: gl.constexpr = acc.shape[1]
    o_layout: gl.constexpr = acc.type.layout
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = acc / gl.expand_dims(gl.where(l_o == 0.0, 1.0, l_o), 1)
    first = slot.to(gl.int64) * TILE_ROWS + WG * M
    rows = gl.expand_dims(first + gl.arange(0, M, layout=gl.SliceLayout(1, o_layout)), 1)  # [M, 1]
    cols = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout)), 0)  # [1, d]
    gl.store(part_ptr + rows * HEAD_DIM + cols, out)
    lse2 = gl.where(l_i > 0.0, m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    gl.store(part_lse_ptr + first + gl.arange(0, M, layout=m_i.type.layout), lse2)
