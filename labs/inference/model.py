"""The model of the inference lab: the roofline of each piece of a decode step, plus a measured fixed cost per kernel.

Pure arithmetic on the parameters and the GPU's facts (labs.engine.gpu): no CUDA call, no kernel launched, no
kernels module imported. A GEMM is its bytes at the copy rate or its FLOPs at the matmul rate, whichever is
longer; decode attention is the bytes of the KV cache; a block's decode step is the sum of its pieces; every
kernel adds its fixed cost (launch, first trip to memory, completion).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from labs.engine import timing
from labs.engine.gpu import KERNEL_LAUNCH_US, MB, Target, sm_shape
from labs.engine.params import ParamError, param
from labs.engine.results import recorded_rows
from labs.inference.launch import ATTN, SKINNY_MAX_M, attention_splits, cdiv, next_pow2, skinny_launches


# ---------------------------------------------------------------------------------------------
# The block's shape and the lab's parameters
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockShape:
    d_model: int
    heads: int
    kv_heads: int
    d_ff: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def weight_shapes(self) -> dict:
        """[out, in] of each matrix (torch's Linear layout)."""
        return {"qkv": (self.qkv_width, self.d_model), "o": (self.d_model, self.heads * self.head_dim),
                "gate_up": (2 * self.d_ff, self.d_model), "down": (self.d_model, self.d_ff)}

    @property
    def params(self) -> int:
        return sum(a * b for a, b in self.weight_shapes.values()) + 2 * self.d_model


EXPERIMENTS = ("gemm", "attention", "block")


@dataclass(frozen=True)
class Params:
    experiments: tuple = param(EXPERIMENTS, "what to run (the launch cost is always measured)", choices=EXPERIMENTS)
    dtype: str = param("bf16", "weights, activations and KV cache", choices=("bf16", "fp16"))
    gemm_k: int = param(8192, "GEMM: inner size K (d_model of the layer)", min=16, max=32768)
    gemm_n: int = param(8192, "GEMM: output size N (width of the weight)", min=16, max=65536)
    gemm_m: tuple = param(tuple(2**i for i in range(13)), "GEMM: rows M (batch x tokens)", min=1, max=16384)
    gemm_kernels: tuple = param(("cublas", "triton"), "GEMM kernels (triton: the weight-streaming kernel, "
                                f"M <= {SKINNY_MAX_M} only)", choices=("cublas", "triton"))
    d_model: int = param(4096, "attention and block: model width", min=16, max=16384)
    heads: int = param(32, "query heads (head dim = d_model / heads, a power of two from 16 to 256)", min=1, max=256)
    kv_heads: int = param(8, "K/V heads (must divide heads; fewer = grouped-query attention)", min=1, max=256)
    attn_context: tuple = param((512, 2048, 8192, 32768), "attention: cached tokens", unit="tokens", min=1,
                                max=1_048_576)
    attn_batch: tuple = param((1, 8, 64), "attention: sequences", min=1, max=4096)
    attn_kernels: tuple = param(("triton", "sdpa"), "attention kernels", choices=("triton", "sdpa"))
    d_ff: int = param(14336, "block: MLP hidden size", min=16, max=65536)
    block_context: int = param(1024, "block: cached tokens per sequence", unit="tokens", min=1, max=1_048_576)
    block_batch: tuple = param(tuple(2**i for i in range(9)), "block: sequences decoded at once", min=1, max=4096)
    block_gemm: str = param("cublas", f"block: GEMM kernel (triton: batch <= {SKINNY_MAX_M} only; auto: triton "
                            "up to 64, then cuBLAS)", choices=("cublas", "triton", "auto"))
    block_attention: str = param("triton", "block: attention kernel", choices=("triton", "sdpa"))
    usd_per_gpu_hour: float = param(2.5, "rent of one GPU, for the cost per token", unit="$/h", min=0.0, max=1000.0)

    @property
    def block_shape(self) -> BlockShape:
        return BlockShape(self.d_model, self.heads, self.kv_heads, self.d_ff)


def check_shapes(p: Params) -> None:
    """Refuse shapes the kernels cannot run, with what to change."""
    if p.d_model % p.heads:
        raise ParamError(f"heads = {p.heads} does not divide d_model = {p.d_model}: each head gets d_model / heads "
                         "dimensions, which must be a whole number.")
    hd = p.d_model // p.heads
    if hd < 16 or hd > 256 or hd & (hd - 1):
        raise ParamError(f"head dim = d_model / heads = {hd}; the attention kernels take a power of two from 16 to 256 "
                         f"(for d_model = {p.d_model}, try heads = {max(1, p.d_model // 128)}).")
    if p.heads % p.kv_heads:
        raise ParamError(f"kv_heads = {p.kv_heads} does not divide heads = {p.heads}: each K/V head serves a whole "
                         "group of query heads.")
    if "block" in p.experiments and p.block_gemm == "triton" and max(p.block_batch) > SKINNY_MAX_M:
        raise ParamError(f"block_gemm = triton handles batch <= {SKINNY_MAX_M}; use auto (cuBLAS above it) or "
                         "smaller block_batch values.")


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
# The fixed cost of a kernel, measured on an H200 (3.49 to 3.55 us and 1.32 us) and re-measured by every run
# (the `launch` rows): the smallest kernel that touches memory (it reads one number that is not in the L2 and
# writes one back) timed alone with an emptied L2, and each extra such kernel inside a CUDA graph. (The engine's
# KERNEL_LAUNCH_US, 3.0 us, is the same kind of figure for other labs; this lab keeps its own measured 3.5 us,
# which its recordings were predicted with.)
LAUNCH_ALONE_MS = 0.0035
GRAPH_NODE_MS = 0.0013


def fixed_ms(launches: int) -> float:
    """Fixed cost of one piece of work made of `launches` kernels back to back: the first as if timed alone,
    each further one as a graph node."""
    return LAUNCH_ALONE_MS + (launches - 1) * GRAPH_NODE_MS


def matmul_tflops(target: Target, dtype: str) -> float:
    rate = target.ceilings.matmul_tflops.get(dtype)
    if not rate:
        raise ParamError(f"{target.name} has no measured {dtype} matmul rate ({dtype} tensor cores unsupported?); "
                         f"choose dtype from {', '.join(d for d in ('bf16', 'fp16') if target.ceilings.matmul_tflops.get(d))}.")
    return rate


def roofline_ms(flops: float, nbytes: float, target: Target, dtype: str) -> float:
    """Time on the roofline: the slower of doing the math at the matmul peak and moving the bytes at copy speed."""
    return max(flops / (matmul_tflops(target, dtype) * 1e12), nbytes / (target.ceilings.copy_tbps * 1e12)) * 1e3


def gemm_flops(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n


def gemm_bytes(m: int, k: int, n: int, dtype: str) -> float:
    """A [M, K] and W [K, N] read once, C [M, N] written once."""
    return float(timing.element_bytes(dtype) * (m * k + k * n + m * n))


def gemm_intensity(m: int, k: int, n: int, dtype: str) -> float:
    return gemm_flops(m, k, n) / gemm_bytes(m, k, n, dtype)


def roofline_ridge_m(k: int, n: int, dtype: str, target: Target) -> float | None:
    """The M at which the GEMM's intensity reaches the ridge (peak / bandwidth), None if it never does.

    2MKN / (e (MK + KN + MN)) = R  <=>  M = R e K N / (2 K N - R e (K + N)).
    """
    r = matmul_tflops(target, dtype) / target.ceilings.copy_tbps
    e = timing.element_bytes(dtype)
    denominator = 2 * k * n - r * e * (k + n)
    return r * e * k * n / denominator if denominator > 0 else None


def gemm_kernel_launches(kernel: str, m: int, k: int, n: int, target: Target) -> int:
    if kernel == "triton" or (kernel == "auto" and m <= SKINNY_MAX_M):
        return skinny_launches(m, n, k, target.sm_count)
    return 1


def gemm_points(p: Params) -> list[tuple[str, int]]:
    return [(kernel, m) for kernel in p.gemm_kernels for m in p.gemm_m if kernel == "cublas" or m <= SKINNY_MAX_M]


def per_token(ms: float, tokens: int, usd_per_hour: float) -> dict:
    """Tokens per second and dollars per million tokens for `tokens` tokens done in `ms`."""
    return {"tokens_per_s": tokens / (ms * 1e-3), "usd_per_mtok": ms * 1e-3 / 3600 * usd_per_hour / tokens * 1e6}


def kv_bytes(batch: int, context: int, kv_heads: int, head_dim: int, dtype: str) -> float:
    """K and V of `context` tokens, one layer, `batch` sequences."""
    return 2.0 * batch * context * kv_heads * head_dim * timing.element_bytes(dtype)


def attention_cost(batch: int, context: int, p: Params) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step's attention in one layer: read K, V, q; write the output."""
    hd = p.d_model // p.heads
    e = timing.element_bytes(p.dtype)
    flops = 4.0 * batch * p.heads * context * hd  # q k^T and p v, 2 FLOPs per multiply-add
    nbytes = kv_bytes(batch, context, p.kv_heads, hd, p.dtype) + 2.0 * batch * p.heads * hd * e
    return flops, nbytes


def attention_launches(kernel: str) -> int:
    return 2  # triton: attention + merge; SDPA: attention + the copy that reshapes its output


def skinny_mma_ms(m: int, k: int, n: int, target: Target, dtype: str) -> float:
    """Tensor-core time of the weight-streaming kernel: its tile has max(16, next power of two >= M) rows, so
    M = 1 multiplies as many rows as M = 16. The kernel multiplies a tile once it has arrived rather than while
    the next one streams in, so this time adds to the bytes' time instead of hiding under it (on the H100 and the
    H200 the Triton kernel's time grows with M from 16 rows up by this much, cuBLAS's does not)."""
    rows = max(16, next_pow2(m))
    return gemm_flops(rows, k, n) / (matmul_tflops(target, dtype) * 1e12) * 1e3


def gemm_ms(kernel: str, m: int, k: int, n: int, target: Target, dtype: str) -> float:
    """One linear layer: the roofline, the fixed cost of its launches, and for the skinny kernel its tile's
    tensor-core time."""
    ms = roofline_ms(gemm_flops(m, k, n), gemm_bytes(m, k, n, dtype), target, dtype) \
        + fixed_ms(gemm_kernel_launches(kernel, m, k, n, target))
    if kernel == "triton" or (kernel == "auto" and m <= SKINNY_MAX_M):
        ms += skinny_mma_ms(m, k, n, target, dtype)
    return ms


def predict_gemm(p: Params, target: Target) -> list[dict]:
    rows = []
    k, n = p.gemm_k, p.gemm_n
    for kernel, m in gemm_points(p):
        flops, nbytes = gemm_flops(m, k, n), gemm_bytes(m, k, n, p.dtype)
        ms = gemm_ms(kernel, m, k, n, target, p.dtype)
        i = flops / nbytes
        rows.append({"experiment": "gemm", "kernel": kernel, "m": m, "k": k, "n": n,
                     "intensity_flop_per_byte": i,
                     "bound": "memory" if i < matmul_tflops(target, p.dtype) / target.ceilings.copy_tbps else "compute",
                     "flops": flops, "bytes": nbytes, "predicted_ms": ms,
                     "predicted_tflops": timing.tflops(flops, ms), "predicted_tbps": timing.tbps(nbytes, ms),
                     **{f"predicted_{key}": v for key, v in per_token(ms, m, p.usd_per_gpu_hour).items()}})
    return rows


# SDPA's decode kernel gives each (sequence, K/V head) pair one thread block, which walks the pair's whole context
# alone. With fewer pairs than SMs the step cannot be faster than one block streaming its pair's K and V, and no
# datasheet gives the rate one block streams at: every run measures it (the `sdpa-block` probe row, one pair at
# SDPA_PROBE_CONTEXT tokens, its fixed cost taken off) and the SDPA points of that run are predicted with it.
SDPA_PROBE_CONTEXT = 16384


def sdpa_block_bytes(context: int, p: Params) -> float:
    """K and V of one (sequence, K/V head) pair: what one of SDPA's thread blocks reads."""
    return kv_bytes(1, context, 1, p.d_model // p.heads, p.dtype)


def sdpa_block_ms(context: int, p: Params, block_gbps: float | None) -> float:
    """The one-block floor of an SDPA decode step: a pair's K and V at the rate one block streams (0 if unknown)."""
    return sdpa_block_bytes(context, p) / (block_gbps * 1e9) * 1e3 if block_gbps else 0.0


# A decode-attention call costs more than two launches even when it reads almost nothing: each of its kernels
# waits for its first loads from memory (the timer has just emptied the L2), the second starts only when the first
# has finished, and the split-KV kernel's partial results make one more round trip. No datasheet gives that, so
# every run measures it per kernel (the `<kernel>-fixed` probe rows: one sequence, one tile of FIXED_PROBE_CONTEXT
# tokens, checked) and the model adds it to the time of the bytes; without a probe it is two launches.
FIXED_PROBE_CONTEXT = ATTN["BLOCK_T"]


def attention_fixed_ms(kernel: str, fixed: dict | None = None) -> float:
    """The fixed cost of one decode-attention call of `kernel`: probed ({kernel: ms}) or two launches."""
    return (fixed or {}).get(kernel) or fixed_ms(attention_launches(kernel))


# The Triton decode kernel aims at ATTN["programs_per_sm"] programs on every SM, but each program keeps up to
# num_stages tiles of K and of V in shared memory (3 x 2 x 64 tokens x 128 x 2 bytes = 96 KiB at head dim 128), and
# an SM's shared memory (228 KiB on Hopper) holds only two such programs: 512 programs (8 sequences x 8 K/V heads x
# 8 slices) run in two waves, not one. The probed fixed cost holds the first wave's first loads; each further wave
# waits for its own first loads and ends with its own stores before the next can start: the engine's figure for
# that, KERNEL_LAUNCH_US, per wave. A short context shows it most (one to four tiles a program).
def triton_attention_per_sm(head_dim: int, dtype: str, target: Target) -> int:
    """Decode-attention programs one SM holds: the aim, or fewer where their K and V tiles fill its shared memory."""
    tile_bytes = ATTN["BLOCK_T"] * head_dim * timing.element_bytes(dtype)
    smem = sm_shape(str(target.compute_capability)).smem_per_sm_kib * 1024
    return max(1, min(ATTN["programs_per_sm"], smem // (ATTN["num_stages"] * 2 * tile_bytes)))


def triton_attention_waves_ms(batch: int, context: int, p: Params, target: Target) -> float:
    """What the Triton decode attention's waves after the first add: one first load and last store each."""
    hd = p.d_model // p.heads
    splits, _ = attention_splits(batch, p.kv_heads, context, target.sm_count)
    waves = cdiv(batch * p.kv_heads * splits, target.sm_count * triton_attention_per_sm(hd, p.dtype, target))
    return (waves - 1) * KERNEL_LAUNCH_US * 1e-3


def attention_row(kernel: str, batch: int, context: int, p: Params, target: Target,
                  block_gbps: float | None = None, fixed: dict | None = None) -> dict:
    """One attention point: the roofline (bytes at the copy rate) and, for SDPA, the one-block floor when the
    block rate is known; plus the fixed cost of a call (probed in the run, or two launches)."""
    hd = p.d_model // p.heads
    flops, nbytes = attention_cost(batch, context, p)
    roof_ms = roofline_ms(flops, nbytes, target, p.dtype)
    block_ms = sdpa_block_ms(context, p, block_gbps) if kernel == "sdpa" else 0.0
    fixed_call_ms = attention_fixed_ms(kernel, fixed)
    waves_ms = triton_attention_waves_ms(batch, context, p, target) if kernel == "triton" else 0.0
    ms = max(roof_ms, block_ms) + fixed_call_ms + waves_ms
    row = {"experiment": "attention", "kernel": kernel, "batch": batch, "context": context,
           "kv_bytes": kv_bytes(batch, context, p.kv_heads, hd, p.dtype),
           "kv_bytes_per_token": kv_bytes(1, 1, p.kv_heads, hd, p.dtype),
           "bytes": nbytes, "predicted_ms": ms, "predicted_tbps": timing.tbps(nbytes, ms),
           "predicted_fixed_ms": fixed_call_ms, "predicted_waves_ms": waves_ms}
    if kernel == "sdpa" and block_gbps:
        row |= {"sdpa_block_gbps": block_gbps, "predicted_limit": "one block" if block_ms > roof_ms else "bandwidth"}
    return row


@functools.lru_cache(maxsize=16)
def recorded_block_gbps(gpu_key: str) -> float | None:
    """The SDPA block rate from the newest recording of this GPU kind, if it has the probe (read once a process:
    the committed recordings do not change under a running app)."""
    for r in recorded_rows("inference", gpu_key):
        if r.get("experiment") == "probe" and r.get("kernel") == "sdpa-block":
            return r.get("measured_gbps")
    return None


@functools.lru_cache(maxsize=16)
def _recorded_fixed(gpu_key: str) -> tuple:
    return tuple(probed_fixed_ms(recorded_rows("inference", gpu_key)).items())


def probed_fixed_ms(rows: list) -> dict:
    """{kernel: ms} from the `<kernel>-fixed` probe rows of a run."""
    return {r["kernel"][:-len("-fixed")]: r["measured_ms"] for r in rows if isinstance(r, dict)
            and r.get("experiment") == "probe" and str(r.get("kernel", "")).endswith("-fixed") and r.get("measured_ms")}


def predict_attention(p: Params, target: Target, block_gbps: float | None = None,
                      fixed: dict | None = None) -> list[dict]:
    block_gbps = block_gbps or ("sdpa" in p.attn_kernels and recorded_block_gbps(target.key)) or None
    fixed = fixed if fixed is not None else dict(_recorded_fixed(target.key))
    return [attention_row(kernel, batch, context, p, target, block_gbps, fixed)
            for kernel in p.attn_kernels for batch in p.attn_batch for context in p.attn_context]


def block_parts(p: Params, batch: int, target: Target) -> dict:
    """The model of one decode step of the block: the sum of the models above.

    The four GEMMs and the attention as the `gemm` and `attention` experiments predict them (roofline time +
    the fixed cost of a kernel timed alone, + a graph node for each second kernel), plus the small layers
    (norms, adds, SiLU, cache writes: their bytes at copy speed + one graph node each).
    Returns ms per part (gemm, attention, small layers, fixed costs) and the number of kernels.
    """
    s, e, t = p.block_shape, timing.element_bytes(p.dtype), p.block_context
    gemm_time, fixed, kernels = 0.0, 0.0, 0
    for (n, k) in s.weight_shapes.values():
        launches = gemm_kernel_launches(p.block_gemm, batch, k, n, target)
        gemm_time += gemm_ms(p.block_gemm, batch, k, n, target, p.dtype) - fixed_ms(launches)
        fixed += fixed_ms(launches)
        kernels += launches
    flops, nbytes = attention_cost(batch, t + 1, p)
    attention_ms = roofline_ms(flops, nbytes, target, p.dtype)
    if p.block_attention == "triton":
        attention_ms += triton_attention_waves_ms(batch, t + 1, p, target)
    fixed += fixed_ms(attention_launches(p.block_attention))
    kernels += attention_launches(p.block_attention)
    d, f, kv = s.d_model, s.d_ff, s.kv_heads * s.head_dim
    small_bytes = e * batch * (2 * d  # RMSNorm 1: read x, write h
                               + 2 * 2 * kv  # copy the new K and V into the cache
                               + 4 * d  # add + RMSNorm 2: read x and o, write x1 and h
                               + 3 * f  # SiLU(gate) * up: read 2F, write F
                               + 3 * d)  # final add: read two, write one
    small_ms = small_bytes / (target.ceilings.copy_tbps * 1e12) * 1e3
    kernels += 6  # two norms, two cache copies, SiLU * up, the final add
    fixed += 6 * GRAPH_NODE_MS
    return {"gemm_ms": gemm_time, "attention_ms": attention_ms, "small_ms": small_ms, "fixed_ms": fixed,
            "kernels": kernels, "weight_bytes": e * s.params, "kv_bytes": kv_bytes(batch, t + 1, s.kv_heads, s.head_dim, p.dtype)}


def predict_block(p: Params, target: Target) -> list[dict]:
    rows = []
    for batch in p.block_batch:
        parts = block_parts(p, batch, target)
        ms = parts["gemm_ms"] + parts["attention_ms"] + parts["small_ms"] + parts["fixed_ms"]
        rows.append({"experiment": "block", "kernel": f"{p.block_gemm}+{p.block_attention}", "batch": batch,
                     "context": p.block_context, "kernels": parts["kernels"], "weight_bytes": parts["weight_bytes"],
                     "kv_bytes": parts["kv_bytes"], "predicted_ms": ms,
                     **{f"predicted_{k}": v for k, v in parts.items() if k.endswith("_ms")},
                     **{f"predicted_{key}": v for key, v in per_token(ms, batch, p.usd_per_gpu_hour).items()}})
    return rows


def predict_launch(p: Params, target: Target) -> list[dict]:
    return [{"experiment": "launch", "kernel": "alone", "predicted_ms": LAUNCH_ALONE_MS},
            {"experiment": "launch", "kernel": "graph-node", "predicted_ms": GRAPH_NODE_MS}]


def predict(p: Params, target: Target) -> list[dict]:
    check_shapes(p)
    rows = predict_launch(p, target)
    if "gemm" in p.experiments:
        rows += predict_gemm(p, target)
    if "attention" in p.experiments:
        rows += predict_attention(p, target)
    if "block" in p.experiments:
        rows += predict_block(p, target)
    return rows


def ridge_m(rows: list, kind: str = "measured", kernel: str = "cublas") -> float | None:
    """Where the flat part of time-vs-M meets the compute line: t(smallest M) / (t(largest M) / largest M).

    Read off `kind` = "measured" or "predicted" GEMM rows of one kernel; None without enough points.
    """
    pts = sorted((r["m"], r.get(f"{kind}_ms")) for r in rows
                 if r.get("experiment") == "gemm" and r.get("kernel") == kernel and r.get(f"{kind}_ms"))
    if len(pts) < 3:
        return None
    (_, t_flat), (m_max, t_max) = pts[0], pts[-1]
    ridge = t_flat / (t_max / m_max)
    return ridge if ridge < m_max else None


# ---------------------------------------------------------------------------------------------
# Memory a run needs, probes read back, re-prediction and the lesson's numbers
# ---------------------------------------------------------------------------------------------
def memory_needed(p: Params) -> dict:
    """Bytes each experiment allocates at its peak (they run one after the other)."""
    e = timing.element_bytes(p.dtype)
    hd = p.d_model // p.heads
    need = {}
    if "gemm" in p.experiments:
        m = max(p.gemm_m)
        need["gemm"] = e * (p.gemm_k * p.gemm_n + m * p.gemm_k + 2 * m * p.gemm_n) + 4 * 8 * SKINNY_MAX_M * p.gemm_n
    if "attention" in p.experiments:
        b, t = max(p.attn_batch), max(p.attn_context)
        need["attention"] = kv_bytes(b, t, p.kv_heads, hd, p.dtype) + 8 * kv_bytes(min(b, CHECK_SEQUENCES), t,
                                                                                    p.kv_heads, hd, p.dtype) / e
    if "block" in p.experiments:
        b, s = max(p.block_batch), p.block_shape
        need["block"] = e * s.params + kv_bytes(b, p.block_context + 1, s.kv_heads, s.head_dim, p.dtype) \
            + 16 * e * b * (s.qkv_width + 3 * s.d_ff + 4 * s.d_model)
    return need


CHECK_SEQUENCES = 2  # attention is checked on the first sequences of the timed problem itself


def block_gbps_from(probe_ms: float, p: Params, fixed_call_ms: float) -> float:
    """The rate one SDPA block streams at, from the probe's time less the fixed cost of a call."""
    return sdpa_block_bytes(SDPA_PROBE_CONTEXT, p) / (max(probe_ms - fixed_call_ms, 1e-6) * 1e-3) / 1e9


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run, its SDPA points with the block rate its own probe measured (the engine's re-prediction hook;
    a recording made before the probe existed gets the roofline alone there)."""
    from labs.engine.params import from_dict

    p = from_dict(Params, recording["params"])
    fixed = probed_fixed_ms(recording["rows"])
    block = next((r for r in recording["rows"] if r.get("kernel") == "sdpa-block"), {})
    gbps = block_gbps_from(block["measured_ms"], p, fixed["sdpa"]) if block and "sdpa" in fixed \
        else block.get("measured_gbps")
    rows = [r for r in predict(p, target) if r["experiment"] != "attention"]
    return rows + (predict_attention(p, target, gbps, fixed) if "attention" in p.experiments else [])


def lesson_numbers(target: Target) -> dict:
    # the default dtype, or fp16 on a GPU without bf16 tensor cores (a T4), so the lesson has numbers everywhere
    dtype = next((d for d in ("bf16", "fp16") if target.ceilings.matmul_tflops.get(d)), "bf16")
    p = Params(dtype=dtype)
    c = target.ceilings
    peak = matmul_tflops(target, p.dtype)
    k, n = p.gemm_k, p.gemm_n
    m1 = predict_gemm(Params(dtype=dtype, gemm_m=(1, 64, 4096), gemm_kernels=("cublas",)), target)
    ridge = roofline_ridge_m(k, n, p.dtype, target)
    hd = p.d_model // p.heads
    block = {r["batch"]: r for r in predict_block(Params(dtype=dtype, block_batch=(1, 64)), target)}
    return {
        "gpu": target.name,
        "ceilings_source": target.describe_ceilings(),
        "bandwidth_tbps": f"{c.copy_tbps:.2f}",
        "bf16_tflops": f"{peak:.0f}",
        "ridge_flop_per_byte": f"{peak / c.copy_tbps:.0f}",
        "ridge_m": f"{ridge:.0f}" if ridge else "never",
        "weight_mb": f"{gemm_bytes(0, k, n, p.dtype) / MB:.0f}",
        "m1_us": f"{1e3 * m1[0]['predicted_ms']:.1f}",
        "m1_tflops": f"{m1[0]['predicted_tflops']:.1f}",
        "m64_us": f"{1e3 * m1[1]['predicted_ms']:.1f}",
        "m4096_us": f"{1e3 * m1[2]['predicted_ms']:.0f}",
        "launch_us": f"{1e3 * LAUNCH_ALONE_MS:.1f}",
        "node_us": f"{1e3 * GRAPH_NODE_MS:.1f}",
        "attn_programs_per_sm": str(ATTN["programs_per_sm"]),
        "attn_program_kib": f"{ATTN['num_stages'] * 2 * ATTN['BLOCK_T'] * hd * timing.element_bytes(dtype) / 1024:.0f}",
        "attn_held_per_sm": str(triton_attention_per_sm(hd, dtype, target)),
        "kernel_launch_us": f"{KERNEL_LAUNCH_US:.0f}",
        "kv_kib_per_token": f"{kv_bytes(1, 1, p.kv_heads, hd, p.dtype) / 1024:.0f}",
        "kv_mb_64x8192": f"{kv_bytes(64, 8192, p.kv_heads, hd, p.dtype) / MB:.0f}",
        "block_weight_mb": f"{block[1]['weight_bytes'] / MB:.0f}",
        "block_b1_us": f"{1e3 * block[1]['predicted_ms']:.0f}",
        "block_b64_us": f"{1e3 * block[64]['predicted_ms']:.0f}",
        "block_kernels": str(block[1]["kernels"]),
        "sdpa_probe_context": str(SDPA_PROBE_CONTEXT),
        "fixed_probe_context": str(FIXED_PROBE_CONTEXT),
    }

