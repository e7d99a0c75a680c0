"""
The recompute lab's kernels: out = sigmoid(sigmoid(sigmoid(x))), forward and backward, as two Triton kernels.

What you will learn here:
- a fused forward kernel that reads x once and writes out (and, with STORE, the two activations s1 and s2);
- a fused backward kernel that either reads the stored s1 and s2 or recomputes them from x in registers
  (RECOMPUTE): one read instead of two, paid for with three sigmoids nobody waits for;
- how to hand such kernels to autograd (`StackedSigmoids`), and the three versions the lab times: stored,
  recomputed, and PyTorch's own three sigmoids; the float64 autograd reference they are checked against.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

BLOCK, NUM_WARPS = 2048, 8  # elements per program, warps per program


@triton.jit
def _load(ptr, offs, mask, F64: tl.constexpr):
    """Load and widen: arithmetic in fp32 (fp64 when the tensors are fp64, as in the tests)."""
    v = tl.load(ptr + offs, mask=mask)
    if F64:
        v = v.to(tl.float64)
    else:
        v = v.to(tl.float32)
    return v


@triton.jit
def sigmoid3_forward_kernel(x_ptr, out_ptr, s1_ptr, s2_ptr, n, STORE: tl.constexpr, BLOCK: tl.constexpr,
                            F64: tl.constexpr):
    """out = sigmoid(sigmoid(sigmoid(x))); with STORE, also write s1 and s2 for the backward pass."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = _load(x_ptr, offs, mask, F64)  # read 1
    s1 = tl.sigmoid(x)
    s2 = tl.sigmoid(s1)
    out = tl.sigmoid(s2)
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)  # write 1
    if STORE:  # the activations the backward pass will need: 2 more writes
        tl.store(s1_ptr + offs, s1.to(s1_ptr.dtype.element_ty), mask=mask)
        tl.store(s2_ptr + offs, s2.to(s2_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sigmoid3_backward_kernel(dout_ptr, x_ptr, s1_ptr, s2_ptr, dx_ptr, n, RECOMPUTE: tl.constexpr,
                             BLOCK: tl.constexpr, F64: tl.constexpr):
    """dx = dout * out' * s2' * s1', where sigmoid'(.) = s (1 - s) of that sigmoid's output s."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = _load(dout_ptr, offs, mask, F64)  # read: the gradient arriving from above
    if RECOMPUTE:  # read x and redo the forward in registers: 1 read instead of 2
        s1 = tl.sigmoid(_load(x_ptr, offs, mask, F64))
        s2 = tl.sigmoid(s1)
    else:  # read the stored activations: 2 reads
        s1 = _load(s1_ptr, offs, mask, F64)
        s2 = _load(s2_ptr, offs, mask, F64)
    out = tl.sigmoid(s2)  # cheaper to recompute from s2 than to store and read back
    g = g * out * (1 - out)
    g = g * s2 * (1 - s2)
    g = g * s1 * (1 - s1)
    tl.store(dx_ptr + offs, g.to(dx_ptr.dtype.element_ty), mask=mask)  # write: dx


def _launch_args(x: torch.Tensor) -> dict:
    return {"BLOCK": BLOCK, "F64": x.dtype == torch.float64, "num_warps": NUM_WARPS}


def sigmoid3_forward(x: torch.Tensor, store: bool, out: Optional[torch.Tensor] = None,
                     s1: Optional[torch.Tensor] = None, s2: Optional[torch.Tensor] = None) -> tuple:
    """(out, s1, s2); s1 and s2 are None unless `store`."""
    out = torch.empty_like(x) if out is None else out
    if store:
        s1 = torch.empty_like(x) if s1 is None else s1
        s2 = torch.empty_like(x) if s2 is None else s2
    grid = (triton.cdiv(x.numel(), BLOCK),)
    sigmoid3_forward_kernel[grid](x, out, s1 if store else out, s2 if store else out, x.numel(), STORE=store,
                                  **_launch_args(x))
    return out, (s1 if store else None), (s2 if store else None)


def sigmoid3_backward(dout: torch.Tensor, x: Optional[torch.Tensor] = None, s1: Optional[torch.Tensor] = None,
                      s2: Optional[torch.Tensor] = None, dx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """dx from x (recomputing) or from the stored s1 and s2."""
    recompute = x is not None
    dx = torch.empty_like(dout) if dx is None else dx
    grid = (triton.cdiv(dout.numel(), BLOCK),)
    sigmoid3_backward_kernel[grid](dout, x if recompute else dout, s1 if not recompute else dout,
                                   s2 if not recompute else dout, dx, dout.numel(), RECOMPUTE=recompute,
                                   **_launch_args(dout))
    return dx


class StackedSigmoids(torch.autograd.Function):
    """sigmoid(sigmoid(sigmoid(x))) with Triton kernels; `recompute` picks what the backward reads. `mark`, if
    given, is called right after each kernel launch (the timer reads the CPU's clock there)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, recompute: bool, mark=None) -> torch.Tensor:
        x = x.contiguous()
        out, s1, s2 = sigmoid3_forward(x, store=not recompute)
        if mark is not None:
            mark()
        ctx.recompute, ctx.mark = recompute, mark
        # Saving the input costs nothing (it exists anyway); saving s1 and s2 is the activation memory.
        ctx.save_for_backward(*((x,) if recompute else (s1, s2)))
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        saved = ctx.saved_tensors
        dout = dout.contiguous()
        if ctx.recompute:
            dx = sigmoid3_backward(dout, x=saved[0])
        else:
            dx = sigmoid3_backward(dout, s1=saved[0], s2=saved[1])
        if ctx.mark is not None:
            ctx.mark()
        return dx, None, None


# ---------------------------------------------------------------------------------------------
# The three versions, and the float64 reference
# ---------------------------------------------------------------------------------------------
def sigmoid3_autograd(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(torch.sigmoid(torch.sigmoid(x)))


VARIANTS = {  # name -> forward function (x, mark=None); mark() is called after each of our kernel launches
    "stored": lambda x, mark=None: StackedSigmoids.apply(x, False, mark),
    "recomputed": lambda x, mark=None: StackedSigmoids.apply(x, True, mark),
    "autograd": lambda x, mark=None: sigmoid3_autograd(x),  # PyTorch launches these: no clock to read inside
}


def forward_backward(forward, x: torch.Tensor, dout: torch.Tensor, mark=None) -> tuple:
    """(out, dx) for one training step's worth of this function (x must require grad). With `mark`, the CPU's
    clock is read after each of our kernel launches and at the end of the forward pass."""
    if mark is None:
        out = forward(x)
    else:
        out = forward(x, mark)
        mark()
    (dx,) = torch.autograd.grad(out, x, dout)  # returns dx without accumulating into x.grad
    return out, dx


def reference(x: torch.Tensor, dout: torch.Tensor) -> tuple:
    """(out, dx) by autograd in float64."""
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    return tuple(t.detach() for t in forward_backward(sigmoid3_autograd, x64, dout.to(torch.float64)))
