"""
Matmul kernels: a tiled Triton matmul, its TMA twin, and the schedules that launch them
=======================================================================================

What you will learn:
- a tiled matmul kernel: each program computes one BLOCK_M x BLOCK_N tile of C, walking K in steps of BLOCK_K,
  with the tensor cores doing the multiply-adds into FP32 accumulators held in registers;
- the launch order (GROUP_M): programs that run at the same time share panels of A and B through the L2;
- two ways to bring tiles in: pointer loads (any strides; as wide as the rows' alignment allows) and the TMA copy
  engine (whole tiles, zero-filled past the edges, rows on 16-byte boundaries);
- schedules built from the same kernel: the row tail and interior + edge (several launches, started early with
  programmatic dependent launch), and stream-K (a persistent kernel sharing out the K steps of the last wave);
- the library call it is measured against (cuBLAS through torch).

The tile shapes and the per-size choice are in labs/matmul/configs.py; the model in labs/matmul/model.py.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine.gpu import device_sm_count
import labs.matmul.configs as configs
from labs.matmul.configs import (AUTOTUNE_CONFIGS, DEFAULT_CONFIGS, EDGE_COL_TILE, EDGE_ROW_TILE, KMAJOR_B,
                                 TileConfig, blocks_per_sm, edge_interior, row_tail_rows, streamk_plan, tail_tile,
                                 tma_supported, vector_elems)


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tile_of(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Launch order -> (tile row, tile column). Programs are launched in order of pid, so consecutive
    pids run at the same time: walking GROUP_M tile rows column by column makes them share row
    panels of A and column panels of B, which then come from the L2 cache instead of memory."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n  # programs in one band of GROUP_M tile rows
    first_m = (pid // per_group) * GROUP_M
    rows_here = tl.minimum(tiles_m - first_m, GROUP_M)  # the last band may be thinner
    tile_m = first_m + (pid % per_group) % rows_here
    tile_n = (pid % per_group) // rows_here
    return tile_m, tile_n


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr, FP32_MODE: tl.constexpr,
                  UPCAST: tl.constexpr = False, ALIGN: tl.constexpr = 1):
    """Pointer path: any strides. Triton knows an integer argument is a multiple of 16 when it is one
    (it compiles a variant for that case); only then can it prove that a row starts on a 16-byte
    boundary and load 16 bytes at a time. Otherwise it loads element by element, unless the launcher
    knows better: ALIGN > 1 promises that the row strides and K are multiples of ALIGN elements (N = 2056:
    8 bf16 elements, 16 bytes), and the kernel passes that on to Triton with tl.multiple_of."""
    tile_m, tile_n = _tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of C (and A) of this tile
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] columns of C (and B)
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    # Rows of A past the edge read row 0 instead: no mask along M (those results are never stored).
    # A row of A is contiguous along K, so this keeps the loads contiguous.
    a_rows = tl.where(rows < M, rows, 0) * stride_am  # [BLOCK_M] where each row of A starts
    if ALIGN > 1:
        a_rows = tl.multiple_of(a_rows, ALIGN)
    a_ptrs = a_ptr + a_rows[:, None] + ks[None, :] * stride_ak
    if B_KMAJOR:  # B stored as [N, K]: contiguous along K, so columns past the edge can read column 0
        b_cols = tl.where(cols < N, cols, 0) * stride_bn
        if ALIGN > 1:
            b_cols = tl.multiple_of(b_cols, ALIGN)
        b_ptrs = b_ptr + ks[:, None] * stride_bk + b_cols[None, :]
    else:  # B row-major: contiguous along N; keep it so (vector loads) and mask the columns past the edge
        b_rows = ks * stride_bk
        if ALIGN > 1:
            b_rows = tl.multiple_of(b_rows, ALIGN)
        b_ptrs = b_ptr + b_rows[:, None] + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # FP32 accumulators, in registers
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K  # the last step may be partial: its missing products must be zero
        col_ok = cols[None, :] < N
        if ALIGN > 1:  # masks constant over ALIGN elements: k_left and the columns left are multiples of ALIGN
            k_left = tl.multiple_of(k_left, ALIGN)
            col_ok = tl.arange(0, BLOCK_N)[None, :] < tl.multiple_of(N - tile_n * BLOCK_N, ALIGN)
        a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)  # [BLOCK_M, BLOCK_K]
        if B_KMAJOR:
            b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)  # [BLOCK_K, BLOCK_N]
        else:
            b = tl.load(b_ptrs, mask=(ks[:, None] < k_left) & col_ok, other=0.0)
        if UPCAST:  # only under Triton's CPU interpreter, whose bf16 arithmetic is broken
            a, b = a.to(tl.float32), b.to(tl.float32)
        if FP32_MODE == 1:  # fp32: true FP32 products (CUDA cores)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        elif FP32_MODE == 2:  # tf32: inputs rounded to 10-bit mantissas, tensor cores
            acc = tl.dot(a, b, acc, input_precision="tf32")
        else:  # fp16 / bf16 / fp8: tensor cores, FP32 accumulation
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_rows = rows * stride_cm
    if ALIGN > 1:
        c_rows = tl.multiple_of(c_rows, ALIGN)
    c_ptrs = c_ptr + c_rows[:, None] + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit(do_not_specialize=["M", "N", "K"])
def matmul_tma_kernel(a_desc, b_desc, c_desc, M, N, K,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr, FP32_MODE: tl.constexpr,
                      UPCAST: tl.constexpr = False, LAUNCH_DEPENDENTS: tl.constexpr = False,
                      WAIT_PRIMARY: tl.constexpr = False):
    """TMA path: the copy engine moves whole tiles between memory and shared memory, and fills the
    parts of a tile outside the matrix with zeros (so no masks at all). It needs every row to start
    on a 16-byte boundary. LAUNCH_DEPENDENTS: let the next kernel in the stream (launched with programmatic
    dependent launch) start its programs on SMs this one frees, once all of this one's programs have started.
    WAIT_PRIMARY (for the kernel so launched): before it ends, wait for the kernel before it to finish, so that
    whatever comes next in the stream finds both done (PTX's griddepcontrol.wait; CUDA does not promise that
    work queued after a dependent launch also waits for the kernel the dependent overlapped). Only the last
    program waits: a kernel ends when all its programs have, so that is enough, and the others free their SM for
    the next program at once instead of idling on it until the earlier kernel is done."""
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    tile_m, tile_n = _tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = tile_m * BLOCK_M
    off_n = tile_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K])  # [BLOCK_M, BLOCK_K]
        if B_KMAJOR:  # B stored transposed (N x K): load [BLOCK_N, BLOCK_K], use its transpose
            b = b_desc.load([off_n, k * BLOCK_K]).T
        else:
            b = b_desc.load([k * BLOCK_K, off_n])  # [BLOCK_K, BLOCK_N]
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        if FP32_MODE == 1:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        elif FP32_MODE == 2:
            acc = tl.dot(a, b, acc, input_precision="tf32")
        else:
            acc = tl.dot(a, b, acc)
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))  # the engine clips the tile at the edges
    if WAIT_PRIMARY:  # launched early: the last program waits for the kernel before this one
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tl.extra.cuda.gdc_wait()


# ---------------------------------------------------------------------------------------------
# Stream-K: the same tiles, but the K steps of the awkward tiles shared out evenly among the SMs
# ---------------------------------------------------------------------------------------------
@triton.jit
def _k_steps(a_desc, b_desc, off_m, off_n, k_lo, k_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, B_KMAJOR: tl.constexpr, FP32_MODE: tl.constexpr, UPCAST: tl.constexpr):
    """K steps k_lo .. k_hi - 1 of one tile, through TMA, into a fresh FP32 accumulator."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi):
        a = a_desc.load([off_m, k * BLOCK_K])  # [BLOCK_M, BLOCK_K]
        if B_KMAJOR:  # B stored transposed (N x K): load [BLOCK_N, BLOCK_K], use its transpose
            b = b_desc.load([off_n, k * BLOCK_K]).T
        else:
            b = b_desc.load([k * BLOCK_K, off_n])  # [BLOCK_K, BLOCK_N]
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        if FP32_MODE == 1:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        elif FP32_MODE == 2:
            acc = tl.dot(a, b, acc, input_precision="tf32")
        else:
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _add_parts(acc, part_ptr, tile, first_p, last_p, me, total, progs, k_steps, MAX_SEG, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, SHARERS: tl.constexpr):
    """acc plus the FP32 parts that the other programs sharing this tile (first_p .. last_p, all but `me`)
    left in their scratch slots."""
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N // 2)
    # the tile in two halves of columns, so that a half of a part (not a whole one) sits in registers beside acc
    lo, hi = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
    for j in tl.static_range(SHARERS):
        q = first_p + j
        if (q != me) & (q <= last_p):
            q_slot = q * MAX_SEG + tile - (q * total // progs) // k_steps  # program q's slot for this tile
            ptrs = part_ptr + q_slot * (BLOCK_M * BLOCK_N) + r[:, None] * BLOCK_N + c[None, :]
            lo += tl.load(ptrs, cache_modifier=".cg")
            tl.debug_barrier()  # keeps the second half's loads from being hoisted above the first half's adds
            hi += tl.load(ptrs + BLOCK_N // 2, cache_modifier=".cg")
            tl.debug_barrier()
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BLOCK_M, BLOCK_N))


@triton.jit(do_not_specialize=["M", "N", "K", "SK_TILES", "MAX_SEG"])
def matmul_streamk_kernel(a_desc, b_desc, c_desc, part_ptr, count_ptr, M, N, K, SK_TILES, MAX_SEG,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, SHARERS: tl.constexpr, B_KMAJOR: tl.constexpr,
                          FP32_MODE: tl.constexpr, UPCAST: tl.constexpr = False, REVERSED: tl.constexpr = False):
    """Persistent TMA kernel, one program per slot (SM x programs per SM). The first SK_TILES tiles (the
    partial wave, and one full wave before it) are cut along K: their SK_TILES x K_STEPS steps are dealt out
    evenly, a contiguous run to each program, so a run may end one tile and start the next. A program that
    holds only part of a tile writes its FP32 partial sum to its own scratch slot (MAX_SEG slots a program)
    and counts itself in on the tile's counter. No program ever waits for another.
    The owner's shortcut: the program holding a tile's first K step (its owner) reaches that part at the very
    end of its run, while the programs after it did theirs at the start of theirs; so the owner looks at the
    counter first, and when every other part is in, it adds them to its own accumulators in registers and
    stores the tile through TMA, without writing its own part. Otherwise whoever arrives last adds the others'
    parts to its own registers, stores the tile and resets the counter.
    Then every program takes whole tiles, one in each `progs`, as the plain kernel does. REVERSED numbers the
    programs backwards (the tests use it: the CPU interpreter runs programs one after another, in order)."""
    progs = tl.num_programs(0)
    pid = progs - 1 - tl.program_id(0) if REVERSED else tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles = tiles_m * tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    total = SK_TILES * k_steps  # K steps shared out (the host makes this >= progs: nobody gets none)
    start = pid * total // progs  # this program's run of steps: [start, end)
    end = (pid + 1) * total // progs
    first_tile = start // k_steps
    r = tl.arange(0, BLOCK_M)
    for tile in range(first_tile, (end + k_steps - 1) // k_steps):  # empty when SK_TILES = 0
        t0 = tile * k_steps  # the tile's first step in the shared-out numbering
        k_lo = tl.maximum(start, t0) - t0
        k_hi = tl.minimum(end, t0 + k_steps) - t0
        tile_m, tile_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _k_steps(a_desc, b_desc, tile_m * BLOCK_M, tile_n * BLOCK_N, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K,
                       B_KMAJOR, FP32_MODE, UPCAST)
        if (k_lo == 0) & (k_hi == k_steps):  # the whole tile is ours
            c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(c_desc.dtype))
        else:
            first_p = ((t0 + 1) * progs - 1) // total  # the programs whose runs cover this tile
            last_p = ((t0 + k_steps) * progs - 1) // total
            others = last_p - first_p
            last = pid < 0  # False, as a tensor
            if k_lo == 0:  # the owner: are all the other parts in already?
                last = tl.atomic_add(count_ptr + tile, 0, sem="acquire", scope="gpu") == others
            if not last:
                slot = part_ptr + (pid * MAX_SEG + tile - first_tile) * (BLOCK_M * BLOCK_N)
                tl.store(slot + r[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :], acc)
                tl.debug_barrier()  # every thread's part is written before the count below releases it
                last = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") == others
            if last:  # every other part is in: add them to ours, store the tile, reset the counter
                acc = _add_parts(acc, part_ptr, tile, first_p, last_p, pid, total, progs, k_steps, MAX_SEG,
                                 BLOCK_M, BLOCK_N, SHARERS)
                c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(c_desc.dtype))
                tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch
    for tile in range(SK_TILES + pid, tiles, progs):  # the full waves: whole tiles
        tile_m, tile_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _k_steps(a_desc, b_desc, tile_m * BLOCK_M, tile_n * BLOCK_N, 0, k_steps, BLOCK_M, BLOCK_N, BLOCK_K,
                       B_KMAJOR, FP32_MODE, UPCAST)
        c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(c_desc.dtype))


# ---------------------------------------------------------------------------------------------
# Launching it: operands, the load path, the schedules
# ---------------------------------------------------------------------------------------------
def out_dtype(dtype: str) -> torch.dtype:
    """fp8 products are written in bf16 (as torch._scaled_mm does); the others in their own dtype."""
    return torch.bfloat16 if dtype == "fp8" else timing.torch_dtype(dtype)


def _fp32_mode(dtype: str) -> int:
    return {"fp32": 1, "tf32": 2}.get(dtype, 0)


def operands(m: int, n: int, k: int, dtype: str, device: Optional[str] = None, kmajor_b: Optional[bool] = None):
    """Fresh random A [m, k] and B [k, n] (B a transposed view of an [n, k] tensor when k-major)."""
    kmajor_b = dtype in KMAJOR_B if kmajor_b is None else kmajor_b
    a = timing.random_tensor((m, k), dtype, device)
    b = timing.random_tensor((n, k), dtype, device).t() if kmajor_b else timing.random_tensor((k, n), dtype, device)
    return a, b


def _scratch_for(device, elems: int, tiles: int):
    """Stream-K's FP32 scratch (partial tiles, left dirty) and one int32 counter per tile (started at zero and left
    at zero by every launch), kept from call to call and grown when a call needs more, so that a CUDA graph can
    replay the launch."""
    key = str(device)
    buf, counts = _SCRATCH.get(key, (None, None))
    if buf is None or buf.numel() < elems:
        buf = torch.zeros(max(elems, 1), device=device, dtype=torch.float32)
    if counts is None or counts.numel() < tiles:
        counts = torch.zeros(max(tiles, 1), device=device, dtype=torch.int32)
    _SCRATCH[key] = (buf, counts)
    return buf, counts


_SCRATCH: dict = {}


def sm_count_of(device) -> int:
    return device_sm_count(device, in_interpreter=4)  # on the CPU: a few programs, so tiles are shared out


def triton_matmul(a: torch.Tensor, b: torch.Tensor, dtype: str, out: Optional[torch.Tensor] = None,
                  config: Optional[TileConfig] = None, tma: str = "auto", autotune: bool = False,
                  programs: Optional[int] = None, reversed_order: bool = False,
                  tail_config: Optional[TileConfig] = None, extra_meta: Optional[dict] = None):
    """C = A @ B with the Triton kernel. Returns (C, path, compiled kernel or None). With a stream-K
    config on the TMA path, `programs` programs run at once (default: one per SM); `reversed_order` numbers
    them backwards (for tests: the interpreter runs them one by one). With a row-tail config, `programs` is
    the slots of the big tile's waves and `tail_config` overrides the tail's tile (configs.tail_tile).
    `extra_meta`: more launch arguments of the plain kernels (the chains' programmatic dependent launch)."""
    (m, k), n = a.shape, b.shape[1]
    config = config or DEFAULT_CONFIGS[dtype]
    out = torch.empty((m, n), device=a.device, dtype=out_dtype(dtype)) if out is None else out
    if config.row_tail and not autotune:
        return _row_tail_matmul(a, b, dtype, out, config, tma, programs, tail_config or tail_tile(config))
    if config.edge and not autotune:
        return _edge_matmul(a, b, dtype, out, config, tma)
    kmajor_b = b.stride(0) == 1 and b.stride(1) != 1
    cc = _device_cc(a.device)
    e = a.element_size()
    b_rows = b.t() if kmajor_b else b  # the contiguous tensor behind B
    aligned = all((t.stride(0) * e) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (a, b_rows)) and \
        (out.stride(0) * out.element_size()) % 16 == 0 and out.data_ptr() % 16 == 0
    # "auto": TMA where the GPU has it (Hopper and newer) and the rows are 16-byte aligned; "on" forces it
    # where aligned (the interpreter runs it on the CPU too); "off" always takes the pointer path.
    use_tma = aligned and (tma == "on" or (tma == "auto" and tma_supported(cc)))
    upcast = a.device.type == "cpu" and dtype == "bf16"  # the interpreter cannot multiply bf16 values
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm, bn, bk = config.block_m, config.block_n, config.block_k
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        b_desc = TensorDescriptor.from_tensor(b_rows, [bn, bk] if kmajor_b else [bk, bn])
        c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
        args = (a_desc, b_desc, c_desc, m, n, k)
        kernel = _autotuned("tma", e) if autotune else matmul_tma_kernel
        meta = dict(B_KMAJOR=kmajor_b, FP32_MODE=_fp32_mode(dtype), UPCAST=upcast)
        path = "tma"
        if config.streamk and not autotune:
            tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
            slots = programs or sm_count_of(a.device) * max(1, blocks_per_sm(config, dtype, "tma", cc))
            plan = streamk_plan(tiles, triton.cdiv(k, bk), slots)
            parts, counts = _scratch_for(a.device, plan["grid"] * plan["max_seg"] * bm * bn, tiles)
            sharers = 1 << max(0, plan["max_sharers"] - 1).bit_length()  # rounded up to a power of two
            compiled = matmul_streamk_kernel[(plan["grid"],)](
                a_desc, b_desc, c_desc, parts, counts, m, n, k, plan["sk_tiles"], plan["max_seg"], BLOCK_M=bm,
                BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.group_m, SHARERS=sharers, REVERSED=reversed_order,
                num_warps=config.num_warps, num_stages=config.num_stages, **meta)
            return out, path, compiled
    else:
        args = (a, b, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))
        # Loads as wide as the rows' alignment allows: where every count is a multiple of 16 Triton sees it
        # itself (ALIGN 1, the kernel as it always was); otherwise the launcher promises what divides them all.
        counts = (n, k, a.stride(0), b_rows.stride(0), out.stride(0))
        bases = all(t.data_ptr() % 16 == 0 for t in (a, b_rows, out))  # Triton assumes less of other pointers
        align = vector_elems(e, *counts) if bases else 1
        sixteen = all(x % 16 == 0 for x in counts)
        meta = dict(B_KMAJOR=kmajor_b, FP32_MODE=_fp32_mode(dtype), UPCAST=upcast, ALIGN=1 if sixteen else align)
        path = f"vec{align * e}"
        kernel = _autotuned("ptr", e) if autotune else matmul_kernel
    if autotune:
        grid = lambda META: (triton.cdiv(m, META["BLOCK_M"]) * triton.cdiv(n, META["BLOCK_N"]),)  # noqa: E731
        compiled = kernel[grid](*args, **meta)
    else:
        grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
        compiled = kernel[grid](*args, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                                GROUP_M=config.group_m, num_warps=config.num_warps, num_stages=config.num_stages,
                                **{**meta, **(extra_meta or {})})  # extra_meta may override (ALIGN, in tests)
    return out, path, compiled


def _row_tail_matmul(a, b, dtype, out, config, tma, programs, tail_config):
    """The row-tail schedule: two launches of the plain kernel on row slices of A and C (B is shared), the big
    tile on the rows of the full waves, then the short tile on the rest. Falls back to one launch of the big tile
    off the TMA path (the per-size choices were measured there)."""
    m, n = a.shape[0], b.shape[1]
    big = dataclasses.replace(config, row_tail=False, tail="")
    cc = _device_cc(a.device)
    slots = programs or sm_count_of(a.device) * max(1, blocks_per_sm(big, dtype, "tma", cc))
    rows = row_tail_rows(m, n, big, slots)
    if rows in (0, m):
        return triton_matmul(a, b, dtype, out, big if rows else tail_config, tma)
    if not _tma_slices_ok(a, b, out, tma):  # the slices cannot take the TMA path: do it all in one launch
        return triton_matmul(a, b, dtype, out, big, tma)
    return _launch_chain([(a[:rows], b, out[:rows], big), (a[rows:], b, out[rows:], tail_config)], dtype, tma, out)


def _edge_matmul(a, b, dtype, out, config, tma):
    """Interior + edge: the big tile on the whole tiles inside the matrix (rows and columns up to the last multiple
    of the tile), then the thin strips left at the bottom (all columns) and on the right (the interior's rows) in
    narrow tiles, each its own launch, started early where the GPU allows it (see _launch_chain)."""
    m, n = a.shape[0], b.shape[1]
    big = dataclasses.replace(config, edge=False)
    rows, cols = edge_interior(m, n, big)
    if rows == 0 or cols == 0 or (rows, cols) == (m, n) or not _tma_slices_ok(a, b, out, tma):
        return triton_matmul(a, b, dtype, out, big, tma)
    parts = [(a[:rows], b[:, :cols], out[:rows, :cols], big)]  # the interior first
    if rows < m:  # the bottom strip: the last rows, every column
        parts.append((a[rows:], b, out[rows:], EDGE_ROW_TILE))
    if cols < n:  # the right strip: the interior's rows, the last columns
        parts.append((a[:rows], b[:, cols:], out[:rows, cols:], EDGE_COL_TILE))
    return _launch_chain(parts, dtype, tma, out)


def _tma_slices_ok(a, b, out, tma) -> bool:
    """Whether row and column slices of these operands can take the TMA path: the whole tensors can (16-byte rows
    and starts), and the GPU has it. Slices at multiples of 16 elements then start on 16-byte boundaries too."""
    b_rows = b.t() if (b.stride(0) == 1 and b.stride(1) != 1) else b
    aligned = all((t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (a, b_rows, out))
    return aligned and (tma == "on" or (tma == "auto" and tma_supported(_device_cc(a.device))))


_PDL_WORKS: dict = {}  # "ok": whether this Triton launched one (a failure turns it off for the process)


def _launch_chain(parts, dtype, tma, out):
    """Launch the plain kernel on each (A, B, C, config) part in turn (they write different parts of C). With
    the early start (configs.EARLY_START) on a GPU: each launch lets the next one start as soon as all of its own
    programs have started (programmatic dependent launch), so the later parts' programs take SMs the earlier ones
    leave idle or share SMs with them; each later kernel's last program waits for the one before it just before it
    ends (WAIT_PRIMARY), so the whole chain is done when its last kernel is, as the next work in
    the stream expects. Returns the first part's (C, path, compiled kernel) with C the whole output."""
    pdl = configs.EARLY_START and _PDL_WORKS.get("ok", True) and parts[0][0].device.type == "cuda"
    if pdl:
        try:
            first = None
            for i, (pa, pb, pout, cfg) in enumerate(parts):
                meta = {"LAUNCH_DEPENDENTS": i + 1 < len(parts)}
                if i:
                    meta.update(launch_pdl=True, WAIT_PRIMARY=True)
                res = triton_matmul(pa, pb, dtype, pout, cfg, tma, extra_meta=meta)
                first = first or res
            _PDL_WORKS["ok"] = True
            return out, first[1], first[2]
        except Exception:  # a Triton without programmatic dependent launch: plain launches from now on
            if _PDL_WORKS.get("ok"):
                raise
            _PDL_WORKS["ok"] = False
    first = None
    for pa, pb, pout, cfg in parts:
        res = triton_matmul(pa, pb, dtype, pout, cfg, tma)
        first = first or res
    return out, first[1], first[2]


_AUTOTUNED: dict = {}


def _autotuned(kind: str, element_bytes: int):
    """The kernel wrapped in triton.autotune over the handful of configs for this element size."""
    key = (kind, element_bytes)
    if key not in _AUTOTUNED:
        def set_blocks(nargs):  # TMA descriptors carry the tile shape: set it for the config being tried
            bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
            nargs["a_desc"].block_shape = [bm, bk]
            nargs["b_desc"].block_shape = [bn, bk] if nargs["B_KMAJOR"] else [bk, bn]
            nargs["c_desc"].block_shape = [bm, bn]

        candidates = [triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k,
                                     "GROUP_M": c.group_m}, num_warps=c.num_warps, num_stages=c.num_stages,
                                    pre_hook=set_blocks if kind == "tma" else None)
                      for c in AUTOTUNE_CONFIGS[element_bytes]]
        base = matmul_tma_kernel if kind == "tma" else matmul_kernel
        _AUTOTUNED[key] = triton.autotune(configs=candidates, key=["M", "N", "K"])(base)
    return _AUTOTUNED[key]


def chosen_config(kernel) -> Optional[str]:
    """The config an autotuned kernel settled on (after a call), as a label."""
    best = getattr(kernel, "best_config", None)
    if best is None:
        return None
    kw = best.kwargs
    return TileConfig(kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], kw["GROUP_M"], best.num_warps,
                      best.num_stages).label


_ONES: dict = {}


def cublas_matmul(a: torch.Tensor, b: torch.Tensor, dtype: str, out: Optional[torch.Tensor] = None):
    """The library call a user would otherwise make (cuBLAS through torch)."""
    if dtype == "fp8":
        one = _ONES.setdefault(str(a.device), torch.ones((), device=a.device))  # unit scales, made once
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return torch.matmul(a, b, out=out)


def _device_cc(device) -> str:
    if getattr(device, "type", str(device)) != "cuda":
        return "0.0"
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"
