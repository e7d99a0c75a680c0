"""Device-side tuning of the roofline kernel: time both ends of the sweep for several launch shapes.

Run on a GPU: python scripts/tune_roofline.py  (prints a table; numbers go in the issue note)
"""
import torch
import triton

from labs import roofline
from labs.engine import timing
from labs.engine.gpu import MiB

n = 1024 * MiB // 4
x = timing.random_tensor((n,), "fp32")
y = torch.empty_like(x)
copy_ms = timing.time_ms(lambda: y.copy_(x))
print(f"torch copy: {timing.tbps(2 * n * 4, copy_ms):.3f} TB/s")
for block, warps in [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)]:
    row = []
    for flops in (1, 2, 8192):
        fmas, extra = divmod(flops, 2)
        grid = (triton.cdiv(n, block),)
        run = lambda: roofline.fma_chain_kernel[grid](x, y, n, -1.0, 0.5, FMAS=fmas, EXTRA_MUL=bool(extra),
                                                       BLOCK=block, UNROLL=8, num_warps=warps)
        run()
        timing.check_close(y, roofline.reference(x, flops), "fp32", "chain")
        ms = timing.time_ms(run)
        row.append(f"F={flops}: {timing.tbps(8 * n, ms):.3f} TB/s {timing.tflops(n * flops, ms):6.2f} TF/s")
    print(f"BLOCK={block:5d} warps={warps:2d} | " + " | ".join(row), flush=True)
