"""Measuring the inference lab: refuse what cannot run, check every kernel against float64, probe, then time.

Every kernel is first checked on odd sizes (or on the first sequences of the timed problem) with its output
poisoned with NaN; the fixed cost of a kernel (the `launch` rows), of a decode-attention call and the rate one SDPA
thread block streams at are probed in the run and feed its predictions.
"""

from __future__ import annotations

import torch

from labs.engine import timing
from labs.engine.gpu import Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.inference.block import DecodeBlock, attention_reference, gemm_reference, make_block_weights
from labs.inference.kernels import attention, linear, sdpa_decode_attention, touch_kernel
from labs.inference.model import (CHECK_SEQUENCES, EXPERIMENTS, FIXED_PROBE_CONTEXT, SDPA_PROBE_CONTEXT, BlockShape,
                                  Params, attention_cost, attention_fixed_ms, attention_row, block_gbps_from,
                                  check_shapes, gemm_bytes, gemm_flops, gemm_points, matmul_tflops, memory_needed,
                                  per_token)


# Timing: timing.time_ms_clean_l2 empties the L2 by *reading* a buffer (see its docstring): a decode
# GEMM moves only ~100 MB, so the write-back of do_bench's dirty flush lines would be a large error.
time_ms = timing.time_ms_clean_l2


def graph_time_ms(fn) -> float:
    """Time of one replay of `fn` captured as a CUDA graph, timed with a clean (read-flushed) L2."""
    return timing.graph_time_ms(fn, timer=time_ms)


def attention_time_ms(fn) -> tuple[float, str]:
    """(ms, timer) of one decode-attention call: a CUDA-graph replay (see ATTENTION_TIMER below), or, should a
    backend refuse to be captured, the call timed from Python, with the row saying so."""
    try:
        return graph_time_ms(fn), "graph"
    except RuntimeError:  # not capturable here: the stream timer, named in the row
        torch.cuda.synchronize()
        return time_ms(fn), "stream"


def check(p: Params, target: Target) -> None:
    """Refuse what cannot run here, before anything is allocated."""
    check_shapes(p)
    matmul_tflops(target, p.dtype)
    need = memory_needed(p)
    if not need:
        return
    name, most = max(need.items(), key=lambda kv: kv[1])
    most += timing.FLUSH_BYTES
    free = free_memory_bytes() if target.live else target.memory_bytes
    if most > 0.9 * free:
        hints = {"gemm": "smaller gemm_k, gemm_n or largest gemm_m", "attention": "shorter attn_context or "
                 "smaller attn_batch", "block": "smaller d_model, d_ff, block_context or block_batch"}
        raise ParamError(f"The {name} experiment needs {most / 1e9:.1f} GB; this GPU has {free / 1e9:.1f} GB free. "
                         f"Choose {hints[name]}.")


TOUCH_STRIDE = 4096  # 16 KB apart: every kernel of a graph reads a line that no other kernel brought into the L2


def measure_launch(progress):
    x = torch.zeros(34 * TOUCH_STRIDE, device="cuda")
    progress(0.0, "fixed cost of a kernel: timing the smallest kernel that touches memory")
    alone = time_ms(lambda: touch_kernel[(1,)](x, 0))
    yield {"experiment": "launch", "kernel": "alone", "measured_ms": alone}

    def many(count):
        def run():
            for i in range(count):
                touch_kernel[(1,)](x, i * TOUCH_STRIDE)
        return run

    node = (graph_time_ms(many(33)) - graph_time_ms(many(1))) / 32
    yield {"experiment": "launch", "kernel": "graph-node", "measured_ms": node}


def _check_gemm(w_odd, kernel: str, m: int, dtype: str) -> float:
    """The GEMM at M = m on odd sizes (every mask exercised), its output poisoned, against float64."""
    x_odd = timing.random_tensor((m, 1001), dtype)
    out = torch.full((m, 777), float("nan"), device="cuda", dtype=x_odd.dtype)
    linear(x_odd, w_odd, kernel, out)
    return timing.check_close(out, gemm_reference(x_odd, w_odd), dtype, f"GEMM {kernel} M={m}")


def _check_attention(q, k_cache, v_cache, context: int, kernel: str, out, dtype: str) -> float:
    """Decode attention into a poisoned `out`, its first CHECK_SEQUENCES sequences against float64."""
    attention(q, k_cache, v_cache, context, kernel, out)
    c = min(q.shape[0], CHECK_SEQUENCES)
    return timing.check_close(out[:c], attention_reference(q[:c], k_cache[:c], v_cache[:c], context),
                              dtype, f"attention {kernel} B={q.shape[0]} T={context}")


def measure_gemm(p: Params, target: Target, progress, done, total):
    k, n = p.gemm_k, p.gemm_n
    w = timing.random_tensor((n, k), p.dtype)  # torch's Linear layout: [out, in]
    x_all = timing.random_tensor((max(p.gemm_m), k), p.dtype)
    w_odd = timing.random_tensor((777, 1001), p.dtype)  # odd sizes: every mask in the kernel is exercised
    for kernel, m in gemm_points(p):
        progress(done / total, f"GEMM {kernel}, M = {m}: checking against float64")
        err = timing.once_per_run(("inference: gemm", kernel, m), lambda: _check_gemm(w_odd, kernel, m, p.dtype))
        progress(done / total, f"GEMM {kernel}, M = {m}: timing")
        x = x_all[:m]
        y = torch.empty((m, n), device="cuda", dtype=x.dtype)
        ms = time_ms(lambda: linear(x, w, kernel, y))
        flops, nbytes = gemm_flops(m, k, n), gemm_bytes(m, k, n, p.dtype)
        done += 1
        yield {"experiment": "gemm", "kernel": kernel, "m": m, "k": k, "n": n, "measured_ms": ms,
               "measured_tflops": timing.tflops(flops, ms), "measured_tbps": timing.tbps(nbytes, ms),
               **{f"measured_{key}": v for key, v in per_token(ms, m, p.usd_per_gpu_hour).items()},
               "check_rel_error": err}


def measure_fixed(p: Params, kernel: str, progress, fraction: float = 0.0) -> dict:
    """The probe row of a decode-attention call's fixed cost: one sequence, FIXED_PROBE_CONTEXT tokens, checked."""
    hd = p.d_model // p.heads
    progress(fraction, f"attention probe: the fixed cost of a {kernel} call ({FIXED_PROBE_CONTEXT} tokens)")
    k_cache = timing.random_tensor((1, p.kv_heads, FIXED_PROBE_CONTEXT, hd), p.dtype)
    v_cache = timing.random_tensor((1, p.kv_heads, FIXED_PROBE_CONTEXT, hd), p.dtype)
    q = timing.random_tensor((1, p.heads * hd), p.dtype)
    out = torch.full_like(q, float("nan"))
    attention(q, k_cache, v_cache, FIXED_PROBE_CONTEXT, kernel, out)
    err = timing.check_close(out, attention_reference(q, k_cache, v_cache, FIXED_PROBE_CONTEXT), p.dtype,
                            f"{kernel} fixed-cost probe")
    ms, timer = attention_time_ms(lambda: attention(q, k_cache, v_cache, FIXED_PROBE_CONTEXT, kernel, out))
    return {"experiment": "probe", "kernel": f"{kernel}-fixed", "batch": 1, "context": FIXED_PROBE_CONTEXT,
            "measured_ms": ms, "timer": timer, "check_rel_error": err}


def measure_sdpa_block(p: Params, progress, fraction: float = 0.0, fixed: dict | None = None) -> dict:
    """The probe row: the rate one SDPA thread block streams K and V at (one sequence, one K/V head, checked)."""
    hd, group = p.d_model // p.heads, p.heads // p.kv_heads
    progress(fraction, f"attention probe: one SDPA thread block over {SDPA_PROBE_CONTEXT} tokens")
    k_cache = timing.random_tensor((1, 1, SDPA_PROBE_CONTEXT, hd), p.dtype)
    v_cache = timing.random_tensor((1, 1, SDPA_PROBE_CONTEXT, hd), p.dtype)
    q = timing.random_tensor((1, group * hd), p.dtype)
    out = torch.full_like(q, float("nan"))
    sdpa_decode_attention(q, k_cache, v_cache, SDPA_PROBE_CONTEXT, out)
    err = timing.check_close(out, attention_reference(q, k_cache, v_cache, SDPA_PROBE_CONTEXT), p.dtype,
                            "SDPA one-block probe")
    ms, timer = attention_time_ms(lambda: sdpa_decode_attention(q, k_cache, v_cache, SDPA_PROBE_CONTEXT, out))
    return {"experiment": "probe", "kernel": "sdpa-block", "context": SDPA_PROBE_CONTEXT, "measured_ms": ms,
            "timer": timer,
            "measured_gbps": block_gbps_from(ms, p, attention_fixed_ms("sdpa", fixed)),  # the streaming part alone
            "check_rel_error": err}


# ATTENTION_TIMER: decode-attention calls (and their probes) are timed as CUDA-graph replays, as serving engines
# run decode steps. Called from Python, the split-KV call's CPU side (two Triton launches and two allocations; one
# Triton launch took 0.08 to 0.21 ms of CPU in the attention lab's recordings) runs while the timer empties the L2
# by reading 512 MiB, which takes 512 MiB / the copy rate: 0.18 ms on an H100, 0.13 ms on an H200. Whatever the CPU
# needs beyond that read, the events count. The H200's two recordings had the Triton kernels at batch 1 and 8 with
# 512 to 8192 tokens at 16 to 55 us where the model of the GPU's work says 10 to 17 us, the H100's once 68 us for
# 13 us (batch 1, 2048 tokens), and one point moved by 2x between two runs on the same GPU kind: the CPU's speed,
# not the GPU's. SDPA's call (one C++ op, a few tens of us of CPU) never showed it. A graph replay costs the CPU a
# few microseconds, so what is timed is the GPU's work alone, on every GPU.
def measure_attention(p: Params, target: Target, progress, done, total):
    hd = p.d_model // p.heads
    block_gbps, fixed = None, {}
    for kernel in p.attn_kernels:
        probe = measure_fixed(p, kernel, progress, done / total)
        fixed[kernel] = probe["measured_ms"]
        yield probe
    if "sdpa" in p.attn_kernels:
        probe = measure_sdpa_block(p, progress, done / total, fixed)
        block_gbps = probe["measured_gbps"]
        yield probe
    for batch in p.attn_batch:
        t_max = max(p.attn_context)
        k_cache = timing.random_tensor((batch, p.kv_heads, t_max, hd), p.dtype)
        v_cache = timing.random_tensor((batch, p.kv_heads, t_max, hd), p.dtype)
        q = timing.random_tensor((batch, p.heads * hd), p.dtype)
        for kernel in p.attn_kernels:
            for context in p.attn_context:
                progress(done / total, f"attention {kernel}, batch {batch}, context {context}: checking")
                out = torch.full_like(q, float("nan"))
                err = timing.once_per_run(("inference: attention", kernel, batch, context),
                                          lambda: _check_attention(q, k_cache, v_cache, context, kernel, out, p.dtype))
                progress(done / total, f"attention {kernel}, batch {batch}, context {context}: timing")
                ms, timer = attention_time_ms(lambda: attention(q, k_cache, v_cache, context, kernel, out))
                _, nbytes = attention_cost(batch, context, p)
                done += 1
                model = attention_row(kernel, batch, context, p, target, block_gbps, fixed)  # this run's probes
                yield model | {"measured_ms": ms, "measured_tbps": timing.tbps(nbytes, ms), "timer": timer,
                               "check_rel_error": err}
        del k_cache, v_cache


CHECK_BLOCK = BlockShape(d_model=320, heads=5, kv_heads=1, d_ff=333)  # odd sizes, head dim 64, 5 heads per K/V head


def check_block(p: Params) -> float:
    """Run a small odd-sized block with the chosen kernels against its float64 reference."""
    worst = 0.0
    kernels = {"auto": ("triton", "cublas"), "triton": ("triton",), "cublas": ("cublas",)}[p.block_gemm]
    for gemm in kernels:
        block = DecodeBlock(CHECK_BLOCK, batch=3, context=77, dtype=p.dtype, device="cuda", gemm=gemm,
                            attention_kernel=p.block_attention)
        ref = block.reference()
        out = torch.full_like(block.x, float("nan"))
        block.step(out)
        worst = max(worst, timing.check_close(out, ref, p.dtype, f"block step ({gemm}, {p.block_attention})"))
    return worst


def measure_block(p: Params, target: Target, progress, done, total):
    progress(done / total, "block: checking one step against float64")
    err = timing.once_per_run("inference: block", lambda: check_block(p))
    weights = make_block_weights(p.block_shape, p.dtype, "cuda")
    for batch in p.block_batch:
        progress(done / total, f"block decode step, batch {batch}: timing (CUDA graph)")
        block = DecodeBlock(p.block_shape, batch, p.block_context, p.dtype, "cuda", p.block_gemm,
                            p.block_attention, weights)
        out = torch.empty_like(block.x)
        ms = graph_time_ms(lambda: block.step(out))
        done += 1
        yield {"experiment": "block", "kernel": f"{p.block_gemm}+{p.block_attention}", "batch": batch,
               "context": p.block_context, "measured_ms": ms,
               **{f"measured_{key}": v for key, v in per_token(ms, batch, p.usd_per_gpu_hour).items()},
               "check_rel_error": err}
        del block


def measure(p: Params, target: Target, progress):
    check_shapes(p)
    total = 2 + ("gemm" in p.experiments) * len(gemm_points(p)) \
        + ("attention" in p.experiments) * (len(p.attn_kernels) * (len(p.attn_batch) * len(p.attn_context) + 1)
                                            + ("sdpa" in p.attn_kernels)) \
        + ("block" in p.experiments) * len(p.block_batch)
    done = 0
    for row in measure_launch(progress):
        done += 1
        yield row
    steps = {"gemm": measure_gemm, "attention": measure_attention, "block": measure_block}
    for name in EXPERIMENTS:
        if name in p.experiments:
            for row in steps[name](p, target, progress, done, total):
                done += 1
                yield row
    progress(1.0, "done")

