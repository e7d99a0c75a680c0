"""
The launch lab's chain: K tiny ops on a small fp32 tensor, run four ways.

What you will learn here:
- eager: K PyTorch ops, each its own kernel launch (and, with `.item()` after each, a round trip to the CPU);
- graph: the same K launches recorded once into a CUDA graph and replayed with one call (`capture`);
- fused: the K ops as one Triton kernel that keeps the value in registers: one launch, one read, one write;
- a float64 reference to check each of them against (the inputs sit on a 1/256 grid, so every step is exact).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labs.engine import timing

# The chain: K ops on a small fp32 tensor, alternately y = y * A and y = y + B. With A = -1, B = 0.5
# the values stay bounded for any K and (inputs on a 1/256 grid) every step is exact in fp32.
A, B = -1.0, 0.5


def chain_eager(x: torch.Tensor, y: torch.Tensor, k: int, sync_each: bool = False,
                first: torch.Tensor | None = None) -> torch.Tensor:
    """K PyTorch ops, each one kernel launch; with sync_each, a .item() after every op (a round trip).

    `first` is a view of y's first element for the .item() calls. The timed calls pass one made beforehand, as the
    round-trip probe does: making the view inside every call adds a few microseconds of Python that no probe has
    (it put the chain with .item() at K = 1 a fifth to a third above its round-trip figure on both GPUs)."""
    torch.mul(x, A, out=y)  # op 1 reads x, so every call starts afresh
    if sync_each:
        first = y[:1] if first is None else first
        first.item()
    for i in range(1, k):
        if i % 2:
            y.add_(B)
        else:
            y.mul_(A)
        if sync_each:
            first.item()  # copy one value to the CPU: waits until the GPU has finished this op
    return y


@triton.jit
def fused_chain_kernel(x_ptr, y_ptr, n, pairs, odd, a, b, BLOCK: tl.constexpr):
    """y = the chain of K = 2 pairs + odd ops applied to x, each element in one thread's registers."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # this program's BLOCK elements
    mask = offs < n  # the last program runs past the end: those lanes neither load nor store
    y = tl.load(x_ptr + offs, mask=mask)  # one read
    for _ in range(pairs):  # all K ops in registers
        y = y * a
        y = y + b
    if odd:
        y = y * a
    tl.store(y_ptr + offs, y, mask=mask)  # one write


FUSED_BLOCK = 1024


def chain_fused(x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """The same K ops as one Triton kernel: one launch, one read and one write per element."""
    grid = (triton.cdiv(x.numel(), FUSED_BLOCK),)
    fused_chain_kernel[grid](x, y, x.numel(), k // 2, k % 2, A, B, BLOCK=FUSED_BLOCK, num_warps=4)
    return y


def chain_reference(x: torch.Tensor, k: int) -> torch.Tensor:
    y = x.double() * A
    for i in range(1, k):
        y = y + B if i % 2 else y * A
    return y


def grid_input(n: int, device=None) -> torch.Tensor:
    """Fresh normal values on a 1/256 grid (exact through the chain)."""
    return torch.round(timing.random_tensor((n,), "fp32", device) * 256) / 256


def capture(fn) -> torch.cuda.CUDAGraph:
    """Record fn's kernels into a CUDA graph (warm-up on a side stream, as capture requires)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph
