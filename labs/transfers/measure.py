"""
The transfers lab's measurement: every copy checked bit for bit, then timed by the wall clock (as a program
waits for it), each pageable copy in turns with the CPU probe of its staging on the same buffer.
"""

from __future__ import annotations

import functools
import os
import statistics
import time

import torch

from labs.engine import timing
from labs.engine.gpu import GB, MiB, Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.transfers.kernels import HandStager, checked_copy, host_buffer, stream_copy_then_compute
from labs.transfers.model import (ASSUMED_LATENCY_US, KIB, MATMUL_N, STAGING_BYTES, fitted_latency_us, link_for,
                                  matmul_count, measured_host_rates, predict_with, size_bytes)

WALL_BUDGET_MS = 60.0  # a copy's timing: repeated for about this long in all rounds together
ROUNDS = 3  # each copy and its CPU probe (each overlap schedule) timed in turns this many times; fastest kept
# Calls of one copy per round at least: one. A large copy (tens of ms) is its own repeat; the rounds and the runner's
# passes give it its others (3 rounds x 5 passes). Three calls a round made a default run spend a quarter of its
# time re-copying the largest buffers.
MIN_CALLS_PER_ROUND = 1


def cpu_l2_bytes():
    """One CPU core's L2 cache in bytes, from Linux's sysfs; None where the OS does not say."""
    import glob

    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(f"{index}/level") as level, open(f"{index}/size") as size:
                if level.read().strip() == "2":
                    text = size.read().strip().upper()
                    scale = {"K": KIB, "M": MiB}.get(text[-1:], 1)
                    return int(text.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return None


def host_free_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def check(p, target: Target) -> None:
    """Refuse buffers that do not fit: one device buffer and one host buffer of each kind, of the largest size."""
    largest = max(size_bytes(max(p.sizes_kib)) if "copies" in p.experiments else 0,
                  p.overlap_mib * MiB if "overlap" in p.experiments else 0,
                  max(p.staging_mib) * MiB if "staging" in p.experiments else 0)
    free = free_memory_bytes() if target.live else target.memory_bytes
    need = largest + (3 * MATMUL_N**2 * 2 if "overlap" in p.experiments else 0)
    if need > 0.8 * free:
        raise ParamError(f"The largest copy ({largest / GB:.1f} GB) does not fit in this GPU's {free / GB:.1f} GB "
                         f"free memory; choose sizes up to {int(0.8 * free / KIB):,} KiB.")
    host = host_free_bytes()
    if host and 2 * largest > 0.5 * host:
        raise ParamError(f"The largest copy needs {2 * largest / GB:.1f} GB of host memory (a pinned and a "
                         f"pageable buffer); this machine has {host / GB:.1f} GB free. Choose smaller sizes.")


def host_copy_gbps(nbytes: int = 256 * MiB) -> float:
    """One CPU thread's memcpy rate, GB/s (numpy's copyto is a single memcpy): the driver's staging copy."""
    import numpy as np

    src = np.random.default_rng(0).random(nbytes // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - started)
    assert np.array_equal(dst, src)
    return nbytes / best / 1e9


def wall_ms(fn, budget_ms: float = WALL_BUDGET_MS, min_reps: int = 5) -> float:
    """Median time of one call of `fn` as the program waits for it: synchronize, call, synchronize again.
    The first call is timed too and sets how many more fit in the budget (at least `min_reps` in all, at
    most 200); the median drops it where it ran cold.

    Not do_bench: do_bench empties the L2 with a memset queued before each timed call, and while the GPU
    runs that memset the CPU already starts a pageable copy's staging, before the start event is stamped.
    Events then miss tens of microseconds of CPU work (a pageable 1 MiB copy looked twice as fast).
    """
    times = [_waited_seconds(fn)]
    for _ in range(max(min_reps, min(200, int(budget_ms * 1e-3 / max(times[0], 1e-6)))) - 1):
        times.append(_waited_seconds(fn))
    timing.record_samples([t * 1e3 for t in times])  # host-side copies: this timer's calls are the repeats
    return statistics.median(times) * 1e3


def _waited_seconds(fn) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def timed_in_turns(pairs: dict, rounds: int = ROUNDS, timer=None, progress=None) -> dict:
    """{key: (ms per copy, the probe's figures)} for several copies, each with its CPU probe or None, timed
    in turns: every copy once (then its probe), then every copy again, `rounds` times; each keeps its fastest.

    On a shared host the CPU's rate and the driver's fixed cost drift within seconds. A probe timed once,
    before or after its copy, can catch a slower or a faster moment than the copy did; the small copies that
    set the model's latency, timed one size after the other, can catch another moment than the 1 MiB copy
    that the latency then predicts (in the H100 recording of 13:27 UTC a 4 KiB pinned d2h copy took 26 us,
    a 256 KiB one 20 us). Timed in turns, every copy and probe samples the same moments, and a disturbance (another
    process, an interrupt) only ever adds time, so the fastest rounds are the least disturbed, and close in time.
    `progress(key, round)` is called before each copy is timed.
    """
    timer = timer or wall_ms  # (ms of one call of a function, given a budget in ms and a least count of calls)
    times = {key: [] for key in pairs}
    figures = {key: [] for key in pairs}
    with timing.collecting():  # the timers' own records stay here: each row records its one time (own_timing)
        for round_ in range(rounds):
            for key, (copy, probe) in pairs.items():
                if progress is not None:
                    progress(key, round_)
                times[key].append(timer(copy, timing.budget_now(WALL_BUDGET_MS) / rounds,
                                        min_reps=MIN_CALLS_PER_ROUND))
                if probe is not None:
                    figures[key].append(probe())
    return {key: (min(times[key]), fastest(figures[key])) for key in pairs}


def own_timing(row: dict) -> dict:
    """The row, its own time handed to the timing rule just before it is yielded (timing.record_own): the experiments
    time all their points in turns and yield the rows afterwards (left to the timers, one row took every timing of
    the sweep: a spread of 105 %, two extra passes, and no spread on any other row)."""
    ms = row.get("measured_ms", row.get("driver_ms"))
    if ms is not None:
        timing.record_own(ms)
    return row


def fastest(rounds: list) -> dict:
    """The best of several rounds of probe figures: the highest rate (`_gbps`), the shortest time (`_ms`)."""
    out = {}
    for figures in rounds:
        for key, value in figures.items():
            better = max if key.endswith("_gbps") else min
            out[key] = value if key not in out else better(out[key], value)
    return out


def staging_probe(host: torch.Tensor):
    """A function that measures, once, one CPU thread's rates for the driver's staging patterns on this very
    buffer (GB/s), and what locking and unlocking its pages costs (pin_times):
    cpu_read_gbps: the buffer copied into a small ring (h2d's staging; the ring stays in cache, the buffer
    comes from wherever it lives: the CPU's cache if it fits and was just used, else DRAM);
    cpu_write_gbps: the buffer written with zeros, nothing read;
    cpu_copy_out_gbps: the ring copied out into the buffer (d2h's staging).
    The write comes before the copy-out, so the buffer ends up holding the ring's data (its own bytes, read
    by the first pass), not zeros that the next copy or probe might move more cheaply."""
    import numpy as np

    buf = host.numpy().view(np.uint8)
    ring = np.empty(min(buf.size, STAGING_BYTES), dtype=np.uint8)
    ring.fill(1)  # touch the ring's pages now: the first timed pass must not pay their page faults
    step = ring.size
    repeats = max(1, (16 * MiB) // buf.size)  # small buffers: enough copies for a clock to time

    def read():
        for _ in range(repeats):
            for i in range(0, buf.size, step):
                np.copyto(ring[:min(step, buf.size - i)], buf[i:i + step])

    def write():  # writing the buffer without reading anything (numpy's fill: glibc's memset)
        for _ in range(repeats):
            buf.fill(0)

    def copy_out():
        for _ in range(repeats):
            for i in range(0, buf.size, step):
                np.copyto(buf[i:i + step], ring[:min(step, buf.size - i)])

    def once() -> dict:
        passes = (("cpu_read_gbps", read), ("cpu_write_gbps", write), ("cpu_copy_out_gbps", copy_out))
        return {name: repeats * buf.size / _seconds(fn) / 1e9 for name, fn in passes} | pin_times(host, reps=1)

    return once


def pin_times(host: torch.Tensor, reps: int = 3) -> dict:
    """What locking this buffer's pages costs and what unlocking them costs (cudaHostRegister, then
    cudaHostUnregister, as a driver must do to copy straight into pageable memory), the least of `reps`, ms.
    Empty where there is no CUDA."""
    if not torch.cuda.is_available():
        return {}
    cudart = torch.cuda.cudart()
    ptr, nbytes = host.data_ptr(), host.numel() * host.element_size()
    pins, unpins = [], []
    for _ in range(reps):
        started = time.perf_counter()
        err = cudart.cudaHostRegister(ptr, nbytes, 0)
        pins.append(time.perf_counter() - started)
        if int(err) != 0:
            torch.cuda.synchronize()
            return {}
        started = time.perf_counter()
        cudart.cudaHostUnregister(ptr)
        unpins.append(time.perf_counter() - started)
    pin, unpin = min(pins) * 1e3, min(unpins) * 1e3  # the least of a few: a preempted lock only adds time
    return {"pin_ms": pin, "unpin_ms": unpin, "pin_gbps": nbytes / (pin * 1e-3) / 1e9}


def _seconds(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure_copies(p, progress, done: int, total: int):
    """Rows of measured copies. For each (memory, direction) every size is first checked bit for bit (which
    also touches every host page, so no copy pays first-touch page faults), then all sizes are timed in turns
    (timed_in_turns), a pageable copy with its CPU staging probe on the same buffer."""
    largest = size_bytes(max(p.sizes_kib))
    sizes = sorted(p.sizes_kib)
    device = run_buffer(("copies", "device", largest), lambda: torch.empty(largest // 4, device="cuda",
                                                                           dtype=torch.float32))
    for memory in p.memories:
        host = run_buffer(("copies", memory, largest), functools.partial(host_buffer, largest, memory == "pinned"))
        for direction in p.directions:
            errors, pairs = {}, {}
            for s in sizes:
                progress(done / total, f"{direction} {memory}, {s:,} KiB: checking the copy bit for bit"
                         if timing.first_pass() else f"{direction} {memory}, {s:,} KiB")
                n = size_bytes(s) // 4
                errors[s] = timing.once_per_run(("copies check", direction, memory, s),
                                                functools.partial(checked_copy, direction, host, device, n))
                src, dst = (host[:n], device[:n]) if direction == "h2d" else (device[:n], host[:n])
                copy = functools.partial(dst.copy_, src, non_blocking=memory == "pinned")
                # the CPU's share of a pageable copy, probed on the same buffer in turns with the copy
                pairs[s] = (copy, staging_probe(host[:n]) if memory == "pageable" else None)

            def step(s, round_):
                progress(done / total, f"{direction} {memory}: round {round_ + 1} of {ROUNDS} over all sizes, "
                                       f"{s:,} KiB" + (" and its CPU probe" if memory == "pageable" else ""))

            for s, (ms, rates) in timed_in_turns(pairs, progress=step).items():
                nbytes = size_bytes(s)
                row = {"experiment": "copies", "direction": direction, "memory": memory, "size_bytes": nbytes,
                       "schedule": "-", "measured_ms": ms, "measured_gbps": nbytes / (ms * 1e-3) / 1e9,
                       "check_rel_error": errors[s]}
                if memory == "pageable":
                    row |= rates | {"cpu_l2_bytes": cpu_l2_bytes()}
                done += 1
                yield row
            del pairs


def run_buffer(key: tuple, allocate):
    """A buffer allocated (and, by its first pass, checked and touched page by page) once a run and kept for the
    run's later passes: allocating 1 GiB of pinned memory and filling it with fresh random numbers again every
    pass took longer than timing its copies."""
    return timing.once_per_run(("transfers buffer",) + key, allocate)


def measure_overlap(p, target: Target, count: int, progress, done: int, total: int):
    nbytes = p.overlap_mib * MiB
    host = run_buffer(("overlap", "pinned", nbytes),
                      lambda: host_buffer(nbytes, pinned=True).copy_(torch.randn(nbytes // 4)))
    device = run_buffer(("overlap", "device", nbytes), lambda: torch.empty(nbytes // 4, device="cuda",
                                                                           dtype=torch.float32))
    a, b = run_buffer(("overlap", "matmul inputs"), lambda: tuple(timing.random_tensor((MATMUL_N, MATMUL_N), "bf16")
                                                                  for _ in range(2)))
    out = torch.empty_like(a)
    side = torch.cuda.Stream()

    def copy():
        device.copy_(host, non_blocking=True)  # on whichever stream is current

    def compute():
        for _ in range(count):
            torch.mm(a, b, out=out)

    def one_stream():
        copy()
        compute()

    def two_streams():
        stream_copy_then_compute(copy, compute, side)

    def check() -> float:
        progress(done / total, "overlap: checking the matmul against float64 and the copy bit for bit")
        err = timing.check_close(torch.mm(a, b, out=out), a.double() @ b.double(), "bf16", "bf16 matmul")
        device.fill_(float("nan"))
        two_streams()
        torch.cuda.synchronize()
        return max(err, timing.check_close(device, host, "fp32", "overlapped h2d copy", tol=0.0))

    err = timing.once_per_run(("overlap check", nbytes, count), check)
    schedules = {"copy alone": copy, "compute alone": compute, "one stream": one_stream, "two streams": two_streams}
    # the four schedules in turns, ROUNDS times, each keeping its fastest round: a copy timed once, alone,
    # can catch a busy moment of the host or the link that the same copy inside "two streams" did not
    times = {name: [] for name in schedules}
    with timing.collecting():  # each row records its own time below (own_timing), not all twelve on the first
        for round_ in range(ROUNDS):
            progress(done / total, f"overlap: the four schedules in turns, round {round_ + 1} of {ROUNDS}")
            for name, fn in schedules.items():
                times[name].append(timing.time_ms(fn, warmup_ms=10, rep_ms=100 / ROUNDS))
    for name, ms in ((name, min(t)) for name, t in times.items()):
        done += 1
        row = {"experiment": "overlap", "direction": "h2d", "memory": "pinned", "size_bytes": nbytes,
               "schedule": name, "matmuls": count, "measured_ms": ms, "check_rel_error": err}
        if name == "copy alone":
            row["measured_gbps"] = nbytes / (ms * 1e-3) / 1e9
        yield row


def measure_staging(p, progress, done: int, total: int):
    """Rows of the staging experiment: per size, the copy staged by hand (checked bit for bit first) with the
    CPU probe on the same buffer, and the driver's own pageable copy of it, all sizes in turns (timed_in_turns)."""
    largest = max(p.staging_mib) * MiB
    host = run_buffer(("staging", "pageable", largest), functools.partial(host_buffer, largest, pinned=False))
    device = run_buffer(("staging", "device", largest), lambda: torch.empty(largest // 4, device="cuda",
                                                                            dtype=torch.float32))
    stager = HandStager()
    try:
        pairs, errors = {}, {}
        for mib in sorted(p.staging_mib):
            progress(done / total, f"staging by hand, {mib} MiB" + (": checking the copy bit for bit"
                                                                    if timing.first_pass() else ""))
            n = mib * MiB // 4
            src, dst = host[:n], device[:n]
            errors[mib] = timing.once_per_run(("staging check", mib),
                                              functools.partial(check_hand_staging, stager, dst, src, mib))
            pairs[(mib, "by hand")] = (functools.partial(stager.copy, dst, src), hand_probe(stager, dst, src))
            pairs[(mib, "driver")] = (functools.partial(dst.copy_, src), None)

        def step(key, round_):
            progress(done / total, f"staging: round {round_ + 1} of {ROUNDS}, {key[0]} MiB {key[1]}")

        for (mib, schedule), (ms, rates) in timed_in_turns(pairs, progress=step).items():
            nbytes = mib * MiB
            row = {"experiment": "staging", "direction": "h2d", "memory": "pageable", "size_bytes": nbytes,
                   "schedule": schedule, "check_rel_error": errors[mib]}
            # the driver's copy is the comparison, measured only: its model is the copies experiment's
            row["measured_ms" if schedule == "by hand" else "driver_ms"] = ms
            row["measured_gbps" if schedule == "by hand" else "driver_gbps"] = nbytes / (ms * 1e-3) / 1e9
            if schedule == "by hand":
                row |= rates | {"cpu_l2_bytes": cpu_l2_bytes()}
                done += 1
            yield row
    finally:
        stager.close()


def hand_probe(stager: HandStager, dst: torch.Tensor, src: torch.Tensor):
    """The staging probe on the source buffer, and what queueing one piece costs the CPU (HandStager.queue_us)."""
    rates = staging_probe(src)
    return lambda: rates() | {"queue_us": stager.queue_us(dst, src)}


def check_hand_staging(stager: HandStager, dst: torch.Tensor, src: torch.Tensor, mib: int) -> float:
    """Fresh random numbers staged by hand into a poisoned destination, compared bit for bit."""
    src.copy_(torch.randn(src.numel()))
    dst.fill_(float("nan"))
    stager.copy(dst, src)
    return timing.check_close(dst, src, "fp32", f"hand-staged copy of {mib} MiB", tol=0.0)


def measure(p, target: Target, progress):
    total = (len(p.directions) * len(p.memories) * len(p.sizes_kib) if "copies" in p.experiments else 0) \
        + (4 if "overlap" in p.experiments else 0) + (len(p.staging_mib) if "staging" in p.experiments else 0) + 1
    progress(0.0, "measuring one CPU thread's memcpy rate")
    host_gbps = timing.once_per_run("transfers host memcpy", host_copy_gbps)  # a note's figure: once a run
    yield (f"One CPU thread copies host memory at {host_gbps:.1f} GB/s here (256 MiB, DRAM to DRAM). Each "
           "pageable copy's model uses the CPU's staging rate measured on its own buffer and size instead.")
    rows = list(measure_copies(p, progress, 1, total)) if "copies" in p.experiments else []
    if "staging" in p.experiments:
        try:
            rows += list(measure_staging(p, progress, 1 + len(rows), total))
        except RuntimeError as err:  # no CUDA runtime library to call by hand: the other experiments still run
            yield f"Staging by hand was skipped: {err}."
    host_rates = {"host_copy_gbps": host_gbps, **measured_host_rates(rows)}
    latency = fitted_latency_us(target, rows, host_rates)
    model = predict_with(p, target, latency, host_rates)
    # every measured row carries the prediction made with this run's own latency and memcpy rate
    by_key = {(m["experiment"], m["direction"], m["memory"], m["size_bytes"], m["schedule"]): m for m in model}
    for r in rows:  # (the driver's copy in the staging experiment has no model row of its own)
        yield own_timing(by_key.get((r["experiment"], r["direction"], r["memory"], r["size_bytes"], r["schedule"]),
                                    {}) | r)
    if "overlap" in p.experiments:
        link = link_for(target)
        count = matmul_count(p, target, link, latency.get(("h2d", "pinned"), ASSUMED_LATENCY_US))
        for r in measure_overlap(p, target, count, progress, 1 + len(rows), total):
            yield own_timing(by_key.get((r["experiment"], r["direction"], r["memory"], r["size_bytes"],
                                         r["schedule"]), {}) | r)
    progress(1.0, "done")
