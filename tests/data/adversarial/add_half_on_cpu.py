"""Adversarial (work hidden off the GPU): the GPU adds the first half, the CPU the second, so the kernels the
profiler sees take half the time. Expected: not credible (below this GPU's physics floor)."""
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def add(x, y):
    out = torch.empty_like(x)
    half = x.numel() // 2
    add_kernel[(triton.cdiv(half, 1024),)](x, y, out, half, BLOCK=1024)
    out[half:].copy_(x[half:].cpu() + y[half:].cpu())  # host work and a copy engine: no kernel
    return out
