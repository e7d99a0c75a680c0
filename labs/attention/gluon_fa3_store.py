"""The Gluon FlashAttention-3 forward's consumers' last step (gluon_fa3.py): a warpgroup's 64 rows of a tile leave
for global memory, normalised once, through a TMA copy from shared memory or straight from registers; their
log-sum-exp for the backward; or, for a piece of a tile cut along its keys, its partial rows, which the tile's
last piece adds up. Needs a Triton with Gluon (labs/hopper/gluon_support.py)."""

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
def _normalised(acc, l_i):
    """Each row of acc over its sum l (in any layout of rows); a row that saw no key (l = 0) stays 0."""
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, acc.type.layout))
    return acc / gl.expand_dims(gl.where(l_o == 0.0, 1.0, l_o), 1)


@gluon.jit
def _lse2(m_i, l_i):
    """A row's log-sum-exp in base 2 from its running max and sum (both in base 2): m + log2 l, -inf where l = 0."""
    return gl.where(l_i > 0.0, m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))


@gluon.jit
def store_rows(o_desc, o_ptr, o_slot, acc, l_i, bh, row0, LQ, O_TMA: gl.constexpr):
    """Normalise once and store our 64 rows. With O_TMA, through shared memory and one TMA copy that runs on while
    the next tile starts (a ragged last block still goes the masked way: the copy would write the next head's
    rows)."""
    M: gl.constexpr = acc.shape[0]
    out = _normalised(acc, l_i).to(gl.bfloat16)
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
    lse = _lse2(m_i, l_i) * 0.6931471805599453
    gl.store(lse_ptr + bh.to(gl.int64) * LQ_PAD + rows, lse, mask=rows < LQ)


@gluon.jit
def _fence_gpu(x):
    """fence.acq_rel.gpu from every thread (once for each element of x it holds): its stores before it are seen
    GPU-wide before anything it does after (CUDA's __threadfence)."""
    return gl.inline_asm_elementwise("fence.acq_rel.gpu;\n mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def store_piece(o_ptr, lse_ptr, parts, acc, m_i, l_i, bh, row0, slot, LQ, LQ_PAD, WG: gl.constexpr,
                TILE_ROWS: gl.constexpr, WRITE_LSE: gl.constexpr):
    """A piece of a tile cut along its keys: our 64 rows over the piece's keys alone (FP32, normalised by the
    piece's own sum) and their base-2 log-sum-exp go to the pieces' buffers, slot * TILE_ROWS + 64 WG onwards. The
    warpgroup that stores the last piece of these rows adds every piece up and stores the rows (and their
    log-sum-exp for the backward).

    How pieces combine: piece i's output o_i and L_i = m_i + log2 l_i give the row's o = sum_i 2^(L_i - L) o_i with
    L = log2 sum_i 2^L_i, shifted by the largest L_i so no exp2 overflows. Who is last (CUDA's last-block pattern):
    every thread's stores, a GPU-wide fence, a barrier of the warpgroup's four warps, then one atomic add on the
    rows' counter; the warpgroup that reads pieces - 1 adds up, and sets the counter back to 0 for the next call."""
    part_o, part_lse, counters, pieces = parts
    M: gl.constexpr = acc.shape[0]
    HEAD_DIM: gl.constexpr = acc.shape[1]
    o_layout: gl.constexpr = acc.type.layout
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    lse2 = _lse2(gl.convert_layout(m_i, row_layout), gl.convert_layout(l_i, row_layout))
    r = gl.arange(0, M, layout=row_layout)
    rows = gl.expand_dims(r, 1)  # [M, 1]
    cols = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout)), 0)  # [1, d]
    mine = slot.to(gl.int64) * TILE_ROWS + WG * M
    gl.store(part_o + (mine + rows) * HEAD_DIM + cols, _normalised(acc, l_i))
    gl.store(part_lse + mine + r, lse2)
    _fence_gpu(lse2.to(gl.int32, bitcast=True))
    gl.thread_barrier()
    counter = counters + (slot // pieces) * (TILE_ROWS // M) + WG
    if gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == pieces - 1:  # ours is the last piece of these rows
        m_run = gl.full([M], float("-inf"), gl.float32, row_layout)
        total = gl.zeros([M], gl.float32, row_layout)
        out = gl.zeros([M, HEAD_DIM], gl.float32, o_layout)
        first = slot - slot % pieces  # the tile's first piece
        for i in range(pieces):
            at = (first + i).to(gl.int64) * TILE_ROWS + WG * M
            lse_i = gl.load(part_lse + at + r, cache_modifier=".cg")  # past L1: written by other SMs
            o_i = gl.load(part_o + (at + rows) * HEAD_DIM + cols, cache_modifier=".cg")
            m_new = gl.maximum(m_run, lse_i)
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # no key in any piece yet: no NaN
            alpha = gl.exp2(m_run - m_use)
            weight = gl.exp2(lse_i - m_use)
            out = out * gl.expand_dims(alpha, 1) + o_i * gl.expand_dims(weight, 1)
            total = total * alpha + weight
            m_run = m_new
        _store_masked(o_ptr, _normalised(out, total).to(gl.bfloat16), bh, row0, LQ)
        if WRITE_LSE:  # the running max and sum over the pieces are the row's, in base 2
            store_lse(lse_ptr, m_run, total, bh, row0, LQ, LQ_PAD)
        gl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # ready for the next call
