"""Time the Gluon FlashAttention-3 backward (labs/attention/gluon_fa3_bwd.py) beside cuDNN and our Triton backward.

    SEQS=2048,8192 DIMS=64,128 python3 scripts/gluon_fa3_bwd_check.py      (on a Hopper GPU, about a minute)

Correctness is tests/test_gluon_fa3_bwd.py's (float64 on odd shapes). Per case (batch 4, 16 heads, bf16):
cuDNN's forward and its backward (its forward+backward less its forward), the Gluon backward and the Triton
backward from the same saved output and log-sum-exp, the Gluon forward, and the training call through autograd
(gluon_attention_train: the Gluon forward writes the log-sum-exp, the Gluon backward reads it) against cuDNN's
forward+backward, both through torch.autograd.grad as the lab times them. Triton's do_bench medians.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from labs.attention import kernels  # noqa: E402
from labs.attention.gluon_fa3 import gluon_attention  # noqa: E402
from labs.attention.gluon_fa3_bwd import gluon_attention_backward, gluon_attention_train  # noqa: E402
from labs.attention.naive import sdpa  # noqa: E402


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_case(d, causal, n, b=4, h=16):
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q4, k4, v4, scale = kernels._prepare(q, k, v, None)
    cfg = kernels.default_config(d, q.dtype, q.device, causal=causal, seq_len=n, batch_heads=b * h, mode="fwd+bwd")
    out, lse = kernels._forward(q4, k4, v4, causal, scale, cfg)
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))

    def cudnn_fwd():
        with torch.no_grad():
            return sdpa(q, k, v, causal, "sdpa-cudnn")

    # both passes as the lab times them: torch.autograd.grad (.backward() would also add the gradients into .grad)
    def cudnn_fwd_bwd():
        torch.autograd.grad(sdpa(qg, kg, vg, causal, "sdpa-cudnn"), (qg, kg, vg), do)

    def gluon_train():
        torch.autograd.grad(gluon_attention_train(qg, kg, vg, causal), (qg, kg, vg), do)

    t_cf, t_cfb = bench(cudnn_fwd), bench(cudnn_fwd_bwd)
    t_gb = bench(lambda: gluon_attention_backward(q, k, v, out, do, lse, causal))
    t_tb = bench(lambda: kernels._backward(q4, k4, v4, out, lse, do, causal, scale, cfg))
    t_gf, t_train = bench(lambda: gluon_attention(q, k, v, causal)), bench(gluon_train)
    t_cb = t_cfb - t_cf
    flops = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    print(f"d {d} {'causal' if causal else 'full  '} N {n:5d}: cuDNN fwd {t_cf:.3f} bwd {t_cb:.3f} | Gluon bwd "
          f"{t_gb:.3f} ({t_cb / t_gb:.2f}x, {2.5 * flops / t_gb / 1e9:.0f} TF/s) Triton bwd {t_tb:.3f} "
          f"({t_cb / t_tb:.2f}x) | Gluon fwd {t_gf:.3f} | training call {t_train:.3f} ms, {t_cfb / t_train:.3f}x "
          f"cuDNN fwd+bwd", flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), flush=True)
    for d in (int(s) for s in os.environ.get("DIMS", "64,128").split(",")):
        for causal in (False, True):
            for n in (int(s) for s in os.environ.get("SEQS", "2048,4096,8192,16384").split(",")):
                time_case(d, causal, n)
