"""Measuring the memory hierarchy: refuse what does not fit, check the read kernel against float64, then time
each buffer size both ways (passes inside one kernel; one launch per pass replayed as a CUDA graph), and keep
the level figures this run measured for the model's next predictions on this GPU."""

from __future__ import annotations

import statistics

import torch

from labs.engine import timing
from labs.engine.gpu import MiB, Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.hierarchy.kernels import BLOCK, UNROLL, programs, read_passes
from labs.hierarchy.model import KiB, launches_for, levels_from_rows, passes_for, save_levels, sizes


def reference(x: torch.Tensor, passes: int, grid: int) -> torch.Tensor:
    """Program p, lane j sums x[(p + k * grid) * BLOCK * UNROLL + u * BLOCK + j] over k and u, times passes."""
    chunk = BLOCK * UNROLL
    k = -(-x.numel() // (grid * chunk))
    padded = torch.zeros(k * grid * chunk, dtype=torch.float64, device=x.device)
    padded[: x.numel()] = x.to(torch.float64)
    return passes * padded.reshape(k, grid, UNROLL, BLOCK).sum(dim=(0, 2))


CHECK_ELEMENTS = 1_000_003  # odd: the last chunk is partly masked


def check(params, target: Target) -> None:
    need = params.max_mib * MiB
    free = free_memory_bytes() if target.live else target.memory_bytes
    if need > 0.9 * free:
        raise ParamError(f"max_mib = {params.max_mib} needs {need / 1e9:.1f} GB; this GPU has {free / 1e9:.1f} GB "
                         f"free. Choose max_mib <= {int(0.9 * free / MiB)}.")
    if params.min_kib * KiB > params.max_mib * MiB:
        raise ParamError(f"min_kib = {params.min_kib} KiB is larger than max_mib = {params.max_mib} MiB.")


def _check_kernel(sm_count: int) -> float:
    probe = timing.random_tensor((CHECK_ELEMENTS,), "fp32")
    worst = 0.0
    for passes in (1, 3):
        grid = programs(probe.numel(), sm_count)
        out = torch.full((grid, BLOCK), float("nan"), device=probe.device)
        read_passes(probe, passes, out, sm_count)
        worst = max(worst, timing.check_close(out, reference(probe, passes, grid), "fp32", f"read x{passes} passes"))
    return worst


def measure(params, target: Target, progress):
    sm_count = target.sm_count
    ws = sizes(params)
    total = len(ws) * len(params.variants)
    progress(0.0, "checking the read kernel against float64")
    err = _check_kernel(sm_count)
    buf = timing.random_tensor((max(ws) // 4,), "fp32")  # one buffer; each size reads a prefix of it
    rows, done = [], 0
    for variant in params.variants:
        for w in ws:
            x = buf[: w // 4]
            out = torch.empty((programs(x.numel(), sm_count), BLOCK), device=buf.device)
            if variant == "loop":
                passes = passes_for(w)
                progress(done / total, f"{w / MiB:.3g} MiB, {passes} passes in one kernel")
                ms = timing.time_ms(lambda: read_passes(x, passes, out, sm_count), warmup_ms=10, rep_ms=50)
            else:
                passes = launches_for(w)
                progress(done / total, f"{w / MiB:.3g} MiB, {passes} launches in a CUDA graph")

                def replay():
                    for _ in range(passes):
                        read_passes(x, 1, out, sm_count)

                ms = timing.graph_time_ms(replay)
            us = ms * 1e3 / passes
            row = {"variant": variant, "size_bytes": w, "passes": passes, "measured_us_per_pass": us,
                   "measured_tbps": w / (us * 1e-6) / 1e12, "check_rel_error": err}
            rows.append(row)
            done += 1
            yield row
    del buf
    save_levels(target.key, levels_from_rows(median_over_passes(rows), target.l2_bytes))
    progress(1.0, "done")


def median_over_passes(rows: list) -> list:
    """This pass's rows, each time the median over every pass of the run so far (the runner times the sweep in
    passes: the levels saved after the last pass come from the same medians as the run's rows)."""
    seen = timing.once_per_run("hierarchy rows of every pass", list)
    seen.append(rows)
    merged = []
    for i, row in enumerate(rows):
        us = statistics.median(p[i]["measured_us_per_pass"] for p in seen if len(p) > i)
        merged.append({**row, "measured_us_per_pass": us, "measured_tbps": row["size_bytes"] / (us * 1e-6) / 1e12})
    return merged
