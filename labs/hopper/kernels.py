"""
Hopper matmul anatomy: one Triton kernel with every Hopper feature a switch
===========================================================================

What you will learn:
- a tensor-core matmul is a loop of "bring a BLOCK_K slice of A and B into shared memory, multiply it into the
  accumulators"; the rest is about keeping the tensor cores fed;
- num_stages: how many slices are in flight (software pipelining);
- TMA: the copy engine moves whole tiles (tensor descriptors) instead of every thread loading 16 bytes;
- the tile order (a small table built on the host, labs/hopper/model.py tile_order) and persistent programs that
  walk many tiles, with the tile loop and the K loop optionally flattened into one;
- warp specialization: a producer warp and consumer warpgroups, written in Gluon (labs/hopper/gluon_ws.py),
  because Triton 3.6's warp_specialize flag on this loop compiles to the same PTX as the step before.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from labs.engine.gpu import device_sm_count
from labs.engine.params import ParamError
from labs.hopper import gluon_support
from labs.hopper.model import Switches, tile_order


# ---------------------------------------------------------------------------------------------
# The kernel: one tile of C per call of _tile_*, the schedule around it
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tile_coords(order_ptr, tile):
    """The tile order lives in a small table (tile -> (row, column) of tiles), built on the host by
    tile_order(): the same table drives the kernel and the model's count of DRAM bytes."""
    return tl.load(order_ptr + 2 * tile), tl.load(order_ptr + 2 * tile + 1)


@triton.jit
def _tile_with_pointers(a_ptr, b_ptr, c_ptr, M, N, K, tile_m, tile_n, stride_am, stride_bk, stride_cm,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        UPCAST: tl.constexpr):
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of A and C
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] columns of B and C
    ks = tl.arange(0, BLOCK_K)
    # rows of A past the edge re-read row 0 (never stored): the loads stay unmasked along M
    a_ptrs = a_ptr + tl.where(rows < M, rows, 0)[:, None] * stride_am + ks[None, :]  # [BLOCK_M, BLOCK_K]
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :]  # [BLOCK_K, BLOCK_N], contiguous along N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K  # the last slice may be partial: its missing products must be zero
        a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=(ks[:, None] < k_left) & (cols[None, :] < N), other=0.0)
        if UPCAST:  # Triton's CPU interpreter cannot multiply 16-bit floats
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)  # tensor cores, FP32 accumulators in registers
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _tile_with_tma(a_desc, b_desc, c_desc, K, tile_m, tile_n,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   UPCAST: tl.constexpr):
    off_m, off_n = tile_m * BLOCK_M, tile_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K])  # the copy engine moves the whole [BLOCK_M, BLOCK_K] slice,
        b = b_desc.load([k * BLOCK_K, off_n])  # zero-filling what lies past the edges: no masks
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))  # clipped at the edges by the engine


@triton.jit
def anatomy_pointer_kernel(a_ptr, b_ptr, c_ptr, order_ptr, M, N, K, num_tiles, stride_am, stride_bk, stride_cm,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           PERSISTENT: tl.constexpr, UPCAST: tl.constexpr = False):
    """Loads by pointers (cp.async on Ampere and Hopper when num_stages > 1). Triton compiles a variant for
    sizes and strides that are multiples of 16: only then can it prove 16-byte alignment and copy 16 bytes
    at a time (cp.async cannot move a single 2-byte element)."""
    if PERSISTENT:  # one program per SM walks the tiles pid, pid + programs, pid + 2 programs, ...
        for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            tile_m, tile_n = _tile_coords(order_ptr, tile)
            _tile_with_pointers(a_ptr, b_ptr, c_ptr, M, N, K, tile_m, tile_n, stride_am, stride_bk, stride_cm,
                                BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)
    else:  # one program per tile; the hardware starts the next program when an SM frees up
        tile_m, tile_n = _tile_coords(order_ptr, tl.program_id(0))
        _tile_with_pointers(a_ptr, b_ptr, c_ptr, M, N, K, tile_m, tile_n, stride_am, stride_bk, stride_cm,
                            BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)


@triton.jit(do_not_specialize=["K", "num_tiles"])
def anatomy_tma_kernel(a_desc, b_desc, c_desc, order_ptr, K, num_tiles,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PERSISTENT: tl.constexpr, UPCAST: tl.constexpr = False,
                       FLATTEN: tl.constexpr = False):
    """Loads and stores by tensor descriptors: the TMA copy engine (cp.async.bulk.tensor)."""
    if PERSISTENT:
        if FLATTEN:  # the tile loop and the K loop pipelined as one: no refill between tiles
            for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True):
                tile_m, tile_n = _tile_coords(order_ptr, tile)
                _tile_with_tma(a_desc, b_desc, c_desc, K, tile_m, tile_n, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)
        else:
            for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
                tile_m, tile_n = _tile_coords(order_ptr, tile)
                _tile_with_tma(a_desc, b_desc, c_desc, K, tile_m, tile_n, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)
    else:
        tile_m, tile_n = _tile_coords(order_ptr, tl.program_id(0))
        _tile_with_tma(a_desc, b_desc, c_desc, K, tile_m, tile_n, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)


_ORDER_TABLES: dict = {}


def order_table(order: str, tiles_m: int, tiles_n: int, device) -> torch.Tensor:
    """tile_order() as an int32 [tiles, 2] tensor on the device (built once per shape)."""
    key = (order, tiles_m, tiles_n, str(device))
    if key not in _ORDER_TABLES:
        _ORDER_TABLES[key] = torch.tensor(tile_order(order, tiles_m, tiles_n), dtype=torch.int32, device=device)
    return _ORDER_TABLES[key]


def sm_count(device) -> int:
    return device_sm_count(device, in_interpreter=3)  # on the CPU: a few programs, so each walks several tiles


def check_tma_rows(*tensors: torch.Tensor) -> None:
    """The TMA reads and writes whole rows of 16-byte units: refuse what it cannot describe, with a message."""
    for t in tensors:
        if (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16 or t.stride(1) != 1:
            raise ParamError("TMA needs row-major matrices whose rows start on 16-byte boundaries "
                             f"(a multiple of {16 // t.element_size()} elements); got {tuple(t.shape)}.")


def prepare_warp_specialized(a, b, out, sw: Switches, table, programs: int, block: tuple, num_warps: int):
    """The Gluon step's launch, or GluonUnavailable saying why this machine cannot run it (no Hopper GPU, or a
    Triton without the Gluon features the kernel uses: labs/hopper/gluon_support.py)."""
    reason = gluon_support.unavailable_reason(gluon_support.device_capability(a.device))
    if reason:
        raise gluon_support.GluonUnavailable(f"the warp-specialized step is written in Gluon and needs a Hopper GPU "
                                             f"and a Triton with Gluon: {reason}.")
    from labs.hopper.gluon_ws import prepare_gluon_ws  # imported only here: it needs Gluon to import

    return prepare_gluon_ws(a, b, out, table, programs, block, sw.stages, num_warps)


def prepare(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, sw: Switches,
            block: Optional[tuple] = None, num_warps: Optional[int] = None, programs: Optional[int] = None):
    """Everything a launch needs, built once (descriptors, order table, grid): returns launch().
    The tile shape and warps are the switches' unless given (the CPU tests shrink them)."""
    (m, k), n = a.shape, b.shape[1]
    bm, bn, bk = block or sw.block
    num_warps = num_warps or sw.num_warps
    tiles_m, tiles_n = triton.cdiv(m, bm), triton.cdiv(n, bn)
    tiles = tiles_m * tiles_n
    table = order_table(sw.order, tiles_m, tiles_n, a.device)
    grid = (min(tiles, programs or sm_count(a.device)),) if sw.persistent else (tiles,)
    upcast = a.device.type == "cpu"  # the interpreter's 16-bit arithmetic is not to be trusted
    if sw.tma:
        check_tma_rows(a, b, out)
    if sw.warp_specialize:  # the Gluon kernel: a producer warp, consumer warpgroups (labs/hopper/gluon_ws.py)
        return prepare_warp_specialized(a, b, out, sw, table, grid[0], (bm, bn, bk), num_warps)
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PERSISTENT=sw.persistent, UPCAST=upcast,
                num_warps=num_warps, num_stages=sw.stages)
    if sw.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        args = (TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn]),
                TensorDescriptor.from_tensor(out, [bm, bn]), table, k, tiles)
        kernel = anatomy_tma_kernel
        if sw.flatten:  # only passed when on, so the other steps compile exactly as before
            meta["FLATTEN"] = True
    else:
        args = (a, b, out, table, m, n, k, tiles, a.stride(0), b.stride(0), out.stride(0))
        kernel = anatomy_pointer_kernel
    return lambda: kernel[grid](*args, **meta)


def anatomy_matmul(a: torch.Tensor, b: torch.Tensor, sw: Switches, out: Optional[torch.Tensor] = None, **kw):
    """C = A @ B (row-major A [M, K], B [K, N]) with the switches `sw`; returns (C, compiled kernel)."""
    out = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype) if out is None else out
    compiled = prepare(a, b, out, sw, **kw)()
    return out, compiled
