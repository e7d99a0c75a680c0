"""
Matmul measurement: check every kernel against float64, then time it
====================================================================

measure(params, target, progress) yields one row per (dtype, N, kernel): the Triton kernel (with the tile config
and schedule configs.config_for picks) and cuBLAS, each first checked on small odd shapes and on a sample of the
real product against float64, then timed by replaying a CUDA graph with the L2 flushed before each replay
(labs/engine/timing.py). A probe at the start times the smallest product: the model's floor and a load's latency.
"""

from __future__ import annotations

from typing import Optional

import torch

from labs.engine import timing
from labs.engine.gpu import Target, free_memory_bytes, sm_shape
from labs.engine.params import ParamError
import labs.matmul.configs as configs
import labs.matmul.model as model
from labs.matmul.configs import (KERNELS, TileConfig, blocks_per_sm, config_for, dtype_support, load_path,
                                 pow2_dividing, shared_bytes)
from labs.matmul.kernels import (_autotuned, _device_cc, chosen_config, cublas_matmul, operands, out_dtype,
                                 triton_matmul)
from labs.matmul.model import FLOOR_TILE, LATENCY_STEPS, bytes_needed, fixed_us, load_latency_us


# ---------------------------------------------------------------------------------------------
# The reference (float64)
# ---------------------------------------------------------------------------------------------
def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A @ B in float64 (of the values actually stored in the inputs)."""
    return a.to(torch.float64) @ b.to(torch.float64)


def check_sampled(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dtype: str, what: str, samples: int = 48,
                  tol: Optional[float] = None) -> float:
    """Check a large product cheaply: every element must be finite (so all were written), and a sample
    of rows x columns (always including the last row and column, which cross the edge tiles) must match
    float64."""
    m, n = out.shape
    if not torch.isfinite(out).all():
        raise timing.KernelMismatch(f"{what}: the output holds NaN or Inf (an element was not written)")
    g = torch.Generator(device="cpu").manual_seed(m * 7919 + n)
    rows = torch.unique(torch.cat([torch.randint(0, m, (samples,), generator=g), torch.tensor([0, m - 1])]))
    cols = torch.unique(torch.cat([torch.randint(0, n, (samples,), generator=g), torch.tensor([0, n - 1])]))
    rows, cols = rows.to(out.device), cols.to(out.device)
    ref = a.index_select(0, rows).to(torch.float64) @ b.index_select(1, cols).to(torch.float64)
    return timing.check_close(out.index_select(0, rows).index_select(1, cols), ref, dtype, what, tol)


# ---------------------------------------------------------------------------------------------
# Checks before anything is allocated
# ---------------------------------------------------------------------------------------------
def check(params, target: Target) -> None:
    """Refuse, before allocating anything, dtypes this GPU lacks and sizes that do not fit."""
    support = dtype_support(target)
    for dtype in params.dtypes:
        if support.get(dtype):
            raise ParamError(support[dtype])
    free = free_memory_bytes() if target.live else target.memory_bytes
    for dtype in params.dtypes:
        n = max(params.sizes)
        need = bytes_needed(n, dtype)
        if need > 0.9 * free:
            largest = max(s for s in range(16, 32769, 16) if bytes_needed(s, dtype) <= 0.9 * free) \
                if bytes_needed(16, dtype) <= 0.9 * free else 0
            raise ParamError(f"N = {n} in {dtype} needs {need / 1e9:.1f} GB (A, B, C and the L2 flush buffer); "
                             f"this GPU has {free / 1e9:.1f} GB free. Choose sizes up to {largest}.")
    for dtype in params.dtypes:
        cfg = config_for(params, dtype, compute_capability=target.compute_capability)
        if blocks_per_sm(cfg, dtype, "vec16", target.compute_capability) == 0:
            raise ParamError(f"Tile {cfg.label} needs {shared_bytes(cfg, dtype, 'vec16') // 1024} KiB of shared "
                             f"memory in {dtype}; an SM of {target.name} has "
                             f"{sm_shape(target.compute_capability).smem_bytes // 1024} KiB. "
                             "Choose smaller blocks or fewer stages.")


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
FLOOR_NOTE = ("The smallest product (one 64 x 64 tile, one K step), timed like the others, took {:.1f} us: the model's "
              "floor. With 8 more K steps it took {:.2f} us more, so a tile's load takes about {:.2f} us to arrive.")


PROBE_TMA = (517, 528, 560)  # M odd; N and K multiples of 16 elements so the TMA path applies
PROBE_ROW_TAIL_SLOTS = 7  # 15 big tiles of PROBE_TMA in 2 waves of 7: rows 0-511 big, the other 5 in the tail
PROBE_ODD = (333, 347, 351)  # all odd: the pointer path, element by element, every edge partial


def kernel_ms(fn) -> float:
    """Median time of one call replayed from a CUDA graph (do_bench on the replay, L2 flushed before
    each): a Triton launch with TMA descriptors costs tens of microseconds of Python, which would
    otherwise show up in place of the kernel's own time at small N. cuBLAS is timed the same way."""
    return timing.graph_time_ms(fn)


def probe_floor_us(target: Target) -> float:
    """Time our kernel on one 64 x 64 x 64 fp16 product, the way kernel_ms times the sweep: the launch, the
    first tiles' trip from memory (the L2 was just flushed), one step on the tensor cores and the store of
    C, which every product pays once whatever its size. Then the same tile with LATENCY_STEPS more K steps:
    one program alone keeps num_stages - 1 loads in flight, so each extra step takes a load's latency over
    num_stages - 1 (its tensor-core work is a fraction of that), which gives the latency."""
    a, b = operands(64, 64, 64 * (1 + LATENCY_STEPS), "fp16")  # A [64, 576], B [576, 64]
    out = torch.empty((64, 64), device=a.device, dtype=torch.float16)
    a1, b1 = a[:, :64], b[:64]
    one = kernel_ms(lambda: triton_matmul(a1, b1, "fp16", out, FLOOR_TILE)) * 1e3
    more = kernel_ms(lambda: triton_matmul(a, b, "fp16", out, FLOOR_TILE)) * 1e3
    model._FLOOR_PROBED[target.key] = one
    model._LATENCY_PROBED[target.key] = max(0.0, more - one) / LATENCY_STEPS * (FLOOR_TILE.num_stages - 1)
    return one


def probe_check(dtype: str, params, path_kind: str, device: str = "cuda",
                config: Optional[TileConfig] = None) -> float:
    """Check the Triton kernel (with `config`, default: the dtype's) on small odd shapes against a full
    float64 product."""
    m, n, k = PROBE_TMA if path_kind == "tma" else PROBE_ODD
    a, b = operands(m, n, k, dtype, device)
    out = torch.full((m, n), float("nan"), device=a.device, dtype=out_dtype(dtype))
    config = config or config_for(params, dtype, compute_capability=_device_cc(a.device))
    # a row-tail config on a few slots, so that this small shape runs both of its launches
    triton_matmul(a, b, dtype, out, config, params.tma if path_kind == "tma" else "off", params.autotune,
                  programs=PROBE_ROW_TAIL_SLOTS if config.row_tail else None)
    return timing.check_close(out, reference(a, b), dtype,
                             f"Triton matmul ({dtype}, {m}x{n}x{k}, {path_kind}, {config.label})")


def measure(params, target: Target, progress):
    total = len(params.dtypes) * len(params.sizes) * len(params.kernels)
    done = 0
    cc = target.compute_capability
    if "triton" in params.kernels and target.key not in model._FLOOR_PROBED:
        progress(0.0, "probe: the time of the smallest product (the floor under every point)")
        with timing.collecting():  # the probe's timings are the note's, not the first row's (as in the Hopper lab)
            floor = probe_floor_us(target)
        lat = load_latency_us(target)
        yield FLOOR_NOTE.format(floor, lat * LATENCY_STEPS / (FLOOR_TILE.num_stages - 1), lat)
    for dtype in params.dtypes:
        if "triton" in params.kernels:
            # every (load path, tile config) the sweep uses, checked on small odd shapes first
            kinds = {("tma" if load_path(n, dtype, cc, params.tma) == "tma" else "ptr",
                      config_for(params, dtype, n, target.sm_count, cc)) for n in params.sizes}
            for kind, config in sorted(kinds, key=lambda kc: (kc[0], kc[1].label)):
                progress(done / total, f"{dtype}: compiling and checking the Triton kernel ({kind} path, "
                                       f"{config.label}) against float64")
                timing.once_per_run(("matmul: probe", dtype, kind, config.label),  # once a run, not once a pass
                                    lambda: probe_check(dtype, params, kind, config=config))
        for n in params.sizes:
            a, b = operands(n, n, n, dtype)
            out = torch.full((n, n), float("nan"), device=a.device, dtype=out_dtype(dtype))
            for kernel in params.kernels:
                progress(done / total, f"{dtype}, N = {n}: {kernel}")
                row = {"kernel": kernel, "dtype": dtype, "n": n, "pow2": pow2_dividing(n, 256)}
                done += 1
                if kernel == "cublas":
                    if dtype == "fp8" and n % 16:
                        row["note"] = "cuBLAS fp8 (torch._scaled_mm) needs N divisible by 16"
                        yield row
                        continue
                    with timing.tf32(dtype == "tf32"):
                        c = cublas_matmul(a, b, dtype, None if dtype == "fp8" else out.fill_(float("nan")))
                        err = timing.once_per_run(("matmul: cublas", dtype, n),
                                                  lambda: check_sampled(c, a, b, dtype, f"cuBLAS ({dtype}, N={n})"))
                        ms = kernel_ms(lambda: cublas_matmul(a, b, dtype, None if dtype == "fp8" else out))
                    del c
                else:
                    config = config_for(params, dtype, n, target.sm_count, cc)
                    out.fill_(float("nan"))
                    _, path, compiled = triton_matmul(a, b, dtype, out, config, params.tma, params.autotune)
                    err = timing.once_per_run(("matmul: triton", dtype, n, path),
                                              lambda: check_sampled(out, a, b, dtype, f"Triton ({dtype}, N={n}, {path})"))
                    ms = kernel_ms(lambda: triton_matmul(a, b, dtype, out, config, params.tma, params.autotune))
                    row.update({"path": path, "config": (chosen_config(_autotuned("tma" if path == "tma" else "ptr",
                                                                                  a.element_size()))
                                                         if params.autotune else config.label)})
                    row.update(compiled_resources(compiled))
                    row["early_start"] = configs.EARLY_START  # how the row tail's / edge's launches ran (for re-predicting)
                    row["floor_us"] = fixed_us(target)  # the probed figures the model used (for re-predicting)
                    row["load_latency_us"] = load_latency_us(target)
                row.update({"measured_ms": ms, "measured_tflops": timing.tflops(2.0 * n**3, ms),
                            "check_rel_error": err})
                yield row
            del a, b, out
    progress(1.0, "done")


def compiled_resources(compiled) -> dict:
    """Registers per thread and shared memory of the compiled kernel, where Triton reports them."""
    try:
        return {"kernel_regs": int(compiled.n_regs), "kernel_smem_bytes": int(compiled.metadata.shared)}
    except (AttributeError, TypeError, ValueError):
        return {}


# ---------------------------------------------------------------------------------------------
# Against the library (the scorecard)
# ---------------------------------------------------------------------------------------------
# The bar for our kernel: at least this share of cuBLAS's speed at every N that is a multiple of LIBRARY_TARGET_STEP
# from 1024 to 8192 (issue 33, narrowing issue 15's every TMA-aligned N from 1024 on). Below 1024 a launch is
# mostly fixed cost; sizes just past a power of two (2049-2064) are there to teach wave and tile quantization, the
# sliver of a last tile, not to be matched; unaligned rows take the slower pointer path by design.
LIBRARY_TARGET = 0.9
LIBRARY_TARGET_NS = (1024, 8192)
LIBRARY_TARGET_STEP = 128


def _library_target(n: int, aligned: bool):
    """The bar at this N (None where no issue sets one)."""
    low, high = LIBRARY_TARGET_NS
    return LIBRARY_TARGET if aligned and low <= n <= high and n % LIBRARY_TARGET_STEP == 0 else None


def library_ratios(rows: list) -> list[dict]:
    """Our Triton kernel against cuBLAS in the same run, one row per (dtype, N) where both were timed: the speed
    ratio is cuBLAS's time over ours (1.0 = as fast, above 1 faster), with the target where the issue sets one
    (labs/engine/repredict.py gathers these from every recording for the scorecard)."""
    times = {(r["dtype"], r["n"], r["kernel"]): r["measured_ms"] for r in rows
             if r.get("kernel") in KERNELS and r.get("measured_ms")}
    paths = {(r["dtype"], r["n"]): r.get("path") for r in rows if r.get("kernel") == "triton"}
    out = []
    for (dtype, n), path in sorted(paths.items()):
        ours, library = times.get((dtype, n, "triton")), times.get((dtype, n, "cublas"))
        if not (ours and library):
            continue
        aligned = path == "tma"
        out.append({"case": f"{dtype} N = {n}" + ("" if aligned else " (unaligned)"), "ours": "Triton",
                    "library": "cuBLAS", "speed_ratio": library / ours,
                    "target": _library_target(n, aligned)})
    return out
