"""What a call costs besides its bytes: the CPU's time to issue it, timed in the very calls a loop makes, and
what it launches, read with torch.profiler (kernel names shortened for the table)."""

from __future__ import annotations

import gc
import re
import statistics
import time
from typing import Callable

import torch

from labs.engine import timing


def back_to_back_ms(fn: Callable[[], object], budget_ms: float = 20.0, batches: int = 5, warmup_ms: float = 5.0,
                    min_reps: int = 8) -> tuple:
    """(wall ms, CPU ms) per call of `fn` called back to back: the medians, over the same batches of calls, of
    the wall time per call (what a loop gets: the slower of the GPU and the CPU) and of the CPU's time to issue
    the calls (the clock read when the last call of a batch returns, before waiting for the GPU).

    Taking both from the very same calls matters where the CPU is the floor. A loop of its own a second apart
    (measured and dropped) saw the CPU's time per call move by up to 2x on one host: in the 2026-11-23 recordings
    eager sin^2 + cos^2 at 1 MiB ran its calls in 0.037 ms while a separate loop right after needed 0.08 ms
    for the same calls, on both the H100 and the H200. The number of calls per batch comes from a burst of
    three calls, never fewer than `min_reps`: a single call slowed once by a pause would otherwise leave a
    batch of one call, which times the call's latency (CPU, then GPU, then the wait) instead of a loop's rate.
    Python's garbage collector is paused while the batches run.
    """
    per_batch_ms = budget_ms / batches
    batches = min(batches, timing.repeats_now())  # inside a pass: one batch, the passes are the repeats
    started = time.perf_counter()
    fn()
    while time.perf_counter() - started < timing.warmup_now(warmup_ms) * 1e-3:  # caches, allocator, CPU clock up to speed
        fn()
    timing.sync()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    timing.sync()
    burst = (time.perf_counter() - t0) / 3
    reps = max(min_reps, min(20_000, int(per_batch_ms * 1e-3 / max(burst, 1e-7))))
    wall, host = [], []
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(batches):
            timing.sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            issued = time.perf_counter()  # the CPU's part: every call issued, the GPU perhaps still busy
            timing.sync()
            wall.append((time.perf_counter() - t0) / reps)
            host.append((issued - t0) / reps)
    finally:
        if collecting:
            gc.enable()
    timing.record_samples([w * 1e3 for w in wall])  # the batches are this timer's independent repeats
    return statistics.median(wall) * 1e3, statistics.median(host) * 1e3


def short_kernel_name(name: str) -> str:
    """'void at::native::vectorized_elementwise_kernel<4, at::native::sin_kernel_cuda(...)...>' ->
    'vectorized_elementwise_kernel[sin]'; Triton names and CPU operators ('aten::sin') are kept."""
    if name.startswith("aten::"):
        return name
    plain = re.sub(r"^void\s+", "", name.replace("(anonymous namespace)::", ""))
    outer = plain.split("<")[0].split("(")[0].split("::")[-1].strip()
    for pattern in (r"at::native::(?:\w+::)*(\w+?)_kernel_cuda", r"CUDAFunctor(?:OnSelf|OnOther)?_(\w+?)\b",
                    r"(\w+?)_kernel_impl", r"at::native::(?:\w+::)*(\w+?)Functor", r"at::native::(?:\w+::)*(\w+?)_kernel"):
        found = re.search(pattern, plain)
        if found and found.group(1) != outer:
            return f"{outer}[{found.group(1)}]"
    return outer or name[:60]


def _us(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def summarize_kernels(kernels: list) -> str:
    """Short names and times in launch order, runs of the same kernel folded:
    'a 12.0 us, b x3 (36.1 us), a 11.8 us'."""
    parts: list = []
    for name, us in kernels:
        name = short_kernel_name(name)
        if parts and parts[-1][0] == name:
            parts[-1][1] += 1
            parts[-1][2] += us
        else:
            parts.append([name, 1, us])
    return ", ".join(f"{name} {_us(us)}" if count == 1 else f"{name} x{count} ({_us(us)})" for name, count, us in parts)


def launched_kernels(fn: Callable[[], object]) -> list:
    """What one call of `fn` runs, read with torch.profiler, as (name, microseconds) in launch order:
    the GPU kernels (and copies) on a GPU; on a CPU, the top-level aten operators (each would be a
    kernel on a GPU)."""
    import warnings

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()  # compile and warm up outside the profile
    timing.sync()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiler's notes about its own cycles
        with profile(activities=activities) as prof:
            fn()
            timing.sync()
        events = list(prof.events())
    if cuda:
        picked = [e for e in events if e.device_type == DeviceType.CUDA]
    else:
        picked = [e for e in events if e.cpu_parent is None and e.name.startswith("aten::")]
    picked.sort(key=lambda e: e.time_range.start)
    return [(e.name, float(e.time_range.elapsed_us())) for e in picked]
