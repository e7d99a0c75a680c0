"""One GPU call that tells whether the Hopper lab's Gluon warp-specialized matmul works, and how fast it is.

    python3 scripts/gluon_ws_check.py            (about a minute on an H100; each variant in its own process)

For each variant (the lab's step 7 first, then a few neighbours): compile (the full exception if it fails), check
against float64 on odd shapes (M, N, K not multiples of the tile; several tiles per program), then time at
N = 4096 and 8192 bf16 beside cuBLAS in the same process. Step 6 (Triton's persistent TMA kernel) is measured too,
with the PTX instruction families that tell the two apart. A variant that hangs (a barrier never completing) is
killed after VARIANT_TIMEOUT_S and said so; variants stop being tried after BUDGET_S. With $OUT set, the PTX of
steps 6 and 7 is written there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VARIANT_TIMEOUT_S, BUDGET_S = 40, 85
SIZES = (4096, 8192)
ODD_SHAPES = ((517, 528, 560, 3), (333, 344, 136, 2), (1000, 1000, 1000, None))  # M, N, K, programs (None: SMs)
# name -> (block, stages, num_warps, producer registers, tile order); the first is the lab's step 7
VARIANTS = {
    "lab step 7: 128x256x64 s3 w8 r24 hilbert": ((128, 256, 64), 3, 8, 24, "hilbert"),
    "128x256x64 s3 w8 r40 hilbert": ((128, 256, 64), 3, 8, 40, "hilbert"),
    "128x256x64 s3 w8 r40 grouped": ((128, 256, 64), 3, 8, 40, "grouped"),
    "128x128x64 s4 w4 r40 hilbert": ((128, 128, 64), 4, 4, 40, "hilbert"),
    "128x128x64 s4 w8 r40 hilbert": ((128, 128, 64), 4, 8, 40, "hilbert"),
}
STEP6 = "triton step 6 (persistent TMA, no warp specialization)"


def say(*parts) -> None:
    print(*parts, flush=True)


def launcher(name: str, a, b, out, programs=None):
    """launch() for a variant (Gluon) or for step 6 (Triton), at the given programs (None: one per SM)."""
    import triton

    from labs.hopper import gluon_ws, kernels, model

    if name == STEP6:
        return kernels.prepare(a, b, out, model.STEPS["6 Hilbert order"], programs=programs)
    block, stages, warps, regs, order = VARIANTS[name]
    tiles_m, tiles_n = triton.cdiv(a.shape[0], block[0]), triton.cdiv(b.shape[1], block[1])
    table = kernels.order_table(order, tiles_m, tiles_n, a.device)
    programs = min(tiles_m * tiles_n, programs or kernels.sm_count(a.device))
    return gluon_ws.prepare_gluon_ws(a, b, out, table, programs, block, stages, warps, regs)


def ptx_summary(compiled) -> str:
    from labs.hopper.measure import instruction_summary

    counts = instruction_summary(compiled)
    keys = ("ptx_setmaxnreg", "ptx_mbarrier_arrive", "ptx_wgmma", "ptx_cp_async_bulk_tensor", "sass_USETMAXREG")
    return (f"warps {compiled.metadata.num_warps}, shared {compiled.metadata.shared} B, "
            + ", ".join(f"{k} {counts.get(k)}" for k in keys))


def run_variant(name: str) -> None:
    """In a child process: compile, check, time. Prints as it goes."""
    import torch

    from labs.engine import timing
    from labs.hopper.gluon_support import device_capability, unavailable_reason
    from labs.hopper.measure import reference
    from labs.matmul.kernels import cublas_matmul
    from labs.matmul.measure import check_sampled

    reason = unavailable_reason(device_capability("cuda")) if name != STEP6 else None
    if reason or not torch.cuda.is_available():
        say(f"  cannot run here: {reason or 'no CUDA GPU'}")
        return
    for m, n, k, programs in ODD_SHAPES:
        a, b = timing.random_tensor((m, k), "bf16", "cuda"), timing.random_tensor((k, n), "bf16", "cuda")
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        started = time.monotonic()
        try:
            compiled = launcher(name, a, b, out, programs)()
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - the whole text, so the next try can be fixed
            say(f"  COMPILE/LAUNCH FAILED at {m}x{n}x{k}:\n{traceback.format_exc()}")
            return
        try:
            err = timing.check_close(out, reference(a, b), "bf16", name)
            say(f"  correct at {m}x{n}x{k} (programs {programs or 'SMs'}): rel error {err:.2e}"
                f" ({time.monotonic() - started:.1f} s incl. compile)")
        except timing.KernelMismatch as exc:
            say(f"  WRONG at {m}x{n}x{k}: {exc}")
            return
    say(f"  {ptx_summary(compiled)}")
    if os.environ.get("OUT") and name in (STEP6, next(iter(VARIANTS))):
        Path(os.environ["OUT"], "step6.ptx" if name == STEP6 else "step7.ptx").write_text(compiled.asm["ptx"])
    for size in SIZES:
        a, b = timing.random_tensor((size, size), "bf16", "cuda"), timing.random_tensor((size, size), "bf16", "cuda")
        out = torch.empty((size, size), device="cuda", dtype=torch.bfloat16)
        launch = launcher(name, a, b, out)
        launch()
        check_sampled(out, a, b, "bf16", f"{name} N={size}")
        short = lambda fn: timing.time_ms(fn, 10, 60)  # noqa: E731 - the lab's rule, shortened
        ms = timing.graph_time_ms(launch, timer=short)
        cublas_ms = timing.graph_time_ms(lambda: cublas_matmul(a, b, "bf16", out), timer=short)
        tflops, cublas = timing.tflops(2.0 * size**3, ms), timing.tflops(2.0 * size**3, cublas_ms)
        say(f"  N={size}: {tflops:7.1f} TFLOP/s   cuBLAS {cublas:7.1f}   ratio {tflops / cublas:.3f}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--variant":
        run_variant(sys.argv[2])
        return
    import torch
    import triton

    say(f"torch {torch.__version__}, triton {triton.__version__}, "
        f"GPU {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
    from labs.hopper.gluon_support import gluon_missing

    say(f"Gluon features: {gluon_missing() or 'all present'}")
    started = time.monotonic()
    for name in (*VARIANTS, STEP6):
        if time.monotonic() - started > BUDGET_S:
            say(f"== {name}: skipped (budget)")
            continue
        say(f"== {name}")
        try:
            subprocess.run([sys.executable, __file__, "--variant", name], timeout=VARIANT_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            say(f"  KILLED after {VARIANT_TIMEOUT_S} s: a hang (an mbarrier never completed?) or a slow compile")
    say(f"total {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
