"""
The matmul ladder: from one thread per output to cuBLAS
=======================================================

What you will learn:
- the naive kernel (one thread per element of C) asks global memory for every input element N times;
- shared-memory tiling (TILE x TILE tiles copied once per step) cuts those requests to N / TILE, yet
  changes the time far less: the re-reads of the naive kernel already hit in the L1/L2 caches, and both
  kernels need two operand loads per multiply-add, each at least one pass (wavefront) of the SM's
  L1/shared-memory pipeline, which makes one pass per clock;
- warp tiling with register blocking: each thread keeps an 8 x 8 block of C in registers, so every
  value it reads from shared memory (16 bytes at a time) feeds 8 multiply-adds, and each block reads
  128-bit vectors from global memory: the arithmetic intensity of every level (global, shared,
  registers) rises until the FMA units, not the loads, set the pace;
- what is left between that and the library: the tensor cores (the Triton kernel of labs/matmul.py);
- each rung as a share of cuBLAS at one size and dtype.

The kernels: naive, tiled and warp-tiled CUDA C++ (labs/cuda/matmul.cu, built with torch's load_inline,
FP32 arithmetic on the CUDA cores for every input dtype), the Triton kernel of the matmul lab, and cuBLAS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from labs import matmul
from labs.engine import timing
from labs.engine import cuda
CUDA_DIR = __import__("pathlib").Path(__file__).resolve().parent
from labs.engine.gpu import Target, free_memory_bytes
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

CUDA_DTYPES = ("fp32", "tf32", "fp16", "bf16")
NAIVE_BLOCK = 16  # the naive kernel's 16 x 16 thread blocks


# ---------------------------------------------------------------------------------------------
# The kernels (CUDA C++ in labs/cuda/matmul.cu; Triton and cuBLAS from labs/matmul.py)
# ---------------------------------------------------------------------------------------------
def extension():
    """The compiled CUDA kernels (built once per machine, then cached by torch)."""
    return cuda.build("roofline_matmul_ladder", CUDA_DIR / "matmul.cu",
                      "void matmul_naive(torch::Tensor a, torch::Tensor b, torch::Tensor c);\n"
                      "void matmul_tiled(torch::Tensor a, torch::Tensor b, torch::Tensor c, int64_t tile);\n"
                      "void matmul_warptile(torch::Tensor a, torch::Tensor b, torch::Tensor c, int64_t min_blocks);\n",
                      ("matmul_naive", "matmul_tiled", "matmul_warptile"))


def cuda_matmul(kernel: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                min_blocks: int = 0) -> torch.Tensor:
    """Run 'naive', 'tiledT' or 'warptiled' on row-major a, b into out."""
    ext = extension()
    if kernel == "naive":
        ext.matmul_naive(a, b, out)
    elif kernel == "warptiled":
        ext.matmul_warptile(a, b, out, min_blocks or WARP.min_blocks)
    else:
        ext.matmul_tiled(a, b, out, int(kernel[len("tiled"):]))
    return out


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    n: int = param(4096, "square size N (M = N = K)", unit="elements", min=64, max=16384)
    dtypes: tuple = param(("fp32", "bf16"), "input dtypes (the CUDA C++ kernels compute in FP32 on CUDA cores)",
                          choices=CUDA_DTYPES)
    tiles: tuple = param((8, 16, 32), "TILE sizes of the shared-memory kernel", choices=(8, 16, 32))


def kernels(params: Params) -> list[str]:
    return ["naive"] + [f"tiled{t}" for t in params.tiles] + ["warptiled", "triton", "cublas"]


@dataclass(frozen=True)
class WarpTile:
    """The warp-tiled kernel's shape (labs/cuda/matmul.cu, namespace warptile)."""

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
    from labs import hopper  # the L2 bandwidth figure (measured where known)

    e = timing.element_bytes(dtype)
    flops = 2.0 * n**3
    clock = matmul.clock_hz(target)
    w = WARP
    global_bytes = n**3 * e * (1 / w.block_m + 1 / w.block_n)
    warp_ks = n**3 / (32 * w.thread_m * w.thread_n)  # (warp, k) pairs in all
    shared_requested = warp_ks * 32 * (w.thread_m + w.thread_n) * 4
    shared_served = warp_ks * w.wavefronts_per_k * matmul.L1_BYTES_PER_CLOCK
    l2, l2_source = hopper.l2_tbps(target)
    smem_tbps = target.sm_count * matmul.L1_BYTES_PER_CLOCK * clock / 1e12
    reg_bytes = n**3 * 3 * 4
    fma_tflops, fma_source = sustained_fp32_tflops(target)
    return [
        {"level": "global (L2)", "bytes": global_bytes, "intensity_flop_per_byte": flops / global_bytes,
         "bandwidth_tbps": l2, "time_ms": global_bytes / (l2 * 1e12) * 1e3, "source": l2_source},
        {"level": "shared memory", "bytes": shared_requested, "intensity_flop_per_byte": flops / shared_requested,
         "bandwidth_tbps": smem_tbps, "time_ms": shared_served / (smem_tbps * 1e12) * 1e3,
         "source": f"{matmul.L1_BYTES_PER_CLOCK} B per clock per SM; {shared_served / 1e9:.1f} GB served after broadcasts"},
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
    total = bound_s / wave_util + matmul.FIXED_US * 1e-6
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
        cfg = matmul.DEFAULT_CONFIGS[dtype]
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
    (scripts/models_gpu.py ladderncu) saw 3.00, 3.01, 1.92 and 1.64 wavefronts per warp-wide FMA for
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
    shape = matmul.sm_shape(target.compute_capability)
    clock = matmul.clock_hz(target)
    warp_fmas = n**3 / 32  # warp-wide multiply-adds in all
    fma_s = n**3 / (target.sm_count * shape.fp32_lanes * clock)
    load_s = warp_fmas * wavefronts_per_fma(kernel, dtype) / (target.sm_count * clock)
    total = max(fma_s, load_s) + matmul.FIXED_US * 1e-6
    return {"predicted_ms": total * 1e3, "predicted_tflops": 2.0 * n**3 / total / 1e12,
            "bound": "L1 wavefronts" if load_s > fma_s else "FMA"}


def predict(params: Params, target: Target) -> list[dict]:
    rows = []
    n = params.n
    for dtype in params.dtypes:
        cublas = matmul.roofline_tflops(n, dtype, target)
        for kernel in kernels(params):
            row = {"dtype": dtype, "kernel": kernel, "n": n,
                   "arithmetic": "CUDA cores, FP32" if kernel in ("naive", "warptiled") or kernel.startswith("tiled")
                   else ("CUDA cores, FP32" if dtype == "fp32" else "tensor cores"),
                   "requested_bytes": requested_bytes(kernel, n, dtype)}
            if kernel == "cublas":
                row.update({"predicted_tflops": cublas, "bound": "measured ceiling"})
                if cublas:
                    row["predicted_ms"] = 2.0 * n**3 / (cublas * 1e12) * 1e3
            elif kernel == "triton":
                p = matmul.predict_point(n, dtype, matmul.DEFAULT_CONFIGS[dtype], target)
                row.update({k: p.get(k) for k in ("predicted_ms", "predicted_tflops", "bound", "path", "config")})
            elif kernel == "warptiled":
                row.update(predict_warptile(n, dtype, target))
            else:
                row.update(predict_cuda(kernel, n, dtype, target))
            if row.get("predicted_tflops") and cublas:
                row["predicted_pct_of_cublas"] = 100.0 * row["predicted_tflops"] / cublas
            if row.get("predicted_ms") and row["requested_bytes"] == row["requested_bytes"]:
                row["predicted_request_tbps"] = timing.tbps(row["requested_bytes"], row["predicted_ms"])
            rows.append(row)
    return rows


def check(params: Params, target: Target) -> None:
    support = matmul.dtype_support(target)
    for dtype in params.dtypes:
        if support.get(dtype):
            raise ParamError(support[dtype])
    free = free_memory_bytes() if target.live else target.memory_bytes
    for dtype in params.dtypes:
        # A, B, B transposed (cuBLAS and Triton read B in their preferred layout), C, L2 flush buffer
        need = matmul.bytes_needed(params.n, dtype) + params.n**2 * timing.element_bytes(dtype)
        if need > 0.9 * free:
            raise ParamError(f"N = {params.n} in {dtype} needs {need / 1e9:.1f} GB; this GPU has {free / 1e9:.1f} GB "
                             f"free. Choose a smaller n.")


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
PROBE = (333, 347, 351)  # odd sizes: every edge block is partial


# Rows of K and N elements that are multiples of 8 start on 16-byte boundaries: the warp-tiled kernel then
# takes its 128-bit load path (M odd and no side a multiple of the 128 x 128 tile: the edges are partial).
VECTOR_PROBE = (197, 264, 136)


def _check_cuda_kernel(kernel: str, dtype: str, shape: tuple = PROBE, min_blocks: int = 0) -> float:
    m, n, k = shape
    a, b = timing.random_tensor((m, k), dtype), timing.random_tensor((k, n), dtype)
    out = torch.full((m, n), float("nan"), device=a.device, dtype=a.dtype)
    cuda_matmul(kernel, a, b, out, min_blocks)
    # FP32 arithmetic: fp32 tolerance for fp32/tf32 storage, the 16-bit output rounding otherwise
    err = timing.check_close(out, matmul.reference(a, b), "fp32" if dtype in ("fp32", "tf32") else dtype,
                            f"{kernel} CUDA matmul ({dtype}, {m}x{n}x{k})")
    if kernel == "warptiled" and shape == PROBE:  # the odd probe took the scalar path: check the vector one
        err = max(err, _check_cuda_kernel(kernel, dtype, VECTOR_PROBE, min_blocks))
    return err


def measure(params: Params, target: Target, progress):
    n = params.n
    names = kernels(params)
    total = len(params.dtypes) * len(names)
    done = 0
    no_cuda = cuda.why_unavailable()
    if not no_cuda:
        progress(0.0, "building the CUDA C++ kernels (about a minute the first time, cached afterwards)")
        extension()
    for dtype in params.dtypes:
        config = matmul.DEFAULT_CONFIGS[dtype]
        a, b_kmajor = matmul.operands(n, n, n, dtype)  # B in the layout cuBLAS and Triton prefer
        b = b_kmajor.contiguous()  # the same values, row-major, for the CUDA C++ kernels
        out = torch.empty((n, n), device=a.device, dtype=matmul.out_dtype(dtype))
        cublas_tflops = None
        for kernel in ["cublas"] + [k for k in names if k != "cublas"]:  # cuBLAS first: the others are % of it
            progress(done / total, f"{dtype}, N = {n}: {kernel}")
            done += 1
            row = {"dtype": dtype, "kernel": kernel, "n": n}
            if kernel == "cublas":
                with timing.tf32(dtype == "tf32"):
                    c = matmul.cublas_matmul(a, b_kmajor, dtype, out.fill_(float("nan")))
                    err = matmul.check_sampled(c, a, b_kmajor, dtype, f"cuBLAS ({dtype}, N={n})")
                    ms = timing.time_ms(lambda: matmul.cublas_matmul(a, b_kmajor, dtype, out), 10, 50)
            elif kernel == "triton":
                params_like = matmul.Params(dtypes=(dtype,), sizes=(n,), kernels=("triton",))
                kind = "tma" if matmul.load_path(n, dtype, target.compute_capability) == "tma" else "ptr"
                matmul.probe_check(dtype, params_like, kind)
                out.fill_(float("nan"))
                _, path, _ = matmul.triton_matmul(a, b_kmajor, dtype, out, config)
                err = matmul.check_sampled(out, a, b_kmajor, dtype, f"Triton ({dtype}, N={n})")
                ms = timing.time_ms(lambda: matmul.triton_matmul(a, b_kmajor, dtype, out, config), 10, 50)
                row["path"] = path
            else:
                if no_cuda:
                    row["note"] = no_cuda
                    yield row
                    continue
                _check_cuda_kernel(kernel, dtype)
                out.fill_(float("nan"))
                cuda_matmul(kernel, a, b, out)
                err = matmul.check_sampled(out, a, b, "fp32" if dtype in ("fp32", "tf32") else dtype,
                                           f"{kernel} ({dtype}, N={n})")
                ms = timing.time_ms(lambda: cuda_matmul(kernel, a, b, out), 10, 50)
            tflops = timing.tflops(2.0 * n**3, ms)
            if kernel == "cublas":
                cublas_tflops = tflops
            row.update({"measured_ms": ms, "measured_tflops": tflops, "check_rel_error": err})
            req = requested_bytes(kernel, n, dtype)
            if req == req:
                row["measured_request_tbps"] = timing.tbps(req, ms)
            if cublas_tflops:
                row["measured_pct_of_cublas"] = 100.0 * tflops / cublas_tflops
            yield row
        del a, b, b_kmajor, out
    progress(1.0, "done")


def lesson_numbers(target: Target) -> dict:
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


LAB = Lab(
    name="matmul_ladder",
    title="Matmul ladder: naive, tiled, Triton, cuBLAS",
    summary="Four rungs of matrix multiplication at one size, from one thread per output to cuBLAS, each as a "
            "share of the library, with the global-memory requests tiling saves.",
    terms=("matmul", "tiling", "shared-memory", "global-memory", "l1-cache", "coalescing", "cuda-core",
           "tensor-core", "cublas", "triton", "thread-block", "load-store-unit", "registers", "fma"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("dtype", "kernel"),
    metric="tflops",
    order=21,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What share of cuBLAS will the shared-memory tiled kernel (TILE = 32) reach in fp32 at "
                      "N = 4096?", "% of cuBLAS", {"dtype": "fp32", "kernel": "tiled32"}, "pct_of_cublas"),
    page="matmul",
)
