"""
Transfers: moving data between the host and the GPU over PCIe
=============================================================

What you will learn:
- how fast host -> device (H2D) and device -> host (D2H) copies go, against the PCIe link the GPU reports
  (generation x lanes gives the bandwidth per direction);
- why a small copy costs a fixed latency (microseconds) whatever its size, and a large one costs its bytes
  over the link: time = latency + bytes / bandwidth, the same alpha-beta model as for collectives;
- why pinned (page-locked) host memory is faster than ordinary pageable memory: for host -> device the
  driver's CPU thread first copies pageable data into pinned staging buffers, so the copy runs at the slower
  of that CPU copy and the link (never at a rate of the core's own cache: the copy engine touches the staging
  buffers between CPU passes); for a large device -> host copy it locks the pageable pages, copies, and
  unlocks them, paying both (each measured on the same buffer in the run);
- how a copy on one CUDA stream hides behind compute on another.

The experiments:
1. `copies`: H2D and D2H from pinned and pageable host buffers, sizes 4 KiB to 1 GiB, each copy checked
   bit for bit against its source before it is timed (wall clock, as a program waits for it); a pageable
   copy and its CPU probe are timed in turns, three rounds, the fastest of each kept.
2. `overlap`: a pinned H2D copy and a chain of bf16 matmuls of about the same duration, run one after the
   other on one stream, then on two streams at once (the four in turns, three rounds, the fastest kept).
3. `staging`: a pageable H2D copy staged by hand, the way the driver is described to do it (one CPU thread
   copies each piece of your buffer into one of two pinned staging buffers while the copy engine moves the
   piece before), checked bit for bit and timed in turns with the driver's own copy of the same buffer and the
   CPU probe. The model of staging describes the hand-made copy, whose every step is known; where the driver's
   copy parts from both, the driver does something it does not document.
"""

from __future__ import annotations

import functools
import os
import re
import statistics
import subprocess
import time
from dataclasses import dataclass

import torch

from labs.engine import timing
from labs.engine.gpu import GB, MiB, Target, free_memory_bytes, links_for
from labs.engine.lab import Headline, Lab
from labs.engine.params import ParamError, param

KIB = 1024
EXPERIMENTS = ("copies", "overlap", "staging")
DIRECTIONS = ("h2d", "d2h")
MEMORIES = ("pinned", "pageable")

# PCI Express raw rate per lane (GT/s) and line-code efficiency, by generation (PCI-SIG base specifications:
# 8b/10b for generations 1 and 2, 128b/130b for 3 to 5). Per direction, x16 Gen5 = 32 x 16 x 128/130 / 8 = 63 GB/s.
PCIE_GTPS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}
PCIE_CODE = {1: 0.8, 2: 0.8, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130}
# The fixed cost of one copy before any live run has measured it: an order of magnitude (a DMA set-up and
# a driver call), drawn as "assumed". Every live run replaces it with the time of its own smallest copy.
ASSUMED_LATENCY_US = 10.0
# Pageable copies before a run measured this machine's CPU memcpy: assumed, replaced by the measurement.
ASSUMED_HOST_COPY_GBPS = 10.0
# The lab's CPU probe copies through a ring of this size, small enough to stay in the CPU's cache; the model
# also takes it as the size of one of the driver's staging buffers (the driver's own, undocumented; 2 and 8 MiB
# probe rings gave the same rates).
STAGING_BYTES = 2 * MiB
# One CPU core's own (L2) cache where the run cannot read it from the OS: 2 MiB, the per-core L2 of the Xeon
# server hosts the recorded runs came from (lscpu there: 2 MiB per core). Every live run reads its own.
ASSUMED_CPU_L2_BYTES = 2 * MiB
WALL_BUDGET_MS = 60.0  # a copy's timing: repeated for about this long in all rounds together
ROUNDS = 3  # each copy and its CPU probe (each overlap schedule) timed in turns this many times; fastest kept
MATMUL_N = 4096  # the overlap experiment's compute: bf16 4096^3 matmuls (compute-bound, ~0.2 ms each on an H100)


# Data travels in transaction-layer packets: at most MAX_PAYLOAD bytes of data each, plus framing, a sequence
# number, a 4-dword header (64-bit addresses) and a CRC (PCI Express base specification: 4 + 2 + 16 + 4 bytes).
# 256 bytes is the payload size data-centre GPUs and their root ports commonly settle on (lspci shows MaxPayload).
PCIE_MAX_PAYLOAD_BYTES = 256
PCIE_PACKET_OVERHEAD_BYTES = 26


def pcie_packet_efficiency(payload_bytes: int = PCIE_MAX_PAYLOAD_BYTES) -> float:
    """The share of the link's bytes that are data, with full packets."""
    return payload_bytes / (payload_bytes + PCIE_PACKET_OVERHEAD_BYTES)


def pcie_gbps(gen: int, lanes: int) -> float:
    """Bandwidth per direction of a PCIe link, GB/s (10^9 bytes/s), after line coding."""
    if gen not in PCIE_GTPS:
        raise ParamError(f"PCIe generation {gen} is not modelled (known: {', '.join(map(str, PCIE_GTPS))}).")
    return PCIE_GTPS[gen] * lanes * PCIE_CODE[gen] / 8


@functools.lru_cache(maxsize=1)
def reported_link() -> tuple:
    """(generation, lanes) that the attached GPU's link reports through nvidia-smi, or (None, None).

    The maximum the GPU and the slot both support: an idle link drops to a lower generation to save power,
    so the current reading understates what a copy gets.
    """
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=pcie.link.gen.max,pcie.link.width.max",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
        gen, width = (int(v) for v in out.stdout.strip().splitlines()[0].split(", "))
        return gen, width
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None, None


def link_for(target: Target) -> dict:
    """The PCIe link a model of this GPU uses: what the live GPU reports, else its datasheet."""
    gen, lanes, source = None, None, ""
    if target.live:
        gen, lanes = reported_link()
        source = "reported by the GPU (nvidia-smi)"
    links = links_for(target.datasheet)
    if (gen is None or gen not in PCIE_GTPS) and links:
        gen, lanes, source = links.pcie_gen, links.pcie_lanes, f"datasheet: {links.source}"
    if gen is None or gen not in PCIE_GTPS:
        gen, lanes, source = 4, 16, "unknown GPU: assumed PCIe Gen4 x16"
    line = pcie_gbps(gen, lanes)
    return {"pcie_gen": gen, "pcie_lanes": lanes, "pcie_line_gbps": line,
            "pcie_gbps": line * pcie_packet_efficiency(), "link_source": source}


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    experiments: tuple = param(EXPERIMENTS, "what to run", choices=EXPERIMENTS)
    directions: tuple = param(DIRECTIONS, "h2d: host to device, d2h: device to host", choices=DIRECTIONS)
    memories: tuple = param(MEMORIES, "host buffer: pinned (page-locked) or pageable", choices=MEMORIES)
    sizes_kib: tuple = param(tuple(4 * 4**k for k in range(9)) + (1048576,), "copy sizes", unit="KiB",
                             min=4, max=4 * 1048576)
    overlap_mib: int = param(256, "overlap experiment: bytes copied while the matmuls run", unit="MiB",
                             min=1, max=4096)
    staging_mib: tuple = param((4, 16, 64, 256), "staging experiment: pageable h2d copies staged by hand",
                               unit="MiB", min=1, max=4096)


def size_bytes(size_kib: int) -> int:
    return size_kib * KIB


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
def copy_ms(nbytes: float, latency_us: float, link_gbps: float) -> float:
    """Alpha-beta: a fixed cost per copy plus the bytes over the link."""
    return latency_us * 1e-3 + nbytes / (link_gbps * 1e9) * 1e3


def effective_gbps(memory: str, link_gbps: float, host_copy_gbps: float) -> float:
    """Pageable data is staged through a pinned buffer by a CPU memcpy, pipelined with the DMA in chunks:
    the slower of the two stages sets the pace. Pinned data goes straight over the link."""
    return link_gbps if memory == "pinned" else min(link_gbps, host_copy_gbps)


def staging_key(direction: str) -> str:
    return "cpu_read_gbps" if direction == "h2d" else "cpu_copy_out_gbps"


def staging_gbps(direction: str, rates: dict) -> float:
    """The CPU side of a pageable copy: for h2d the driver's thread reads your buffer into its pinned staging
    buffer; for d2h it copies the staging buffer out into yours. `rates` holds the one-thread rates measured
    on the same buffer (cpu_read_gbps, cpu_copy_out_gbps), and `out_of_cache_gbps`: the same probe's rate on
    a buffer larger than one core's cache.

    The probe copies through a ring that stays in the core's cache, but the driver's staging buffers cannot:
    between two CPU passes the copy engine reads them (h2d) or writes them (d2h), so the CPU finds them in
    the shared cache or DRAM, never in its own. A copy small enough for the core's cache therefore stages no
    faster than one that is not: the model takes the slower of the two measured rates.

    For d2h the driver writes your buffer whole and has no use for its old bytes: it goes at least as fast
    as the probe's memcpy, and as fast as writing the buffer alone (cpu_write_gbps: memset's stores, which
    do not read a line before writing it). Beyond the CPU's caches the two differ: the memcpy reads every
    line of the destination before it writes it (on the H100 host of 12:20 UTC: memcpy 7.2 to 7.7 GB/s,
    write 9.8 to 10.9, the driver's copy-out 9.7 to 10.1, for 12 to 32 MiB buffers)."""
    own = rates.get(staging_key(direction)) or rates.get("host_copy_gbps") or ASSUMED_HOST_COPY_GBPS
    if direction == "d2h":
        own = max(own, rates.get("cpu_write_gbps") or own)
    return min(own, rates.get("out_of_cache_gbps") or own)


def first_piece_ms(direction: str, nbytes: float, link_gbps: float) -> float:
    """What a staged d2h copy cannot hide: the CPU copies a staging buffer out only once the copy engine has
    filled it, so the first buffer's transfer (the whole copy, up to one staging buffer) comes before any CPU
    work. A staged h2d copy hands the engine each piece as it is staged; no such term."""
    return min(nbytes, STAGING_BYTES) / (link_gbps * 1e9) * 1e3 if direction == "d2h" else 0.0


def out_of_cache_rates(host_rates: dict, l2_bytes: int) -> dict:
    """Per direction: the staging probe's rate at the smallest measured size larger than one core's cache."""
    out = {}
    for (direction, size), rates in sorted((k, v) for k, v in host_rates.items() if isinstance(k, tuple)):
        if size > l2_bytes and direction not in out and rates.get(staging_key(direction)):
            out[direction] = rates[staging_key(direction)]
    return out


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


def pinned_on_the_fly_ms(nbytes: float, pinned_latency_us: float, link_gbps: float, rates: dict) -> float:
    """A large pageable d2h copy as the driver appears to do it: lock your buffer's pages (as
    cudaHostRegister does), run a pinned copy straight into it, unlock the pages. Pin and unpin times are
    measured on the same buffer."""
    return rates["pin_ms"] + copy_ms(nbytes, pinned_latency_us, link_gbps) + rates["unpin_ms"]


def copy_row(direction: str, memory: str, nbytes: int, link: dict, latency_us: float, rates: dict,
             pinned_latency_us: float = ASSUMED_LATENCY_US) -> dict:
    bandwidth = effective_gbps(memory, link["pcie_gbps"], staging_gbps(direction, rates))
    route = "pinned" if memory == "pinned" else "staged"
    ms = copy_ms(nbytes, latency_us, bandwidth)
    if memory == "pageable":
        ms += first_piece_ms(direction, nbytes, link["pcie_gbps"])
    if memory == "pageable" and direction == "d2h" and rates.get("pin_ms") is not None:
        # the driver stages small copies (locking the pages alone would take longer than the whole measured
        # copy) and pins large ones: the model takes the faster of the two routes
        pinned_ms = pinned_on_the_fly_ms(nbytes, pinned_latency_us, link["pcie_gbps"], rates)
        if pinned_ms < ms:
            route, bandwidth, ms = "pinned on the fly", link["pcie_gbps"], pinned_ms
    exposed = first_piece_ms(direction, nbytes, link["pcie_gbps"]) if route == "staged" else 0.0
    return {"experiment": "copies", "direction": direction, "memory": memory, "size_bytes": nbytes,
            "schedule": "-", "predicted_ms": ms, "predicted_gbps": nbytes / (ms * 1e-3) / 1e9,
            "model_latency_us": latency_us, "model_bandwidth_gbps": bandwidth, "model_route": route,
            "model_first_piece_us": 1e3 * exposed}


# Staging by hand: the pieces are the probe's ring size, so the probe measures exactly the CPU half of each step.
HAND_PIECE_BYTES = STAGING_BYTES
HAND_BUFFERS = 2  # double buffering: the CPU fills one buffer while the copy engine empties the other


def hand_staging_ms(nbytes: int, cpu_gbps: float, link_gbps: float, pinned_latency_us: float,
                    piece: int = HAND_PIECE_BYTES) -> float:
    """A pageable h2d copy staged by hand through two pinned buffers, as a two-stage pipeline: the CPU copies
    piece i into a free buffer (bytes / cpu rate) while the engine moves piece i - 1 (a pinned copy: latency +
    bytes over the link). Each step takes the longer of the two; the first CPU copy and the last engine copy
    stick out at the ends."""
    sizes = [min(piece, nbytes - off) for off in range(0, nbytes, piece)]
    cpu = [b / (cpu_gbps * 1e9) * 1e3 for b in sizes]
    engine = [copy_ms(b, pinned_latency_us, link_gbps) for b in sizes]
    steps = [max(cpu[i + 1], engine[i]) for i in range(len(sizes) - 1)]  # CPU on piece i + 1, engine on piece i
    return cpu[0] + sum(steps) + engine[-1]


def hand_staging_row(nbytes: int, link: dict, pinned_latency_us: float, rates: dict) -> dict:
    cpu = staging_gbps("h2d", rates)
    ms = hand_staging_ms(nbytes, cpu, link["pcie_gbps"], pinned_latency_us)
    return {"experiment": "staging", "direction": "h2d", "memory": "pageable", "size_bytes": nbytes,
            "schedule": "by hand", "predicted_ms": ms, "predicted_gbps": nbytes / (ms * 1e-3) / 1e9,
            "model_bandwidth_gbps": min(cpu, link["pcie_gbps"]), "model_latency_us": pinned_latency_us,
            "model_route": f"{HAND_BUFFERS} x {HAND_PIECE_BYTES // MiB} MiB pinned buffers"}


def matmul_ms(target: Target, count: int) -> float:
    rate = target.ceilings.matmul_tflops.get("bf16") or target.ceilings.fma_tflops
    return count * 2 * MATMUL_N**3 / (rate * 1e12) * 1e3


def matmul_count(p: Params, target: Target, link: dict, latency_us: float) -> int:
    """How many matmuls take about as long as the overlap copy (so overlap can hide one behind the other)."""
    copy = copy_ms(p.overlap_mib * MiB, latency_us, link["pcie_gbps"])
    return max(1, round(copy / matmul_ms(target, 1)))


def overlap_rows(p: Params, target: Target, link: dict, latency_us: float) -> list[dict]:
    nbytes = p.overlap_mib * MiB
    count = matmul_count(p, target, link, latency_us)
    copy, compute = copy_ms(nbytes, latency_us, link["pcie_gbps"]), matmul_ms(target, count)
    times = {"copy alone": copy, "compute alone": compute, "one stream": copy + compute,
             "two streams": max(copy, compute)}
    rows = [{"experiment": "overlap", "direction": "h2d", "memory": "pinned", "size_bytes": nbytes,
             "schedule": name, "matmuls": count, "predicted_ms": ms} for name, ms in times.items()]
    rows[0]["predicted_gbps"] = nbytes / (copy * 1e-3) / 1e9  # the copy alone, beside its measured GB/s
    return rows


def predict_with(p: Params, target: Target, latency_us: dict, host_rates: dict) -> list[dict]:
    """The model with the given latency per (direction, memory) and the CPU's staging rates: host_rates maps
    (direction, size_bytes) to the rates measured at that size, and "host_copy_gbps" to one rate for all."""
    link = link_for(target)
    l2 = next((v["cpu_l2_bytes"] for k, v in host_rates.items() if isinstance(k, tuple) and v.get("cpu_l2_bytes")),
              ASSUMED_CPU_L2_BYTES)
    out_of_cache = out_of_cache_rates(host_rates, l2)
    rows = []
    if "copies" in p.experiments:
        for direction in p.directions:
            for memory in p.memories:
                lat = latency_us.get((direction, memory), ASSUMED_LATENCY_US)
                pinned_lat = latency_us.get((direction, "pinned"), ASSUMED_LATENCY_US)
                for s in sorted(p.sizes_kib):
                    rates = host_rates.get((direction, size_bytes(s)), {})
                    rates = {"host_copy_gbps": host_rates.get("host_copy_gbps"),
                             "out_of_cache_gbps": out_of_cache.get(direction), **rates}
                    rows.append(copy_row(direction, memory, size_bytes(s), link, lat, rates, pinned_lat))
    if "overlap" in p.experiments:
        rows += overlap_rows(p, target, link, latency_us.get(("h2d", "pinned"), ASSUMED_LATENCY_US))
    if "staging" in p.experiments:
        for mib in sorted(p.staging_mib):
            # the probe measured beside the hand-made copy, else the copies experiment's at that size
            rates = host_rates.get(("hand", mib * MiB)) or host_rates.get(("h2d", mib * MiB), {})
            rates = {"host_copy_gbps": host_rates.get("host_copy_gbps"), "out_of_cache_gbps": out_of_cache.get("h2d"),
                     **rates}
            rows.append(hand_staging_row(mib * MiB, link, latency_us.get(("h2d", "pinned"), ASSUMED_LATENCY_US),
                                         rates))
    return rows


def predict(p: Params, target: Target) -> list[dict]:
    """Before a run: the link from the GPU (or its datasheet); latency fitted to a recorded run of this GPU
    kind if there is one, else assumed; the host memcpy rate assumed (a run measures it)."""
    from labs.collectives import recorded_rows

    recorded = recorded_rows(LAB.name, target.key)
    host_rates = measured_host_rates(recorded)
    return predict_with(p, target, fitted_latency_us(target, recorded, host_rates), host_rates)


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
def host_free_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def check(p: Params, target: Target) -> None:
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
    return statistics.median(times) * 1e3


def _waited_seconds(fn) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def paired_ms(copy, probe=None, rounds: int = ROUNDS, timer=None) -> tuple:
    """(ms per copy, the probe's figures) for one copy and its probe timed in turns (see timed_in_turns)."""
    return timed_in_turns({0: (copy, probe)}, rounds, timer)[0]


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
    for round_ in range(rounds):
        for key, (copy, probe) in pairs.items():
            if progress is not None:
                progress(key, round_)
            times[key].append(timer(copy, WALL_BUDGET_MS / rounds, min_reps=3))
            if probe is not None:
                figures[key].append(probe())
    return {key: (min(times[key]), fastest(figures[key])) for key in pairs}


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


def staging_rates(host: torch.Tensor, rounds: int = ROUNDS) -> dict:
    """The staging probe's best figures of a few rounds on this buffer (its contents are overwritten)."""
    probe = staging_probe(host)
    return fastest([probe() for _ in range(rounds)])


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


def host_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    return torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=pinned)


def checked_copy(direction: str, host: torch.Tensor, device: torch.Tensor, n: int) -> float:
    """Fill the source with fresh random numbers, poison the destination, copy, compare bit for bit."""
    src, dst = (host[:n], device[:n]) if direction == "h2d" else (device[:n], host[:n])
    src.copy_(torch.randn(n, device=src.device))
    dst.fill_(float("nan"))
    dst.copy_(src)
    torch.cuda.synchronize()
    return timing.check_close(dst, src, "fp32", f"{direction} copy of {n * 4} bytes", tol=0.0)


def measure_copies(p: Params, progress, done: int, total: int):
    """Rows of measured copies. For each (memory, direction) every size is first checked bit for bit (which
    also touches every host page, so no copy pays first-touch page faults), then all sizes are timed in turns
    (timed_in_turns), a pageable copy with its CPU staging probe on the same buffer."""
    largest = size_bytes(max(p.sizes_kib))
    sizes = sorted(p.sizes_kib)
    device = torch.empty(largest // 4, device="cuda", dtype=torch.float32)
    for memory in p.memories:
        host = host_buffer(largest, memory == "pinned")
        for direction in p.directions:
            errors, pairs = {}, {}
            for s in sizes:
                progress(done / total, f"{direction} {memory}, {s:,} KiB: checking the copy bit for bit")
                n = size_bytes(s) // 4
                errors[s] = checked_copy(direction, host, device, n)
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
        del host


def measure_overlap(p: Params, target: Target, count: int, progress, done: int, total: int):
    nbytes = p.overlap_mib * MiB
    host = host_buffer(nbytes, pinned=True).copy_(torch.randn(nbytes // 4))
    device = torch.empty(nbytes // 4, device="cuda", dtype=torch.float32)
    a, b = (timing.random_tensor((MATMUL_N, MATMUL_N), "bf16") for _ in range(2))
    out = torch.empty_like(a)
    side = torch.cuda.Stream()
    progress(done / total, "overlap: checking the matmul against float64 and the copy bit for bit")
    err = timing.check_close(torch.mm(a, b, out=out), a.double() @ b.double(), "bf16", "bf16 matmul")

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

    device.fill_(float("nan"))
    two_streams()
    torch.cuda.synchronize()
    err = max(err, timing.check_close(device, host, "fp32", "overlapped h2d copy", tol=0.0))
    schedules = {"copy alone": copy, "compute alone": compute, "one stream": one_stream, "two streams": two_streams}
    # the four schedules in turns, ROUNDS times, each keeping its fastest round: a copy timed once, alone,
    # can catch a busy moment of the host or the link that the same copy inside "two streams" did not
    times = {name: [] for name in schedules}
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


class HandStager:
    """Pageable host -> device copies staged by hand: one CPU thread (this one) copies each piece of the source
    into one of HAND_BUFFERS pinned buffers (a plain memcpy), then queues the copy engine's copy of that buffer
    to the device (cudaMemcpyAsync) and an event behind it; a buffer is refilled only once its event has passed.
    The CUDA runtime is called through ctypes (the library torch has loaded), so each piece costs a few calls
    of C, not of PyTorch's Python layer. Raises RuntimeError where that library cannot be found."""

    def __init__(self, piece: int = HAND_PIECE_BYTES, buffers: int = HAND_BUFFERS):
        import ctypes

        self._ct = ctypes
        self.lib = _cudart()
        self.piece = piece
        self.pinned = [torch.empty(piece, dtype=torch.uint8, pin_memory=True) for _ in range(buffers)]
        self.events = []
        for _ in range(buffers):
            event = ctypes.c_void_p()
            _cuda_ok(self.lib.cudaEventCreateWithFlags(ctypes.byref(event), 2), "cudaEventCreateWithFlags")
            self.events.append(event)  # flag 2: cudaEventDisableTiming (only ordering is needed)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst (on the GPU) <- src (pageable host memory), both contiguous, same size; returns when it is done."""
        nbytes = src.numel() * src.element_size()
        stream = self._ct.c_void_p(torch.cuda.current_stream().cuda_stream)
        src_ptr, dst_ptr, lib = src.data_ptr(), dst.data_ptr(), self.lib
        for i, off in enumerate(range(0, nbytes, self.piece)):
            n, b = min(self.piece, nbytes - off), i % len(self.pinned)
            if i >= len(self.pinned):
                lib.cudaEventSynchronize(self.events[b])  # the engine has moved this buffer's last piece
            buf = self.pinned[b].data_ptr()
            self._ct.memmove(buf, src_ptr + off, n)  # the CPU's half: the piece into pinned memory
            lib.cudaMemcpyAsync(dst_ptr + off, buf, n, 1, stream)  # the engine's half (1: host to device)
            lib.cudaEventRecord(self.events[b], stream)
        torch.cuda.current_stream().synchronize()

    def close(self) -> None:
        for event in self.events:
            self.lib.cudaEventDestroy(event)
        self.events = []


def _cudart():
    """The CUDA runtime library this process has loaded for torch, through ctypes, with the argument types of
    the few calls HandStager makes."""
    import ctypes
    import ctypes.util

    torch.cuda.init()
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libcudart.so" in line})
    except OSError:
        pass
    name = paths[0] if paths else ctypes.util.find_library("cudart")
    if not name:
        raise RuntimeError("the CUDA runtime library (libcudart) was not found in this process")
    lib = ctypes.CDLL(name)
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
    lib.cudaEventDestroy.argtypes = [ctypes.c_void_p]
    lib.cudaEventCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    return lib


def _cuda_ok(code: int, what: str) -> None:
    if int(code) != 0:
        raise RuntimeError(f"{what} failed with CUDA error {int(code)}")


def measure_staging(p: Params, progress, done: int, total: int):
    """Rows of the staging experiment: per size, the copy staged by hand (checked bit for bit first) with the
    CPU probe on the same buffer, and the driver's own pageable copy of it, all sizes in turns (timed_in_turns)."""
    largest = max(p.staging_mib) * MiB
    host = host_buffer(largest, pinned=False)
    device = torch.empty(largest // 4, device="cuda", dtype=torch.float32)
    stager = HandStager()
    try:
        pairs, errors = {}, {}
        for mib in sorted(p.staging_mib):
            progress(done / total, f"staging by hand, {mib} MiB: checking the copy bit for bit")
            n = mib * MiB // 4
            src, dst = host[:n], device[:n]
            src.copy_(torch.randn(n))
            dst.fill_(float("nan"))
            stager.copy(dst, src)
            errors[mib] = timing.check_close(dst, src, "fp32", f"hand-staged copy of {mib} MiB", tol=0.0)
            pairs[(mib, "by hand")] = (functools.partial(stager.copy, dst, src), staging_probe(src))
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


def stream_copy_then_compute(copy, compute, side) -> None:
    """The copy queued on the side stream first, then the matmuls on the current one: both run at once."""
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        copy()
    compute()
    torch.cuda.current_stream().wait_stream(side)


def measured_latency_us(rows: list) -> dict:
    """The time of each (direction, memory)'s smallest copy, in microseconds: a first estimate of alpha (the
    model's latency before the fit below, and what an old recording without its host rates gives)."""
    smallest = {}
    for r in rows:
        k = (r["direction"], r["memory"])
        if r["experiment"] == "copies" and (k not in smallest or r["size_bytes"] < smallest[k]["size_bytes"]):
            smallest[k] = r
    return {k: 1e3 * r["measured_ms"] for k, r in smallest.items()}


LATENCY_FIT_BYTES = 256 * KIB  # the copies whose time is mostly fixed cost: their bytes take <= 5 us on PCIe 5


def fitted_latency_us(target: Target, rows: list, host_rates: dict) -> dict:
    """Alpha per (direction, memory), in microseconds: what remains of each small copy's measured time once
    the model's byte terms are taken away (the model run with zero latency), the median over the copies up to
    LATENCY_FIT_BYTES. This is the intercept of time against bytes with the slope the model already knows (the
    link, or the CPU's staging rate). One copy's time is not a trustworthy alpha on a busy host: the median of
    several sizes is, and it counts the bytes even a 256 KiB copy moves. Falls back to the smallest copy's
    time where no copy is small enough."""
    copies = [r for r in rows if r["experiment"] == "copies" and r.get("measured_ms") is not None]
    p = Params(experiments=("copies",), sizes_kib=tuple(sorted({r["size_bytes"] // KIB for r in copies})) or (4,))
    zero = {(d, m): 0.0 for d in DIRECTIONS for m in MEMORIES}
    bytes_ms = {(m["direction"], m["memory"], m["size_bytes"]): m["predicted_ms"]
                for m in predict_with(p, target, zero, host_rates) if m["experiment"] == "copies"}
    remainders = {}
    for r in copies:
        key = (r["direction"], r["memory"], r["size_bytes"])
        if r["size_bytes"] <= LATENCY_FIT_BYTES and key in bytes_ms:
            remainders.setdefault(key[:2], []).append(1e3 * (r["measured_ms"] - bytes_ms[key]))
    fitted = {k: max(0.0, statistics.median(v)) for k, v in remainders.items()}
    return measured_latency_us(copies) | fitted


def measured_host_rates(rows: list) -> dict:
    """The CPU staging rates measured beside each pageable copy, by (direction, size_bytes), and beside each
    copy staged by hand, by ("hand", size_bytes)."""
    keys = ("cpu_read_gbps", "cpu_copy_out_gbps", "cpu_write_gbps", "pin_ms", "unpin_ms", "cpu_l2_bytes")
    found = {}
    for r in rows:
        kind = r["direction"] if r.get("experiment") == "copies" else \
            "hand" if (r.get("experiment"), r.get("schedule")) == ("staging", "by hand") else None
        if kind and any(r.get(k) for k in keys):
            found[(kind, r["size_bytes"])] = {k: r[k] for k in keys if r.get(k) is not None}
    return found


def measure(p: Params, target: Target, progress):
    total = (len(p.directions) * len(p.memories) * len(p.sizes_kib) if "copies" in p.experiments else 0) \
        + (4 if "overlap" in p.experiments else 0) + (len(p.staging_mib) if "staging" in p.experiments else 0) + 1
    progress(0.0, "measuring one CPU thread's memcpy rate")
    host_gbps = host_copy_gbps()
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
        yield by_key.get((r["experiment"], r["direction"], r["memory"], r["size_bytes"], r["schedule"]), {}) | r
    if "overlap" in p.experiments:
        link = link_for(target)
        count = matmul_count(p, target, link, latency.get(("h2d", "pinned"), ASSUMED_LATENCY_US))
        for r in measure_overlap(p, target, count, progress, 1 + len(rows), total):
            yield by_key.get((r["experiment"], r["direction"], r["memory"], r["size_bytes"], r["schedule"]), {}) | r
    progress(1.0, "done")


HOST_RATE_NOTE = re.compile(r"copies host memory at ([0-9.]+) GB/s")  # the note measure() yields


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run with its own latencies and memcpy rate, as measure() made it
    (scripts/repredict.py)."""
    from labs.engine.params import from_dict

    p = from_dict(Params, recording["params"])
    found = [HOST_RATE_NOTE.search(m) for m in recording.get("messages", [])]
    host_gbps = next((float(m.group(1)) for m in found if m), ASSUMED_HOST_COPY_GBPS)
    measured = [r for r in recording["rows"] if r.get("measured_ms") is not None]
    host_rates = {"host_copy_gbps": host_gbps, **measured_host_rates(measured)}
    return predict_with(p, target, fitted_latency_us(target, measured, host_rates), host_rates)


# ---------------------------------------------------------------------------------------------
def lesson_latency_us(target: Target) -> tuple:
    """(latency of a pinned h2d copy in us, where it comes from): fitted to this GPU kind's recorded run if there
    is one, else the assumed order of magnitude."""
    from labs.collectives import recorded_rows

    recorded = recorded_rows(LAB.name, target.key)
    fitted = fitted_latency_us(target, recorded, measured_host_rates(recorded)).get(("h2d", "pinned"))
    if fitted:
        return fitted, f"fitted to the run recorded on the {target.name}"
    return ASSUMED_LATENCY_US, "an assumed order of magnitude: no run of this GPU is recorded"


def lesson_numbers(target: Target) -> dict:
    link = link_for(target)
    latency_us, latency_source = lesson_latency_us(target)
    gib = copy_ms(GiB_BYTES, latency_us, link["pcie_gbps"])
    small = copy_ms(4 * KIB, latency_us, link["pcie_gbps"])
    return {
        "gpu": target.name,
        "pcie_gen": str(link["pcie_gen"]),
        "pcie_lanes": str(link["pcie_lanes"]),
        "pcie_gbps": f"{link['pcie_gbps']:.1f}",
        "pcie_line_gbps": f"{link['pcie_line_gbps']:.1f}",
        "packet_pct": f"{100 * pcie_packet_efficiency():.0f}",
        "max_payload": str(PCIE_MAX_PAYLOAD_BYTES),
        "link_source": link["link_source"],
        "hbm_ratio": f"{target.ceilings.copy_tbps * 1e3 / link['pcie_gbps']:.0f}",
        "latency_us": f"{latency_us:.0f}",
        "latency_source": latency_source,
        "gib_ms": f"{gib:.1f}",
        "small_gbps": f"{4 * KIB / (small * 1e-3) / 1e9:.2f}",
        "half_size_kib": f"{latency_us * 1e-6 * link['pcie_gbps'] * 1e9 / KIB:.0f}",
        "hand_piece_mib": f"{HAND_PIECE_BYTES / MiB:.0f}",
    }


GiB_BYTES = 1024 * MiB

LAB = Lab(
    name="transfers",
    title="Host transfers: PCIe",
    summary="Copy 4 KiB to 1 GiB between host and GPU, pinned and pageable, against latency + bytes over the PCIe "
            "link the GPU reports; then hide a copy behind compute with two streams.",
    terms=("pcie", "pinned-memory", "cuda-stream"),
    Params=Params,
    predict=predict,
    measure=measure,
    key=("experiment", "direction", "memory", "size_bytes", "schedule"),
    metric="ms",
    order=70,
    check=check,
    lesson_numbers=lesson_numbers,
    headline=Headline("What GB/s will a 1 GiB host-to-device copy from pinned memory reach?", "GB/s",
                      {"experiment": "copies", "direction": "h2d", "memory": "pinned", "size_bytes": 1024 * MiB},
                      "gbps"),
)
