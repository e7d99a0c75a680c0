"""
The memory hierarchy's kernel: read one buffer `passes` times, every load from the L2 (or HBM behind it)
=========================================================================================================

What you will learn:
- a grid-stride loop: a few programs per SM walk the whole buffer, so a pass costs the same launch
  whatever the buffer's size;
- how to keep many loads in flight: UNROLL independent 8-float loads per thread per step;
- how to skip the L1: the `.cg` cache modifier caches a load in the L2 only, so a repeat pass over a buffer
  that fits in the L2 is served there, and one that does not fit comes from HBM every time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def read_passes_kernel(x_ptr, out_ptr, n, passes, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)  # this program's place in the grid-stride walk
    nprog = tl.num_programs(0)  # a few programs per SM, not one per chunk: each walks the whole buffer's share
    acc = tl.zeros([BLOCK], dtype=tl.float32)  # one running sum per lane: the loads cannot be optimised away
    for _p in range(passes):  # the same chunks each pass: the L2 holds them if the buffer fits
        for start in range(pid * BLOCK * UNROLL, n, nprog * BLOCK * UNROLL):  # grid-stride over the buffer
            for u in tl.static_range(UNROLL):  # UNROLL independent loads in flight per thread
                offs = start + u * BLOCK + tl.arange(0, BLOCK)
                # .cg: cache in the L2 only, so a repeat read cannot be served by this SM's L1
                acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)  # one partial sum per lane keeps the loads alive


BLOCK, UNROLL, NUM_WARPS = 2048, 4, 8  # 8 floats x 4 loads = 128 bytes in flight per thread
PROGRAMS_PER_SM = 4  # 1024 threads per SM: ~128 KiB in flight per SM, plenty for L2 and HBM latency


def programs(n: int, sm_count: int) -> int:
    """Programs in the grid: enough to fill every SM (PROGRAMS_PER_SM each), never more than the chunks."""
    return max(1, min(triton.cdiv(n, BLOCK * UNROLL), sm_count * PROGRAMS_PER_SM))


def read_passes(x: torch.Tensor, passes: int, out: torch.Tensor | None = None, sm_count: int | None = None):
    """Per-lane partial sums of `passes` reads of x, shape (programs, BLOCK)."""
    sm_count = sm_count or _sm_count(x.device)
    grid = programs(x.numel(), sm_count)  # a persistent-style grid sized to the GPU, not to the buffer
    out = torch.empty((grid, BLOCK), device=x.device, dtype=torch.float32) if out is None else out  # (programs, BLOCK)
    read_passes_kernel[(grid,)](x, out, x.numel(), passes, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=NUM_WARPS)
    return out


def _sm_count(device) -> int:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the CPU interpreter: a few programs, so the grid-stride loop is exercised
