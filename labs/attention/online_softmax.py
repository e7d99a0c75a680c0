"""The online softmax in numpy: the idea behind FlashAttention, one row of scores at a time.

What you will learn: a row's softmax can be computed tile by tile, keeping only a running max, a running sum
and a rescaled partial output, and the last step equals the softmax computed at once. The page's stepper walks
through these steps; the Triton kernels (kernels.py) do the same on the chip, one tile of keys per step.
"""

from __future__ import annotations

import math

import numpy as np

from labs.engine.params import ParamError


def online_softmax_steps(scores, values, tile: int) -> list[dict]:
    """Process one query's scores tile by tile, as the kernel does; return the state after each tile.

    scores: (L,) one row of scaled scores s_j; values: (L, dv) the value vectors v_j; tile: keys per step.
    Each step holds the running max m, the running sum l = sum_j exp(s_j - m), the unnormalised partial
    output o = sum_j exp(s_j - m) v_j, and alpha = exp(m_old - m_new), the factor that rescales the old
    l and o when a larger score arrives. After the last step o / l equals softmax(scores) @ values.
    """
    s = np.asarray(scores, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64).reshape(len(s), -1)
    if tile < 1:
        raise ParamError("tile must be at least 1 key.")
    m, l, o = -np.inf, 0.0, np.zeros(v.shape[1])
    steps = []
    for start in range(0, len(s), tile):
        block = s[start:start + tile]
        m_new = max(m, float(block.max()))
        alpha = math.exp(m - m_new) if m > -np.inf else 0.0  # rescales what was summed under the old max
        p = np.exp(block - m_new)  # this tile's unnormalised probabilities, all <= 1
        l = l * alpha + float(p.sum())
        o = o * alpha + p @ v[start:start + tile]
        m = m_new
        steps.append({"step": len(steps), "start": start, "stop": start + len(block), "tile_max": float(block.max()),
                      "m": m, "alpha": alpha, "l": l, "lse": m + math.log(l), "o": o.copy(), "output": o / l,
                      "p_tile": p.copy()})
    return steps


def softmax_at_once(scores, values) -> dict:
    """The textbook computation that the steps must end equal to: softmax over the whole row, then @ values."""
    s = np.asarray(scores, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64).reshape(len(s), -1)
    p = np.exp(s - s.max())
    p = p / p.sum()
    return {"p": p, "output": p @ v, "m": float(s.max()), "l": float(np.exp(s - s.max()).sum()),
            "lse": float(s.max() + np.log(np.exp(s - s.max()).sum()))}


def stepper_example(length: int = 24, seed: int = 0, dv: int = 2) -> tuple:
    """A row of scores for the stepper: mostly small, with a few large ones arriving late, so the running
    max jumps and the rescaling shows. Returns (scores (length,), values (length, dv))."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(0.0, 1.0, length)
    late = rng.choice(np.arange(length // 3, length), size=max(1, length // 8), replace=False)
    scores[late] += rng.uniform(2.0, 4.0, len(late))
    return np.round(scores, 2), np.round(rng.normal(0.0, 1.0, (length, dv)), 2)

