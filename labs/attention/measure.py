"""Measuring the attention lab: refuse what cannot run, check every configuration against float64, then time.

Every configuration a run times is checked first, on fresh random input of odd length with its outputs poisoned
with NaN, against the float64 reference (naive.reference); then each point is timed after a warm-up call with the
L2 emptied before every call. Naive attention's probes (torch's softmax and masked_fill, on a slice of rows of each
length) feed its model with the rates this GPU streams them at. Points predicted not to fit in free memory are
skipped with a note, and one that still runs out of memory is skipped without ending the sweep.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from labs.attention.kernels import (_backward, _forward, attention_bwd_dkdv_kernel, attention_bwd_dq_kernel,
                                    attention_fwd_kernel, default_config, flash_attention)
from labs.attention.gluon_rung import (check_gluon, gluon_attention_fn, gluon_case_reason, gluon_keys_ok,
                                       gluon_notes)
from labs.attention.model import (GLUON_IMPL, HOST_FLOOR_IMPLS, NAIVE_PROBE_BYTES, PROBE_IMPL, Params, Shape,
                                  _needs_host_floor, _nbytes, _row_key, _shape, attention_flops, fits, flash_peak_bytes,
                                  host_floor_row, naive_host_floor_row, naive_matmul_kernel, naive_peak_bytes,
                                  naive_prediction, point_peak_bytes, skip_note)
from labs.attention.naive import SDPA_BACKENDS, causal_visible, naive_attention, reference, sdpa
from labs.attention.tiles import FlashConfig, lq_pad
from labs.engine import timing
from labs.engine.gpu import Target, free_memory_bytes
from labs.engine.params import ParamError

CHECK_LQ, CHECK_LK = 1000, 1000  # odd sizes: the last tiles are ragged
CHECK_BH = (1, 2)


def _free_bytes(target: Target) -> int:
    return free_memory_bytes() if target.live else target.memory_bytes


def _available_bytes() -> int:
    """Free device memory plus what PyTorch's allocator holds cached but unused (it reuses that first)."""
    return free_memory_bytes() + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


def check(params: Params, target: Target) -> None:
    """Refuse what cannot run at all: a dtype this GPU lacks, or inputs that do not fit even for flash."""
    if "bf16" in params.dtypes and target.live and not torch.cuda.is_bf16_supported():
        raise ParamError("This GPU has no bf16 support: choose fp16 or fp32.")
    n, d = max(params.seq_lens), max(params.head_dims)
    e = max(_nbytes(t) for t in params.dtypes)
    shape = Shape(params.batch, params.heads, n, n, d, False, "fp32" if e == 4 else "bf16")
    need = 4 * shape.q_bytes + flash_peak_bytes(shape, "fwd+bwd")
    free = _free_bytes(target)
    if need > 0.9 * free:
        raise ParamError(f"N = {n} with B = {params.batch}, H = {params.heads}, d = {d} needs {need / 1e9:.1f} GB "
                         f"even for FlashAttention (Q, K, V, dO and the gradients); this GPU has {free / 1e9:.1f} GB "
                         f"free. Choose a smaller N, batch or heads.")


def _free_for_point() -> int:
    """Free device memory now, after handing cached blocks back: a large block carved up by small tensors
    from an earlier size cannot hold an N x N matrix, so cached memory does not count as free."""
    torch.cuda.empty_cache()
    return _available_bytes()


def naive_probe_heads(n: int, dtype: str, heads: int) -> int:
    """How many (N, N) matrices a probe takes: about NAIVE_PROBE_BYTES, and at least two where the run has two,
    because masked_fill takes its fast contiguous path when the mask is not broadcast (measured: 2.45 TB/s for
    one matrix of N = 16384 against 1.35 TB/s broadcast over two or more, on an H100)."""
    return min(heads, max(2, NAIVE_PROBE_BYTES // (n * n * _nbytes(dtype))))


SOFTMAX_PROBE = "softmax"  # the first probe row's mode: once it is in a run's rates, that N and dtype are probed


def probe_naive_kernels(n: int, dtype: str, heads: int, causal: bool):
    """Rows (yielded each right after its timing, so the runner gives each row its own spread) with the rate (TB/s, bytes read + written) at which torch's softmax and masked_fill stream an N x N
    matrix of row length n, timed on a slice of `heads` rows-of-matrices of about NAIVE_PROBE_BYTES (the kernel
    torch picks depends on the row length, not on how many rows there are). The L2 is emptied by a read before
    each call, so no dirty lines of the flush are written back during the probe."""
    h = naive_probe_heads(n, dtype, heads)
    e = _nbytes(dtype)
    s = timing.random_tensor((h, n, n), dtype)  # scores: what the softmax reads in naive attention
    fns = {SOFTMAX_PROBE: lambda: torch.softmax(s, dim=-1)}
    if causal:
        hidden = ~causal_visible(n, n, s.device)
        s_causal = s.masked_fill(hidden, float("-inf"))
        fns["softmax-causal"] = lambda: torch.softmax(s_causal, dim=-1)
        fns["masked-fill"] = lambda: s.masked_fill_(hidden, float("-inf"))  # last: it overwrites s
    for kernel, fn in fns.items():
        ms = timing.time_ms_clean_l2(fn, warmup_ms=5, rep_ms=25)
        moved = 2 * h * n * n * e
        yield {"impl": PROBE_IMPL, "mode": kernel, "causal": None, "dtype": dtype, "head_dim": None,
               "seq_len": n, "probe_bytes": moved, "measured_ms": ms, "measured_tbps": timing.tbps(moved, ms)}


def probe_naive_matmuls(n: int, d: int, dtype: str, heads: int):
    """Rows (as probe_naive_kernels') with the rate (TB/s, bytes read + written) of naive attention's batched
    products at row length n and head dim d, timed on the same slice of heads: S = Q K^T (an N x N matrix written
    from two N x d) and P V (one read, an N x d written). See model.naive_matmul_kernel."""
    h = naive_probe_heads(n, dtype, heads)
    e = _nbytes(dtype)
    a, b = (timing.random_tensor((h, n, d), dtype) for _ in range(2))
    p = timing.random_tensor((h, n, n), dtype)
    products = {naive_matmul_kernel("scores", d): (lambda: torch.matmul(a, b.transpose(1, 2)), h * (2 * n * d + n * n)),
                naive_matmul_kernel("values", d): (lambda: torch.matmul(p, b), h * (n * n + 2 * n * d))}
    for kernel, (fn, elements) in products.items():
        ms = timing.time_ms_clean_l2(fn, warmup_ms=5, rep_ms=25)
        moved = elements * e
        yield {"impl": PROBE_IMPL, "mode": kernel, "causal": None, "dtype": dtype, "head_dim": d,
               "seq_len": n, "probe_bytes": moved, "measured_ms": ms, "measured_tbps": timing.tbps(moved, ms)}


def _poisoned(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan"))


def point_config(shape: Shape, mode: str, device: torch.device) -> FlashConfig:
    """The configuration flash_attention picks for this point (tiles, TMA or pointer loads)."""
    return default_config(shape.d, timing.torch_dtype(shape.dtype), device, causal=shape.causal,
                          seq_len=shape.lq, batch_heads=shape.b * shape.h, mode=mode)


def _check_ours(dtype: str, d: int, causal: bool, mode: str, cfg: Optional[FlashConfig] = None) -> float:
    """Our kernels with configuration `cfg` (default: the long-sequence one) on fresh random input of odd
    length, outputs poisoned with NaN, against float64: on a GPU twice, so that the launch path of the timed
    calls (the compiled kernel called directly, or the recorded plan) is checked as well as the compiling one."""
    b, h = CHECK_BH
    q, k, v = (timing.random_tensor((b, h, n, d), dtype) for n in (CHECK_LQ, CHECK_LK, CHECK_LK))
    ref_out, ref_lse = reference(q, k, v, causal)
    cfg = cfg or default_config(d, q.dtype, q.device)
    what = f"our FlashAttention ({dtype}, d={d}, {'causal' if causal else 'full'})"
    fin = torch.isfinite(ref_lse)
    if mode == "fwd+bwd":
        do = timing.random_tensor(q.shape, dtype)
        qr, kr, vr = (x.detach().to(torch.float64).requires_grad_() for x in (q, k, v))
        refs = torch.autograd.grad(reference(qr, kr, vr, causal)[0], (qr, kr, vr), do.to(torch.float64))
    err = 0.0
    for _ in range(2 if q.is_cuda else 1):  # on the GPU twice: the second call launches as the timed calls do
        out, lse = _poisoned(q), torch.full((b, h, lq_pad(CHECK_LQ)), float("nan"), device=q.device)
        _forward(q, k, v, causal, 1 / math.sqrt(d), cfg, out, lse)
        err = max(err, timing.check_close(out, ref_out, dtype, f"{what} output"))
        err = max(err, timing.check_close(lse[..., :CHECK_LQ][fin], ref_lse[fin], dtype, f"{what} log-sum-exp"))
        if mode == "fwd+bwd":
            grads = _backward(q, k, v, out, lse, do, causal, 1 / math.sqrt(d), cfg,
                              _poisoned(q), _poisoned(k), _poisoned(v))
            for name, g, r in zip(("dQ", "dK", "dV"), grads, refs):
                err = max(err, timing.check_close(g, r, dtype, f"{what} {name}"))
    return err


def impl_fn(impl: str, causal: bool, mode: str = "fwd"):
    if impl == "ours":
        return lambda q, k, v: flash_attention(q, k, v, causal)
    if impl == GLUON_IMPL:  # the forward alone, or the training call that autograd differentiates
        return gluon_attention_fn(causal, mode)
    if impl == "naive":
        return lambda q, k, v: naive_attention(q, k, v, causal)
    return lambda q, k, v: sdpa(q, k, v, causal, impl)


def _check_reference_impl(impl: str, dtype: str, d: int, causal: bool, mode: str) -> float:
    """A library implementation against float64 (its outputs are its own: they cannot be poisoned)."""
    b, h = CHECK_BH
    q, k, v = (timing.random_tensor((b, h, CHECK_LQ, d), dtype).requires_grad_() for _ in range(3))
    fn = impl_fn(impl, causal)
    out = fn(q, k, v)
    ref = reference(q, k, v, causal)[0]
    what = f"{impl} ({dtype}, d={d}, {'causal' if causal else 'full'})"
    err = timing.check_close(out, ref, dtype, what)
    if mode == "fwd+bwd":
        do = timing.random_tensor(q.shape, dtype)
        grads = torch.autograd.grad(out, (q, k, v), do)
        refs = torch.autograd.grad(ref, (q, k, v), do.to(torch.float64))
        for name, g, r in zip(("dQ", "dK", "dV"), grads, refs):
            err = max(err, timing.check_close(g, r.to(g.dtype), dtype, f"{what} {name}"))
    return err


def _runner(fn, mode: str, q, k, v, do):
    """One call to time: inference forward (no autograd record), or forward and backward."""
    def forward():
        with torch.no_grad():
            return fn(q, k, v)

    def forward_backward():
        return torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    return forward if mode == "fwd" else forward_backward


# Timing budget (the default run should finish in about a minute, compile time included: it took 103 s on an H100 and
# 107 s on an H200 with the Gluon rung's backward, on fresh machines, recordings of 2026-11-28). A point's first call
# compiles, builds library plans and takes workspaces; the second gives its peak memory and, timed with events after an
# L2 flush, how long a call is. Where the caching allocator took new memory from the driver inside that call, the
# call is timed once more: cudaMalloc holds the CPU while the GPU runs dry, time no warm call spends (each pass starts
# every N with an emptied cache, so a pass's first call of a point can need a new segment; on an H200 one of 268 MB
# added 5-10 ms to a 16 ms training call, 2026-11-28). A call of LONG_CALL_MS or more (milliseconds of streaming
# gigabytes or of hundreds of GFLOPs, nothing a launch or a clock step moves by much) is timed as the median of
# LONG_CALL_REPS such calls (that second one included), where do_bench would spend five calls estimating, one warming
# up and one or more timing. A shorter call is timed by do_bench (median, L2 flushed before each call) with
# SHORT_WARMUP_MS of warm-up and SHORT_REP_MS of timed calls: 25 samples or more of any call under a millisecond.
LONG_CALL_MS = 5.0
LONG_CALL_REPS = timing.REPEATS  # the timing rule's repeats (in one window; one a pass inside passes)
SHORT_WARMUP_MS, SHORT_REP_MS = 5, 25
FLUSH_BYTES = 256 * 2**20  # what do_bench writes to empty the L2 (TIMER_BYTES accounts for it)


def timer_cost(call_ms: float, flush_ms: float, host_ms: float = 0.0, passes: int = timing.PASSES) -> tuple[int, float]:
    """(calls, GPU ms) that timing one point costs under the rules above, for a call of call_ms on the GPU and
    host_ms on the CPU, and an L2 flush of flush_ms: a bound on a run's time that needs no GPU. The runner
    times a sweep in `passes` passes (1: every repeat in one window): the compiling call comes once a run, the
    peak-memory call (after a flush) once a pass, and a pass takes one repeat of the timer. Left out: the call
    timed again where a peak-memory call took memory from the driver (how often depends on the allocator's state)."""
    first = call_ms + passes * (call_ms + flush_ms)  # the compiling call, then each pass's peak-memory call
    if call_ms >= LONG_CALL_MS:  # the peak-memory calls are the repeats: LONG_CALL_REPS of them in all
        extra = max(0, LONG_CALL_REPS - passes)
        return 1 + passes + extra, first + extra * (call_ms + flush_ms)
    step = call_ms + flush_ms
    # timing.time_ms: REPEATS do_bench calls (one a pass), each one call and 5 to estimate, then its warm-up
    # (the first SHORT_WARMUP_MS, the later ones 1 ms) and its share of SHORT_REP_MS (at least 5 ms) of timed calls
    warm = max(1, int(SHORT_WARMUP_MS / step)) + (timing.REPEATS - 1) * max(1, int(1 / step))
    rep = timing.REPEATS * max(1, int(max(SHORT_REP_MS / timing.REPEATS, 5) / step))
    calls = 1 + passes + timing.REPEATS * (1 + 5) + warm + rep
    return calls, (first + timing.REPEATS * (call_ms + 5 * step) + warm * max(call_ms, host_ms)
                   + rep * max(step, host_ms))


def _flush_l2() -> None:
    torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda").zero_()


def _event_ms(run) -> float:
    """One call of `run` between CUDA events, the L2 emptied by a 256 MiB write before it (as do_bench does)."""
    _flush_l2()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = run()
    end.record()
    torch.cuda.synchronize()
    del result
    return start.elapsed_time(end)


def _driver_segments() -> int:
    """How many segments the caching allocator has taken from the driver (cudaMalloc calls) so far."""
    return torch.cuda.memory_stats().get("segment.all.allocated", 0)


def _peak_and_ms(run) -> tuple[int, float]:
    """(bytes `run` allocates at its peak beyond what was allocated before, its time between CUDA events with an
    emptied L2). The time is of a call that took no new memory from the driver: where this one did, the next is
    timed."""
    _flush_l2()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base, segments = torch.cuda.memory_allocated(), _driver_segments()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = run()
    end.record()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    if _driver_segments() > segments:  # its time holds cudaMalloc's: the allocator has the memory now
        return int(peak), _event_ms(run)
    return int(peak), start.elapsed_time(end)


def _time_point(run, with_host: bool = False):
    """(peak bytes, median ms, CPU ms per call or None, CPU ms per timer cycle or None) of one point, or None if it
    ran out of memory: a point the prediction let through must not end the sweep (the allocator's fragmentation and
    the libraries' workspaces are not in the model), so its tensors are released and the next point runs.
    with_host: the CPU's time is measured inside the timed calls themselves, and the CPU's time from one timed
    call to the next (timing.time_step, do_bench's way: the CPU prepares a call while the L2 flush runs)."""
    try:
        if timing.first_pass():  # compile, cuDNN plans, cuBLAS workspace: before the memory baseline (once a run)
            run()
        peak, first_ms = _peak_and_ms(run)
        if with_host:
            timed = timing.time_step(lambda mark: run(), SHORT_WARMUP_MS, SHORT_REP_MS, wait_for_flush=False)
            return peak, timed["gpu_ms"], timed["host_ms"], timed["cycle_ms"]
        if first_ms >= LONG_CALL_MS:
            times = sorted([first_ms] + [_event_ms(run) for _ in range(min(LONG_CALL_REPS, timing.repeats_now()) - 1)])
            timing.record_samples(times)  # each long call is one independent repeat
            return peak, times[len(times) // 2], None, None
        return peak, timing.time_ms(run, warmup_ms=SHORT_WARMUP_MS, rep_ms=SHORT_REP_MS), None, None
    except torch.cuda.OutOfMemoryError:
        pass  # leaving the handler drops the traceback, and with it the frames holding the N x N matrices
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return None


def unavailable_reason(impl: str, dtype: str, d: int, causal: bool) -> Optional[str]:
    """Why a library backend cannot run this case (None if it can): asked on a tiny input."""
    if impl in ("naive", "ours"):
        return None
    if impl == GLUON_IMPL:
        return gluon_case_reason(dtype, d)
    try:
        q = timing.random_tensor((1, 1, 128, d), dtype)
        sdpa(q, q, q, causal, impl)
        return None
    except RuntimeError as exc:
        return str(exc).split("\n")[0][:160]


# Checking before timing. Every configuration the run times is checked against float64 first, all of them before
# the first point is timed, CHECK_THREADS at a time: a check's first call compiles its Triton kernels (or builds
# the library's plans), and Triton and cuDNN do most of that work with Python's lock released, so the compiles of
# a run's 25 kernels overlap instead of queueing (Triton 3.6, compiling this file's kernels for sm_90 on a CPU:
# 0.4 to 1.9 s each, 22 s in a row, and a Python thread kept 96 % of its speed while they compiled; Triton's own
# AsyncCompileMode rests on the same property). The library backends are checked one after another in one of
# those threads, because torch's sdpa_kernel switches the backend for the whole process, and cuDNN keeps the plans
# it builds per thread: those of the checks' odd sizes are never used again, so building them aside costs nothing.
CHECK_THREADS = 8


def check_keys(params: Params, config_of) -> list[tuple]:
    """Every configuration a run can time, once each, as (impl, dtype, d, causal, mode, cfg): naive attention and
    the library backends by case (cfg None), ours by the tiles it takes at each N (config_of(shape, mode))."""
    keys = {}
    for dtype in params.dtypes:
        for d in params.head_dims:
            for mask in params.masks:
                for impl in params.impls:
                    for mode in params.modes:
                        if impl == GLUON_IMPL and not gluon_keys_ok(dtype, d, mode):
                            continue  # bf16, d 64 and 128: nothing else to check
                        for n in params.seq_lens:
                            cfg = config_of(_shape(params, n, d, mask, dtype), mode) if impl == "ours" else None
                            keys[(impl, dtype, d, mask == "causal", mode, cfg)] = None
    return list(keys)


def triton_kernels(keys: list) -> set:
    """The distinct Triton kernels (kernel, head dim, mask, tiles, TMA) that checking `keys` compiles."""
    kernels = set()
    for impl, dtype, d, causal, mode, cfg in keys:
        if impl == "ours":
            kernels.add(("fwd", dtype, d, causal, cfg.fwd, cfg.use_tma))
            if mode == "fwd+bwd":
                kernels.add(("dq", dtype, d, causal, cfg.dq, cfg.use_tma))
                kernels.add(("dkdv", dtype, d, causal, cfg.dkdv, cfg.use_tma))
    return kernels


def _check(key: tuple) -> float:
    impl, dtype, d, causal, mode, cfg = key
    if impl == "ours":
        return _check_ours(dtype, d, causal, mode, cfg)
    if impl == GLUON_IMPL:
        return check_gluon(dtype, d, causal, mode)
    return _check_reference_impl(impl, dtype, d, causal, mode)


def in_parallel(jobs: dict, threads: int) -> dict:
    """{name: job()}, the jobs spread over `threads` threads. A job that fails in a thread runs again alone in this
    one, so that a real failure (a KernelMismatch, say) is raised here just as it would be without threads."""
    from concurrent.futures import ThreadPoolExecutor

    results = {}
    if threads > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(min(threads, len(jobs))) as pool:
            futures = {name: pool.submit(job) for name, job in jobs.items()}
            for name, future in futures.items():
                try:
                    results[name] = future.result()
                except Exception:  # noqa: BLE001 - run again below, alone, where it raises for real
                    pass
    for name, job in jobs.items():
        if name not in results:
            results[name] = job()
    return results


def _run_checks(keys: list, device: torch.device) -> tuple[dict, dict]:
    """(relative error by check key, why each library case cannot run or None) for every key."""
    threads = CHECK_THREADS if device.type == "cuda" else 1  # the CPU interpreter patches triton as it runs
    index = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        for kernel in (attention_fwd_kernel, attention_bwd_dq_kernel, attention_bwd_dkdv_kernel):
            try:  # each kernel's per-device cache made here, so that no two threads create it at once
                kernel.device_caches[index]
            except Exception:  # noqa: BLE001 - another Triton: the threads create it, at worst compiling twice
                pass

    def on_device(job):
        def run():
            if device.type == "cuda":
                torch.cuda.set_device(index)
            return job()
        return run

    library = [k for k in keys if k[0] in SDPA_BACKENDS]
    gluon = [k for k in keys if k[0] == GLUON_IMPL]

    def library_checks():
        why, errors = {}, {}
        for key in library:
            case = key[:4]
            if case not in why:
                why[case] = unavailable_reason(*case)
            if not why[case]:
                errors[key] = _check(key)
        return why, errors

    def gluon_checks():  # one after another in one thread: the Gluon kernel's compiles are its own business
        return {key: _check(key) for key in gluon}

    jobs = {"library": on_device(library_checks)} if library else {}
    jobs |= {"gluon": on_device(gluon_checks)} if gluon else {}
    jobs |= {key: on_device(functools.partial(_check, key)) for key in keys
             if key[0] not in SDPA_BACKENDS and key[0] != GLUON_IMPL}
    results = in_parallel(jobs, threads)
    if device.type == "cuda":
        torch.cuda.synchronize()
    why, library_errors = results.pop("library", ({}, {}))
    return results | library_errors | results.pop("gluon", {}), why


def measure(params: Params, target: Target, progress):
    device = torch.device("cuda", torch.cuda.current_device())
    params, notes = gluon_notes(params, target.compute_capability)  # the Gluon rung: left out where it cannot run
    yield from notes
    cases = [(dtype, d, mask) for dtype in params.dtypes for d in params.head_dims for mask in params.masks]
    total = len(cases) * len(params.seq_lens) * len(params.impls) * len(params.modes)
    done, skipped, rates = 0, [], {}
    keys = check_keys(params, lambda shape, mode: point_config(shape, mode, device))
    progress(0.0, f"checking {len(keys)} configurations against float64, {CHECK_THREADS} at a time "
                  f"(their kernels compile meanwhile)")
    # once a run: later passes find every configuration checked (and those met on the way, added to `checked`)
    checked, unavailable = timing.once_per_run("attention: checks", lambda: _run_checks(keys, device))
    for dtype in params.dtypes:
        for d in params.head_dims:
            for n in params.seq_lens:
                torch.cuda.empty_cache()  # the inputs must not pin the large blocks an earlier N left cached
                probe_bytes = naive_probe_heads(n, dtype, params.batch * params.heads) * n * n * _nbytes(dtype)
                if "naive" in params.impls and (SOFTMAX_PROBE, n, dtype) not in rates \
                        and fits(4 * probe_bytes + n * n, _available_bytes()):
                    progress(done / total, f"N={n}, {dtype}: probing the rates of torch's softmax and masked_fill")
                    for probe_row in probe_naive_kernels(n, dtype, params.batch * params.heads, "causal" in params.masks):
                        rates[(probe_row["mode"], n, dtype)] = probe_row["measured_tbps"]
                        yield probe_row
                    torch.cuda.empty_cache()
                if "naive" in params.impls and (naive_matmul_kernel("scores", d), n, dtype) not in rates \
                        and fits(4 * probe_bytes + n * n, _available_bytes()):
                    progress(done / total, f"N={n}, d={d}, {dtype}: probing the rates of torch's batched products")
                    for probe_row in probe_naive_matmuls(n, d, dtype, params.batch * params.heads):
                        rates[(probe_row["mode"], n, dtype)] = probe_row["measured_tbps"]
                        yield probe_row
                    torch.cuda.empty_cache()
                q, k, v, do = (timing.random_tensor((params.batch, params.heads, n, d), dtype) for _ in range(4))
                q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
                for mask in params.masks:
                    causal = mask == "causal"
                    shape = _shape(params, n, d, mask, dtype)
                    for impl in params.impls:
                        if (impl, dtype, d, causal) not in unavailable:
                            unavailable[(impl, dtype, d, causal)] = unavailable_reason(impl, dtype, d, causal)
                        for mode in params.modes:
                            key = _row_key(impl, mode, mask, dtype, d, n)
                            label = f"{impl} {mode}, {mask}, {dtype}, d={d}, N={n}"
                            done += 1
                            frac = (done - 1) / total
                            why = unavailable[(impl, dtype, d, causal)]
                            if why:
                                yield key | {"note": f"unavailable: {why}"}
                                continue
                            row = dict(key)
                            need = point_peak_bytes(impl, shape, mode)
                            free = _free_for_point() if need > 2**30 else _available_bytes()
                            if not fits(need, free):
                                progress(frac, f"{label}: skipped ({need / 1e9:.1f} GB needed)")
                                skipped.append(f"{impl} {mode} N={n} d={d} {mask}")
                                yield key | {"predicted_peak_bytes": need, "note": skip_note(impl, need, free)}
                                continue
                            # every configuration the run times is checked (ours picks tiles per point)
                            cfg = point_config(shape, mode, q.device) if impl == "ours" else None  # Gluon: its own
                            check_key = (impl, dtype, d, causal, mode, cfg)
                            if check_key not in checked:
                                progress(frac, f"{label}: checking against float64")
                                checked[check_key] = _check(check_key)
                            run = _runner(impl_fn(impl, causal, mode), mode, q, k, v, do)
                            progress(frac, f"{label}: timing")
                            host_floor = impl in HOST_FLOOR_IMPLS and _needs_host_floor(shape, mode, target, impl)
                            timed = _time_point(run, with_host=host_floor)
                            if timed is None:  # predicted to fit, yet out of memory: keep going without it
                                skipped.append(f"{impl} {mode} N={n} d={d} {mask}")
                                yield key | {"predicted_peak_bytes": need,
                                             "note": f"skipped: predicted to need {need / 1e9:.1f} GB of the "
                                                     f"{free / 1e9:.1f} GB free, but ran out of memory"}
                                continue
                            peak, ms, host_ms, cycle_ms = timed
                            flops = attention_flops(mode, shape.b, shape.h, n, n, d, causal)
                            row |= {"measured_ms": ms, "measured_tflops": timing.tflops(flops, ms),
                                    "measured_peak_bytes": peak,
                                    "check_rel_error": checked[check_key]}
                            if impl in ("naive", "ours", GLUON_IMPL):
                                predicted = naive_peak_bytes(shape, mode) if impl == "naive" else \
                                    point_peak_bytes(impl, shape, mode)
                                row["memory_error_pct"] = 100.0 * (peak - predicted) / predicted
                            if host_floor and impl != "naive":  # short sequences: the GPU can wait for our launches
                                row = host_floor_row(row, shape, mode, host_ms, target, impl, cycle_ms)
                            if impl == "naive":  # with the rates this run probed
                                row = naive_prediction(shape, mode, target, rates) | row
                                if host_floor:  # and torch's launches, op by op
                                    row = naive_host_floor_row(row, shape, mode, host_ms, target, rates)
                            yield row
                del q, k, v, do
    if skipped:
        yield (f"{len(skipped)} points were skipped because they do not fit in this GPU's free memory "
               f"(e.g. {skipped[0]}); the model still shows them. Their rows say how much each needs.")
    progress(1.0, "done")

