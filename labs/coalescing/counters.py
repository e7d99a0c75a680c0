"""How Nsight Compute counts this lab (sectors per request, DRAM reads and writes, shared-memory wavefronts and bank conflicts): the counter spec the engine asks for.

`points` picks the rows counted by default, `prepare` builds one point's inputs on the GPU and returns the
launch to count, `model` gives the model's value of each compared quantity (labs/engine/counters.py runs them).
"""

from __future__ import annotations

import torch
import triton

from labs.coalescing.kernels import WALK_SEG, strided_read, transpose, walk
from labs.coalescing.model import GRANULE_BYTES, fetched_bytes_per_element, stride_elements
from labs.engine import timing
from labs.engine.counters import Adapter


def points(params) -> list[dict]:
    points = []
    if "stride" in params.experiments:
        points += [{"experiment": "stride", "variant": f"stride {s}"} for s in params.strides if s in (1, 2, 4, 8, 32)]
    if "walk" in params.experiments:
        points += [{"experiment": "walk", "variant": v} for v in ("column walk", "row walk")]
    if "transpose" in params.experiments:
        points += [{"experiment": "transpose", "variant": v} for v in ("naive", "tiled", "tiled+padded")]
    return points


def prepare(params, point):
    variant = point["variant"]
    if point["experiment"] == "stride":
        stride = int(variant.split()[1])
        x = timing.random_tensor((params.size_mib * 2**20 // 4,), "fp32")
        y = torch.empty(triton.cdiv(x.numel(), stride), device=x.device)
        return lambda: strided_read(x, stride, y)
    x = timing.random_tensor((params.matrix_n,) * 2, "fp32")
    if point["experiment"] == "walk":
        along_rows = variant == "row walk"
        y = walk(x, along_rows)
        return lambda: walk(x, along_rows, y)
    y = torch.empty_like(x)
    return lambda: transpose(x, variant, y)


OUTPUTS_PER_VECTOR = 4  # Triton lays the strided read's block out as 4 consecutive outputs per thread (one 16-byte store)


def stride_sectors_per_request(stride: int) -> float:
    """Sectors one warp-wide load touches. Each thread holds 4 consecutive outputs, so neighbouring lanes
    read addresses 4 x stride floats = 16 x stride bytes apart. At stride 1 the 4 floats are one 16-byte
    vector load: 32 lanes x 16 bytes = 512 bytes = 16 sectors. From stride 2 on the loads are single floats
    at least 32 bytes apart: every lane needs its own sector, 32 per request."""
    return 16.0 if stride == 1 else 32.0


def stride_load_sectors(elements: int, stride: int) -> float:
    """Sectors the L1 is asked for: one request per 4 outputs at stride 1, one per output beyond. The L1
    serves most of them from its cache (the next instruction reads the next float of the same sector),
    which is why DRAM bytes still follow the lab's sector model while the L1's requests do not."""
    requests = elements / OUTPUTS_PER_VECTOR / 32 if stride == 1 else elements / 32
    return requests * stride_sectors_per_request(stride)


def model(params, point, predicted, target) -> dict:
    """DRAM bytes from the lab's model (reads in 64-byte granules, writes contiguous), split into reads and
    writes so a learner sees which side moves more than the model; the L1's sectors from the layout."""
    n, variant = params.matrix_n, point["variant"]
    if point["experiment"] == "stride":
        stride = int(variant.split()[1])
        elements = stride_elements(params, stride)
        read = elements * fetched_bytes_per_element(stride, fetch=GRANULE_BYTES)
        return {"dram_bytes": predicted.get("fetched_bytes"), "dram_read_bytes": read, "dram_write_bytes": 4 * elements,
                "sectors_per_request": stride_sectors_per_request(stride),
                "load_sectors": stride_load_sectors(elements, stride)}
    if point["experiment"] == "walk":
        out_bytes = 4 * n * triton.cdiv(n, WALK_SEG)  # the segment sums written back
        return {"dram_bytes": 4 * n * n + out_bytes, "dram_read_bytes": 4 * n * n, "dram_write_bytes": out_bytes,
                "sectors_per_request": predicted.get("sectors_per_warp_load"),
                "load_sectors": n * n * predicted.get("sectors_per_warp_load", 0) / 32}
    shared = {"naive": None, "tiled": 32.0, "tiled+padded": 1.0}[variant]  # wavefronts per warp's shared load
    conflicts = {"naive": 0.0, "tiled": n * n / 32 * 31, "tiled+padded": 0.0}[variant]
    return {"dram_bytes": 8 * n * n, "dram_read_bytes": 4 * n * n, "dram_write_bytes": 4 * n * n,
            "shared_wavefronts_per_load": shared, "bank_conflicts": conflicts, "sectors_per_request": 4.0}


COUNTERS = Adapter(("dram", "sectors", "shared"), points, prepare, model,
                   ("dram_bytes", "dram_read_bytes", "dram_write_bytes", "load_sectors",
                    "sectors_per_request", "shared_wavefronts_per_load", "bank_conflicts"))
