"""
The tensor cores' rate at a size: cuBLAS as the Matmul lab recorded it on this GPU kind
======================================================================================

The calibration's matmul ceiling is cuBLAS at N = 8192. The tensor cores' rate is capped by power: a long, large
product holds a lower clock than a shorter one, so cuBLAS runs 4096^3 products faster than 8192^3 ones (on an H100
and an H200, 13 to 16 % faster). A model of a product at N = 4096 takes the rate cuBLAS reached at that N on this
GPU kind (the Matmul lab measures cuBLAS at every size of its sweep) and falls back to the ceiling where no such
size was recorded. The Hopper lab and the matmul ladder read it here; pure, no GPU.

The Matmul lab's rows also carry the load latency its probe measured at the start of the run (labs/matmul/measure.py
probe_floor_us): the Hopper lab's one-stage step waits that long for every slice, and reads it here where its own
run did not probe it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from labs.engine.gpu import Target


def _recordings_stamp() -> tuple:
    """The Matmul lab's recording files and their times: a cache key that changes when one is re-recorded."""
    from labs.engine.results import RECORDED_DIR

    return tuple(sorted((str(p), p.stat().st_mtime_ns) for p in RECORDED_DIR.glob("*/matmul.json")))


def recorded_cublas_tflops(gpu_key: str) -> dict:
    """(dtype, N) -> cuBLAS TFLOP/s from the matmul lab's committed recording of this GPU kind (read again whenever
    a recording file changes, e.g. after a --record in this process)."""
    return _cublas_rates(gpu_key, _recordings_stamp())


def recorded_load_latency_us(gpu_key: str) -> Optional[float]:
    """The load latency (us) the Matmul lab's newest recording of this GPU kind probed; None where none did."""
    return _load_latency(gpu_key, _recordings_stamp())


@functools.lru_cache(maxsize=16)
def _load_latency(gpu_key: str, _stamp: tuple) -> Optional[float]:
    from labs.engine.results import list_recorded

    for result in list_recorded("matmul"):  # newest first: the first recording that probed it wins
        if result.meta.get("gpu", {}).get("key") != gpu_key:
            continue
        probed = [r["load_latency_us"] for r in result.rows
                  if isinstance(r.get("load_latency_us"), (int, float)) and r["load_latency_us"] > 0]
        if probed:
            return float(probed[0])
    return None


@functools.lru_cache(maxsize=16)
def _cublas_rates(gpu_key: str, _stamp: tuple) -> dict:
    from labs.engine.results import list_recorded

    rates: dict = {}
    for result in reversed(list_recorded("matmul")):  # oldest first, so the newest recording wins
        if result.meta.get("gpu", {}).get("key") != gpu_key:
            continue
        for r in result.rows:
            rate = r.get("measured_tflops")
            if r.get("kernel") == "cublas" and isinstance(rate, (int, float)) and rate > 0:
                rates[(r.get("dtype"), r.get("n"))] = float(rate)
    return rates


def at_size(target: Target, dtype: str, n: int) -> tuple:
    """(the Target with its `dtype` matmul ceiling replaced by cuBLAS's recorded rate at N, where it comes from);
    the Target as it is where this GPU kind has no recorded cuBLAS rate at N."""
    rate = recorded_cublas_tflops(target.key).get((dtype, n))
    if not rate:
        return target, f"the {target.ceilings.source} {dtype} matmul ceiling"
    ceilings = dataclasses.replace(target.ceilings, matmul_tflops={**target.ceilings.matmul_tflops, dtype: rate})
    return dataclasses.replace(target, ceilings=ceilings), f"cuBLAS at N = {n}, recorded by the Matmul lab on this GPU kind"
