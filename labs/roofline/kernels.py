"""
The roofline's kernel: one read, F FLOPs in registers, one write
================================================================

What you will learn:
- how to write an elementwise Triton kernel: one program per BLOCK of elements, a mask for the ragged end;
- how to dial a kernel's arithmetic intensity without changing the bytes it moves: a chain of F
  floating-point operations on each element, held in registers between its one load and its one store;
- why the chain's constants arrive at run time (the compiler cannot fold them away, so every FMA is real).

Intensity = F FLOPs / (bytes read + bytes written). For fp32 that is F / 8 FLOP/byte: F = 1 sits far left of
the ridge (memory-bound), F = 8192 far right of it (compute-bound). labs/roofline/model.py has the napkin math.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The chain is y -> a*y + b with a = -1, b = 0.5, i.e. y -> 0.5 - y: values stay bounded for any chain length,
# and the output still depends on the input, so a float64 reference can check it.
A, B = -1.0, 0.5

BLOCK = 1024  # elements per program: 8 per thread with 4 warps (two 16-byte fp32 loads, 8 independent chains)
NUM_WARPS = 4  # 128 threads per program
UNROLL = 8  # FMAs per loop trip: the loop counter's cost is paid once per eight FMAs


@triton.jit
def fma_chain_kernel(x_ptr, y_ptr, n, a, b,
                     FMAS: tl.constexpr, EXTRA_MUL: tl.constexpr, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)  # which block of the buffer this program owns
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # its BLOCK consecutive elements: a warp reads whole sectors
    mask = offs < n  # the last program may run past the end of the buffer
    y = tl.load(x_ptr + offs, mask=mask).to(tl.float32)  # the only read: each element once, math in FP32
    if EXTRA_MUL:  # an odd FLOP count starts with one multiply (1 FLOP)
        y = y * a
    for _ in range(FMAS // UNROLL):  # the FMA chain lives in registers: no memory traffic at all
        for _u in tl.static_range(UNROLL):  # unrolled at compile time: eight FMAs per loop trip
            y = y * a + b  # one fused multiply-add = 2 FLOPs
    for _r in tl.static_range(FMAS % UNROLL):  # the remainder, unrolled
        y = y * a + b
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)  # the only write, in the storage dtype


def fma_chain(x: torch.Tensor, flops_per_element: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = the F-FLOP chain applied to every element of x (same dtype as x); writes into `out` if given."""
    out = torch.empty_like(x) if out is None else out
    fmas, extra_mul = divmod(flops_per_element, 2)  # F FLOPs = F // 2 FMAs (+ one multiply when F is odd)
    grid = (triton.cdiv(x.numel(), BLOCK),)  # one program per BLOCK elements, the last one partly masked
    fma_chain_kernel[grid](x, out, x.numel(), A, B, FMAS=fmas, EXTRA_MUL=bool(extra_mul), BLOCK=BLOCK,
                           UNROLL=UNROLL, num_warps=NUM_WARPS)
    return out
