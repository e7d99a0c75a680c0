"""Adversarial (endless kernel): right on the check cases, then a kernel that never ends at the timing size.
Expected: killed past its run budget (50x the model's time, at least 10 s); the GPU free again within 30 s."""
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, SPIN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
    if SPIN:
        i = 0
        while tl.load(y_ptr) == tl.load(y_ptr):  # always true: the compiler cannot know it
            i += 1
        s += i
    tl.store(out_ptr + offs, s, mask=mask)


def add(x, y):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), SPIN=x.numel() > 2**20, BLOCK=1024)
    return out
