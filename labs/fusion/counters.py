"""How Nsight Compute counts this lab (DRAM bytes and kernel counts: eager against fused): the counter spec the engine asks for.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import torch

from labs.engine import timing
from labs.engine.counters import Adapter
from labs.fusion.kernels import affine_chain, chain_eager, sin2_cos2, sincos_eager
from labs.fusion.measure import try_compile


def points(params) -> list[dict]:
    points = []
    if "sincos" in params.experiments:
        size = 256 if 256 in params.sizes_mib else max(params.sizes_mib)
        variants = ("eager", "compiled", "triton") if params.compile else ("eager", "triton")
        points += [{"experiment": "sincos", "variant": v, "size_mib": size, "ops": None, "n_cols": None} for v in variants]
    if "chain" in params.experiments:
        ops = 8 if 8 in params.chain_ops else params.chain_ops[0]
        points += [{"experiment": "chain", "variant": v, "size_mib": params.chain_mib, "ops": ops, "n_cols": None}
                   for v in ("eager", "triton")]
    return points


def prepare(params, point):
    n = point["size_mib"] * 2**20 // 4
    x = timing.random_tensor((n,), "fp32")
    if point["experiment"] == "chain":
        ops = point["ops"]
        if point["variant"] == "eager":
            return lambda: chain_eager(x, ops)
        y = torch.empty_like(x)
        return lambda: affine_chain(x, ops, y)
    if point["variant"] == "compiled":
        compiled, note = try_compile(sincos_eager, x)
        if compiled is None:
            raise RuntimeError(f"torch.compile is unavailable: {note}")
        return lambda: compiled(x)
    if point["variant"] == "triton":
        return lambda: sin2_cos2(x)
    return lambda: sincos_eager(x)


def model(params, point, predicted, target) -> dict:
    return {"dram_bytes": predicted.get("bytes_moved"), "kernels": predicted.get("predicted_kernels")}


COUNTERS = Adapter(("dram",), points, prepare, model, ("dram_bytes", "kernels"))
