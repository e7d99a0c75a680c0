"""
The matmul ladder's CUDA-core rungs, modelled: naive, shared-memory tiled, warp-tiled
======================================================================================

Pure arithmetic (no GPU): how many L1 wavefronts each rung of the ladder pays per multiply-add, what the
warp-tiled kernel's levels (L2, shared memory, registers) allow, and the numbers the lessons quote. The ladder
lab (labs/matmul_ladder/) predicts its rows with these; the Matmul lesson ("Why tiling alone is not enough") and
the Hopper lesson quote them, which is why they live here, below all three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labs.engine import timing
from labs.engine.gpu import Target, sm_shape
from labs.matmul.configs import DEFAULT_CONFIGS
from labs.matmul.model import FIXED_US, L1_BYTES_PER_CLOCK, clock_hz, l2_tbps

NAIVE_BLOCK = 16  # the naive kernel's 16 x 16 thread blocks


@dataclass(frozen=True)
class WarpTile:
    """The warp-tiled kernel's shape (labs/matmul_ladder/matmul.cu, namespace warptile)."""

    block_m: int = 128  # block tile of C
    block_n: int = 128
    block_k_fp32: int = 8  # K slice per shared-memory buffer for fp32 inputs (16 for 16-bit inputs)
    thread_m: int = 8  # outputs per thread (registers)
    thread_n: int = 8
    threads: int = 256
    min_blocks: int = 2  # __launch_bounds__ minimum blocks per SM (caps registers at 128 per thread)

    def block_k(self, dtype: str) -> int:
        return self.block_k_fp32 if timing.element_bytes(dtype) == 4 else 16
    lds_per_k: int = 4  # 16-byte shared loads per thread per k: 2 for A, 2 for B
    wavefronts_per_k: int = 4  # shared-memory wavefronts per warp per k (same-address lanes are broadcast)


WARP = WarpTile()


def warptile_overhead_per_slice(dtype: str) -> int:
    """Instructions per thread per K slice besides the FMAs and shared loads, counted from the kernel:
    16-byte global loads, stores into shared memory (A transposed: one per element; B: 16-byte
    stores), conversions of 16-bit inputs to float, one barrier, and ~8 for addresses and the loop."""
    e = timing.element_bytes(dtype)
    w = 16 // e  # elements per 16-byte load
    bk = WARP.block_k(dtype)
    per_thread = (WARP.block_m + WARP.block_n) * bk // WARP.threads  # elements fetched per slice
    loads = per_thread // w
    stores = WARP.block_m * bk // WARP.threads + WARP.block_n * bk // WARP.threads // 4
    converts = per_thread if e < 4 else 0
    return loads + stores + converts + 1 + 8


def sustained_fp32_tflops(target: Target) -> tuple:
    """(TFLOP/s, where it comes from): the rate FP32 multiply-adds keep up inside a long matrix product.

    The FMA ceiling is measured by a short kernel of nothing but FMAs. A matrix product on the CUDA cores
    runs for milliseconds with every FP32 lane, the register file and shared memory busy, and stops well
    short of that (cuBLAS's own FP32 matmul near four fifths of the FMA ceiling on an H100 and an H200).
    Where this GPU's FP32 cuBLAS rate has been measured (calibration), it is the better ceiling for a
    CUDA-core matmul; else the FMA ceiling."""
    fma = target.ceilings.fma_tflops
    sgemm = target.ceilings.matmul_tflops.get("fp32")
    if sgemm and sgemm < fma:
        return sgemm, "the measured FP32 cuBLAS rate (a long CUDA-core matmul)"
    return fma, "the FP32 FMA ceiling"


def warptile_levels(n: int, dtype: str, target: Target) -> list[dict]:
    """Arithmetic intensity and time of the warp-tiled kernel at each level it reads from.

    - global: a block reads (BM + BN) BK inputs per slice for 2 BM BN BK FLOPs; served by the L2;
    - shared: a thread reads TM + TN floats per k for 2 TM TN FLOPs (requested bytes); lanes that
      ask for the same address are served once, so the wavefronts move fewer bytes than requested;
    - registers: every FMA reads three 4-byte registers; the register file feeds every FP32 lane
      each clock, so this level's time is the FMA rate's, as sustained in a long matmul.
    """
    e = timing.element_bytes(dtype)
    flops = 2.0 * n**3
    clock = clock_hz(target)
    w = WARP
    global_bytes = n**3 * e * (1 / w.block_m + 1 / w.block_n)
    warp_ks = n**3 / (32 * w.thread_m * w.thread_n)  # (warp, k) pairs in all
    shared_requested = warp_ks * 32 * (w.thread_m + w.thread_n) * 4
    shared_served = warp_ks * w.wavefronts_per_k * L1_BYTES_PER_CLOCK
    l2, l2_source = l2_tbps(target)
    smem_tbps = target.sm_count * L1_BYTES_PER_CLOCK * clock / 1e12
    reg_bytes = n**3 * 3 * 4
    fma_tflops, fma_source = sustained_fp32_tflops(target)
    return [
        {"level": "global (L2)", "bytes": global_bytes, "intensity_flop_per_byte": flops / global_bytes,
         "bandwidth_tbps": l2, "time_ms": global_bytes / (l2 * 1e12) * 1e3, "source": l2_source},
        {"level": "shared memory", "bytes": shared_requested, "intensity_flop_per_byte": flops / shared_requested,
         "bandwidth_tbps": smem_tbps, "time_ms": shared_served / (smem_tbps * 1e12) * 1e3,
         "source": f"{L1_BYTES_PER_CLOCK} B per clock per SM; {shared_served / 1e9:.1f} GB served after broadcasts"},
        {"level": "registers (FMA)", "bytes": reg_bytes, "intensity_flop_per_byte": flops / reg_bytes,
         "bandwidth_tbps": reg_bytes / (flops / (fma_tflops * 1e12)) / 1e12,
         "time_ms": flops / (fma_tflops * 1e12) * 1e3, "source": fma_source},
    ]


def predict_warptile(n: int, dtype: str, target: Target) -> dict:
    """The slowest level, or the issue slots: every thread issues 64 FMAs, 4 shared loads and its share
    of the slice's overhead per k, and an SM issues 4 warp instructions per clock while its FP32 lanes
    finish 4 warp FMAs per clock; then the tiles' last wave."""
    levels = {r["level"]: r["time_ms"] * 1e-3 for r in warptile_levels(n, dtype, target)}
    fmas_per_k = WARP.thread_m * WARP.thread_n
    per_k = fmas_per_k + WARP.lds_per_k + warptile_overhead_per_slice(dtype) / WARP.block_k(dtype)
    issue_s = levels["registers (FMA)"] * per_k / fmas_per_k
    tiles = math.ceil(n / WARP.block_m) * math.ceil(n / WARP.block_n)
    slots = target.sm_count * WARP.min_blocks
    wave_util = tiles / (math.ceil(tiles / slots) * slots)
    bound_s = max(issue_s, levels["shared memory"], levels["global (L2)"])
    total = bound_s / wave_util + FIXED_US * 1e-6
    bound = "FMA issue" if bound_s == issue_s else ("shared memory" if bound_s == levels["shared memory"] else "L2")
    return {"predicted_ms": total * 1e3, "predicted_tflops": 2.0 * n**3 / total / 1e12, "bound": bound,
            "wave_util": wave_util}


def requested_bytes(kernel: str, n: int, dtype: str) -> float:
    """Bytes the kernel asks global memory for (cache hits included). Naive: each of the N^2 threads
    reads a row of A and a column of B, so 2 N^3 elements; tiled: N / TILE times less."""
    e = timing.element_bytes(dtype)
    if kernel == "naive":
        return 2.0 * n**3 * e
    if kernel.startswith("tiled"):
        return 2.0 * n**3 * e / int(kernel[len("tiled"):])
    if kernel == "warptiled":  # each block reads its row panel of A and column panel of B once
        return n**3 * e * (1 / WARP.block_m + 1 / WARP.block_n)
    if kernel == "triton":
        cfg = DEFAULT_CONFIGS[dtype]
        return float(n * n * e * (math.ceil(n / cfg.block_n) + math.ceil(n / cfg.block_m)))
    return float("nan")


def wavefronts_per_fma(kernel: str, dtype: str = "fp32") -> float:
    """L1 wavefronts (128-byte passes of the SM's L1/shared-memory pipeline) per warp-wide FMA.

    A warp instruction costs one wavefront for every 128-byte line its 32 addresses touch (lanes that ask
    for the same address are served together), and the pipeline handles one wavefront per clock.
    Naive (16 x 16 blocks, so a warp covers 2 rows of C and 16 columns): per multiply-add, a load of A
    touches 2 lines (one per row, each a single element) and a load of B one (16 neighbouring elements).
    Tiled (TILE x TILE blocks; a warp covers max(1, 32 / TILE) rows): per k, one shared load of Bs (a row
    segment, 1 wavefront) and a quarter of a 16-byte shared load of As (the compiler reads 4 consecutive k
    of a row at once; such a load costs 2 wavefronts); once per TILE steps, a global load of A and one of
    B (one line per row the warp covers) and two shared stores (1 each). Hardware counters on an H100
    saw 3.00, 3.01, 1.92 and 1.64 wavefronts per warp-wide FMA for
    naive and TILE = 8, 16, 32, against 3, 2.75, 1.875 and 1.625 counted here (the global loads of the
    small tiles cost a little more than one wavefront per line)."""
    e = timing.element_bytes(dtype)
    if kernel == "naive":
        rows = 32 // NAIVE_BLOCK
        return rows + math.ceil(NAIVE_BLOCK * e / 128)
    tile = int(kernel[len("tiled"):])
    rows = max(1, 32 // tile)
    return 1.0 + 2 / 4 + (2 * rows + 2) / tile


def predict_cuda(kernel: str, n: int, dtype: str, target: Target) -> dict:
    """Time = the larger of the FMA work on the CUDA cores and the L1 wavefronts of the loads and stores
    (one per clock per SM), plus the fixed cost of a launch."""
    shape = sm_shape(target.compute_capability)
    clock = clock_hz(target)
    warp_fmas = n**3 / 32  # warp-wide multiply-adds in all
    fma_s = n**3 / (target.sm_count * shape.fp32_lanes * clock)
    load_s = warp_fmas * wavefronts_per_fma(kernel, dtype) / (target.sm_count * clock)
    total = max(fma_s, load_s) + FIXED_US * 1e-6
    return {"predicted_ms": total * 1e3, "predicted_tflops": 2.0 * n**3 / total / 1e12,
            "bound": "L1 wavefronts" if load_s > fma_s else "FMA"}



def lesson_numbers(target: Target) -> dict:
    """The ladder's numbers for the lessons (the Matmul lesson prefixes them ladder_, the Hopper lesson takes warp_*)."""
    n = 4096
    naive = predict_cuda("naive", n, "fp32", target)
    tiled = predict_cuda("tiled32", n, "fp32", target)
    warp = predict_warptile(n, "fp32", target)
    levels = {r["level"]: r for r in warptile_levels(n, "fp32", target)}
    return {
        "warp_tflops": f"{warp['predicted_tflops']:.1f}",
        "warp_pct_of_fma": f"{100 * warp['predicted_tflops'] / target.ceilings.fma_tflops:.0f}",
        "warp_global_intensity": f"{levels['global (L2)']['intensity_flop_per_byte']:.0f}",
        "warp_shared_intensity": f"{levels['shared memory']['intensity_flop_per_byte']:.0f}",
        "gpu": target.name,
        "fma_tflops": f"{target.ceilings.fma_tflops:.1f}",
        "naive_tflops": f"{naive['predicted_tflops']:.1f}",
        "tiled_tflops": f"{tiled['predicted_tflops']:.1f}",
        "naive_request_tbps": f"{timing.tbps(requested_bytes('naive', n, 'fp32'), naive['predicted_ms']):.0f}",
        "copy_tbps": f"{target.ceilings.copy_tbps:.2f}",
    }
