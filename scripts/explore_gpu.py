"""One device call that answers the open questions of the memory, fusion and attention labs.

    python3 scripts/explore_gpu.py [attention] [strides] [softmax] [compile]

attention  FlashAttention forward, bf16, d = 128: the lab's tiles with and without Triton's warp
           specialization, registers and spills per variant, against SDPA flash and cuDNN (same inputs).
strides    why strided reads fall below the sector model: the stride sweep from DRAM and from a warm L2,
           whole 64-byte granules read with gaps, granules read in a scattered order, and the sweep
           with the L2 fetch granularity set to 32 and 128 bytes.
softmax    the online softmax at 65536 columns: chunk sizes and warps.
compile    torch.compile's per-call floor on tiny tensors next to its 64 MiB time.
Prints tables; writes $OUT/explore.json when OUT is set.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

import torch
import triton
import triton.language as tl

from labs.engine import timing
from labs.engine.gpu import MiB

T0 = time.monotonic()
RESULTS: dict = {}


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def section(name):
    def wrap(fn):
        def run():
            if len(sys.argv) > 1 and name not in sys.argv[1:]:
                return
            log(f"=== {name}")
            try:
                RESULTS[name] = fn()
            except Exception as exc:  # noqa: BLE001 - report and go on with the next section
                import traceback
                traceback.print_exc()
                RESULTS[name] = {"error": repr(exc)}
            torch.cuda.empty_cache()
        return run
    return wrap


# ------------------------------------------------------------------------------------------------
@section("attention")
def attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    from labs import attention as A

    out = []
    B, H, d = 4, 16, 128
    base = A.tiles_for(d, "bf16", (9, 0))
    variants = {"default": base}
    for tiles in ((128, 32, 4, 2), (128, 32, 4, 3), (128, 64, 4, 3), (64, 64, 4, 2), (64, 128, 4, 2), (64, 64, 4, 3)):
        variants["x".join(map(str, tiles))] = A.FlashConfig(A.Tiles(*tiles), base.dkdv, base.dq, True)
    if "ws" in sys.argv:  # Triton's warp specialization (on the H200 with Triton 3.6: 8 warps only, slower)
        variants["ws 128x128 w8 s2"] = A.FlashConfig(A.Tiles(128, 128, 8, 2), base.dkdv, base.dq, True, False, True)
    for n in (4096, 8192):
        g = torch.Generator(device="cuda").manual_seed(n)
        q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        flops = 4 * B * H * n * n * d
        ref = None
        for causal in (False,):
            cells = []
            for name, cfg in variants.items():
                try:
                    o, _ = A._forward(q, k, v, causal, 1 / math.sqrt(d), cfg)
                    if ref is None:
                        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    err = timing.rel_error(o, ref)
                    ms = timing.time_ms(lambda: A._forward(q, k, v, causal, 1 / math.sqrt(d), cfg))
                    regs = spills = None
                    try:  # the kernel compiled last: its registers per thread and spilled registers
                        cache = A.attention_fwd_kernel.device_caches[torch.cuda.current_device()][0]
                        kern = list(cache.values())[-1]
                        regs, spills = kern.n_regs, kern.n_spills
                    except Exception:  # noqa: BLE001 - Triton's internals differ between versions
                        pass
                    row = {"n": n, "variant": name, "ms": ms, "tflops": flops / ms / 1e9, "err": err,
                           "regs": regs, "spills": spills}
                except Exception as exc:  # noqa: BLE001
                    row = {"n": n, "variant": name, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                out.append(row)
                cells.append(f"{name}: " + (f"{row['tflops']:.0f} TF/s err {row['err']:.1e} regs {row['regs']} "
                                            f"spills {row['spills']}" if "tflops" in row else row["error"]))
            for backend, label in ((SDPBackend.FLASH_ATTENTION, "sdpa-flash"), (SDPBackend.CUDNN_ATTENTION, "cudnn")):
                with sdpa_kernel([backend]):
                    ms = timing.time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                out.append({"n": n, "variant": label, "ms": ms, "tflops": flops / ms / 1e9})
                cells.append(f"{label}: {flops / ms / 1e9:.0f} TF/s")
            log(f"d=128 N={n} full:\n    " + "\n    ".join(cells))
        del q, k, v, ref
    return out


# ------------------------------------------------------------------------------------------------
@triton.jit
def granule_gap_kernel(x_ptr, y_ptr, n, GRANULE: tl.constexpr, GAP: tl.constexpr, BLOCK: tl.constexpr):
    """y[i] = x[(i // GRANULE) * GRANULE * GAP + i % GRANULE]: whole granules, GAP - 1 skipped between."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    src = (offs // GRANULE) * (GRANULE * GAP) + offs % GRANULE
    tl.store(y_ptr + offs, tl.load(x_ptr + src, mask=mask), mask=mask)


@triton.jit
def scattered_kernel(x_ptr, y_ptr, n, n_granules, GRANULE: tl.constexpr, BLOCK: tl.constexpr):
    """y[i] = x[first float of granule h(i)], h a bijection that scatters neighbours (odd multiplier mod 2^k)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = (offs * 2654435761) & (n_granules - 1)
    tl.store(y_ptr + offs, tl.load(x_ptr + g * GRANULE, mask=mask), mask=mask)


@section("strides")
def strides():
    from labs import coalescing as co
    res = {}
    bw = None
    x = torch.randn(512 * MiB, device="cuda")  # 2 GiB span
    y = torch.empty_like(x)
    ms = timing.time_ms(lambda: y.copy_(x))
    bw = timing.tbps(2 * x.numel() * 4, ms)
    res["copy_tbps"] = bw
    log(f"copy {bw:.3f} TB/s")

    def sweep(label, span):
        rows = []
        xs = x[: span // 4]
        for s in (1, 2, 4, 8, 16, 32, 64):
            out = torch.empty(triton.cdiv(xs.numel(), s), device="cuda")
            if span >= 256 * MiB:
                t = timing.time_ms(lambda: co.strided_read(xs, s, out))
            else:
                def replay():
                    for _ in range(16):
                        co.strided_read(xs, s, out)
                t = timing.graph_time_ms(replay) / 16
            rows.append({"stride": s, "ms": t, "useful_tbps": timing.tbps(8 * out.numel(), t),
                         "sectors_tbps": timing.tbps(out.numel() * (co.fetched_bytes_per_element(s) + 4), t)})
        log(f"{label}: " + ", ".join(f"s{r['stride']} useful {r['useful_tbps']:.2f} sect {r['sectors_tbps']:.2f} "
                                     f"({r['ms'] * 1e3:.0f}us)" for r in rows))
        return rows

    res["dram"] = sweep("strides from DRAM, 2 GiB span", 2048 * MiB)
    res["l2_16mib"] = sweep("strides from a warm L2, 16 MiB span", 16 * MiB)
    res["l2_4mib"] = sweep("strides from a warm L2, 4 MiB span", 4 * MiB)

    rows = []
    for granule in (8, 16, 32):  # floats: 32-byte sectors, 64-byte granules, 128-byte lines
        for gap in (1, 2, 4, 8, 16):
            n = x.numel() // gap
            out = torch.empty(n, device="cuda")
            fn = lambda: granule_gap_kernel[(triton.cdiv(n, 4096),)](x, out, n, GRANULE=granule, GAP=gap,
                                                                     BLOCK=4096, num_warps=8)
            fn()
            ref = x.view(-1, granule * gap)[:, :granule].reshape(-1) if x.numel() % (granule * gap) == 0 else None
            if ref is not None:
                assert torch.equal(out, ref)
            t = timing.time_ms(fn)
            rows.append({"granule_bytes": 4 * granule, "gap": gap, "ms": t, "tbps": timing.tbps(8 * n, t)})
        log(f"whole {4 * granule}-byte pieces with gaps: " + ", ".join(
            f"gap {r['gap']} {r['tbps']:.2f} TB/s ({r['tbps'] / bw:.2f}x)" for r in rows if r["granule_bytes"] == 4 * granule))
    res["gaps"] = rows

    rows = []
    for granule in (8, 16, 32):
        n_granules = x.numel() // granule
        n = n_granules
        out = torch.empty(n, device="cuda")
        fn = lambda: scattered_kernel[(triton.cdiv(n, 4096),)](x, out, n, n_granules, GRANULE=granule, BLOCK=4096,
                                                               num_warps=8)
        t = timing.time_ms(fn)
        fetched = n * (4 * granule + 4)
        rows.append({"granule_bytes": 4 * granule, "ms": t, "useful_tbps": timing.tbps(8 * n, t),
                     "fetched_tbps": timing.tbps(fetched, t), "granules_per_s": n / (t * 1e-3)})
    log("one float per scattered piece: " + ", ".join(
        f"{r['granule_bytes']}B: useful {r['useful_tbps']:.3f}, fetched(if piece) {r['fetched_tbps']:.2f} TB/s, "
        f"{r['granules_per_s'] / 1e9:.1f} G/s" for r in rows))
    res["scattered"] = rows

    try:
        ext = co.transpose_ext()
        default = ext.l2_fetch_granularity(0)
        res["default_granularity"] = default
        for gran in (32, 128):
            ext.l2_fetch_granularity(gran)
            res[f"dram_gran_{gran}"] = sweep(f"strides from DRAM, L2 fetch granularity {gran} B", 2048 * MiB)
        ext.l2_fetch_granularity(default)
    except Exception as exc:  # noqa: BLE001
        log(f"granularity: {exc!r}")
    del x, y
    return res


# ------------------------------------------------------------------------------------------------
@section("softmax")
def softmax():
    from labs import fusion as fu
    rows = []
    for n_cols in (65536, 131072):
        r = 256 * MiB // (4 * n_cols)
        x = torch.randn(r, n_cols, device="cuda")
        y = torch.empty_like(x)
        t_copy = timing.time_ms(lambda: y.copy_(x))
        ref = torch.softmax(x.double(), dim=1)
        cells = []
        for row_max, chunk, warps in ((32768, 16384, 16), (32768, 32768, 16), (32768, 32768, 32), (32768, 32768, 8),
                                      (32768, 16384, 32), (32768, 65536, 32)):
            fu.SOFTMAX_CHUNK_WARPS = warps
            try:
                fu.online_softmax(x, y, row_max, chunk)
                err = timing.rel_error(y, ref)
                t = timing.time_ms(lambda: fu.online_softmax(x, y, row_max, chunk))
                cells.append(f"rowmax {row_max} chunk {chunk} warps {warps} cfg {fu.softmax_config(n_cols, row_max, chunk)}: "
                             f"{t_copy / t:.2f}x copy (err {err:.1e})")
                rows.append({"n_cols": n_cols, "row_max": row_max, "chunk": chunk, "warps": warps, "fraction_of_copy": t_copy / t,
                             "err": err})
            except Exception as exc:  # noqa: BLE001
                cells.append(f"rowmax {row_max} chunk {chunk}: {type(exc).__name__} {str(exc)[:120]}")
        t = timing.time_ms(lambda: torch.softmax(x, dim=1))
        cells.append(f"torch.softmax {t_copy / t:.2f}x copy")
        log(f"softmax {n_cols} cols x {r} rows:\n    " + "\n    ".join(cells))
        del x, y, ref
    return rows


@section("compile")
def compile_floor():
    from labs import fusion as fu
    rows = []
    for size in (4096, 64 * MiB, 256 * MiB):
        x = torch.rand(size // 4, device="cuda")
        compiled, note = fu.try_compile(fu.sincos_eager, x)
        runs = {"eager": lambda: fu.sincos_eager(x), "triton": lambda: fu.sin2_cos2(x),
                "copy": lambda: x.clone()}
        if compiled is not None:
            runs["compiled"] = lambda: compiled(x)
        cells = []
        for name, fn in runs.items():
            t = timing.time_ms(fn)
            rows.append({"bytes": size, "variant": name, "ms": t})
            cells.append(f"{name} {t * 1e3:.1f} us")
        log(f"sin^2+cos^2 at {size} B: " + ", ".join(cells) + (f" ({note})" if note else ""))
    return rows


@section("backtoback")
def back_to_back():
    """Why calls timed back to back at 1 GiB take longer than do_bench's GPU time."""
    from labs import fusion as fu
    rows = []
    x = torch.rand(256 * MiB, device="cuda")
    compiled, note = fu.try_compile(fu.sincos_eager, x)
    y = torch.empty_like(x)
    runs = {"compiled": lambda: compiled(x), "triton": lambda: fu.sin2_cos2(x), "triton out=": lambda: fu.sin2_cos2(x, 1.0, y),
            "copy": lambda: torch.empty_like(x).copy_(x), "copy out=": lambda: y.copy_(x), "eager": lambda: fu.sincos_eager(x)}
    for name, fn in runs.items():
        fn()
        torch.cuda.synchronize()
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_sync_debug_mode("warn")
            import warnings
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn()
            torch.cuda.set_sync_debug_mode(0)
        syncs = len(caught)
        t_bench = timing.time_ms(fn)
        t_b2b = timing.per_call_us(fn) / 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        w0 = time.perf_counter()
        start.record()
        for _ in range(20):
            fn()
        end.record()
        w1 = time.perf_counter()
        torch.cuda.synchronize()
        w2 = time.perf_counter()
        ev = start.elapsed_time(end) / 20
        row = {"variant": name, "do_bench": t_bench, "per_call": t_b2b, "events20": ev, "host20": (w1 - w0) / 20 * 1e3,
               "wall20": (w2 - w0) / 20 * 1e3, "sync_warnings": syncs}
        rows.append(row)
        log("  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return rows


@triton.jit
def strided_passes_kernel(x_ptr, y_ptr, n, passes, STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """y[i] = sum over `passes` re-reads of x[i * STRIDE]: after the first pass the span sits in the L2."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in range(passes):
        idx = offs + (p % 2) * BLOCK  # odd passes read the neighbouring block: the load cannot be hoisted
        acc += tl.load(x_ptr + idx * STRIDE, mask=idx < n, other=0.0, cache_modifier=".cg")
    tl.store(y_ptr + offs, acc, mask=mask)


@section("l2strides")
def l2_strides():
    """Strided reads served by the L2 (many passes over a span that fits) against the same from DRAM."""
    rows = []
    for span_mib, passes in ((2048, 1), (24, 64), (24, 128)):
        x = torch.randn(span_mib * MiB // 4, device="cuda")
        cells = []
        for s in (1, 2, 4, 8, 16, 32, 64):
            n = x.numel() // s
            y = torch.empty(n, device="cuda")
            fn = lambda: strided_passes_kernel[(triton.cdiv(n, 4096),)](x, y, n, passes, STRIDE=s, BLOCK=4096,
                                                                       num_warps=8)
            fn()
            if passes == 1:
                assert torch.equal(y, x[::s][:n])
            t = timing.time_ms(fn)
            reads = n * passes
            row = {"span_mib": span_mib, "passes": passes, "stride": s, "ms": t,
                   "sector_requests_per_s": reads / (t * 1e-3), "useful_read_tbps": 4 * reads / (t * 1e-3) / 1e12}
            rows.append(row)
            cells.append(f"s{s}: {row['useful_read_tbps']:.2f} TB/s useful, {row['sector_requests_per_s'] / 1e9:.0f} G loads/s")
        log(f"span {span_mib} MiB x {passes} passes: " + " | ".join(cells))
        del x
    return rows


for fn in (attention, strides, softmax, compile_floor, back_to_back, l2_strides):
    fn()
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "explore.json"), "w") as fh:
        json.dump(RESULTS, fh, indent=1)
log("done")
