"""Device checks for the models of attention (naive path), inference (decode floors) and recompute (CPU floors).

Run on a GPU:  python scripts/naive_models_gpu.py [profile] [probes] [host] [decode]   (default: all)
- profile: the CUDA kernels naive attention launches (torch.profiler), forward and forward+backward, by name;
- probes: the streaming rate of torch's softmax / masked_fill / softmax backward on a 256 MiB slice of rows
  against the same op on the full (B*H, N, N) matrix (does a small probe predict the full op?);
- host: the CPU time per call, three ways, against do_bench's median, on the CPU-bound points of the labs;
- decode: decode attention's fixed cost (a one-tile context) against the small points of the inference lab.
Prints a compact table per section; with $OUT set, writes naive_models_gpu.json there.
"""
import json
import os
import statistics
import sys
import time

import torch

from devreport import Report
from labs.engine import timing

REPORT = Report("naive_models_gpu", deadline_s=220)
results, record, late = REPORT.results, REPORT.record, REPORT.late


def section_profile():
    from torch.profiler import ProfilerActivity, profile

    from labs import attention as A

    for n in (1024, 4096, 8192):
        for causal in (False, True):
            for mode in ("fwd", "fwd+bwd"):
                if late():
                    return
                q, k, v, do = (timing.random_tensor((4, 16, n, 64), "bf16") for _ in range(4))
                for t in (q, k, v):
                    t.requires_grad_()
                run = A._runner(A._impl_fn("naive", causal), mode, q, k, v, do)
                run()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    run()
                    torch.cuda.synchronize()
                kernels = {}
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        name = e.name[:60]
                        c, us = kernels.get(name, (0, 0.0))
                        kernels[name] = (c + 1, us + e.time_range.elapsed_us())
                total = sum(us for _, us in kernels.values())
                record("profile", n=n, causal=causal, mode=mode, kernels=sum(c for c, _ in kernels.values()),
                       total_ms=total / 1e3)
                for name, (c, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
                    if us > 0.01 * total:
                        print(f"    {us / 1e3:9.3f} ms x{c:<2} {name}")
                results["rows"][-1]["kernels_by_name"] = kernels
                del q, k, v, do, run
                torch.cuda.empty_cache()


PROBE_BYTES = 256 * 2**20


def _ops(s, mask, dp):
    """The row-wise and elementwise ops of naive attention on an (heads, N, N) bf16 matrix s."""
    return {"softmax": lambda: torch.softmax(s, dim=-1),
            "mask_": lambda: s.masked_fill_(~mask, float("-inf")),
            "mask_oop": lambda: dp.masked_fill(~mask, 0.0),
            "softmax_bwd": lambda: torch._softmax_backward_data(dp, s, -1, s.dtype)}


def section_probes():
    for n in (1024, 2048, 4096, 8192):
        if late():
            return
        heads_full = 64
        heads_probe = max(1, min(heads_full, PROBE_BYTES // (2 * n * n)))
        mask = torch.ones((n, n), device="cuda", dtype=torch.bool).tril_()
        row = {}
        for label, heads in (("probe", heads_probe), ("full", heads_full)):
            s = torch.softmax(timing.random_tensor((heads, n, n), "bf16"), dim=-1)
            dp = timing.random_tensor((heads, n, n), "bf16")
            for name, fn in _ops(s, mask, dp).items():
                ms = timing.time_ms(fn, warmup_ms=5, rep_ms=25)
                passes = 3 if name == "softmax_bwd" else 2
                row[f"{name}_{label}_tbps"] = passes * heads * n * n * 2 / (ms * 1e-3) / 1e12
            del s, dp
            torch.cuda.empty_cache()
        record("probes", n=n, heads_probe=heads_probe, **row)


def host_mean(fn, kernels):  # labs.fusion.host_ms_per_call
    from labs.fusion import host_ms_per_call

    return host_ms_per_call(fn, kernels)


def host_median(fn, calls=10, batches=7):
    """Median over batches of back-to-back calls (sync before each batch, none inside)."""
    fn()
    timing.sync()
    samples = []
    for _ in range(batches):
        timing.sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e3)
    timing.sync()
    return statistics.median(samples), min(samples)


def section_host():
    from labs import attention as A
    from labs import recompute as R

    cases = []
    for dtype in ("fp32", "bf16"):
        for size in (16, 64):
            n = size * 2**20 // timing.element_bytes(dtype)
            x = timing.random_tensor((n,), dtype).requires_grad_(True)
            dout = timing.random_tensor((n,), dtype)
            for variant, forward in R.VARIANTS.items():
                cases.append((f"rc {dtype} {size} {variant}", len(R.KERNELS[variant]),
                              (lambda f=forward, x=x, d=dout: R.forward_backward(f, x, d))))
    q, k, v, do = (timing.random_tensor((4, 16, 1024, 64), "bf16") for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    for causal in (False, True):
        for mode in ("fwd", "fwd+bwd"):
            cases.append((f"attn ours {mode} causal={causal}", A.OUR_KERNELS[mode],
                          A._runner(A._impl_fn("ours", causal), mode, q, k, v, do)))
    for label, kernels, fn in cases:
        if late():
            return
        fn()
        timing.sync()
        measured = [timing.time_ms(fn) for _ in range(2)]
        means = [host_mean(fn, kernels) for _ in range(2)]
        med, mn = host_median(fn)
        record("host", case=label, do_bench_ms=measured[0], do_bench2_ms=measured[1], host_mean_ms=means[0],
               host_mean2_ms=means[1], host_median_ms=med, host_min_ms=mn)


def section_decode():
    from labs import inference as I

    p = I.Params()
    hd = p.d_model // p.heads
    for kernel in ("triton", "sdpa"):
        for batch, context in ((1, 64), (1, 512), (1, 2048), (8, 64), (8, 512), (64, 64), (64, 512)):
            if late():
                return
            kc = timing.random_tensor((batch, p.kv_heads, context, hd), "bf16")
            vc = timing.random_tensor((batch, p.kv_heads, context, hd), "bf16")
            q = timing.random_tensor((batch, p.heads * hd), "bf16")
            out = torch.empty_like(q)
            fn = lambda: I.attention(q, kc, vc, context, kernel, out)  # noqa: E731
            fn()
            clean = [I.time_ms(fn) for _ in range(2)]
            graph = I.graph_time_ms(fn)
            dob = timing.time_ms(fn)
            _, nbytes = I.attention_cost(batch, context, p)
            record("decode", kernel=kernel, batch=batch, context=context, clean_us=1e3 * clean[0],
                   clean2_us=1e3 * clean[1], graph_us=1e3 * graph, do_bench_us=1e3 * dob,
                   bytes_us=nbytes / 3.0e12 * 1e6)  # at an H100's 3.0 TB/s
    x = torch.zeros(4096, device="cuda")
    touch = lambda: I.touch_kernel[(1,)](x, 0)  # noqa: E731
    record("decode", kernel="touch", clean_us=1e3 * I.time_ms(touch), do_bench_us=1e3 * timing.time_ms(touch))


SECTIONS = {"profile": section_profile, "probes": section_probes, "host": section_host, "decode": section_decode}

if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    REPORT.run_sections(SECTIONS, sys.argv[1:] or list(SECTIONS))
