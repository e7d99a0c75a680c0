"""Exercise 2, our solution: one kernel reads x once and writes the result
once.

sin, cos, both squares and the sum stay in registers. On a GPU the special
function units' fast approximations keep the arithmetic well under the
memory time; the interpreter runs the accurate ones.
"""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def sin2_cos2_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, FAST: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)  # the only read
    if FAST:
        s = libdevice.fast_sinf(x)
        c = libdevice.fast_cosf(x)
    else:
        s = tl.sin(x)
        c = tl.cos(x)
    tl.store(out_ptr + offs, s * s + c * c, mask=mask)  # the only write


def sin2_cos2(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    BLOCK = 1024
    grid = (triton.cdiv(x.numel(), BLOCK),)
    sin2_cos2_kernel[grid](x, out, x.numel(), BLOCK=BLOCK, FAST=x.is_cuda, num_warps=4)
    return out
