"""Check and time the Gluon FlashAttention-3 backward (labs/attention/gluon_fa3_bwd.py) on one GPU.

    PART=check python3 scripts/gluon_fa3_bwd_check.py   (float64 on odd shapes, d 64 and 128, causal and not)
    PART=time SEQS=2048,8192 python3 scripts/gluon_fa3_bwd_check.py
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from labs.attention import kernels  # noqa: E402
from labs.attention.gluon_fa3 import gluon_attention  # noqa: E402
from labs.attention.gluon_fa3_bwd import gluon_attention_backward  # noqa: E402
from labs.attention.naive import reference, sdpa  # noqa: E402

ODD = ((1, 2, 1000, 1000), (2, 1, 333, 333), (1, 2, 333, 1000), (1, 1, 1000, 333), (1, 1, 128, 128))


def forward_with_lse(q, k, v, causal):
    q4, k4, v4, scale = kernels._prepare(q, k, v, None)
    cfg = kernels.default_config(q.shape[-1], q.dtype, q.device, causal=causal)
    return kernels._forward(q4, k4, v4, causal, scale, cfg)


def check():
    worst = 0.0
    for d in (64, 128):
        for causal in (False, True):
            for b, h, lq, lk in ODD:
                torch.manual_seed(lq + lk + d)
                q = torch.randn(b, h, lq, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, h, lk, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, h, lk, d, device="cuda", dtype=torch.bfloat16)
                do = torch.randn(b, h, lq, d, device="cuda", dtype=torch.bfloat16)
                out, lse = forward_with_lse(q, k, v, causal)
                dq, dk, dv = gluon_attention_backward(q, k, v, out, do, lse, causal)
                torch.cuda.synchronize()
                qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
                ref, _ = reference(qr, kr, vr, causal)
                ref.backward(do.double())
                errs = []
                for name, ours, truth in (("dq", dq, qr.grad), ("dk", dk, kr.grad), ("dv", dv, vr.grad)):
                    err = ((ours.double() - truth).abs().max() / truth.abs().max().clamp_min(1e-12)).item()
                    errs.append(f"{name} {err:.2e}")
                    worst = max(worst, err if err == err else float("inf"))
                print(f"d {d} {'causal' if causal else 'full  '} {b}x{h} Lq {lq} Lk {lk}: " + ", ".join(errs), flush=True)
    print(f"worst relative error {worst:.2e}: {'PASS' if worst < 2e-2 else 'FAIL'}", flush=True)


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_all():
    seqs = [int(s) for s in os.environ.get("SEQS", "2048,4096,8192,16384").split(",")]
    dims = [int(s) for s in os.environ.get("DIMS", "64,128").split(",")]
    b, h = 4, 16
    for d in dims:
        for causal in (False, True):
            for n in seqs:
                torch.manual_seed(n)
                q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                out, lse = forward_with_lse(q, k, v, causal)
                flops = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
                qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))

                def cudnn_fwd():
                    with torch.no_grad():
                        return sdpa(q, k, v, causal, "sdpa-cudnn")

                def cudnn_fwdbwd():
                    o = sdpa(qg, kg, vg, causal, "sdpa-cudnn")
                    o.backward(do)
                t_cf, t_cfb = bench(cudnn_fwd), bench(cudnn_fwdbwd)
                t_gf = bench(lambda: gluon_attention(q, k, v, causal))
                t_gb = bench(lambda: gluon_attention_backward(q, k, v, out, do, lse, causal))
                q4, k4, v4, scale = kernels._prepare(q, k, v, None)
                cfg = kernels.default_config(d, q.dtype, q.device, causal=causal, seq_len=n, batch_heads=b * h,
                                             mode="fwd+bwd")
                t_tb = bench(lambda: kernels._backward(q4, k4, v4, out, lse, do, causal, scale, cfg))
                t_cb = t_cfb - t_cf
                print(f"d {d} {'causal' if causal else 'full  '} N {n:5d}: cuDNN fwd {t_cf:.3f} bwd {t_cb:.3f} | "
                      f"Gluon bwd {t_gb:.3f} ({t_cb / t_gb:.2f}x, {2.5 * flops / t_gb / 1e9:.0f} TF/s) "
                      f"Triton bwd {t_tb:.3f} ({t_cb / t_tb:.2f}x) | Gluon fwd {t_gf:.3f} | fwd+bwd "
                      f"{t_cfb / (t_gf + t_gb):.3f}x cuDNN", flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), flush=True)
    check() if os.environ.get("PART", "check") == "check" else time_all()
