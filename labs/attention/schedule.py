"""Schedule: how one kernel's programs share the SMs, and what that costs beyond the sum of their work.

Pure arithmetic (no torch, no GPU), beside tiles.py: tiles.py says which tiles a program visits; this module
says how long the programs take once the GPU hands them to its SMs. Three things the plain sum of work leaves
out, each from the GPU's facts and the kernels' own loops:

- **Waves and the tail.** The GPU starts programs in launch order (program_id(0) fastest, then the head) on
  whichever SM slot frees first, SMs x programs per SM slots in all. A kernel lasts until its last slot is done:
  with equal programs, a last wave that fills few slots costs a whole program's time; with the causal mask the
  programs are unequal (a query tile near the end sees the most keys), and a long program that starts late
  leaves the other slots idle at the end.
- **A program's start and end.** Each program loads its first tiles from memory before its loop can run and
  stores its output after: KERNEL_LAUNCH_US, the engine's figure for a kernel's first loads and last store.
  At N = 1024 a program runs only 8 to 16 key tiles, and this is a sizeable share of it.
- **Two programs per SM.** The registers of an SM hold two programs of 4 warps (programs_per_sm), and while
  one waits on its exponentials, the other's matrix multiplies run. Neither program knows the other's phase,
  so the model hides (P - 1) / P of the shorter phase under the longer: half of it with two programs, none
  with one (a lone program waits on itself: FlashAttention-2's loop does one thing after the other).
"""

from __future__ import annotations

import heapq
from labs.attention.tiles import Tiles, visible_range
from labs.engine.gpu import KERNEL_LAUNCH_US, SmShape

MAX_REGISTERS_PER_THREAD = 255  # CUDA's cap; Triton's FlashAttention programs use about all of it (fp32 tiles)
SIMULATED_PROGRAMS = 1 << 16  # more programs than this: their work over the slots (the tail is under 1 %)


def programs_per_sm(sm: SmShape, warps: int) -> int:
    """Programs of `warps` warps one SM holds when each thread takes the most registers CUDA gives it: an SM's
    65,536 registers hold two programs of 4 warps (128 threads x 255 registers each)."""
    return max(1, sm.registers // (warps * 32 * MAX_REGISTERS_PER_THREAD))


def hidden_share(programs: int) -> float:
    """The share of the shorter phase (tensor cores or exponentials) hidden under another program's longer
    one: (P - 1) / P with P programs per SM, none for a program alone."""
    return (programs - 1) / programs if programs > 1 else 0.0


def forward_tiles(lq: int, lk: int, t: Tiles, causal: bool) -> list[int]:
    """Key tiles each forward (or dQ) program visits, in launch order: the kernels launch causal query tiles
    from the last (the longest) to the first."""
    n_m = max(1, -(-lq // t.block_m))
    order = range(n_m - 1, -1, -1) if causal else range(n_m)
    return [-(-visible_range(i * t.block_m, t.block_m, lq, lk, t.block_n, causal)[1] // t.block_n) for i in order]


def dkdv_tiles(lq: int, lk: int, t: Tiles, causal: bool) -> list[int]:
    """Query tiles each dK/dV program visits, in launch order: key tile j sees the query tiles from its
    diagonal on (all of them without the mask), as attention_bwd_dkdv_kernel's loop bounds."""
    n_m, n_n = max(1, -(-lq // t.block_m)), max(1, -(-lk // t.block_n))
    out = []
    for j in range(n_n):
        lo = min(n_m, max(0, j * t.block_n - (lk - lq)) // t.block_m) if causal else 0
        out.append(n_m - lo)
    return out


def makespan(durations: list[float], copies: int, slots: int) -> float:
    """When the last program ends: `copies` repeats of `durations` (seconds, in launch order), each program
    started on the first free slot."""
    programs = copies * len(durations)
    if not programs:
        return 0.0
    if programs <= slots:
        return max(durations)
    if len(set(durations)) == 1:
        return -(-programs // slots) * durations[0]  # equal programs: whole waves
    if programs > SIMULATED_PROGRAMS:
        return copies * sum(durations) / slots
    ends = [0.0] * slots
    for d in durations * copies:
        heapq.heapreplace(ends, ends[0] + d)
    return max(ends)


def kernel_seconds(tiles_per_program: list[int], copies: int, mma_s: float, exp_s: float, sm_count: int,
                   per_sm: int) -> dict:
    """One kernel: `copies` (batch x heads) repeats of the programs `tiles_per_program`, each tile taking mma_s
    of an SM's tensor cores and exp_s of its special-function units.

    With more programs than SMs, `per_sm` programs share each SM: a tile costs the SM mma_s + exp_s less the
    hidden part, and each program advances at 1 / per_sm of that rate. With no more programs than SMs, each has
    an SM to itself and nothing to overlap with."""
    programs = copies * len(tiles_per_program)
    shared = programs > sm_count
    p = per_sm if shared else 1
    hidden = hidden_share(p) * min(mma_s, exp_s)
    tile_s = p * (mma_s + exp_s - hidden)  # one tile's time for one program
    fixed_s = KERNEL_LAUNCH_US * 1e-6  # the program's first loads and last store
    span = makespan([n * tile_s + fixed_s for n in tiles_per_program], copies, sm_count * p)
    tiles = copies * sum(tiles_per_program)
    return {"s": span + KERNEL_LAUNCH_US * 1e-6,  # and the kernel's own start
            "mma_s": tiles * mma_s / sm_count, "exp_s": tiles * exp_s / sm_count,
            "hidden_s": tiles * hidden / sm_count if shared else 0.0}


def tile_seconds(t: Tiles, d: int, matmuls: int, mma_rate: float, exp_rate: float,
                 sm_count: int) -> tuple[float, float]:
    """(tensor-core seconds, exponential seconds) of one BLOCK_M x BLOCK_N tile on one SM: `matmuls` products
    of 2 d FLOPs per score, and one exponential per score."""
    scores = t.block_m * t.block_n
    return (matmuls * 2 * d * scores / (mma_rate / sm_count),
            scores / (exp_rate / sm_count))
