"""
The transfers lab's model: a copy costs a fixed latency plus its bytes over the slower of the PCIe link and
(for pageable memory) the CPU thread that stages it; two streams hide a copy behind compute.

Pure arithmetic on the Params, the GPU's datasheet and figures a run measured (read back from the run's rows or
from the recorded run of this GPU kind). Nothing here needs a GPU or launches a copy.

The PCIe link's facts (generation x lanes -> GB/s per direction, packet overhead, the link the GPU reports) live
here too; the collectives lab imports them from here (its link for GPUs without NVLink).
"""

from __future__ import annotations

import re
import statistics

from labs.engine.gpu import MiB, Target
from labs.engine.links import (PCIE_CODE, PCIE_GTPS, PCIE_MAX_PAYLOAD_BYTES, PCIE_PACKET_OVERHEAD_BYTES,  # noqa: F401
                               link_for, links_for, pcie_gbps, pcie_packet_efficiency, reported_link)
from labs.engine.results import recorded_rows  # noqa: F401  (the collectives, attention and inference labs use it)
from labs.engine.params import ParamError, from_dict

NAME = "transfers"  # the lab's name: its recordings are content/recorded/<gpu>/transfers.json
KIB = 1024
GiB_BYTES = 1024 * MiB
EXPERIMENTS = ("copies", "overlap", "staging")
DIRECTIONS = ("h2d", "d2h")
MEMORIES = ("pinned", "pageable")

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

MATMUL_N = 4096  # the overlap experiment's compute: bf16 4096^3 matmuls (compute-bound, ~0.2 ms each on an H100)
# Staging by hand: the pieces are the probe's ring size, so the probe measures exactly the CPU half of each step.
HAND_PIECE_BYTES = STAGING_BYTES
HAND_BUFFERS = 2  # double buffering: the CPU fills one buffer while the copy engine empties the other


# ---------------------------------------------------------------------------------------------
# Copies: latency + bytes over the slower stage
# ---------------------------------------------------------------------------------------------
def size_bytes(size_kib: int) -> int:
    return size_kib * KIB


def copy_ms(nbytes: float, latency_us: float, link_gbps: float) -> float:
    """Alpha-beta: a fixed cost per copy plus the bytes over the link."""
    return latency_us * 1e-3 + nbytes / (link_gbps * 1e9) * 1e3


def effective_gbps(memory: str, link_gbps: float, host_copy_gbps: float) -> float:
    """Pageable data is staged through a pinned buffer by a CPU memcpy, pipelined with the DMA in chunks:
    the slower of the two stages sets the pace. Pinned data goes straight over the link."""
    return link_gbps if memory == "pinned" else min(link_gbps, host_copy_gbps)


def staging_rate(direction: str, rates: dict):
    """The probe's rate for one direction's staging copy on one buffer (None where not measured).

    h2d: the CPU reads your buffer (the probe's read) and writes a staging buffer that the copy engine has
    just read. The engine's reads leave those lines outside the core's cache, so the CPU writes them as it
    writes any buffer outside its cache: as the probe's copy-out does, which must fetch each line before
    it overwrites it. With both halves out of cache, the copy goes no faster than the slower of the two
    measured copies (on the H100 host at 64 and 256 MiB the copy-out was the slower, 6.5 against 7.6 GB/s,
    and the pageable copies ran at 6.4 to 7.1). d2h: the probe's copy-out (see staging_gbps)."""
    if direction == "d2h":
        return rates.get("cpu_copy_out_gbps")
    measured = [rates[k] for k in ("cpu_read_gbps", "cpu_copy_out_gbps") if rates.get(k)]
    return min(measured) if measured else None


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
    own = staging_rate(direction, rates) or rates.get("host_copy_gbps") or ASSUMED_HOST_COPY_GBPS
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
        if size > l2_bytes and direction not in out and staging_rate(direction, rates):
            out[direction] = staging_rate(direction, rates)
    return out


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


def hand_staging_ms(nbytes: int, cpu_gbps: float, link_gbps: float, pinned_latency_us: float,
                    piece: int = HAND_PIECE_BYTES, queue_us: float = 0.0) -> float:
    """A pageable h2d copy staged by hand through two pinned buffers, as a two-stage pipeline: the CPU copies
    piece i into a free buffer (bytes / cpu rate) and queues its copy (queue_us: the runtime calls' own CPU
    time) while the engine moves piece i - 1 (a pinned copy: latency + bytes over the link). Each step takes
    the longer of the two; the first CPU copy and the last engine copy stick out at the ends."""
    sizes = [min(piece, nbytes - off) for off in range(0, nbytes, piece)]
    cpu = [b / (cpu_gbps * 1e9) * 1e3 + queue_us * 1e-3 for b in sizes]
    engine = [copy_ms(b, pinned_latency_us, link_gbps) for b in sizes]
    steps = [max(cpu[i + 1], engine[i]) for i in range(len(sizes) - 1)]  # CPU on piece i + 1, engine on piece i
    return cpu[0] + sum(steps) + engine[-1]


def hand_staging_row(nbytes: int, link: dict, pinned_latency_us: float, rates: dict) -> dict:
    cpu = staging_gbps("h2d", rates)
    queue_us = rates.get("queue_us") or 0.0  # recordings made before the probe measured it: none
    ms = hand_staging_ms(nbytes, cpu, link["pcie_gbps"], pinned_latency_us, queue_us=queue_us)
    return {"experiment": "staging", "direction": "h2d", "memory": "pageable", "size_bytes": nbytes,
            "schedule": "by hand", "predicted_ms": ms, "predicted_gbps": nbytes / (ms * 1e-3) / 1e9,
            "model_bandwidth_gbps": min(cpu, link["pcie_gbps"]), "model_latency_us": pinned_latency_us,
            "model_queue_us": queue_us,
            "model_route": f"{HAND_BUFFERS} x {HAND_PIECE_BYTES // MiB} MiB pinned buffers"}


def matmul_tflops(target: Target) -> float:
    """The rate of the overlap's bf16 matmuls: cuBLAS at N = MATMUL_N as the Matmul lab recorded it on this GPU
    kind, else the calibrated ceiling. The ceiling is cuBLAS at N = 8192, where the GPU holds a lower clock under
    its power cap: on an H100 and an H200 cuBLAS ran 4096^3 products 13 to 16 % faster than that (the Hopper lab
    takes the same rate for the same reason)."""
    for r in recorded_rows("matmul", target.key):
        if (r.get("kernel"), r.get("dtype"), r.get("n")) == ("cublas", "bf16", MATMUL_N) and r.get("measured_tflops"):
            return float(r["measured_tflops"])
    return target.ceilings.matmul_tflops.get("bf16") or target.ceilings.fma_tflops


def matmul_ms(target: Target, count: int) -> float:
    return count * 2 * MATMUL_N**3 / (matmul_tflops(target) * 1e12) * 1e3


def matmul_count(p, target: Target, link: dict, latency_us: float) -> int:
    """How many matmuls take about as long as the overlap copy (so overlap can hide one behind the other)."""
    copy = copy_ms(p.overlap_mib * MiB, latency_us, link["pcie_gbps"])
    return max(1, round(copy / matmul_ms(target, 1)))


def overlap_rows(p, target: Target, link: dict, latency_us: float, count: int = 0) -> list[dict]:
    """The overlap's four schedules; `count` matmuls as the run ran them (else as many as the copy takes)."""
    nbytes = p.overlap_mib * MiB
    count = count or matmul_count(p, target, link, latency_us)
    copy, compute = copy_ms(nbytes, latency_us, link["pcie_gbps"]), matmul_ms(target, count)
    times = {"copy alone": copy, "compute alone": compute, "one stream": copy + compute,
             "two streams": max(copy, compute)}
    rows = [{"experiment": "overlap", "direction": "h2d", "memory": "pinned", "size_bytes": nbytes,
             "schedule": name, "matmuls": count, "predicted_ms": ms} for name, ms in times.items()]
    rows[0]["predicted_gbps"] = nbytes / (copy * 1e-3) / 1e9  # the copy alone, beside its measured GB/s
    return rows


def out_of_cache_for(host_rates: dict) -> dict:
    """out_of_cache_rates with the core's L2 size the run measured (else assumed)."""
    l2 = next((v["cpu_l2_bytes"] for k, v in host_rates.items() if isinstance(k, tuple) and v.get("cpu_l2_bytes")),
              ASSUMED_CPU_L2_BYTES)
    return out_of_cache_rates(host_rates, l2)


def copies_rows(directions, memories, sizes_kib, target: Target, latency_us: dict, host_rates: dict) -> list[dict]:
    """The copies experiment's model rows for these directions, memories and sizes (see predict_with)."""
    link = link_for(target)
    out_of_cache = out_of_cache_for(host_rates)
    rows = []
    for direction in directions:
        for memory in memories:
            lat = latency_us.get((direction, memory), ASSUMED_LATENCY_US)
            pinned_lat = latency_us.get((direction, "pinned"), ASSUMED_LATENCY_US)
            for s in sorted(sizes_kib):
                rates = host_rates.get((direction, size_bytes(s)), {})
                rates = {"host_copy_gbps": host_rates.get("host_copy_gbps"),
                         "out_of_cache_gbps": out_of_cache.get(direction), **rates}
                rows.append(copy_row(direction, memory, size_bytes(s), link, lat, rates, pinned_lat))
    return rows


def predict_with(p, target: Target, latency_us: dict, host_rates: dict, matmuls: int = 0) -> list[dict]:
    """The model with the given latency per (direction, memory) and the CPU's staging rates: host_rates maps
    (direction, size_bytes) to the rates measured at that size, and "host_copy_gbps" to one rate for all;
    `matmuls`: the overlap's matmul count a run ran (0: the model's own choice)."""
    link = link_for(target)
    out_of_cache = out_of_cache_for(host_rates)
    rows = []
    if "copies" in p.experiments:
        rows += copies_rows(p.directions, p.memories, p.sizes_kib, target, latency_us, host_rates)
    if "overlap" in p.experiments:
        rows += overlap_rows(p, target, link, latency_us.get(("h2d", "pinned"), ASSUMED_LATENCY_US), matmuls)
    if "staging" in p.experiments:
        for mib in sorted(p.staging_mib):
            # the probe measured beside the hand-made copy, else the copies experiment's at that size
            rates = host_rates.get(("hand", mib * MiB)) or host_rates.get(("h2d", mib * MiB), {})
            rates = {"host_copy_gbps": host_rates.get("host_copy_gbps"), "out_of_cache_gbps": out_of_cache.get("h2d"),
                     **rates}
            rows.append(hand_staging_row(mib * MiB, link, latency_us.get(("h2d", "pinned"), ASSUMED_LATENCY_US),
                                         rates))
    return rows


def predict(p, target: Target) -> list[dict]:
    """Before a run: the link from the GPU (or its datasheet); latency fitted to a recorded run of this GPU
    kind if there is one, else assumed; the host memcpy rate assumed (a run measures it)."""
    recorded = recorded_rows(NAME, target.key)
    host_rates = measured_host_rates(recorded)
    return predict_with(p, target, fitted_latency_us(target, recorded, host_rates), host_rates)


# ---------------------------------------------------------------------------------------------
# The model's terms, from a run's measured rows
# ---------------------------------------------------------------------------------------------
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
    sizes_kib = tuple(sorted({r["size_bytes"] // KIB for r in copies})) or (4,)
    zero = {(d, m): 0.0 for d in DIRECTIONS for m in MEMORIES}
    bytes_ms = {(m["direction"], m["memory"], m["size_bytes"]): m["predicted_ms"]
                for m in copies_rows(DIRECTIONS, MEMORIES, sizes_kib, target, zero, host_rates)}
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
    keys = ("cpu_read_gbps", "cpu_copy_out_gbps", "cpu_write_gbps", "pin_ms", "unpin_ms", "cpu_l2_bytes", "queue_us")
    found = {}
    for r in rows:
        kind = r["direction"] if r.get("experiment") == "copies" else \
            "hand" if (r.get("experiment"), r.get("schedule")) == ("staging", "by hand") else None
        if kind and any(r.get(k) for k in keys):
            found[(kind, r["size_bytes"])] = {k: r[k] for k in keys if r.get(k) is not None}
    return found


HOST_RATE_NOTE = re.compile(r"copies host memory at ([0-9.]+) GB/s")  # the note measure() yields


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run with its own latencies and memcpy rate, as measure() made it."""
    from labs.engine.registry import get_lab  # the lab's Params (labs/transfers/__init__.py)

    p = from_dict(get_lab(NAME).Params, recording["params"])
    found = [HOST_RATE_NOTE.search(m) for m in recording.get("messages", [])]
    host_gbps = next((float(m.group(1)) for m in found if m), ASSUMED_HOST_COPY_GBPS)
    measured = [r for r in recording["rows"] if r.get("measured_ms") is not None]
    host_rates = {"host_copy_gbps": host_gbps, **measured_host_rates(measured)}
    matmuls = next((r["matmuls"] for r in measured if r.get("experiment") == "overlap" and r.get("matmuls")), 0)
    return predict_with(p, target, fitted_latency_us(target, measured, host_rates), host_rates, matmuls)


# ---------------------------------------------------------------------------------------------
# The lesson's numbers
# ---------------------------------------------------------------------------------------------
def lesson_latency_us(target: Target) -> tuple:
    """(latency of a pinned h2d copy in us, where it comes from): fitted to this GPU kind's recorded run if there
    is one, else the assumed order of magnitude."""
    recorded = recorded_rows(NAME, target.key)
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