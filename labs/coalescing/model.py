"""Coalescing's napkin math: the lowest of the limits a pattern meets.

- DRAM bytes: what the L2 fetches, in 64-byte granules, at the calibrated copy bandwidth (the lecture's sector
  model, 32-byte sectors at copy bandwidth, is kept beside it for comparison);
- DRAM requests: reads whose elements each need their own sector reach DRAM as separate requests, one per
  128-byte line they touch, each at the price the run's probe measured for a lone request;
- the L1: SMs x clock x useful bytes per wavefront (one 128-byte line, or one access per bank, per clock);
- the L2's request slots (the transposes).
Pure arithmetic on the parameters and the GPU's facts: no kernel. (The L2 bandwidth comes from the memory-
hierarchy lab's model, the attached GPU's clock from labs.engine.gpu.detect.)
"""

from __future__ import annotations

from labs.engine.gpu import MiB, Target
from labs.engine.params import from_dict
from labs.engine.registry import get_lab
from labs.hierarchy.model import l2_tbps as measured_l2_tbps  # the memory-hierarchy lab's L2 plateau

SECTOR_BYTES = 32  # the unit the L1/L2 fetch in: a warp's load costs every 32-byte sector it touches
# What the L2 asks DRAM for on a miss: cudaLimitMaxL2FetchGranularity reads 64 bytes by default on
# an H200 (read with cudaDeviceGetLimit while the lab was built; that probe was dropped); assumed for every GPU.
GRANULE_BYTES = 64
WARP = 32
ELEMENT = "fp32"  # every experiment moves 4-byte floats, so a sector holds 8 of them
TRANSPOSES = ("naive", "tiled", "tiled+padded", "torch")  # the ladder, bottom to top, and the library


def fetched_bytes_per_element(stride: int, element_bytes: int = 4, fetch: int = SECTOR_BYTES) -> float:
    """Bytes a strided read fetches per useful element, in units of `fetch` bytes.

    Lanes stride * element_bytes apart: below a unit, the warp's addresses cover every unit of the
    span (stride elements fetched per useful one); at a unit or beyond, each element costs a unit.
    """
    return float(min(stride * element_bytes, fetch))


def stride_efficiency(stride: int, element_bytes: int = 4, fetch: int = SECTOR_BYTES) -> float:
    """Useful bytes / fetched bytes for read-with-stride + contiguous write (one element each way),
    when the read is fetched in units of `fetch` bytes (32-byte sectors; 64-byte DRAM granules)."""
    useful = 2 * element_bytes
    fetched = fetched_bytes_per_element(stride, element_bytes, fetch) + element_bytes
    return useful / fetched


def requests_per_element(stride: int, element_bytes: int = 4) -> float:
    """Separate DRAM requests per element read. While neighbouring elements share sectors the L2 sees
    whole lines and DRAM streams them: none counted. From 32 bytes apart every element needs its own
    sector, and every 128-byte line the reads touch becomes one separate request (an L2 request never
    spans more than one line): four elements share it at stride 8, two at stride 16, and from a line
    apart on each element pays for its own."""
    gap = stride * element_bytes
    return 0.0 if gap < SECTOR_BYTES else min(1.0, gap / LINE_BYTES)


def riding_granules_per_element(stride: int, element_bytes: int = 4) -> float:
    """Granules per element that travel inside a request already paid for. A separate request brings
    every granule its line needs: the first at the request's price, the others at streaming speed
    (one more at strides 8 and 16, where a line holds two needed granules; none from stride 32 on)."""
    requests = requests_per_element(stride, element_bytes)
    if not requests:
        return 0.0
    granules = fetched_bytes_per_element(stride, element_bytes, GRANULE_BYTES) / GRANULE_BYTES
    return max(0.0, granules - requests)


def walk_sectors_per_load(along_rows: bool, element_bytes: int = 4) -> float:
    """Sectors one warp-wide load touches: 32 lanes side by side share 32 * 4 / 32 = 4; lanes on different rows 32."""
    return float(WARP) if along_rows else WARP * element_bytes / SECTOR_BYTES


def walk_efficiency(along_rows: bool, element_bytes: int = 4) -> float:
    """Useful / fetched bytes of a walk if nothing fetched is ever reused (the lecture's burst picture)."""
    return WARP * element_bytes / (walk_sectors_per_load(along_rows, element_bytes) * SECTOR_BYTES)


# The second limit: each SM's L1/shared-memory pipeline handles one 128-byte line ("wavefront") per
# clock. A warp instruction whose 32 addresses fall in k different lines (or, in shared memory, k
# accesses to the same bank) costs k clocks. Below: per warp, the useful bytes it moves through one
# round of its instructions and the wavefronts they cost.
LINE_BYTES = 128


def stride_wavefronts(stride: int, element_bytes: int = 4) -> tuple[int, int]:
    """Warp reads 32 floats spread over min(32, stride) lines, then writes 32 floats to one line."""
    lines = min(WARP, -(-WARP * element_bytes * stride // LINE_BYTES))
    return 2 * WARP * element_bytes, lines + 1


WALK_WAVEFRONTS = {"column walk": (128, 1), "row walk": (128, WARP)}  # 32 rows = 32 lines per warp load
# naive: load 1 line, store 32 lines; tiled: load 1, shared store 1, shared column load 32 (all lanes in
# one bank), store 1; padded: the column load hits 32 banks, 1 wavefront; torch: not modelled (None).
TRANSPOSE_WAVEFRONTS = {"naive": (256, 1 + WARP), "tiled": (256, 1 + 1 + WARP + 1), "tiled+padded": (256, 4),
                        "torch": None}

# The third limit, in the L2: each L2 slice handles one request per clock and moves at most 64 bytes with it
# (NVIDIA's A100 whitepaper: 5120 bytes per clock from 80 slices); the bandwidth the memory-hierarchy lab
# measures is reached with requests that carry those 64 bytes. A request for a single scattered sector costs
# the slot all the same, and a write of part of a sector costs two (the slice reads the sector to merge the
# new bytes into it, then writes it). Per element of a transpose, in 64-byte slots: the coalesced side moves
# 4 bytes of a full line (4 / 64); naive writes each element alone into a sector (2); torch's strided copy
# reads each element from its own sector (1). The tiled rungs move whole lines both ways.
L2_SLOT_BYTES = 64
TRANSPOSE_L2_SLOTS = {"naive": 2 + 4 / L2_SLOT_BYTES, "tiled": 8 / L2_SLOT_BYTES, "tiled+padded": 8 / L2_SLOT_BYTES,
                      "torch": 1 + 4 / L2_SLOT_BYTES}


def l2_request_bound_tbps(useful_bytes: float, slots: float, target: Target, l2_tbps=None) -> tuple:
    """(useful TB/s the L2's request slots allow, where the L2 bandwidth comes from); l2_tbps: a figure
    to use instead of this GPU's (a recording's own)."""
    l2, source = (l2_tbps, "as recorded with the run") if l2_tbps else measured_l2_tbps(target)
    seconds = slots * L2_SLOT_BYTES / (l2 * 1e12)
    return useful_bytes / seconds / 1e12, source


def sm_clock_mhz(target: Target):
    """The attached GPU's maximum SM clock (nvidia-smi), else the datasheet boost clock, else None."""
    if target.live:
        from labs.engine.gpu import detect

        info = detect()
        if info.available and info.sm_clock_mhz:
            return info.sm_clock_mhz
    return target.datasheet.boost_clock_mhz if target.datasheet else None


def l1_bound_tbps(cost, target: Target):
    """Useful TB/s the SMs' L1 pipelines allow: SMs x clock x useful bytes per wavefront."""
    clock = sm_clock_mhz(target)
    if cost is None or not clock:
        return None
    useful, wavefronts = cost
    return target.sm_count * clock * 1e6 * useful / wavefronts / 1e12


def _bounded(row: dict, dram_tbps: float, l1_tbps, useful_bytes: float, request_tbps=None, l2_tbps=None) -> dict:
    """The model: the lowest of the limits that apply (None: no such limit)."""
    limits = {"DRAM": dram_tbps, "DRAM requests": request_tbps, "L1": l1_tbps, "L2 requests": l2_tbps}
    bound = min((name for name, rate in limits.items() if rate is not None), key=lambda name: limits[name])
    rate = limits[bound]
    row.update({"dram_bound_tbps": dram_tbps, "l1_bound_tbps": l1_tbps, "request_bound_tbps": request_tbps,
                "l2_request_bound_tbps": l2_tbps, "bound": bound, "predicted_tbps": rate,
                "predicted_ms": useful_bytes / (rate * 1e12) * 1e3})
    return row


def stride_row(params, stride: int, target: Target, requests_per_s=None) -> dict:
    """One stride's model. Before a run only the bytes and the L1 are known; the run's probe adds
    the rate of separate DRAM requests."""
    n = stride_elements(params, stride)
    sector_eff, granule_eff = stride_efficiency(stride), stride_efficiency(stride, fetch=GRANULE_BYTES)
    requests, riding = n * requests_per_element(stride), n * riding_granules_per_element(stride)
    row = {"experiment": "stride", "variant": f"stride {stride}", "stride": stride, "useful_bytes": 8 * n,
           "fetched_bytes": n * (fetched_bytes_per_element(stride, fetch=GRANULE_BYTES) + 4),
           "sector_efficiency": sector_eff, "granule_efficiency": granule_eff,
           "sector_model_tbps": target.ceilings.copy_tbps * sector_eff, "dram_requests": requests,
           "riding_granules": riding}
    request_tbps = None
    if requests_per_s and requests:
        request_tbps = 8 * n / request_seconds(requests, riding, requests_per_s, target) / 1e12
    return _bounded(row, target.ceilings.copy_tbps * granule_eff, l1_bound_tbps(stride_wavefronts(stride), target),
                    8 * n, request_tbps)


def request_seconds(requests: float, riding: float, requests_per_s: float, target: Target) -> float:
    """Time DRAM spends on separate requests: each costs what the probe's lone-granule requests cost
    (a fixed price plus its first granule), and the granules riding along stream at copy bandwidth.
    Both rates are measured, so the balance between them follows each GPU's DRAM."""
    return requests / requests_per_s + riding * GRANULE_BYTES / (target.ceilings.copy_tbps * 1e12)


def stride_elements(params, stride: int) -> int:
    return -(-params.size_mib * MiB // 4 // stride)


def predict(params, target: Target, l2_tbps=None) -> list[dict]:
    bw = target.ceilings.copy_tbps
    rows = []
    if "stride" in params.experiments:
        rows += [stride_row(params, s, target) for s in params.strides]
    if "walk" in params.experiments:
        n = params.matrix_n
        for along_rows, name in ((False, "column walk"), (True, "row walk")):
            # the L1 keeps each fetched sector for the thread's next steps: DRAM moves every byte once
            row = {"experiment": "walk", "variant": name, "sectors_per_warp_load": walk_sectors_per_load(along_rows),
                   "useful_bytes": 4 * n * n, "sector_efficiency": 1.0,
                   "no_reuse_tbps": bw * walk_efficiency(along_rows)}
            rows.append(_bounded(row, bw, l1_bound_tbps(WALK_WAVEFRONTS[name], target), 4 * n * n))
    if "transpose" in params.experiments:
        n = params.matrix_n
        for variant in TRANSPOSES:  # every rung moves exactly what a copy moves through DRAM
            row = {"experiment": "transpose", "variant": variant, "useful_bytes": 8 * n * n, "sector_efficiency": 1.0,
                   "l2_slots_per_element": TRANSPOSE_L2_SLOTS[variant]}
            l2, row["l2_source"] = l2_request_bound_tbps(8 * n * n, TRANSPOSE_L2_SLOTS[variant] * n * n, target,
                                                         l2_tbps)
            row["l2_tbps"] = l2_tbps or _l2(target)  # the L2 bandwidth used (kept, so a re-prediction uses it too)
            rows.append(_bounded(row, bw, l1_bound_tbps(TRANSPOSE_WAVEFRONTS[variant], target), 8 * n * n,
                                 l2_tbps=l2))
    return rows


def repredict(recording: dict, target: Target) -> list[dict]:
    """The model of a recorded run with the DRAM request rate its own probe measured (called by
    labs/engine/repredict.py)."""
    params = from_dict(get_lab("coalescing").Params, recording["params"])
    rate = next((r.get("requests_per_s") for r in recording["rows"] if r.get("experiment") == "probe"), None)
    l2 = next((r.get("l2_tbps") for r in recording["rows"] if r.get("l2_tbps")), None)  # the run's L2 figure
    return [stride_row(params, r["stride"], target, rate) if r["experiment"] == "stride" else r
            for r in predict(params, target, l2)]


# ---------------------------------------------------------------------------------------------
# Summaries for the page and the lesson
# ---------------------------------------------------------------------------------------------
def ladder_gains(rows: list[dict]) -> list[dict]:
    """Each transpose rung's measured bandwidth, its gain over the rung below, and its share of copy bandwidth."""
    by_variant = {r["variant"]: r for r in rows if r.get("experiment") == "transpose" and r.get("measured_tbps")}
    out, below = [], None
    for variant in TRANSPOSES:
        row = by_variant.get(variant)
        if row is None:
            continue
        tbps = row["measured_tbps"]
        gain = tbps / below if below and variant != "torch" else None
        out.append({"variant": variant, "measured_tbps": tbps, "gain_over_previous": gain,
                    "fraction_of_copy": tbps / row["dram_bound_tbps"] if row.get("dram_bound_tbps") else None})
        if variant != "torch":
            below = tbps
    return out


def lesson_numbers(target: Target) -> dict:
    bw = target.ceilings.copy_tbps
    return {
        "gpu": target.name,
        "bandwidth_tbps": f"{bw:.2f}",
        "ceilings_source": target.describe_ceilings(),
        "stride2_tbps": f"{bw * stride_efficiency(2):.2f}",
        "stride8_tbps": f"{bw * stride_efficiency(8):.2f}",
        "stride8_pct": f"{100 * stride_efficiency(8):.0f}",
        "row_walk_no_reuse_tbps": f"{bw * walk_efficiency(True):.2f}",
        "row_walk_l1_tbps": _fmt(l1_bound_tbps(WALK_WAVEFRONTS["row walk"], target)),
        "tiled_l1_tbps": _fmt(l1_bound_tbps(TRANSPOSE_WAVEFRONTS["tiled"], target)),
        "naive_l1_tbps": _fmt(l1_bound_tbps(TRANSPOSE_WAVEFRONTS["naive"], target)),
        "l2_tbps": f"{_l2(target):.1f}",
        "naive_l2_tbps": f"{l2_request_bound_tbps(8, TRANSPOSE_L2_SLOTS['naive'], target)[0]:.2f}",
        "torch_l2_tbps": f"{l2_request_bound_tbps(8, TRANSPOSE_L2_SLOTS['torch'], target)[0]:.2f}",
        "sm_count": str(target.sm_count),
        "clock_mhz": str(sm_clock_mhz(target) or "?"),
    }


def _l2(target: Target) -> float:
    return measured_l2_tbps(target)[0]


def _fmt(x) -> str:
    return f"{x:.2f} TB/s" if x is not None else "an unknown rate (no clock figure for this GPU)"
