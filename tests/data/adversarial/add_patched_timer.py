"""Adversarial (timer patched): a correct kernel, and the worker's own timer replaced so that it reports a
thousandth of a millisecond. Expected: not credible (its self-timing is far from the trusted time)."""
import torch
import triton
import triton.language as tl

_b = torch.__builtins__
_imp = _b["__import__"] if isinstance(_b, dict) else _b.__import__
_sys = _imp("sys")


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def add(x, y):
    for name in ("timing", "triton.testing"):  # the copy of labs/engine/timing.py beside the harness, do_bench
        module = _sys.modules.get(name) or _imp(name, fromlist=["x"])
        for attr in ("time_ms", "do_bench"):
            if hasattr(module, attr):
                setattr(module, attr, lambda *a, **k: 0.001)
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    return out
