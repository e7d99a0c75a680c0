"""Device-side checks and tuning for the fusion and recompute labs, in one batch (one GPU call).

Run on a GPU:  PYTHONPATH=$PWD python3 scripts/fusion_gpu.py [--quick]
Prints a compact table per experiment; figures go in the issue note.
- launch cost of tiny kernels (grounds fusion.LAUNCH_US);
- sin^2 + cos^2 at 1 GiB: copy, eager, torch.compile (with its compile time), Triton with fast (SFU)
  and accurate (libdevice) sin/cos over launch shapes; kernel names from torch.profiler;
- the chain's fused kernel across the ridge;
- the online softmax over launch shapes against eager-decomposed and torch.softmax;
- recomputation: launch shapes, speed-up, gradients, activation memory.
"""
import sys
import time

import torch
import triton

from labs import fusion, recompute
from labs.engine import timing
from labs.engine import gpu
from labs.engine.gpu import MiB

QUICK = "--quick" in sys.argv
T0 = time.time()
target = gpu.live_target()
bw = target.ceilings.copy_tbps
print(f"GPU {target.name}: copy {bw:.3f} TB/s, FMA {target.ceilings.fma_tflops:.1f} TFLOP/s, L2 {target.l2_bytes / 1e6:.0f} MB,"
      f" torch {torch.__version__}, triton {triton.__version__}", flush=True)


def line(*cells):
    print(" | ".join(str(c) for c in cells), flush=True)


# --- launch cost ------------------------------------------------------------------------------
tiny = torch.randn(1, device="cuda")
tiny_out = torch.empty_like(tiny)
small = torch.randn(256 * 1024, device="cuda")  # 1 MiB
line("launch", "triton 1 element", f"{timing.time_ms(lambda: fusion.sin2_cos2(tiny, 1.0, tiny_out)) * 1e3:.2f} us")
line("launch", "eager sin 1 element", f"{timing.time_ms(lambda: torch.sin(tiny)) * 1e3:.2f} us")
line("launch", "eager sin^2+cos^2 1 MiB (5 kernels)", f"{timing.time_ms(lambda: fusion.sincos_eager(small)) * 1e3:.2f} us")
line("launch", "eager 20 x add 1 element", f"{timing.time_ms(lambda: fusion.chain_eager(tiny, 20)) * 1e3 / 20:.2f} us each")

# --- sin^2 + cos^2 at 1 GiB ---------------------------------------------------------------------
n = 1024 * MiB // 4
floor_ms = 2 * n * 4 / (bw * 1e12) * 1e3
x = timing.random_tensor((n,), "fp32")
y = torch.empty_like(x)
probe = timing.random_tensor((1_000_003,), "fp32")
ref = fusion.reference_sincos(probe)
line("sincos", "byte floor (model)", f"{floor_ms:.4f} ms")
for name, fn in (("copy", lambda: y.copy_(x)), ("eager", lambda: fusion.sincos_eager(x))):
    ms = timing.time_ms(fn)
    line("sincos", name, f"{ms:.4f} ms", f"{ms / floor_ms:.3f}x floor")
t = time.time()
compiled, reason = fusion.try_compile(fusion.sincos_eager, probe)
line("sincos", "torch.compile compile time", f"{time.time() - t:.1f} s", reason)
if compiled is not None:
    timing.check_close(compiled(probe), ref, "fp32", "compiled")
    compiled(x)  # static shapes: compile for this size before timing
    ms = timing.time_ms(lambda: compiled(x))
    line("sincos", "compiled (static shapes)", f"{ms:.4f} ms", f"{ms / floor_ms:.3f}x floor")
    torch._dynamo.reset()
    dynamic = torch.compile(fusion.sincos_eager, fullgraph=True, dynamic=True)
    dynamic(probe)
    dynamic(x)
    ms = timing.time_ms(lambda: dynamic(x))
    line("sincos", "compiled (dynamic shapes)", f"{ms:.4f} ms", f"{ms / floor_ms:.3f}x floor")
    torch._dynamo.reset()
    compiled, reason = fusion.try_compile(fusion.sincos_eager, probe)
for fast in (True, False):
    for block, warps in ((1024, 4), (2048, 8)) if fast else ((1024, 4),):
        run = lambda o, xx=x: fusion.sin2_cos2_kernel[(triton.cdiv(xx.numel(), block),)](
            xx, o, xx.numel(), 1.0, BLOCK=block, FAST=fast, num_warps=warps)
        out = torch.full_like(probe, float("nan"))
        fusion.sin2_cos2_kernel[(triton.cdiv(probe.numel(), block),)](probe, out, probe.numel(), -1.0, BLOCK=block,
                                                                      FAST=fast, num_warps=warps)
        err = timing.check_close(out, fusion.reference_sincos(probe, -1.0), "fp32", "sincos b=-1")
        ms = timing.time_ms(lambda: run(y))
        line("sincos", f"triton fast={fast} BLOCK={block} warps={warps}", f"{ms:.4f} ms", f"{ms / floor_ms:.3f}x floor",
             f"err {err:.1e}")
for name, fn in (("eager", lambda: fusion.sincos_eager(probe)), ("compiled", lambda: compiled(probe)),
                 ("triton", lambda: fusion.sin2_cos2(probe)), ("copy", lambda: torch.empty_like(probe).copy_(probe))):
    if name == "compiled" and compiled is None:
        continue
    names = fusion.launched_kernels(fn)
    line("profiler", name, len(names), fusion.summarize_kernels(names))
    for full in dict.fromkeys(name for name, _ in names):
        print("    full name:", full[:300])
del x, y
torch.cuda.empty_cache()
print(f"[{time.time() - T0:.0f} s]", flush=True)

# --- chain ----------------------------------------------------------------------------------------
n = 256 * MiB // 4
x = timing.random_tensor((n,), "fp32")
y = torch.empty_like(x)
mem_ms = 2 * n * 4 / (bw * 1e12) * 1e3
for block, warps in ((1024, 4), (2048, 4), (4096, 8)):
    for ops in (1, 32, 64, 128, 256):
        grid = (triton.cdiv(n, block),)
        ms = timing.time_ms(lambda: fusion.affine_chain_kernel[grid](x, y, n, ops, fusion.A, fusion.B, BLOCK=block,
                                                                    UNROLL=fusion.UNROLL, num_warps=warps))
        comp = fusion.chain_compute_ms(n, ops, target)
        pred = fusion.model_ms(2 * n * 4, 1, target, comp)
        line("chain", f"triton BLOCK={block} warps={warps} ops={ops}", f"{ms:.4f} ms", f"model {pred:.4f}",
             f"err {100 * (ms - pred) / pred:+.1f}%", f"{timing.tflops(2.0 * n * ops, ms):.1f} TFLOP/s")
for ops in (1, 4, 16):
    ms = timing.time_ms(lambda: fusion.chain_eager(x, ops))
    pred = ops * fusion.model_ms(2 * n * 4, 1, target)
    line("chain", f"eager ops={ops}", f"{ms:.4f} ms", f"model {pred:.4f}", f"err {100 * (ms - pred) / pred:+.1f}%")
del x, y
torch.cuda.empty_cache()
print(f"[{time.time() - T0:.0f} s]", flush=True)

# --- softmax --------------------------------------------------------------------------------------
for n_cols in (16384, 32768, 65536):
    rows = 256 * MiB // (4 * n_cols)
    x = timing.random_tensor((rows, n_cols), "fp32")
    y = torch.empty_like(x)
    p = timing.random_tensor((5, n_cols - 1), "fp32")
    pref = fusion.reference_softmax(p)
    floor = 2 * x.numel() * 4 / (bw * 1e12) * 1e3
    configs = [(n_cols, 1, w) for w in (16, 32)] if n_cols <= 32768 else []
    configs += [(c, n_cols // c, w) for c in (4096, 8192, 16384) if c < n_cols for w in (8, 16, 32)]
    for block, chunks, warps in configs:
        po = torch.full_like(p, float("nan"))
        fusion.online_softmax_kernel[(p.shape[0],)](p, po, p.shape[1], p.stride(0), po.stride(0), BLOCK=block,
                                                     CHUNKS=triton.cdiv(p.shape[1], block), num_warps=warps)
        timing.check_close(po, pref, "fp32", "softmax")
        ms = timing.time_ms(lambda: fusion.online_softmax_kernel[(rows,)](x, y, n_cols, x.stride(0), y.stride(0),
                                                                          BLOCK=block, CHUNKS=chunks, num_warps=warps))
        line("softmax", f"cols={n_cols} triton BLOCK={block} CHUNKS={chunks} warps={warps}", f"{ms:.4f} ms",
             f"{timing.tbps(2 * x.numel() * 4, ms) / bw:.3f}x copy")
    ms = timing.time_ms(lambda: fusion.online_softmax(x, y))
    line("softmax", f"cols={n_cols} lab default {fusion.softmax_config(n_cols)}", f"{ms:.4f} ms",
         f"{timing.tbps(2 * x.numel() * 4, ms) / bw:.3f}x copy", f"{ms / floor:.2f}x floor")
    del x, y
    torch.cuda.empty_cache()
print(f"[{time.time() - T0:.0f} s]", flush=True)

# --- recomputation: the forward kernels alone, against the model's memory and SFU terms --------------
for dtype in ("fp32", "bf16"):
    n = 1024 * MiB // timing.element_bytes(dtype)
    x = timing.random_tensor((n,), dtype)
    for store, (accesses, sigmoids) in ((True, recompute.KERNELS["stored"][0]), (False, recompute.KERNELS["recomputed"][0])):
        ms = timing.time_ms(lambda: recompute.sigmoid3_forward(x, store))
        pred, bound = recompute.kernel_ms(accesses, sigmoids, 1024 * MiB, dtype, target)
        line("recompute", dtype, f"forward store={store}", f"{ms:.4f} ms", f"model {pred:.4f} ({bound})")
    del x
    torch.cuda.empty_cache()
print(f"[{time.time() - T0:.0f} s] done", flush=True)
