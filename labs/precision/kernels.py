"""
Lower precision's kernels: a ReLU in any storage dtype, and dot products summed in a chosen precision
=====================================================================================================

What you will learn:
- a memory-bound kernel pays for the bytes of each element, not for its arithmetic: the ReLU loads fp32,
  bf16, fp16 or fp8, computes in fp32 registers, and stores back in the storage dtype;
- how to size a block in bytes rather than elements, so every dtype moves the same 64 bytes per thread;
- how rounding enters a long sum: the dot-product kernel rounds its running sum to the accumulator's
  precision after every addition, exactly as a bf16 or fp16 accumulator would.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# ---------------------------------------------------------------------------------------------
# Kernel 1: ReLU in the storage dtype
# ---------------------------------------------------------------------------------------------
@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # this program's BLOCK consecutive elements
    mask = offs < n  # the last program may run past the end
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)  # the element's bytes are what costs; math is fp32
    y = tl.maximum(x, 0.0)  # 1 FLOP per element
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)  # back to the storage dtype


BLOCK_BYTES, RELU_WARPS = 16384, 8  # 64 bytes per thread for every dtype: four 16-byte loads of fp32, one of fp8


def relu(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """max(x, 0) elementwise, in x's dtype."""
    out = torch.empty_like(x) if out is None else out
    block = BLOCK_BYTES // x.element_size()  # the same bytes per program whatever the dtype
    relu_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block, num_warps=RELU_WARPS)
    return out


# ---------------------------------------------------------------------------------------------
# Kernel 2: dot products accumulated term by term in a chosen precision
# ---------------------------------------------------------------------------------------------
@triton.jit
def round_to_bf16(x):
    """fp32 -> the nearest bf16 value (ties to even), kept in fp32: add half an ulp of bf16, drop 16 bits.

    Done with integer ops so the GPU and Triton's CPU interpreter round identically."""
    bits = x.to(tl.uint32, bitcast=True)  # the float's bit pattern
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # round to even at bit 16, clear the low half
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def dot_accumulate_kernel(a_ptr, b_ptr, out_ptr, m, k, ACC: tl.constexpr, BLOCK_M: tl.constexpr):
    """out[i] = sum_j a[i, j] * b[j], the running sum rounded to ACC (0 fp32, 1 bf16, 2 fp16) after every addition."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # BLOCK_M dot products per program, one per row
    mask = rows < m  # the last block of rows is partial
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for j in range(k):  # one term at a time: the order of a naive sequential sum
        a = tl.load(a_ptr + rows.to(tl.int64) * k + j, mask=mask, other=0.0).to(tl.float32)  # a[rows, j]
        b = tl.load(b_ptr + j).to(tl.float32)  # b[j], the same for every row
        # the product of two bf16 numbers is exact in fp32; the rounding happens when it joins the sum
        acc = acc + a * b
        if ACC == 1:  # a bf16 accumulator: keep 8 significant bits
            acc = round_to_bf16(acc)
        elif ACC == 2:  # an fp16 accumulator: 11 significant bits
            acc = acc.to(tl.float16).to(tl.float32)
    tl.store(out_ptr + rows, acc, mask=mask)


ACC_CODE = {"fp32": 0, "bf16": 1, "fp16": 2}
DOT_BLOCK_M = 128


def dot_accumulate(a: torch.Tensor, b: torch.Tensor, acc: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """a: (m, k) bf16, b: (k,) bf16 -> (m,) fp32 holding the accumulator's final value."""
    m, k = a.shape
    out = torch.empty(m, device=a.device, dtype=torch.float32) if out is None else out
    dot_accumulate_kernel[(triton.cdiv(m, DOT_BLOCK_M),)](a, b, out, m, k, ACC=ACC_CODE[acc], BLOCK_M=DOT_BLOCK_M,
                                                          num_warps=4)
    return out
