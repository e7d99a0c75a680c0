"""Exercise 6: out = x.T as a new contiguous tensor (x: a 2-D fp32 matrix of
any shape).

This starter is correct but slow: each program reads BLOCK consecutive
elements of one row of x (the warp's loads are coalesced) and writes them
down one column of out, where consecutive elements lie a whole row apart.
Every 4-byte store lands in a different 32-byte sector. Move a square tile
instead: read it along the rows of x, and write it along the rows of out
(Triton reshuffles it through shared memory).
"""
import torch
import triton
import triton.language as tl


@triton.jit
def transpose_kernel(x_ptr, out_ptr, R, C, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < C
    v = tl.load(x_ptr + row * C + cols, mask=mask)  # along a row of x: coalesced
    tl.store(out_ptr + cols * R + row, v, mask=mask)  # down a column of out: R elements apart


def transpose(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    R, C = x.shape
    out = torch.empty((C, R), device=x.device, dtype=x.dtype)
    BLOCK = 128
    transpose_kernel[(R, triton.cdiv(C, BLOCK))](x, out, R, C, BLOCK=BLOCK, num_warps=4)
    return out
