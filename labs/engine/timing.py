"""Timing and correctness helpers shared by every lab: the one timing rule.

The rule: every timed point is the median of REPEATS independent timings (each one a do_bench median over its
own calls, the L2 flushed before each call); their spread (p10 to p90, in % of the median) is kept with the
point. The repeats are spread over the run, not taken back to back: the runner (labs/engine/local.py) runs a
lab's sweep in PASSES passes, and inside a pass (`in_pass`) every timer takes ONE timing per call, so a point's
repeats lie a whole sweep apart and see the slow drift (clocks, temperature, allocation) that five timings in
one tenth of a second cannot. labs/engine/passes.py matches the rows of the passes by the lab's key, takes each
measured number's median and the widest spread; a point wider than STEADY_PCT gets extra passes (at most
MAX_EXTRA_PASSES, while the time limit allows) and one that stays unsteady is flagged `unsteady`, never averaged
in silently. Warm-up is done in the first pass; later passes warm up briefly. Correctness needs checking once
a run: `first_pass()` and `once_per_run()` let a measure() skip re-checking what an earlier pass checked.

Outside a pass (a lab whose timings are taken by other processes, `Lab.timed_in_passes = False`, or a direct
call) a timer takes its REPEATS back to back, and a point wider than STEADY_PCT is measured again, a whole new
set of repeats, at most MAX_ROUNDS times; one that stays unsteady keeps its steadiest set and is flagged.

`time_ms` applies the rule to kernels, `graph_time_ms` to CUDA-graph replays (launch-bound work), `time_step` to
steps whose CPU time matters too, `per_call_us` to back-to-back calls; timers of host-side work (copies between
host and GPU) take `repeats_now()` samples and hand them to `record_samples`. Whatever a lab's measurement timed
for one row is attached to that row by the runner (`repeats`, `spread_pct`, `unsteady`).

Also here: rate helpers and the float64 correctness check every kernel passes before it is timed.
"""

from __future__ import annotations

import contextlib
import contextvars
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "tf32": torch.float32,  # stored as fp32; the tensor cores round the inputs to TF32
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
if hasattr(torch, "float8_e4m3fn"):
    DTYPES["fp8"] = torch.float8_e4m3fn

# ||out - ref|| / ||ref|| allowed against a float64 reference, by the dtype the kernel computes in.
TOLERANCE = {"fp64": 1e-12, "fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3, "bf16": 2e-2, "fp8": 1e-1}


class KernelMismatch(AssertionError):
    """A kernel's output differs from its float64 reference by more than its dtype allows."""


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def element_bytes(name: str) -> int:
    return torch.empty((), dtype=DTYPES[name]).element_size()


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def random_tensor(shape, dtype: str, device: Optional[str] = None, generator=None) -> torch.Tensor:
    """Fresh standard-normal data (never zeros: zeros hide unwritten outputs and time faster)."""
    device = device or default_device()
    x = torch.randn(shape, device=device, dtype=torch.float32, generator=generator)
    return x.to(DTYPES[dtype])


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| computed in float64; NaN or Inf anywhere gives inf."""
    out64, ref64 = out.detach().to(torch.float64), ref.detach().to(torch.float64).to(out.device)
    if not torch.isfinite(out64).all():
        return float("inf")
    denom = torch.linalg.vector_norm(ref64).item()
    diff = torch.linalg.vector_norm(out64 - ref64).item()
    return diff / denom if denom > 0 else diff


def check_close(out: torch.Tensor, ref: torch.Tensor, dtype: str, what: str, tol: Optional[float] = None) -> float:
    """Raise KernelMismatch if `out` is further from `ref` than the dtype's tolerance."""
    if out.shape != ref.shape:
        raise KernelMismatch(f"{what}: shape {tuple(out.shape)} but the reference has {tuple(ref.shape)}")
    err = rel_error(out, ref)
    limit = TOLERANCE[dtype] if tol is None else tol
    if not err <= limit:
        raise KernelMismatch(f"{what}: relative error {err:.3g} exceeds the {dtype} tolerance {limit:g}")
    return err


REPEATS = 5  # independent timings behind every point
PASSES = REPEATS  # passes over a lab's sweep: one timing of each point per pass
STEADY_PCT = 10.0  # a point whose p10-p90 spread is wider than this (% of its median) is measured again
MAX_ROUNDS = 3  # in one window: rounds of REPEATS at most; a point still unsteady after them is flagged
MAX_EXTRA_PASSES = 2  # in passes: extra passes at most while a point is unsteady (and the time limit allows)
LATER_PASS_WARMUP_MS = 1.0  # warm-up of a timer after the first pass: the kernel is compiled and was run before


def spread_pct(samples: list) -> float:
    """(p90 - p10) / median of the samples, in % (linear interpolation between the sorted samples)."""
    ordered = sorted(samples)
    if len(ordered) < 2:
        return 0.0

    def quantile(q):
        pos = q * (len(ordered) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    middle = statistics.median(ordered)
    return 100.0 * (quantile(0.9) - quantile(0.1)) / middle if middle > 0 else 0.0


@dataclass
class Timing:
    """One timed point: the independent timings behind it and what the rule made of them."""

    samples_ms: list
    rounds: int = 1  # rounds of repeats it took (more than one: it was measured again)
    payloads: list = field(default_factory=list)  # what each repeat measured beside its time (time_step: CPU times)

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.samples_ms))

    @property
    def repeats(self) -> int:
        return len(self.samples_ms)

    @property
    def spread_pct(self) -> float:
        return spread_pct(self.samples_ms)

    @property
    def steady(self) -> bool:
        return self.spread_pct <= STEADY_PCT


@dataclass
class _Collector:
    timings: list = field(default_factory=list)

    def take(self) -> list:
        taken, self.timings = self.timings, []
        return taken


_COLLECTOR: contextvars.ContextVar = contextvars.ContextVar("roofline_timings", default=None)


@contextlib.contextmanager
def collecting():
    """Collect every Timing made inside the block (the runner takes them row by row)."""
    collector = _Collector()
    token = _COLLECTOR.set(collector)
    try:
        yield collector
    finally:
        _COLLECTOR.reset(token)


def record(timing: Timing) -> Timing:
    collector = _COLLECTOR.get()
    if collector is not None:
        collector.timings.append(timing)
    return timing


@dataclass
class _Pass:
    index: int  # 0: the first pass of the run
    memo: dict  # what once_per_run computed: shared by every pass of one run


_PASS: contextvars.ContextVar = contextvars.ContextVar("roofline_pass", default=None)


@contextlib.contextmanager
def in_pass(index: int, memo: dict):
    """Inside the block every timer takes one timing per call (pass `index` of a run; `memo` lives for the run)."""
    token = _PASS.set(_Pass(index, memo))
    try:
        yield
    finally:
        _PASS.reset(token)


def first_pass() -> bool:
    """True outside passes and in a run's first pass: what only needs doing once a run (checks) is done now."""
    current = _PASS.get()
    return current is None or current.index == 0


def repeats_now() -> int:
    """How many independent timings a timer takes per call: one inside a pass, REPEATS in one window."""
    return REPEATS if _PASS.get() is None else 1


def once_per_run(key, compute: Callable[[], object]):
    """compute() the first time `key` is asked for in this run, its value again in later passes (a float64
    check of the same kernel on the same shape need not run five times). Outside passes: compute() each time."""
    current = _PASS.get()
    if current is None:
        return compute()
    if key not in current.memo:
        current.memo[key] = compute()
    return current.memo[key]


def warmup_now(warmup_ms: float) -> float:
    """The warm-up a timer does now: all of it in the first pass (or in one window), a short one later."""
    return warmup_ms if first_pass() else min(warmup_ms, LATER_PASS_WARMUP_MS)


def budget_now(budget_ms: float) -> float:
    """A timer's budget now: all of it in one window, its pass's share inside a pass (the same time in all)."""
    return budget_ms if _PASS.get() is None else budget_ms / PASSES


def record_samples(samples_ms: list) -> Timing:
    """For a timer of its own (host copies, a torchrun worker): hand its independent samples to the rule's record.
    Inside a pass the timer's one timing is their median (the passes are the repeats)."""
    if _PASS.get() is not None:
        return record(Timing([float(statistics.median(samples_ms))]))
    return record(Timing(list(samples_ms)))


def record_own(*figures_ms: float) -> None:
    """Hand the rule, as their own timings, the figures (ms) that the row about to be yielded reports. A lab that times
    its points in turns and yields the rows afterwards calls this just before each row: the runner gives a row the
    timings made since the row before it, so left to the timers every timing of the sweep would fall on the first
    row (one row with a huge spread, flagged unsteady, and no spread on the others). Over the passes, the row's
    spread is then the spread of its own figures."""
    for ms in figures_ms:
        record_samples([ms])


def repeated(once: Callable[[], object], repeats: int = REPEATS) -> Timing:
    """The rule: `once()` gives one independent timing (ms, or (ms, what else it measured)). Inside a pass: one
    of them (the passes are the repeats). In one window: REPEATS of them, measured again while unsteady, the
    steadiest set kept. What else was measured is kept as `.payloads`."""
    if _PASS.get() is not None:
        repeats, max_rounds = 1, 1
    else:
        max_rounds = MAX_ROUNDS
    best = None
    for rounds in range(1, max_rounds + 1):
        results = [once() for _ in range(repeats)]
        pairs = [r if isinstance(r, tuple) else (r, None) for r in results]
        timing = Timing([float(ms) for ms, _ in pairs], rounds)
        timing.payloads = [extra for _, extra in pairs]
        if best is None or timing.spread_pct < best.spread_pct:
            best = timing
        if timing.steady:
            break
    best.rounds = rounds
    return record(best)


def row_spread(row: dict, timings: list) -> dict:
    """The row with the spread of what was timed for it: the fewest repeats, the widest spread, any unsteady."""
    if not timings or "spread_pct" in row:
        return row
    return {**row, "repeats": min(t.repeats for t in timings),
            "spread_pct": round(max(t.spread_pct for t in timings), 2),
            "unsteady": any(not t.steady for t in timings)}


def time_ms(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of one call of `fn`, in ms, by the rule: REPEATS do_bench medians (one per pass inside passes;
    warm-up once, L2 flushed before every call, CUDA events around it), each over rep_ms / REPEATS of calls."""
    import triton.testing

    warm = [warmup_now(warmup_ms)]

    def once() -> float:
        ms = triton.testing.do_bench(fn, warmup=warm[0], rep=max(rep_ms / REPEATS, 5), return_mode="median")
        warm[0] = 1  # warm after the first repeat: the later ones only re-estimate
        return float(ms)

    return repeated(once).median_ms


FLUSH_BYTES = 512 * 2**20  # larger than any L2 so far


def time_ms_clean_l2(fn, warmup_ms: float = 25, rep_ms: float = 60) -> float:
    """Median time of one call of `fn` (ms), CUDA events around each call, the L2 emptied by a *read* before it.

    `time_ms` (triton's do_bench) empties the L2 by writing 256 MB, which leaves it full of dirty lines that
    the timed kernel pays to write back: ~L2-size bytes of extra traffic, a large error for a kernel that
    moves ~100 MB. Reading a large buffer leaves clean lines instead.
    """
    flush = torch.empty(FLUSH_BYTES // 4, device="cuda", dtype=torch.float32)  # contents do not matter: only read
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.sum()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = start.elapsed_time(end) / 5
    for _ in range(max(1, int(warmup_now(warmup_ms) / estimate))):
        fn()
    n = min(2000 // REPEATS, max(1, int(rep_ms / REPEATS / estimate)))  # calls per repeat

    def once() -> float:  # one repeat: the median of n calls, each after the read that empties the L2
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            flush.sum()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return float(statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)))

    return repeated(once).median_ms


FLUSH_WRITE_BYTES = 256 * 2**20  # what triton's do_bench (time_ms) writes to empty the L2 before each call


def time_with_host_ms(fn, warmup_ms: float = 25, rep_ms: float = 100, max_reps: int = 2000,
                      wait_for_flush: bool = False) -> tuple[float, float]:
    """(GPU ms, CPU ms) of one call of `fn`: the medians, over the same calls, of the time between CUDA events
    around each call and of the CPU's time inside it.

    The calls are timed as time_ms (triton's do_bench) times them: a 256 MiB write empties the L2 before
    each, events on either side. Measuring the CPU's time in the very same calls, rather than in a separate loop,
    matters where the CPU is the floor: on a shared host the CPU's speed drifts by a third between two loops a
    second apart (measured on the GPU hosts, an experiment since dropped), so a floor measured apart from the timed calls
    cannot be trusted to 15 %.

    Without `wait_for_flush` (do_bench's way, the attention lab's timer) the CPU prepares each call while the write
    runs, and its clock runs between the two events' recording. With it, the CPU waits for the write before it
    starts the call (see time_step).
    """
    timed = time_step(lambda mark: fn(), warmup_ms, rep_ms, max_reps, wait_for_flush)
    return timed["gpu_ms"], timed["host_ms"]


def time_step(step, warmup_ms: float = 25, rep_ms: float = 100, max_reps: int = 2000,
              wait_for_flush: bool = True) -> dict:
    """The GPU's and the CPU's time of one call of `step(mark)`, medians over the same calls:
    {"gpu_ms": between the CUDA events around each call, "host_ms": the CPU's time, "cycle_ms": the CPU's time
    from one call's L2-clearing write to the next's (the whole loop, the timer's own work included), "marks_ms":
    [the CPU's time from the start of its window to each mark() the step made, in order]}.

    With `wait_for_flush`, the CPU waits for the L2-clearing write to finish before each call, so the GPU is idle
    when the clock starts and the CPU gets no head start on any GPU. The GPU then sees all of the CPU's lead-in,
    and the CPU's clock must cover everything the events can: it runs from before the start event is recorded to
    after the end event is recorded. (Read between the two records, it missed the records themselves and the
    Python around them, and CPU-bound steps came out 11-13 % above it on both an H100 and an H200.)
    Without the wait (see time_with_host_ms) the clock runs between the two records, as it always has there.
    """
    flush = torch.empty(FLUSH_WRITE_BYTES // 4, dtype=torch.int32, device="cuda")
    idle = lambda: None  # noqa: E731 - mark() outside the timed calls
    step(idle)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        step(idle)
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_now(warmup_ms) / estimate))):
        step(idle)
    n = max(1, min(max_reps // REPEATS, int(rep_ms / REPEATS / estimate)))  # calls per repeat

    def once():  # one repeat: n calls, the GPU's and the CPU's medians over them
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        host, marks, cycle_starts = [], [], []
        for i in range(n):
            stamps = []
            cycle_starts.append(time.perf_counter())
            flush.zero_()
            if wait_for_flush:
                torch.cuda.synchronize()  # the GPU is idle when the clock starts: no head start for the CPU
                t0 = time.perf_counter()  # before the start event: the CPU's window covers the events'
                starts[i].record()
            else:
                starts[i].record()
                t0 = time.perf_counter()
            step(lambda: stamps.append(time.perf_counter()))
            if not wait_for_flush:
                host.append(time.perf_counter() - t0)
            ends[i].record()
            if wait_for_flush:
                host.append(time.perf_counter() - t0)
            marks.append([t - t0 for t in stamps])
        cycle_starts.append(time.perf_counter())  # the loop's end: the last call's cycle
        torch.cuda.synchronize()
        gpu_ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
        per_mark = [statistics.median(m[j] for m in marks) * 1e3 for j in range(min(len(m) for m in marks))]
        cycle = statistics.median(b - a for a, b in zip(cycle_starts, cycle_starts[1:]))
        return float(gpu_ms), (statistics.median(host) * 1e3, per_mark, cycle * 1e3)

    timing = repeated(once)
    host_ms = statistics.median(host for host, _, _ in timing.payloads)
    cycle_ms = statistics.median(cycle for _, _, cycle in timing.payloads)
    marks = [marks for _, marks, _ in timing.payloads]
    per_mark = [statistics.median(m[j] for m in marks) for j in range(min(len(m) for m in marks))]
    return {"gpu_ms": timing.median_ms, "host_ms": host_ms, "cycle_ms": cycle_ms, "marks_ms": per_mark}


def graph_time_ms(fn: Callable[[], object], timer: Callable = time_ms) -> float:
    """Time of one call of `fn` captured in a CUDA graph (for work dominated by launch cost)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on a side stream, as graph capture requires
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timer(graph.replay)


def tbps(nbytes: float, ms: float) -> float:
    """Achieved bandwidth in TB/s (10^12 bytes per second)."""
    return nbytes / (ms * 1e-3) / 1e12


def tflops(flops: float, ms: float) -> float:
    """Achieved arithmetic rate in TFLOP/s."""
    return flops / (ms * 1e-3) / 1e12


@contextlib.contextmanager
def tf32(enabled: bool):
    """Let fp32 matmuls use TF32 tensor cores inside the block (and restore the setting after)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_call_us(fn, budget_ms: float = 20.0, batches: int = REPEATS, warmup_ms: float = 5.0) -> float:
    """Median wall time of one call of `fn` when called back to back, in microseconds.

    This is what a loop of calls gets: the larger of the GPU's time and the CPU's time per call. The
    do_bench timers above flush the L2 with a large memset before each call, and the CPU queues the
    next call while that memset runs: they hide the CPU's share, which this timer keeps.
    """
    per_batch_ms = budget_ms / batches
    batches = min(batches, repeats_now())  # inside a pass: one batch, the passes are the repeats
    start = time.perf_counter()
    fn()
    # every pass warms up in full: the CPU's share is the subject here, and a CPU coming from other work (the pass
    # before, another lab) needs its caches and clock back; 5 ms a point is cheap
    while time.perf_counter() - start < warmup_ms * 1e-3:  # caches, allocator, CPU clock up to speed
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    single = time.perf_counter() - t0
    reps = max(1, min(20_000, int(per_batch_ms * 1e-3 / max(single, 1e-7))))
    samples = []
    for _ in range(batches):
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / reps)
    record_samples([t * 1e3 for t in samples])  # the batches are this timer's independent repeats
    return statistics.median(samples) * 1e6
