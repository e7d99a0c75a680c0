"""
Warp divergence's kernels: the same two paths as real CUDA branches and as Triton code
======================================================================================

What you will learn:
- CUDA C++ (divergence.cu, beside this file) gives each thread its own branch: thread i runs path A or path B,
  and a warp whose lanes disagree runs both, one after the other (`branches`); a loop whose trip count differs
  per lane runs as long as its slowest lane (`varying_work`);
- Triton programs work on blocks, so a per-element condition is a `tl.where` that computes both chains for
  every element, while a condition uniform across a program compiles to a real branch (`two_paths`);
- how to keep the compiler honest: run-time constants and trip counts, and no specialisation of g = 1.

Both paths are chains y <- y * mul + add: with mul = 1 and inputs on a 1/256 grid they are exact in fp32, so
the check against float64 is exact, and the constants are run-time arguments, so every FMA is really issued.
"""

from __future__ import annotations

from pathlib import Path

import torch
import triton
import triton.language as tl

from labs.divergence.model import TRITON_BLOCK, TRITON_UNROLL  # the shapes the model counts with
from labs.engine import cuda

CUDA_DIR = Path(__file__).resolve().parent  # divergence.cu lives beside this file
# The chains y <- y * mul + add with mul = 1 and inputs on a 1/256 grid are exact in fp32, so the
# check against float64 is exact; the constants are run-time arguments, so every FMA is really issued.
A_MUL, A_ADD = 1.0, 0.5  # branch A
B_MUL, B_ADD = 1.0, -0.25  # branch B (other constants, other loop shape: nothing to merge)


# ---------------------------------------------------------------------------------------------
# 1. Real divergence in CUDA C++ (divergence.cu)
# ---------------------------------------------------------------------------------------------
CPP_DECLS = """
void branches(at::Tensor x, at::Tensor y, int64_t g, int64_t trips_a, int64_t trips_b,
              double a, double b, double c, double d);
void varying_work(at::Tensor k, at::Tensor x, at::Tensor y, double a, double b);
"""


def cuda_kernels():
    """The compiled extension (built on first use, ~30-60 s; ParamError with the reason if it cannot be)."""
    return cuda.build("roofline_divergence", CUDA_DIR / "divergence.cu", CPP_DECLS, ("branches", "varying_work"))


def cuda_unavailable_reason() -> str:
    """Why the CUDA C++ experiments cannot run here ('' when they can)."""
    return cuda.why_unavailable()


def branches(x: torch.Tensor, g: int, trips_a: int, trips_b: int, out: torch.Tensor) -> torch.Tensor:
    """Thread i runs path A (trips_a trips) if (i // g) is even, else path B (trips_b trips)."""
    cuda_kernels().branches(x, out, g, trips_a, trips_b, A_MUL, A_ADD, B_MUL, B_ADD)
    return out


def varying_work(k: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Thread i runs path A for k[i] trips: a warp lasts as long as its largest k."""
    cuda_kernels().varying_work(k, x, out, A_MUL, A_ADD)
    return out


# ---------------------------------------------------------------------------------------------
# 2. The same two paths in Triton: per-element tl.where vs a per-program branch
# ---------------------------------------------------------------------------------------------
# 2 elements (2 independent chains) per thread; many small programs, so that the last wave of long
# programs (branch B with cost_ratio > 1) leaves little of the GPU idle
TRITON_WARPS = 4  # 128 threads for TRITON_BLOCK = 256 elements; TRITON_UNROLL FMAs per trip of a chain


@triton.jit
def _chain(y, trips, mul, add, UNROLL: tl.constexpr):
    for _ in range(trips):  # run-time trip count: the chain is really executed
        for _u in tl.static_range(UNROLL):
            y = y * mul + add  # one FMA per element
    return y


# g = 1 must not become a compile-time constant (Triton specializes integer arguments equal to 1): then
# the compiler would know which side each register holds and drop the other chain
@triton.jit(do_not_specialize=["g"])
def two_paths_kernel(x_ptr, y_ptr, n, g, trips_a, trips_b, a_mul, a_add, b_mul, b_add,
                     PER_PROGRAM: tl.constexpr, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # this program's BLOCK elements
    mask = offs < n  # the last program is partial
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)  # one 4-byte read per element: the rest is arithmetic
    if PER_PROGRAM:
        # One scalar condition for the whole program: compiled to a real branch, and each program
        # runs only the side it takes.
        if pid % 2 == 1:
            y = _chain(x, trips_b, b_mul, b_add, UNROLL)
        else:
            y = _chain(x, trips_a, a_mul, a_add, UNROLL)
    else:
        # A condition per element: a block of values has no single "side", so Triton computes both
        # chains for every element and selects (even when the condition happens to be uniform).
        take_b = ((offs // g) % 2) == 1
        y = tl.where(take_b, _chain(x, trips_b, b_mul, b_add, UNROLL), _chain(x, trips_a, a_mul, a_add, UNROLL))
    tl.store(y_ptr + offs, y, mask=mask)  # one 4-byte write per element


def two_paths(x: torch.Tensor, trips_a: int, trips_b: int, per_program: bool, g: int = 1,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Element i takes path B if its group of g (per_program: its program) is odd, else path A."""
    out = torch.empty_like(x) if out is None else out
    grid = (triton.cdiv(x.numel(), TRITON_BLOCK),)  # one program per TRITON_BLOCK elements
    two_paths_kernel[grid](x, out, x.numel(), g, trips_a, trips_b, A_MUL, A_ADD, B_MUL, B_ADD,
                           PER_PROGRAM=per_program, BLOCK=TRITON_BLOCK, UNROLL=TRITON_UNROLL,
                           num_warps=TRITON_WARPS)
    return out
