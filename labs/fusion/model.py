"""Kernel fusion's napkin math: bytes moved / copy bandwidth + kernels x launch cost, each kernel no faster than
its arithmetic, and (once a run has timed it) no faster than the CPU can issue the call.

Pure arithmetic on the parameters and the GPU's facts (labs.engine.gpu): it never touches the GPU and
launches no kernel.
"""

from __future__ import annotations

from labs.engine import timing
from labs.engine.gpu import KERNEL_LAUNCH_US, MiB, Target
from labs.engine.params import from_dict
from labs.engine.registry import get_lab

# A fixed cost per kernel on top of its bytes: launch, ramp-up and drain. A few microseconds on
# current NVIDIA GPUs; it only matters for small tensors (below ~1 MiB it is most of the time).
LAUNCH_US = KERNEL_LAUNCH_US

EXPERIMENTS = ("sincos", "chain", "softmax")
F32 = 4  # bytes per fp32 element

# Per variant: (kernels launched, elements moved per element of the input). Eager sin^2 + cos^2:
# sin (read x, write s), s**2 (read s, write), cos, c**2, then add (read two, write one) = 11.
SINCOS = {
    "eager": (5, 11),
    "compiled": (1, 2),
    "triton": (1, 2),
    "copy": (1, 2),  # the byte floor, measured: read every element once, write it once
}
SOFTMAX = {
    "eager_decomposed": (5, 8),  # amax (1) + subtract (2) + exp (2) + sum (1) + divide (2)
    "torch_softmax": (1, 2),  # 4 for rows too long for a block's shared memory: see torch_softmax_moves
    "triton_online": (1, 2),
}

# PyTorch's CUDA softmax (aten/src/ATen/native/cuda/SoftMax.cu) keeps a row on chip (registers or the block's
# shared memory) when it fits in sharedMemPerBlock, which is 48 KiB on every GPU since Volta unless a kernel opts
# in to more (this one does not), less one float per warp of its 1024-thread block for the reduction scratch.
# A longer row is read three times (row max, row sum of exponentials, then once more to write the result).
SHARED_MEMORY_PER_BLOCK_BYTES = 48 * 1024
SOFTMAX_SCRATCH_BYTES = 1024 // 32 * F32


def torch_softmax_moves(n_cols: int, element_bytes: int = F32) -> int:
    """Element trips per input element of torch.softmax over rows of n_cols: 2 when a row stays on chip
    (one read, one write), else 4 (three reads, one write)."""
    on_chip = n_cols < (SHARED_MEMORY_PER_BLOCK_BYTES - SOFTMAX_SCRATCH_BYTES) // element_bytes
    return 2 if on_chip else 4


# Eager softmax, written out, runs two kinds of PyTorch kernels besides the vectorized exp: row reductions
# (amax, sum: one read) and elementwise kernels that broadcast a per-row value over the row (subtract, divide:
# one read, one write). The broadcasting ones index every element through PyTorch's general offset calculator,
# not with wide vector loads, and reach well under the copy rate (about 0.6x on an H200, 0.8x on an H100, in the
# 2026-11-23 profiles); the reductions about 0.8-0.9x. A live run probes both rates on a tensor of its own
# (probe_softmax_rates) and the model of the written-out softmax charges each pass at its kernel's rate.
SOFTMAX_PROBE_MIB = 128
SOFTMAX_PROBE_COLS = 4096


def decomposed_softmax_ms(nbytes: float, target: Target, reduce_tbps: float, broadcast_tbps: float) -> float:
    """Eager softmax over a tensor of nbytes, each pass at its kernel's probed rate: two reductions (one read
    each), two broadcasting elementwise passes (read and write) and the exp (read and write, at the copy rate)."""
    reductions = 2 * nbytes / (reduce_tbps * 1e12) * 1e3
    broadcasts = 2 * 2 * nbytes / (broadcast_tbps * 1e12) * 1e3
    return reductions + broadcasts + memory_ms(2 * nbytes, target) + 5 * LAUNCH_US * 1e-3


def memory_ms(nbytes: float, target: Target) -> float:
    return nbytes / (target.ceilings.copy_tbps * 1e12) * 1e3


def model_ms(nbytes: float, kernels: int, target: Target, compute_ms: float = 0.0) -> float:
    """The lesson's model: each kernel's time is the larger of its bytes and its arithmetic, plus a
    fixed launch cost; the kernels run one after the other."""
    return max(memory_ms(nbytes, target), compute_ms) + kernels * LAUNCH_US * 1e-3


def with_host_floor(row: dict, nbytes_useful: float, nbytes: float, kernels: int, gpu_ms: float, host_ms: float,
                    target: Target) -> dict:
    """The model once the host's time per call is known: the larger of the GPU's time and the CPU's."""
    limit = "host" if host_ms > gpu_ms else "GPU"
    return {**row, **_predicted(nbytes_useful, nbytes, kernels, max(gpu_ms, host_ms), target), "host_ms": host_ms,
            "gpu_model_ms": gpu_ms, "limited_by": limit}


def with_softmax_probes(row: dict, nbytes: float, probes: dict, target: Target) -> dict:
    """The written-out softmax's model once the run has probed its kernels' rates: each pass at its rate."""
    ms = decomposed_softmax_ms(nbytes, target, probes["reduce_probe_tbps"], probes["broadcast_probe_tbps"])
    return {**row, **_predicted(2 * nbytes, 8 * nbytes, 5, ms, target), **probes}


def chain_compute_ms(n: int, ops: int, target: Target) -> float:
    """A multiply-add is 2 FLOPs at the FMA ceiling."""
    return 2.0 * n * ops / (target.ceilings.fma_tflops * 1e12) * 1e3


def chain_ridge_ops(target: Target) -> float:
    """Chain length at which the fused kernel's arithmetic takes as long as its 8 bytes per element."""
    return target.ridge_flop_per_byte * 2 * F32 / 2


def _row(experiment, variant, size_mib, ops=None, n_cols=None, **values) -> dict:
    return {"experiment": experiment, "variant": variant, "size_mib": size_mib, "ops": ops, "n_cols": n_cols,
            **values}


def _predicted(nbytes_useful: float, nbytes: float, kernels: int, ms: float, target: Target) -> dict:
    return {"bytes_moved": nbytes, "predicted_kernels": kernels, "predicted_ms": ms,
            "predicted_tbps": nbytes / (ms * 1e-3) / 1e12, "predicted_effective_tbps": timing.tbps(nbytes_useful, ms),
            "size_over_l2": nbytes_useful / 2 / target.l2_bytes if target.l2_bytes else None}


def softmax_shape(params, n_cols: int) -> tuple:
    return max(1, params.softmax_mib * MiB // (F32 * n_cols)), n_cols


def predict(params, target: Target) -> list[dict]:
    rows = []
    if "sincos" in params.experiments:
        for size in params.sizes_mib:
            n = size * MiB // F32
            for variant, (kernels, moves) in SINCOS.items():
                if variant == "compiled" and not params.compile:
                    continue
                nbytes = moves * n * F32
                ms = model_ms(nbytes, kernels, target)
                rows.append(_row("sincos", variant, size, **_predicted(2 * n * F32, nbytes, kernels, ms, target)))
    if "chain" in params.experiments:
        n = params.chain_mib * MiB // F32
        for ops in params.chain_ops:
            eager_ms = ops * model_ms(2 * n * F32, 1, target)
            rows.append(_row("chain", "eager", params.chain_mib, ops,
                             **_predicted(2 * n * F32, 2 * ops * n * F32, ops, eager_ms, target)))
            fused_ms = model_ms(2 * n * F32, 1, target, chain_compute_ms(n, ops, target))
            rows.append(_row("chain", "triton", params.chain_mib, ops,
                             **_predicted(2 * n * F32, 2 * n * F32, 1, fused_ms, target),
                             bound="compute" if ops > chain_ridge_ops(target) else "memory"))
    if "softmax" in params.experiments:
        for n_cols in params.softmax_cols:
            r, c = softmax_shape(params, n_cols)
            for variant, (kernels, moves) in SOFTMAX.items():
                moves = torch_softmax_moves(c) if variant == "torch_softmax" else moves
                nbytes = moves * r * c * F32
                ms = model_ms(nbytes, kernels, target)
                rows.append(_row("softmax", variant, params.softmax_mib, n_cols=n_cols,
                                 **_predicted(2 * r * c * F32, nbytes, kernels, ms, target)))
    return rows


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run (labs/engine/repredict.py calls it): predict()'s rows, and for every point whose live
    prediction took the CPU's time per call into account (sin^2 + cos^2), the larger of this model's GPU
    time and the host time the run measured for it (its `host_ms`); for the written-out softmax, each pass at
    the kernel rates the run probed (its `reduce_probe_tbps` and `broadcast_probe_tbps`), where it has them."""
    Params = get_lab("fusion").Params
    known = set(Params.__dataclass_fields__)
    params = from_dict(Params, {k: v for k, v in recording["params"].items() if k in known})
    rows = predict(params, target)
    host = {(r.get("experiment"), r.get("variant"), r.get("size_mib")): r["host_ms"] for r in recording["rows"]
            if r.get("experiment") == "sincos" and isinstance(r.get("host_ms"), (int, float))}
    probes = {r["n_cols"]: {k: r[k] for k in ("reduce_probe_tbps", "broadcast_probe_tbps")} for r in recording["rows"]
              if r.get("variant") == "eager_decomposed" and isinstance(r.get("broadcast_probe_tbps"), (int, float))}
    out = []
    for row in rows:
        host_ms = host.get((row["experiment"], row["variant"], row["size_mib"]))
        if host_ms is not None:
            kernels, moves = SINCOS[row["variant"]]
            n = row["size_mib"] * MiB // F32
            row = with_host_floor(row, 2 * n * F32, moves * n * F32, kernels, row["predicted_ms"], host_ms, target)
        if row["variant"] == "eager_decomposed" and row["n_cols"] in probes:
            r, c = softmax_shape(params, row["n_cols"])
            row = with_softmax_probes(row, r * c * F32, probes[row["n_cols"]], target)
        out.append(row)
    return out


def lesson_numbers(target: Target) -> dict:
    c = target.ceilings
    n = 1024 * MiB // F32
    eager = model_ms(11 * n * F32, 5, target)
    floor = memory_ms(2 * n * F32, target)
    return {
        "gpu": target.name,
        "bandwidth_tbps": f"{c.copy_tbps:.2f}",
        "ceilings_source": target.describe_ceilings(),
        "l2_mb": f"{target.l2_bytes / 1e6:.0f}",
        "launch_us": f"{LAUNCH_US:g}",
        "eager_1gib_ms": f"{eager:.2f}",
        "floor_1gib_ms": f"{floor:.2f}",
        "fused_1gib_ms": f"{model_ms(2 * n * F32, 1, target):.2f}",
        "eager_ratio": f"{eager / floor:.1f}",
        "ridge_ops": f"{chain_ridge_ops(target):.0f}",
        "fma_tflops": f"{c.fma_tflops:.1f}",
    }
