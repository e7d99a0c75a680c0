"""
Warp specialization in Gluon: one producer warp, two consumer warpgroups, a ring of shared-memory stages
========================================================================================================

What you will learn:
- Gluon (`triton.experimental.gluon`) is Triton one level down: you place shared memory, barriers and layouts
  yourself, and the compiler does what you wrote instead of choosing a schedule for you;
- a warp-specialized kernel splits its warps into partitions that run different code at the same time:
  here one *producer* warp only issues TMA copies, and the *consumers* (two warpgroups, 8 warps) only issue
  tensor-core instructions (`wgmma`) and write the result;
- the two sides talk through a ring of STAGES shared-memory buffers and two mbarriers per buffer: `ready`
  (the TMA has landed the slice: the producer arms it with the byte count, the copy engine completes it) and
  `empty` (the consumers have finished reading the slice: they arrive on it once their `wgmma` is done);
- an mbarrier counts phases, so a waiter names the parity of the phase it waits for: the k-th use of a stage
  waits for parity (k // STAGES) & 1, and a fresh barrier counts as having completed the phase before phase 0,
  which is why the producer's first pass over the ring does not wait;
- registers move between partitions (`setmaxnreg`): the producer needs a few dozen, the consumers hold a
  128 x 256 FP32 accumulator (128 registers a thread) and get what the producer gave up.

The kernel is persistent: one program per SM walks the output tiles in the order of a table built on the
host (the same Hilbert order as step 6), so the producer runs ahead into the next tile while the consumers
write this one. The edges need no masks: the TMA fills reads past the matrix with zeros and clips the stores.
This module needs a Triton that ships Gluon and a Hopper GPU; labs/hopper/gluon_support.py says whether
this machine has both, so the lab can leave the step out with a note where it does not.
"""

from __future__ import annotations

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
PRODUCER_WARPS = gl.constexpr(1)  # one warp is plenty to issue two TMA copies per slice
PRODUCER_REGS = 24  # registers per producer thread after setmaxnreg: the least Hopper allows; an H100 ran 726
# TFLOP/s at 8192 with 24 against 700 with 40 (scripts/gluon_ws_check.py, 2026-11-27): what the producer gives
# up, the consumers keep
# Triton 3.6 names the TMA copies async_copy_global_to_shared / async_copy_shared_to_global; later Tritons rename
# them async_load / async_store (and make the old names raise). Look for the feature, not the version.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared  # (desc, coord, barrier, dst)
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global  # (desc, coord, src)


def _tma_add_from_builder(tensor_desc, coord, src, _semantic=None):
    """global[box at coord] += shared `src` by the TMA unit (cp.reduce.async.bulk.tensor .add), tracked as a TMA
    store is (tma.store_wait). Triton 3.6 has the operation in its builder but no Gluon function for it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


# later Tritons call it async_atomic_add (desc, coord, src)
tma_add = getattr(tma, "async_atomic_add", None) or builtin(_tma_add_from_builder)


@gluon.constexpr_function
def wgmma_layout(block_m, block_n, num_warps):
    """Where each accumulator element lives: warps stacked along M (16 rows each, a warpgroup per 64 rows),
    one wgmma instruction as wide as the tile (m16 x n x k16, n at most 256)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                     instr_shape=[16, min(block_n, 256), 16])


@gluon.jit
def _tile_offsets(order_ptr, tile, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Row and column of a tile's first element, from the host's order table (tile -> (tile row, tile column))."""
    return gl.load(order_ptr + 2 * tile) * BLOCK_M, gl.load(order_ptr + 2 * tile + 1) * BLOCK_N


# ---------------------------------------------------------------------------------------------
# The producer: one warp that only issues copies
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _producer(a_desc, b_desc, order_ptr, num_tiles, a_ring, b_ring, ready, empty):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    STAGES: gl.constexpr = a_ring.type.shape[0]
    k_slices = gl.cdiv(a_desc.shape[1], BLOCK_K)
    count = 0  # slices issued so far, over every tile: stage count % STAGES, its use count // STAGES
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(order_ptr, tile, BLOCK_M, BLOCK_N)
        for ks in range(k_slices):
            stage = count % STAGES
            # wait until the consumers have emptied this stage (its previous use); the first pass goes through
            mbarrier.wait(empty.index(stage), ((count // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            # arm `ready` with the bytes both copies will bring; the copy engine completes the phase on arrival
            # (a slice past an edge still counts its full size: the TMA writes zeros there)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma_load(a_desc, [off_m, ks * BLOCK_K], bar, a_ring.index(stage))  # [BLOCK_M, BLOCK_K] of A
            tma_load(b_desc, [ks * BLOCK_K, off_n], bar, b_ring.index(stage))  # [BLOCK_K, BLOCK_N] of B
            count += 1


# ---------------------------------------------------------------------------------------------
# The consumers: two warpgroups that only multiply, then write the tile
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _consumers(c_desc, order_ptr, num_tiles, k_slices, a_ring, b_ring, ready, empty, c_smem,
               num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    STAGES: gl.constexpr = a_ring.type.shape[0]
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps)
    count = 0  # slices consumed so far: the same sequence the producer issued
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(order_ptr, tile, BLOCK_M, BLOCK_N)
        acc = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, acc_layout)  # [BLOCK_M, BLOCK_N] FP32 in registers
        for ks in range(k_slices):
            stage = count % STAGES
            mbarrier.wait(ready.index(stage), (count // STAGES) & 1)  # this slice has landed
            # each warpgroup multiplies its 64 rows of A by the slice of B, straight from shared memory
            acc = warpgroup_mma(a_ring.index(stage), b_ring.index(stage), acc, is_async=True)
            # keep this wgmma in flight, wait for the one before it: its stage is no longer read
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=ks > 0)
            count += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))  # the tile's last slice is free too
        # the epilogue: the producer is already loading the next tile's first slices meanwhile
        tma.store_wait(pendings=0)  # the previous tile's store has finished reading c_smem
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()  # order the generic-proxy writes before the TMA (async proxy) reads them
        tma_store(c_desc, [off_m, off_n], c_smem)  # runs on while the next tile's K loop starts
    tma.store_wait(pendings=0)


# ---------------------------------------------------------------------------------------------
# The kernel: allocate the ring and its barriers, then fork into the partitions
# ---------------------------------------------------------------------------------------------
@gluon.jit
def gluon_ws_kernel(a_desc, b_desc, c_desc, order_ptr, num_tiles, STAGES: gl.constexpr,
                    PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = a_desc.dtype
    a_ring = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)  # [S, BM, BK]
    b_ring = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)  # [S, BK, BN]
    c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)  # [BM, BN], for the TMA store
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)  # one arrival: the producer's expect (then the bytes)
        mbarrier.init(empty.index(i), count=1)  # one arrival: the consumers', after their wgmma
    k_slices = gl.cdiv(a_desc.shape[1], a_desc.block_type.shape[1])
    # the default partition (first) runs on the kernel's num_warps warps; the worker gets its own warp
    gl.warp_specialize([
        (_consumers, (c_desc, order_ptr, num_tiles, k_slices, a_ring, b_ring, ready, empty, c_smem, num_warps)),
        (_producer, (a_desc, b_desc, order_ptr, num_tiles, a_ring, b_ring, ready, empty)),
    ], [PRODUCER_WARPS], [PRODUCER_REGS])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


def register_budget(num_warps: int) -> int:
    """maxnreg for the launch: every thread starts with this many registers, and the SM's 65,536 must cover the
    consumers' warps plus the producer's warpgroup (a worker's warps are rounded up to four)."""
    threads = (num_warps + 4) * 32
    return min(256, (65536 // threads) // 8 * 8)


SMEM_BYTES = 227 * 1024  # shared memory one block may use on Hopper


def smem_bytes(block: tuple, stages: int, element_bytes: int = 2) -> int:
    """The ring of A and B slices, the C tile for the store, and two mbarriers (8 bytes) per stage."""
    bm, bn, bk = block
    return stages * (bm * bk + bk * bn) * element_bytes + bm * bn * element_bytes + 2 * 8 * stages


def prepare_gluon_ws(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, order: torch.Tensor, programs: int,
                     block: tuple, stages: int, num_warps: int = 8, producer_regs: int = PRODUCER_REGS):
    """C = A @ B (row-major A [M, K], B [K, N], C [M, N]) over the tiles of `order` (int32 [tiles, 2]) on
    `programs` persistent programs. Builds the descriptors once and returns launch(), which returns the compiled
    kernel (its .asm holds the PTX and SASS)."""
    bm, bn, bk = block
    if smem_bytes(block, stages, a.element_size()) > SMEM_BYTES:
        raise ValueError(f"{bm}x{bn}x{bk} with {stages} stages needs {smem_bytes(block, stages) // 1024} KiB of "
                         f"shared memory; a Hopper block has {SMEM_BYTES // 1024} KiB.")
    dtype = GL_DTYPES[a.dtype]

    def descriptor(t, shape):
        return TensorDescriptor.from_tensor(t, list(shape), gl.NVMMASharedLayout.get_default_for(list(shape), dtype))

    args = (descriptor(a, (bm, bk)), descriptor(b, (bk, bn)), descriptor(out, (bm, bn)), order, order.shape[0])
    meta = dict(STAGES=stages, PRODUCER_REGS=producer_regs, num_warps=num_warps, maxnreg=register_budget(num_warps))
    return lambda: gluon_ws_kernel[(programs, )](*args, **meta)
