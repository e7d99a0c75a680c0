"""The model of the attention lab: FLOPs, exponentials, bytes, memory and time, for our kernels and naive attention.

Pure arithmetic on the parameters and the GPU's facts (labs.engine.gpu): no CUDA call, no kernel launched, no
kernels module imported, so it predicts for any GPU of the datasheet on a machine without one. Our kernels are
predicted with the very tiles they launch with (tiles.tiles_for).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

from labs.attention.compare import library_ratios  # noqa: F401 (the scorecard's hook, found beside predict)
from labs.attention.fa3_bwd_model import (bwd_warp_instructions as fa3_bwd_instructions, fa3_backward,
                                          peak_bytes as fa3_train_peak_bytes, step_seconds as fa3_step_seconds)
from labs.attention.fa3_model import fa3_forward, fa3_supports, hbm_bytes as fa3_hbm_bytes
from labs.attention.schedule import dkdv_tiles, forward_tiles, kernel_seconds, programs_per_sm, tile_seconds
from labs.attention.tiles import HEAD_DIMS, FlashConfig, Tiles, lq_pad, tile_counts, tiles_for
from labs.engine.gpu import Target, clock_hz, sm_shape
from labs.engine.params import param
from labs.engine.results import recorded_rows

GLUON_IMPL = "gluon-fa3"  # the Gluon FlashAttention-3 rung (gluon_fa3.py, gluon_fa3_bwd.py): Hopper, bf16, d 64, 128
IMPLS = ("naive", "ours", GLUON_IMPL, "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
MODELLED_IMPLS = ("naive", "ours", GLUON_IMPL)  # the implementations the lab predicts
MODES = ("fwd", "fwd+bwd")
MASKS = ("full", "causal")


def _sum_clamped(t0: int, t1: int, hi: int) -> int:
    """sum over t = t0..t1 of min(max(t, 0), hi)."""
    if t1 < t0:
        return 0
    a, b = max(t0, 1), min(t1, hi)
    total = (a + b) * (b - a + 1) // 2 if b >= a else 0
    return total + max(0, t1 - max(t0, hi + 1) + 1) * hi


def visible_pairs(lq: int, lk: int, causal: bool) -> int:
    """(query, key) pairs whose score counts: Lq*Lk, or about half of it with the causal mask."""
    if not causal:
        return lq * lk
    return _sum_clamped(lk - lq + 1, lk, lk)  # query i sees clamp(i + Lk - Lq + 1, 0, Lk) keys


def attention_flops(mode: str, b: int, h: int, lq: int, lk: int, d: int, causal: bool) -> float:
    """The conventional count: 4*B*H*pairs*d forward (QK^T and PV), 2.5 times that backward."""
    fwd = 4.0 * b * h * visible_pairs(lq, lk, causal) * d
    return fwd if mode == "fwd" else 3.5 * fwd


def exp_rate(target: Target) -> float:
    """Exponentials per second: the FP32 lane rate (half the FMA FLOP rate) times the SFU share: the SM's
    special-function lanes (exp2, log2, rcp) over its FP32 lanes, from labs.engine.gpu.sm_shape (16 against 64 on
    V100, T4 and A100, against 128 on every later GPU)."""
    sm = sm_shape(str(target.compute_capability))
    ratio = sm.sfu_lanes / sm.fp32_lanes
    return target.ceilings.fma_tflops * 1e12 / 2 * ratio


def matmul_rate(target: Target, dtype: str) -> float:
    rates = target.ceilings.matmul_tflops
    return (rates.get(dtype) or rates.get("fp16") or target.ceilings.fma_tflops) * 1e12


def peak_matmul_rate(target: Target, dtype: str) -> float:
    """The tensor cores' dense peak from the datasheet (FLOP/s): where the multiplies run when nothing else holds the
    tensor pipe back; the measured ceiling where the table has no row for this GPU. The measured ceiling (cuBLAS at
    N = 8192, calibrated) is lower: among other things the SM clock falls when the tensor cores are busy all the time
    (about 1,600 MHz under cuBLAS on an H200, about 1,770 under the Gluon backward, busy two thirds of the time)."""
    sheet = target.datasheet.matmul_tflops(dtype) if target.datasheet else None
    return sheet * 1e12 if sheet else matmul_rate(target, dtype)


def _nbytes(dtype: str) -> int:
    return {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]


@dataclass(frozen=True)
class Shape:
    b: int
    h: int
    lq: int
    lk: int
    d: int
    causal: bool
    dtype: str

    @property
    def e(self) -> int:
        return _nbytes(self.dtype)

    @property
    def q_bytes(self) -> int:  # also dO, O, dQ
        return self.b * self.h * self.lq * self.d * self.e

    @property
    def kv_bytes(self) -> int:  # one of K, V, dK, dV
        return self.b * self.h * self.lk * self.d * self.e

    @property
    def s_bytes(self) -> int:  # one (B, H, Lq, Lk) matrix in the input dtype
        return self.b * self.h * self.lq * self.lk * self.e

    @property
    def lse_bytes(self) -> int:  # one float32 per query, rows padded to LSE_ALIGN
        return self.b * self.h * lq_pad(self.lq) * 4


def _cc(target: Target) -> tuple:
    try:
        return tuple(int(x) for x in str(target.compute_capability).split(".")[:2])
    except ValueError:
        return (9, 0)


def _tile_elements(shape: Shape, t: Tiles) -> int:
    """Scores computed by the tensor cores: every visited tile in full (masked diagonal tiles included)."""
    c = tile_counts(shape.lq, shape.lk, t.block_m, t.block_n, shape.causal)
    return shape.b * shape.h * (c["full"] + c["masked"]) * t.block_m * t.block_n


def _kernel_time(shape: Shape, t: Tiles, programs: list, matmuls: int, hbm_bytes: float, target: Target) -> dict:
    """One kernel on the SMs (schedule.kernel_seconds: its programs in waves, each tile's tensor-core time plus
    its exponential time less what the SM's other program hides, each program's start and end), or the memory
    time if that is longer. programs: the tiles each program visits, per head; matmuls: products per score."""
    mma, exp = tile_seconds(t, shape.d, matmuls, matmul_rate(target, shape.dtype), exp_rate(target), target.sm_count)
    per_sm = programs_per_sm(sm_shape(str(target.compute_capability)), t.warps)
    k = kernel_seconds(programs, shape.b * shape.h, mma, exp, target.sm_count, per_sm)
    mem_s = hbm_bytes / (target.ceilings.copy_tbps * 1e12)
    return k | {"mem_s": mem_s, "schedule_s": k["s"] - (k["mma_s"] + k["exp_s"] - k["hidden_s"]),
                "s": max(k["s"], mem_s)}


def _kv_rereads(shape: Shape, t: Tiles, target: Target) -> tuple[float, float]:
    """(bytes of K and V the query tiles request, bytes that reach HBM).

    Every query tile streams the K and V rows it sees. Consecutive programs work on the same head, so
    the L2 serves the repeats when the heads in flight fit in it; then K and V come from HBM once.
    """
    elems = _tile_elements(shape, t)
    requested = 2 * elems / t.block_m * shape.d * shape.e  # each visited tile loads BLOCK_N rows of K and of V
    q_tiles = -(-shape.lq // t.block_m)
    heads_in_flight = max(1, -(-target.sm_count // q_tiles))
    fits = heads_in_flight * 2 * shape.lk * shape.d * shape.e <= target.l2_bytes
    return requested, (2 * shape.kv_bytes if fits else requested)


def planned_config(shape: Shape, mode: str, target: Target) -> FlashConfig:
    """The tiles our kernels take for this point on `target` (what kernels.default_config picks on that GPU)."""
    return tiles_for(shape.d, shape.dtype, _cc(target), causal=shape.causal, seq_len=shape.lq,
                     batch_heads=shape.b * shape.h, sm_count=target.sm_count, mode=mode)


def flash_model(shape: Shape, mode: str, target: Target, cfg: Optional[FlashConfig] = None) -> dict:
    """Predicted time, HBM bytes and peak memory of our kernels, with the tiles they pick for this point on `target`
    (tiles_for: by head dim, mask, mode and how much work there is against the SMs)."""
    cfg = cfg or planned_config(shape, mode, target)
    lq, lk, causal = shape.lq, shape.lk, shape.causal
    requested, kv_hbm = _kv_rereads(shape, cfg.fwd, target)
    fwd_bytes = 2 * shape.q_bytes + kv_hbm + shape.lse_bytes  # Q in, O out, K and V, lse out
    k_fwd = _kernel_time(shape, cfg.fwd, forward_tiles(lq, lk, cfg.fwd, causal), 2, fwd_bytes, target)  # S, PV
    out = {"predicted_hbm_bytes": fwd_bytes, "predicted_l2_request_bytes": requested + 2 * shape.q_bytes,
           "predicted_mem_ms": k_fwd["mem_s"] * 1e3, "predicted_ms": k_fwd["s"] * 1e3,
           "predicted_peak_bytes": shape.q_bytes + shape.lse_bytes}
    kernels = [k_fwd]
    hbm = fwd_bytes
    if mode != "fwd":
        _, kv_hbm_b = _kv_rereads(shape, cfg.dkdv, target)
        kv_bytes = 2 * shape.q_bytes + 2 * shape.kv_bytes * 2 + 2 * shape.lse_bytes  # Q, dO; K, V in, dK, dV out
        # S^T, dV, dP^T, dK per score
        kernels.append(_kernel_time(shape, cfg.dkdv, dkdv_tiles(lq, lk, cfg.dkdv, causal), 4, kv_bytes, target))
        # the dQ kernel runs first and also writes delta = rowsum(dO * O) and lse2 for the dK/dV kernel
        prep_bytes = 2 * shape.q_bytes + 3 * shape.lse_bytes  # reads O, dO and lse; writes delta and lse2
        q_bytes = 2 * shape.q_bytes + kv_hbm_b + prep_bytes  # Q in, dQ out, K and V, O, dO and lse
        dq_programs = forward_tiles(lq, lk, cfg.dq, causal)
        kernels.append(_kernel_time(shape, cfg.dq, dq_programs, 3, q_bytes, target))  # S, dP, dQ per score
        hbm += kv_bytes + q_bytes
        out["predicted_peak_bytes"] = flash_peak_bytes(shape, mode)
    out.update({"predicted_hbm_bytes": hbm, "predicted_ms": sum(k["s"] for k in kernels) * 1e3,
                **{f"predicted_{part}_ms": sum(k[f"{part}_s"] for k in kernels) * 1e3
                   for part in ("mma", "exp", "hidden", "schedule")}})
    return out


def flash_peak_bytes(shape: Shape, mode: str) -> int:
    """Memory our kernels allocate beyond the inputs (and dO): grows as N, never N^2."""
    fwd = shape.q_bytes + shape.lse_bytes  # O and the log-sum-exp
    if mode == "fwd":
        return fwd
    return fwd + 2 * shape.lse_bytes + shape.q_bytes + 2 * shape.kv_bytes  # delta, lse2, dQ, dK, dV


def gluon_model(shape: Shape, target: Target, mode: str = "fwd") -> dict:
    """Predicted time, HBM bytes and peak memory of the Gluon FlashAttention-3 rung: its forward (fa3_model.py: the
    tensor cores and the exponentials overlapped by two or three consumer warpgroups in turn, on one program per
    SM), and for fwd+bwd its backward after it (fa3_bwd_model.py: each step's multiplies, then its chain)."""
    rate, copy_bps = matmul_rate(target, shape.dtype), target.ceilings.copy_tbps * 1e12
    parts = [fa3_forward(shape, rate, exp_rate(target), copy_bps, target.sm_count, clock_hz(target),
                         target.l2_bytes)]
    hbm, peak = fa3_hbm_bytes(shape), shape.q_bytes  # the forward: Q, K, V in, O out; O alone allocated
    if mode != "fwd":
        parts.append(fa3_backward(shape, peak_matmul_rate(target, shape.dtype), copy_bps, target.sm_count,
                                  clock_hz(target)))
        hbm, peak = hbm + shape.lse_bytes + parts[-1]["hbm_bytes"], fa3_train_peak_bytes(shape)
    return {"predicted_ms": sum(k["s"] for k in parts) * 1e3, "predicted_hbm_bytes": hbm,
            "predicted_l2_request_bytes": hbm, "predicted_peak_bytes": peak,
            **{f"predicted_{part}_ms": sum(k[f"{part}_s"] for k in parts) * 1e3
               for part in ("mma", "exp", "hidden", "schedule", "mem")}}


def gluon_runs(shape: Shape, mode: str, target: Target) -> bool:
    """The Gluon rung has a point here: bf16, d 64 or 128, on a Hopper GPU (forward, and forward and backward)."""
    return fa3_supports(shape.dtype, shape.d, str(target.compute_capability))


def gpu_model(impl: str, shape: Shape, mode: str, target: Target) -> dict:
    """The GPU's time of one call of a modelled implementation (naive attention at the copy rate)."""
    if impl == "naive":
        return naive_model(shape, mode, target)
    return gluon_model(shape, target, mode) if impl == GLUON_IMPL else flash_model(shape, mode, target)


# PyTorch's own kernels that naive attention runs over the N x N matrices, and the rate each streams them at.
# Read from torch's kernels (torch.profiler on an H100): the matrix multiplies, the
# softmax backward, the product dP * P before it and the copies run near the copy rate; the softmax forward (one
# thread block or one warp per row, several passes over the row) and masked_fill with the (N, N) mask broadcast
# over batch and heads (a generic strided kernel: one 2-byte element per access, index arithmetic for each) do
# not. Their rates are probed in every run (NAIVE_PROBES, on a slice of rows) and fall back to the copy rate.
NAIVE_PROBES = ("softmax", "softmax-causal", "masked-fill")
NAIVE_PROBE_BYTES = 512 * 2**20  # each probe streams a (heads', N, N) slice of about this many bytes


def naive_matmul_kernel(kind: str, d: int) -> str:
    """The probe name of naive attention's batched products at head dim d: "scores" (an N x d by a d x N: S = Q K^T
    and dP = dO V^T write an N x N matrix) or "values" (an N x N by an N x d: P V and the gradients that read one).
    At d = 64 or 128 they move far more bytes than they compute, and cuBLAS's rate on those bytes is below the copy
    rate; it is probed in every run beside the softmax's, per head dim, and falls back to the copy rate."""
    return f"bmm-{kind}-d{d}"


def naive_ops(shape: Shape, mode: str) -> list[dict]:
    """The kernels of naive attention with their FLOPs, bytes (read + written) and the kernel class whose rate
    they run at: "copy", one of NAIVE_PROBES, or a batched product's (naive_matmul_kernel), each on its roofline."""
    q, kv, s, mm = shape.q_bytes, shape.kv_bytes, shape.s_bytes, 2.0 * shape.b * shape.h * shape.lq * shape.lk * shape.d
    mask = shape.lq * shape.lk  # one bool per (query, key)
    softmax = "softmax-causal" if shape.causal else "softmax"  # rows that end in -inf run slower (measured)
    scores, values = naive_matmul_kernel("scores", shape.d), naive_matmul_kernel("values", shape.d)
    ops = [{"op": "q * scale", "flops": 0, "bytes": 2 * q, "kernel": "copy"},
           {"op": "S = Q K^T", "flops": mm, "bytes": q + kv + s, "kernel": scores}]
    if shape.causal:
        ops += [{"op": "mask = ~(j <= i)", "flops": 0, "bytes": 3 * mask, "kernel": "copy"},
                {"op": "S.masked_fill_(mask, -inf)", "flops": 0, "bytes": 2 * s, "kernel": "masked-fill"}]
    ops += [{"op": "P = softmax(S)", "flops": 0, "bytes": 2 * s, "kernel": softmax},
            {"op": "O = P V", "flops": mm, "bytes": s + kv + q, "kernel": values}]
    if mode == "fwd":
        return ops
    ops += [{"op": "dP = dO V^T", "flops": mm, "bytes": q + kv + s, "kernel": scores},
            {"op": "dV = P^T dO", "flops": mm, "bytes": s + q + kv, "kernel": values},
            {"op": "dP * P", "flops": 0, "bytes": 3 * s, "kernel": "copy"},  # torch's softmax backward forms it first
            {"op": "dS = dP * P - P * rowsum(dP * P)", "flops": 0, "bytes": 3 * s, "kernel": "copy"}]
    if shape.causal:  # masked_fill's backward is out of place: a copy of dS, then masked_fill_ on the copy
        ops += [{"op": "dS.clone()", "flops": 0, "bytes": 2 * s, "kernel": "copy"},
                {"op": "dS.masked_fill_(mask, 0)", "flops": 0, "bytes": 2 * s, "kernel": "masked-fill"}]
    ops += [{"op": "dQ = dS K", "flops": mm, "bytes": s + kv + q, "kernel": values},
            {"op": "dK = dS^T Q", "flops": mm, "bytes": s + q + kv, "kernel": values},
            {"op": "dq * scale", "flops": 0, "bytes": 2 * q, "kernel": "copy"}]
    return ops


def naive_peak_bytes(shape: Shape, mode: str) -> int:
    """Memory naive attention allocates beyond its inputs.

    Forward (no autograd record): S and P, both alive while the softmax reads one and writes the other.
    Forward and backward: the peak is in the softmax's backward pass, where P (saved), dP, dS and the
    temporary dP * P that PyTorch's CUDA softmax backward forms first are alive together: four N x N
    matrices, beside q * scale (saved), the output and dV; and the causal mask (one byte per pair).
    """
    if mode == "fwd":
        return 2 * shape.s_bytes
    mask = shape.lq * shape.lk if shape.causal else 0
    return 4 * shape.s_bytes + 2 * shape.q_bytes + shape.kv_bytes + mask


def naive_rates_for(rates: Optional[dict], n: int, dtype: str) -> dict:
    """{probe kernel: TB/s} for row length n from probed rates keyed (kernel, n, dtype); a row length the run did
    not probe takes the nearest one probed (the kernel torch picks changes with the row length)."""
    out = {}
    for kernel in {k for k, _, _ in (rates or {})}:
        known = [(abs(math.log(m / n)), tbps) for (k, m, t), tbps in (rates or {}).items()
                 if k == kernel and t == dtype and tbps]
        if known:
            out[kernel] = min(known)[1]
    return out


def naive_model(shape: Shape, mode: str, target: Target, rates: Optional[dict] = None) -> dict:
    """Each kernel on its own roofline; the kernels in `rates` ({probe kernel: TB/s}) at their probed rate."""
    ops = naive_ops(shape, mode)
    peak, bw = matmul_rate(target, shape.dtype), target.ceilings.copy_tbps * 1e12
    rates = rates or {}

    def seconds(o):
        rate = rates.get(o["kernel"], 0) * 1e12 or bw
        return max(o["flops"] / peak, o["bytes"] / rate)

    return {"predicted_ms": sum(seconds(o) for o in ops) * 1e3, "predicted_hbm_bytes": sum(o["bytes"] for o in ops),
            "predicted_mma_ms": sum(o["flops"] for o in ops) / peak * 1e3,
            "predicted_mem_ms": sum(o["bytes"] for o in ops) / bw * 1e3,
            "predicted_probed_ms": sum(seconds(o) for o in ops if o["kernel"] in rates) * 1e3,
            "predicted_peak_bytes": naive_peak_bytes(shape, mode)}


# ---------------------------------------------------------------------------------------------
# The lab's parameters and the prediction of every point
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    seq_lens: tuple = param((1024, 2048, 4096, 8192, 16384), "sequence lengths N (queries = keys)", unit="tokens",
                            min=1, max=262144)
    head_dims: tuple = param((64, 128), "head dimension d", choices=HEAD_DIMS)
    masks: tuple = param(("full", "causal"), "attention masks", choices=MASKS)
    dtypes: tuple = param(("bf16",), "input dtype (accumulation is fp32)", choices=("bf16", "fp16", "fp32"))
    impls: tuple = param(IMPLS, "implementations", choices=IMPLS)
    modes: tuple = param(MODES, "forward alone, or forward and backward", choices=MODES)
    batch: int = param(4, "batch size B", min=1, max=1024)
    heads: int = param(16, "heads H", min=1, max=1024)


KEY = ("impl", "mode", "causal", "dtype", "head_dim", "seq_len")  # the columns that name a point (LAB.key)


def _shape(params: Params, n: int, d: int, mask: str, dtype: str) -> Shape:
    return Shape(params.batch, params.heads, n, n, d, mask == "causal", dtype)


def _row_key(impl, mode, mask, dtype, d, n) -> dict:
    return {"impl": impl, "mode": mode, "causal": mask == "causal", "dtype": dtype, "head_dim": d, "seq_len": n}


def predict(params: Params, target: Target, naive_rates: Optional[dict] = None) -> list[dict]:
    """The model of every point. naive_rates: probed rates of torch's kernels keyed (kernel, N, dtype) in TB/s;
    by default those of the newest recording of this GPU kind (the copy rate where there is none)."""
    if naive_rates is None and "naive" in params.impls:
        naive_rates = recorded_naive_rates(target.key)
    rows = []
    for dtype in params.dtypes:
        for d in params.head_dims:
            for mask in params.masks:
                for n in params.seq_lens:
                    shape = _shape(params, n, d, mask, dtype)
                    for mode in params.modes:
                        flops = attention_flops(mode, shape.b, shape.h, n, n, d, shape.causal)
                        for impl in MODELLED_IMPLS:
                            if impl not in params.impls or (impl == GLUON_IMPL and not gluon_runs(shape, mode, target)):
                                continue
                            if impl == "naive":
                                m = naive_model(shape, mode, target, naive_rates_for(naive_rates, n, dtype))
                            else:
                                m = gpu_model(impl, shape, mode, target)
                            rows.append(_row_key(impl, mode, mask, dtype, d, n) | {"flops": flops} | m |
                                        {"predicted_tflops": flops / (m["predicted_ms"] * 1e-3) / 1e12})
    return rows


PROBE_IMPL = "naive-probe"  # the `impl` of the rows that carry a probed rate (mode = the probed kernel)


def probed_naive_rates(rows: list) -> dict:
    """{(kernel, N, dtype): TB/s} from the probe rows of a run."""
    return {(r["mode"], r["seq_len"], r["dtype"]): r["measured_tbps"] for r in rows
            if isinstance(r, dict) and r.get("impl") == PROBE_IMPL and r.get("measured_tbps")}


@functools.lru_cache(maxsize=16)
def _recorded_naive_rates(gpu_key: str) -> tuple:
    return tuple(probed_naive_rates(recorded_rows("attention", gpu_key)).items())


def recorded_naive_rates(gpu_key: str) -> dict:
    """The probed rates of the newest committed recording of this GPU kind (read once a process)."""
    return dict(_recorded_naive_rates(gpu_key))


# ---------------------------------------------------------------------------------------------
# Memory: every point's peak is predicted before it runs, and what would not fit is skipped
# ---------------------------------------------------------------------------------------------
# Memory a timed point needs beyond its own tensors: triton's do_bench allocates 256 MB to clear the L2,
# and a share of free memory stays reserved for the CUDA libraries' workspaces (cuBLAS, cuDNN plans).
TIMER_BYTES = 256 * 10**6
FREE_SHARE = 0.8  # on an 80 GB H100, naive N = 16384 (68.7 GB) passed a 0.9 test and then ran out of memory
LIBRARY_PEAK_FACTOR = 2  # the SDPA backends keep float32 copies and workspaces: measured 1.0-2.0x ours


def point_peak_bytes(impl: str, shape: Shape, mode: str) -> int:
    """Memory one point allocates beyond its inputs while it runs: the models above for naive and ours;
    for a library backend, twice ours (a bound, so a point is never refused for it on a GPU that fits)."""
    if impl == "naive":
        return naive_peak_bytes(shape, mode)
    if impl == GLUON_IMPL:  # the forward alone: its output (no log-sum-exp); training: fa3_bwd_model.peak_bytes
        return shape.q_bytes if mode == "fwd" else fa3_train_peak_bytes(shape)
    peak = flash_peak_bytes(shape, mode)
    return peak if impl == "ours" else LIBRARY_PEAK_FACTOR * peak


def fits(need_bytes: int, free_bytes: int) -> bool:
    """Will a point that allocates need_bytes (plus the timer's buffer) run in free_bytes of free memory?"""
    return need_bytes + TIMER_BYTES <= FREE_SHARE * free_bytes


def skip_note(impl: str, need_bytes: int, free_bytes: int) -> str:
    """Why a point does not run, in the terms of fits(): what it needs against the share of free memory a point
    may use (the rest stays with the CUDA libraries' workspaces)."""
    what = "its N x N matrices" if impl == "naive" else "outputs"
    return (f"skipped: {impl} would need {need_bytes / 1e9:.1f} GB ({what} and workspace) plus "
            f"{TIMER_BYTES / 1e9:.2f} GB for the timer; of the {free_bytes / 1e9:.1f} GB free a point may use "
            f"{100 * FREE_SHARE:.0f} % ({FREE_SHARE * free_bytes / 1e9:.1f} GB), the rest is left to the CUDA "
            "libraries' workspaces")


def plan_points(params: "Params", free_bytes: int) -> list[dict]:
    """Every point of a run with its predicted peak memory and whether it fits, decided before anything is
    allocated. free_bytes: the device's free memory before the inputs (Q, K, V, dO) of the largest N."""
    plan = []
    for dtype in params.dtypes:
        for d in params.head_dims:
            for n in params.seq_lens:
                inputs = 4 * _shape(params, n, d, "full", dtype).q_bytes  # Q, K, V and dO of this N
                for mask in params.masks:
                    shape = _shape(params, n, d, mask, dtype)
                    for impl in params.impls:
                        for mode in params.modes:
                            need = point_peak_bytes(impl, shape, mode)
                            plan.append(_row_key(impl, mode, mask, dtype, d, n) |
                                        {"peak_bytes": need, "fits": fits(need, free_bytes - inputs)})
    return plan


# ---------------------------------------------------------------------------------------------
# Short calls: the CPU's time per call as a floor
# ---------------------------------------------------------------------------------------------
HOST_FLOOR_BELOW_MS = 2.0  # the CPU's time per call is measured only where the GPU model is shorter than this

HOST_FLOOR_IMPLS = ("ours", "naive", GLUON_IMPL)  # launched from Python (ours, Gluon) or op by op (naive)


def _needs_host_floor(shape: Shape, mode: str, target: Target, impl: str = "ours") -> bool:
    """Short calls only: a launch costs tens of microseconds, it cannot be what limits a call of milliseconds.
    Naive attention launches a dozen or two of torch's kernels per call (its forward and, through autograd, its
    backward), so a short one can wait on the CPU just as ours does."""
    return gpu_model(impl, shape, mode, target)["predicted_ms"] <= HOST_FLOOR_BELOW_MS


TIMER_FLUSH_BYTES = 256 * 2**20  # what the lab's timer (as do_bench) writes per call


def timer_flush_ms(target: Target) -> float:
    """How long the timer's L2-clearing write takes: its bytes at the measured copy rate (0.09 ms on an H100,
    0.06 ms on an H200)."""
    return TIMER_FLUSH_BYTES / (target.ceilings.copy_tbps * 1e12) * 1e3


def host_floor_row(row: dict, shape: Shape, mode: str, host_ms: float, target: Target, impl: str = "ours",
                   cycle_ms: Optional[float] = None) -> dict:
    """`row` predicted with the CPU's measured time per call (host_ms) and, where the run measured it, per cycle of
    the timer's loop (cycle_ms): what repredict redoes offline for a recording.

    A forward call of ours or of the Gluon rung is one kernel, launched at the end of the CPU's work. The timer
    (do_bench's way) starts its clock when the L2-clearing write ends and lets the CPU prepare the call meanwhile,
    so the write hides the first timer_flush_ms of the CPU's time. Then the call lasts the larger of:
    - the kernel alone (k), where the GPU is the slower side;
    - host + k - flush, the CPU's time the write did not hide and then the kernel, where the CPU is the slower
      side and its rest of the loop (cycle - host) outlasts the kernel;
    - cycle - flush, where that rest is shorter: the next call's write then waits for this kernel, and one call
      every cycle is all the CPU gives.
    Calls of many kernels (backward passes), and recordings without cycle_ms, keep the coarser floor: the CPU's
    whole time per call (host_ms), the larger of that and the GPU's time."""
    model = gpu_model(impl, shape, mode, target)
    if mode == "fwd" and impl in ("ours", GLUON_IMPL) and cycle_ms is not None:
        k = model["predicted_ms"]
        floor = min(host_ms + k, cycle_ms) - timer_flush_ms(target)
        return _with_host_floor(row, model, shape, mode, host_ms, floor) | {"host_cycle_ms": cycle_ms}
    return _with_host_floor(row, model, shape, mode, host_ms)


def naive_host_floor_row(row: dict, shape: Shape, mode: str, host_ms: float, target: Target, rates: dict) -> dict:
    """The same floor for naive attention, over its GPU model with the rates the run probed."""
    model = naive_model(shape, mode, target, naive_rates_for(rates, shape.lq, shape.dtype))
    return _with_host_floor(row, model, shape, mode, host_ms)


def _with_host_floor(row: dict, model: dict, shape: Shape, mode: str, host_ms: float,
                     floor_ms: Optional[float] = None) -> dict:
    gpu_ms = model["predicted_ms"]
    floor_ms = host_ms if floor_ms is None else floor_ms
    ms = max(gpu_ms, floor_ms)
    flops = attention_flops(mode, shape.b, shape.h, shape.lq, shape.lk, shape.d, shape.causal)
    return row | {"host_ms": host_ms, "gpu_model_ms": gpu_ms, "predicted_ms": ms,
                  "predicted_tflops": flops / (ms * 1e-3) / 1e12, "limited_by": "CPU" if floor_ms > gpu_ms else "GPU"}


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run (the engine's re-prediction hook): naive attention with the rates that run
    probed, the short points with the CPU times it measured."""
    from labs.engine.params import from_dict

    params = from_dict(Params, recording["params"])
    host = {tuple(r.get(k) for k in KEY): (r["host_ms"], r.get("host_cycle_ms"))
            for r in recording["rows"] if r.get("host_ms") is not None}
    rates = probed_naive_rates(recording["rows"])
    rows = []
    for row in predict(params, target, rates or None):
        key = tuple(row.get(k) for k in KEY)
        if key in host:
            shape = _shape(params, row["seq_len"], row["head_dim"], "causal" if row["causal"] else "full", row["dtype"])
            host_ms, cycle_ms = host[key]
            row = naive_host_floor_row(row, shape, row["mode"], host_ms, target, rates) if row["impl"] == "naive" \
                else host_floor_row(row, shape, row["mode"], host_ms, target, row["impl"], cycle_ms)
        rows.append(row)
    return rows


def naive_prediction(shape: Shape, mode: str, target: Target, rates: dict) -> dict:
    m = naive_model(shape, mode, target, naive_rates_for(rates, shape.lq, shape.dtype))
    flops = attention_flops(mode, shape.b, shape.h, shape.lq, shape.lk, shape.d, shape.causal)
    return m | {"predicted_tflops": flops / (m["predicted_ms"] * 1e-3) / 1e12}


def _tflops(shape: Shape, m: dict, mode: str = "fwd") -> float:
    flops = attention_flops(mode, shape.b, shape.h, shape.lq, shape.lk, shape.d, shape.causal)
    return flops / (m["predicted_ms"] * 1e-3) / 1e12


def lesson_numbers(target: Target) -> dict:
    c = target.ceilings
    mm = matmul_rate(target, "bf16")
    ex = exp_rate(target)
    shape64 = Shape(4, 16, 8192, 8192, 64, False, "bf16")
    shape128 = Shape(4, 16, 8192, 8192, 128, False, "bf16")
    f64 = flash_model(shape64, "fwd", target)
    f128 = flash_model(shape128, "fwd", target)
    big = Shape(4, 16, 16384, 16384, 64, False, "bf16")
    short = flash_model(Shape(4, 16, 1024, 1024, 64, False, "bf16"), "fwd", target)
    g64, g128 = gluon_model(shape64, target), gluon_model(shape128, target)
    t128 = gluon_model(shape128, target, "fwd+bwd")
    mma_step, chain_step = fa3_step_seconds(128, peak_matmul_rate(target, "bf16"), clock_hz(target), target.sm_count)
    return {
        "gpu": target.name,
        "ceilings_source": target.describe_ceilings(),
        "bf16_matmul_tflops": f"{mm / 1e12:.0f}",
        "exp_per_s": f"{ex / 1e12:.2f}",
        "mma_per_exp": f"{mm / ex:.0f}",
        "exp_share_d64_pct": f"{100 * f64['predicted_exp_ms'] / f64['predicted_ms']:.0f}",
        "exp_share_d128_pct": f"{100 * f128['predicted_exp_ms'] / f128['predicted_ms']:.0f}",
        "hidden_share_d64_pct": f"{100 * f64['predicted_hidden_ms'] / f64['predicted_exp_ms']:.0f}",
        "programs_per_sm": str(programs_per_sm(sm_shape(str(target.compute_capability)), 4)),
        "short_schedule_pct": f"{100 * short['predicted_schedule_ms'] / short['predicted_ms']:.0f}",
        "predicted_d64_tflops": f"{_tflops(shape64, f64):.0f}",
        "predicted_d128_tflops": f"{_tflops(shape128, f128):.0f}",
        "fa3_d64_tflops": f"{_tflops(shape64, g64):.0f}",
        "fa3_d128_tflops": f"{_tflops(shape128, g128):.0f}",
        "fa3_train_d128_tflops": f"{_tflops(shape128, t128, 'fwd+bwd'):.0f}",
        "fa3_bwd_step_mma_us": f"{mma_step * 1e6:.2f}",
        "fa3_bwd_step_chain_us": f"{chain_step * 1e6:.2f}",
        "fa3_bwd_chain_pct": f"{100 * chain_step / (mma_step + chain_step):.0f}",
        "fa3_bwd_instructions_d128": f"{fa3_bwd_instructions(128, False):.0f}",
        "s_gb_16k": f"{big.s_bytes / 1e9:.1f}",
        "naive_fwd_gb_16k": f"{naive_peak_bytes(big, 'fwd') / 1e9:.1f}",
        "naive_train_gb_16k": f"{naive_peak_bytes(big, 'fwd+bwd') / 1e9:.1f}",
        "flash_fwd_mb_16k": f"{flash_peak_bytes(big, 'fwd') / 1e6:.0f}",
        "memory_gb": f"{target.memory_bytes / 1e9:.0f}",
        "block_m_d64": str(tiles_for(64, "bf16", _cc(target)).fwd.block_m),
        "kv_requested_gb_8k": f"{(f64['predicted_l2_request_bytes'] - 2 * shape64.q_bytes) / 1e9:.1f}",
        "kv_once_mb_8k": f"{2 * shape64.kv_bytes / 1e6:.0f}",
        "l2_mb": f"{target.l2_bytes / 1e6:.0f}",
        "copy_tbps": f"{c.copy_tbps:.2f}",
        "timer_flush_ms": f"{timer_flush_ms(target):.2f}",
        "ridge_bf16": f"{mm / (c.copy_tbps * 1e12):.0f}",
    }

