"""Measuring coalescing: refuse what does not fit, check every kernel against float64 on odd sizes, then time it;
the probe's rate of lone DRAM requests feeds the stride rows' model in the same run."""

from __future__ import annotations

import torch
import triton

from labs.coalescing.kernels import (SCATTER, WALK_SEG, scattered_granules, scattered_read, strided_read, transpose,
                                     walk)
from labs.coalescing.model import ELEMENT, GRANULE_BYTES, TRANSPOSES, stride_row, walk_sectors_per_load
from labs.engine import cuda, timing
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.params import ParamError


# ---------------------------------------------------------------------------------------------
# References (float64)
# ---------------------------------------------------------------------------------------------
def strided_reference(x: torch.Tensor, stride: int) -> torch.Tensor:
    return x.to(torch.float64)[::stride]


def walk_reference(x: torch.Tensor, along_rows: bool) -> torch.Tensor:
    n = x.shape[0]
    nseg = -(-n // WALK_SEG)
    m = x.to(torch.float64)
    m = m if along_rows else m.t()  # lines are rows of m
    padded = torch.zeros((n, nseg * WALK_SEG), dtype=torch.float64, device=x.device)
    padded[:, :n] = m
    sums = padded.reshape(n, nseg, WALK_SEG).sum(dim=2)  # (line, segment)
    return sums if along_rows else sums.t()


def transpose_reference(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64).t()


def scattered_reference(x: torch.Tensor) -> torch.Tensor:
    n = scattered_granules(x.numel(), x.element_size())
    granule = (torch.arange(n, device=x.device, dtype=torch.int64) * SCATTER.value) & (n - 1)
    return x.to(torch.float64)[granule * (GRANULE_BYTES // x.element_size())]


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
CHECK_SPAN = 1_000_003  # odd sizes: the last program is partly masked
CHECK_MATRIX = (1001, 1003)  # a rectangle not a multiple of any tile


def memory_needed(params) -> int:
    need = 0
    if "stride" in params.experiments:
        need = max(need, 2 * params.size_mib * MiB)  # input span + the stride-1 output
    if {"walk", "transpose"} & set(params.experiments):
        need = max(need, 2 * 4 * params.matrix_n ** 2)  # matrix + its transpose
    return need


def check(params, target: Target) -> None:
    need = memory_needed(params)
    free = free_memory_bytes() if target.live else target.memory_bytes
    if need > 0.9 * free:
        raise ParamError(f"This run needs {need / 1e9:.1f} GB of GPU memory (input and output); this GPU has "
                         f"{free / 1e9:.1f} GB free. Lower size_mib (strided reads) or matrix_n (walk, transpose).")
    if "transpose" in params.experiments and target.live:
        reason = cuda.why_unavailable()
        if reason:
            raise ParamError(f"{reason} Run without the transpose: experiments=stride,walk.")


def _timed_row(experiment: str, variant: str, useful_bytes: int, ms: float, err: float, **extra) -> dict:
    return {"experiment": experiment, "variant": variant, **extra, "measured_ms": ms,
            "measured_tbps": timing.tbps(useful_bytes, ms), "check_rel_error": err}


def measure_scattered(x: torch.Tensor, probe: torch.Tensor) -> dict:
    """The probe's row: separate one-granule DRAM requests served per second."""
    out = torch.full((scattered_granules(probe.numel()),), float("nan"), device=probe.device)
    err = timing.check_close(scattered_read(probe, out), scattered_reference(probe), ELEMENT, "scattered read")
    y = torch.empty(scattered_granules(x.numel()), device=x.device)
    ms = timing.time_ms(lambda: scattered_read(x, y))
    return _timed_row("probe", "scattered granules", 8 * y.numel(), ms, err, dram_requests=y.numel(),
                      requests_per_s=y.numel() / (ms * 1e-3), granule_bytes=GRANULE_BYTES)


def measure_strides(params, target: Target, progress, done: int, total: int):
    probe = timing.random_tensor((CHECK_SPAN,), ELEMENT)
    x = timing.random_tensor((params.size_mib * MiB // 4,), ELEMENT)
    progress(done / total, "probe: one float from each 64-byte granule, in a scrambled order")
    scattered = measure_scattered(x, probe)
    yield scattered
    for s in params.strides:
        progress(done / total, f"stride {s}: checking against float64")
        out = torch.full((triton.cdiv(probe.numel(), s),), float("nan"), device=probe.device)
        strided_read(probe, s, out)
        err = timing.check_close(out, strided_reference(probe, s), ELEMENT, f"strided read (stride {s})")
        progress(done / total, f"stride {s}: timing")
        y = torch.empty(triton.cdiv(x.numel(), s), device=x.device)
        ms = timing.time_ms(lambda: strided_read(x, s, y))
        done += 1
        model = stride_row(params, s, target, scattered["requests_per_s"])  # the model, now with the request rate
        yield {**model, **_timed_row("stride", f"stride {s}", 8 * y.numel(), ms, err, stride=s)}
        del y
    del x


def measure_walks(params, target: Target, progress, done: int, total: int):
    probe = timing.random_tensor((CHECK_MATRIX[0],) * 2, ELEMENT)
    x = timing.random_tensor((params.matrix_n,) * 2, ELEMENT)
    for along_rows, name in ((False, "column walk"), (True, "row walk")):
        progress(done / total, f"{name}: checking against float64")
        ref = walk_reference(probe, along_rows)
        out = torch.full(ref.shape, float("nan"), device=probe.device)
        walk(probe, along_rows, out)
        err = timing.check_close(out, ref, ELEMENT, name)
        progress(done / total, f"{name}: timing")
        y = walk(x, along_rows)
        ms = timing.time_ms(lambda: walk(x, along_rows, y))
        done += 1
        yield _timed_row("walk", name, 4 * x.numel(), ms, err, sectors_per_warp_load=walk_sectors_per_load(along_rows))


def measure_transposes(params, target: Target, progress, done: int, total: int):
    probe = timing.random_tensor(CHECK_MATRIX, ELEMENT)
    x = timing.random_tensor((params.matrix_n,) * 2, ELEMENT)
    y = torch.empty_like(x)
    for i, variant in enumerate(TRANSPOSES):
        note = " (compiling the CUDA C++ kernels the first time: ~30 s)" if i == 0 else ""
        progress(done / total, f"transpose, {variant}: checking against float64{note}")
        out = torch.full((probe.shape[1], probe.shape[0]), float("nan"), device=probe.device)
        transpose(probe, variant, out)
        err = timing.check_close(out, transpose_reference(probe), ELEMENT, f"transpose ({variant})")
        progress(done / total, f"transpose, {variant}: timing")
        ms = timing.time_ms(lambda: transpose(x, variant, y))
        done += 1
        yield _timed_row("transpose", variant, 8 * x.numel(), ms, err)


def measure(params, target: Target, progress):
    counts = {"stride": len(params.strides), "walk": 2, "transpose": len(TRANSPOSES)}
    total = sum(counts[e] for e in params.experiments)
    done = 0
    for experiment, fn in (("stride", measure_strides), ("walk", measure_walks), ("transpose", measure_transposes)):
        if experiment in params.experiments:
            yield from fn(params, target, progress, done, total)
            done += counts[experiment]
            torch.cuda.empty_cache()
    progress(1.0, "done")
