"""Device-side checks and tuning for the inference lab: one call, one compact table per question.

Run on a GPU:  PYTHONPATH=$PWD python3 scripts/inference_gpu.py [sections]   (default: all)
Sections: launch, flush, skinny, attention, block. The figures go in the lab's notes; the constants
they choose (SKINNY, ATTN, LAUNCH_ALONE_MS, GRAPH_NODE_MS) live in labs/inference.py.
"""

import sys
import time
import traceback

import torch

from labs.engine import timing
from labs.engine import gpu
from labs import inference as inf

SECTIONS = sys.argv[1:] or ["launch", "flush", "skinny", "attention", "block"]
target = gpu.live_target()
bw, peak = target.ceilings.copy_tbps, target.ceilings.matmul_tflops["bf16"]
print(f"{target.name}: {target.sm_count} SMs, L2 {target.l2_bytes / 1e6:.0f} MB; ceilings {target.describe_ceilings()}, "
      f"bf16 {peak:.0f} TFLOP/s; torch {torch.__version__}", flush=True)
T0 = time.time()


def section(name):
    def wrap(fn):
        if name in SECTIONS:
            print(f"\n== {name} ({time.time() - T0:.0f} s)", flush=True)
            try:
                fn()
            except Exception:
                traceback.print_exc()
        return fn
    return wrap


@section("launch")
def launch():
    rows = {r["kernel"]: r["measured_ms"] for r in inf.measure_launch(lambda f, m: None)}
    x = torch.zeros(1, device="cuda")
    dirty = timing.time_ms(lambda: inf.touch_kernel[(1,)](x, 0))
    print(f"touch kernel alone: {1e3 * rows['alone']:.2f} us (read-flushed) {1e3 * dirty:.2f} us (timing.time_ms); "
          f"graph node: {1e3 * rows['graph-node']:.2f} us; the lab assumes {1e3 * inf.LAUNCH_ALONE_MS:.2f} and "
          f"{1e3 * inf.GRAPH_NODE_MS:.2f} us")


@section("flush")
def flush():
    """cuBLAS over M: read-flushed timing vs timing.time_ms (write-flushed), and the two weight layouts."""
    k = n = 8192
    w = timing.random_tensor((n, k), "bf16")
    wt = w.t().contiguous()  # [K, N]
    x_all = timing.random_tensor((4096, k), "bf16")
    print(f"{'M':>5} {'model us':>9} {'clean us':>9} {'do_bench':>9} {'x@W[K,N]':>9} {'err%':>6} {'TB/s':>5} {'TF/s':>5}")
    for m in [2**i for i in range(13)]:
        x = x_all[:m]
        model = inf.roofline_ms(inf.gemm_flops(m, k, n), inf.gemm_bytes(m, k, n, "bf16"), target, "bf16") + inf.LAUNCH_ALONE_MS
        clean = inf.time_ms(lambda: torch.nn.functional.linear(x, w))
        dirty = timing.time_ms(lambda: torch.nn.functional.linear(x, w))
        other = inf.time_ms(lambda: x @ wt)
        print(f"{m:5d} {1e3 * model:9.1f} {1e3 * clean:9.1f} {1e3 * dirty:9.1f} {1e3 * other:9.1f} "
              f"{100 * (clean - model) / model:6.1f} {timing.tbps(inf.gemm_bytes(m, k, n, 'bf16'), clean):5.2f} "
              f"{timing.tflops(inf.gemm_flops(m, k, n), clean):5.0f}", flush=True)


@section("skinny")
def skinny():
    k = n = 8192
    w = timing.random_tensor((n, k), "bf16")
    x_all = timing.random_tensor((64, k), "bf16")
    configs = [
        dict(BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=4, programs_per_sm=4),
        dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, programs_per_sm=4),
        dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=6, programs_per_sm=2),
        dict(BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=4, programs_per_sm=4),
        dict(BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=3, programs_per_sm=4),
        dict(BLOCK_N=16, BLOCK_K=512, num_warps=4, num_stages=3, programs_per_sm=4),
        dict(BLOCK_N=64, BLOCK_K=256, num_warps=8, num_stages=3, programs_per_sm=8),
        dict(BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=8, programs_per_sm=4),
    ]
    ms_list = (1, 8, 16, 32, 64)
    print("model us: " + " ".join(f"M={m}: {1e3 * inf.roofline_ms(inf.gemm_flops(m, k, n), inf.gemm_bytes(m, k, n, 'bf16'), target, 'bf16'):.1f}"
                                  for m in ms_list))
    for c in configs + [None]:
        cells = []
        for m in ms_list:
            x = x_all[:m]
            cfg = c or inf.skinny_config(m)
            try:
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                inf.skinny_linear(x, w, out, config=cfg)
                err = timing.rel_error(out, inf.gemm_reference(x, w))
                ms = inf.time_ms(lambda: inf.skinny_linear(x, w, out, config=cfg))
                splits = inf.skinny_splits(m, n, k, target.sm_count, cfg)[0]
                cells.append(f"M={m}: {1e3 * ms:6.1f}us {timing.tbps(inf.gemm_bytes(m, k, n, 'bf16'), ms):4.2f}TB/s s{splits}"
                             + ("" if err < 2e-2 else f" ERR {err:.2g}"))
            except Exception as exc:  # out of shared memory and the like
                cells.append(f"M={m}: {type(exc).__name__}")
        print(("default(lab) " if c is None else str(tuple(c.values()))) + " | " + " | ".join(cells), flush=True)


@section("attention")
def attention():
    p = inf.Params()
    hd = p.d_model // p.heads
    configs = {"default": inf.ATTN, "T128": inf.ATTN | {"BLOCK_T": 128},
               "pps8": inf.ATTN | {"programs_per_sm": 8, "max_splits": 128}, "T32s4": inf.ATTN | {"BLOCK_T": 32, "num_stages": 4}}
    print(f"{'B':>3} {'T':>6} {'model us':>9} " + " ".join(f"{k:>9}" for k in configs) + f" {'sdpa':>9} {'TB/s best':>9}")
    for b in (1, 8, 64):
        t_max = 32768
        kc = timing.random_tensor((b, p.kv_heads, t_max, hd), "bf16")
        vc = timing.random_tensor((b, p.kv_heads, t_max, hd), "bf16")
        q = timing.random_tensor((b, p.heads * hd), "bf16")
        for t in (512, 2048, 8192, 32768):
            flops, nbytes = inf.attention_cost(b, t, p)
            model = inf.roofline_ms(flops, nbytes, target, "bf16") + inf.LAUNCH_ALONE_MS + inf.GRAPH_NODE_MS
            cells, best = [], 1e9
            for name, cfg in configs.items():
                out = torch.full_like(q, float("nan"))
                inf.triton_decode_attention(q, kc, vc, t, out, cfg)
                c = min(b, 2)
                err = timing.rel_error(out[:c], inf.attention_reference(q[:c], kc[:c], vc[:c], t))
                ms = inf.time_ms(lambda: inf.triton_decode_attention(q, kc, vc, t, out, cfg))
                best = min(best, ms)
                cells.append(f"{1e3 * ms:9.1f}" + ("" if err < 2e-2 else "!"))
            ms = inf.time_ms(lambda: inf.sdpa_decode_attention(q, kc, vc, t))
            best = min(best, ms)
            print(f"{b:3d} {t:6d} {1e3 * model:9.1f} " + " ".join(cells) + f" {1e3 * ms:9.1f} {timing.tbps(nbytes, best):9.2f}",
                  flush=True)
        del kc, vc


@section("block")
def block():
    p = inf.Params()
    weights = inf.make_block_weights(p.block_shape, "bf16", "cuda")
    variants = [("cublas", "triton"), ("cublas", "sdpa"), ("auto", "triton")]
    print(f"{'B':>4} {'model us':>9} {'gemm':>6} {'attn':>6} {'fixed':>6} " + " ".join(f"{g + '+' + a:>13}" for g, a in variants)
          + f" {'timing.graph':>11}")
    for b in p.block_batch:
        cells = []
        for g, a in variants:
            q = inf.Params(block_gemm=g, block_attention=a)
            parts = inf.block_parts(q, b, target)
            model = parts["gemm_ms"] + parts["attention_ms"] + parts["small_ms"] + parts["fixed_ms"]
            blk = inf.DecodeBlock(q.block_shape, b, q.block_context, "bf16", "cuda", g, a, weights)
            out = torch.empty_like(blk.x)
            ms = inf.graph_time_ms(lambda: blk.step(out))
            cells.append(f"{1e3 * ms:6.1f}({100 * (ms - model) / model:+4.0f}%)")
            if (g, a) == variants[0]:
                head = (f"{b:4d} {1e3 * model:9.1f} {1e3 * parts['gemm_ms']:6.1f} {1e3 * parts['attention_ms']:6.1f} "
                        f"{1e3 * parts['fixed_ms']:6.1f} ")
                dirty = timing.graph_time_ms(lambda: blk.step(out)) if b in (1, 64) else float("nan")
            del blk
        print(head + " ".join(cells) + f" {1e3 * dirty:11.1f}", flush=True)
    print(f"done in {time.time() - T0:.0f} s")
