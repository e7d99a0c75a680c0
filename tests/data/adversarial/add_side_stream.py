"""Adversarial (side stream): the work runs on a stream of its own, so that events recorded on the default
stream around the call see an empty call. Expected: the trusted time is the real one (every kernel counted);
the self-timing disagrees -> not credible."""
import torch
import triton
import triton.language as tl

_SIDE = {}


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def add(x, y):
    out = torch.empty_like(x)
    if x.device.type != "cuda":
        add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
        return out
    side = _SIDE.setdefault("s", torch.cuda.Stream())
    with torch.cuda.stream(side):
        add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    return out
