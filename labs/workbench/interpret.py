"""What the learner's kernel does, counted in Triton's interpreter, and the time the model gives *their* launch.

Without a GPU the workbench cannot time a kernel, yet the slow starter and a good kernel should not look the
same. So a correct kernel is run once more in the sandbox, in Triton's interpreter (interpret_worker.py), at
each timing point's real size; a sample of each launch's programs is counted and scaled to the whole grid:

    count(ex, code)                     -> {point label: counts}   (programs, warps, bytes, masked lanes, FLOPs)
    predict_yours(counts, ex, point, t) -> {"predicted_ms_yours": ..., "bound": ..., terms}   (pure arithmetic)
    attach(verdict, ex, code, target)      the two in a verdict's rows, its notes and its top-level keys

The model of a launch takes the longest of these times (each a ceiling of the GPU chosen in the selector):
    DRAM        memory-bound exercises: every byte the programs load or store crosses DRAM (a streaming kernel
                has no reuse to find), at least the exercise's floor; compute-bound ones: the floor's bytes only
    L2          every byte requested passes through the L2, at L2_OVER_HBM x the copy bandwidth
    in flight   Little's law: the programs resident together (warps and the SM's block limit) keep some bytes
                in flight; each load waits one latency plus the bytes queued ahead of it, so the rate is
                in_flight / (latency + in_flight / bandwidth): too few bytes in flight never reach the bandwidth
    tensor      tl.dot FLOPs at the tensor-core rate, plus exponentials at the SFU rate
    operands    tl.dot operands read from shared memory at 128 bytes per clock per SM (small tiles re-read more)
plus one launch cost per kernel launch. The counts come from the learner's own process: they teach, and never
decide a verdict (the timing on a GPU does).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Optional

from labs.engine import gpu as gpu_mod
from labs.glossary.facts import L2_OVER_HBM, LATENCY_CYCLES
from labs.workbench import sandbox
from labs.workbench.exercises import Exercise, Point, rate

WORKER = Path(__file__).with_name("interpret_worker.py")
SAMPLES = 4  # programs counted per launch, evenly spread: exact for work that grows linearly along the grid
SMEM_BYTES_PER_CLOCK = 128  # one SM's shared memory: 32 banks x 4 bytes per clock (CUDA C++ Programming Guide)
SFU_PER_SM_PER_CLOCK = 16  # exponentials per SM per clock (CUDA C++ Programming Guide, arithmetic throughput)
# resident blocks per SM by compute capability (CUDA C++ Programming Guide, technical specifications)
MAX_BLOCKS_PER_SM = {"7.0": 32, "7.5": 16, "8.0": 32, "8.6": 16, "8.7": 16, "8.9": 24, "9.0": 32, "10.0": 32}
_ONE_AT_A_TIME = threading.Lock()
QUANTITIES = ("load_bytes", "store_bytes", "load_lanes", "masked_load_lanes", "store_lanes", "masked_store_lanes",
              "load_calls", "store_calls", "dot_flops", "dot_operand_bytes", "exps")


def enabled() -> bool:
    return os.environ.get("ROOFLINE_WORKBENCH_INTERPRET", "1") != "0"


# ---------------------------------------------------------------------------------------------
# The count: one more sandboxed run, in the interpreter
# ---------------------------------------------------------------------------------------------
def scale(launch: dict) -> dict:
    """One launch's sampled programs scaled up to its whole grid."""
    sampled = launch.get("sampled") or []
    programs = int(launch.get("programs") or 0)
    out = {"kernel": launch.get("kernel", "?"), "grid": launch.get("grid", []), "programs": programs,
           "num_warps": int(launch.get("num_warps") or 4), "num_stages": int(launch.get("num_stages") or 3),
           "constexprs": launch.get("constexprs", {}), "sampled_programs": len(sampled)}
    for q in QUANTITIES:
        mean = sum(float(s.get(q, 0)) for s in sampled) / len(sampled) if sampled else 0.0
        out[q] = mean * programs
    return out


def summarise(launches: list) -> dict:
    """A point's launches, scaled, and their totals."""
    scaled = [scale(launch) for launch in launches if launch.get("programs")]
    totals = {q: sum(s[q] for s in scaled) for q in QUANTITIES}
    totals["bytes"] = totals["load_bytes"] + totals["store_bytes"]
    totals["masked_lanes"] = totals["masked_load_lanes"] + totals["masked_store_lanes"]
    totals["programs"] = sum(s["programs"] for s in scaled)
    return totals | {"launches": scaled}


def count(ex: Exercise, code: str, limits: Optional[sandbox.Limits] = None, samples: int = SAMPLES) -> dict:
    """{"status": "ok", "points": {label: summary}} or {"status": ..., "message": why not}."""
    job = {"entry": ex.entry, "gpu": False, "samples": samples, "mode": "interpret",
           "points": [{"label": p.label, "args": list(p.args)} for p in ex.points]}
    limits = limits or sandbox.Limits(compile_s=240, cpu_s=240)
    with _ONE_AT_A_TIME:  # a count holds the point's full-size inputs (768 MB for add): one such run at a time
        run = sandbox.run_worker(code, job, {}, limits, False, worker=WORKER.name)
    if run.status != "ok":
        return {"status": run.status, "message": (run.message or "the interpreted run stopped").strip()}
    points = run.result.get("points") or []
    return {"status": "ok", "seconds": run.seconds,
            "points": {p.get("label"): summarise(p.get("launches") or []) for p in points}}


# ---------------------------------------------------------------------------------------------
# The model of their launch
# ---------------------------------------------------------------------------------------------
def resident_programs(num_warps: int, target) -> int:
    """Programs one SM holds at once: its thread limit over the program's threads, at most its block limit
    (registers and shared memory can lower it further; the count cannot see them)."""
    shape = gpu_mod.sm_shape(target.compute_capability)
    blocks = MAX_BLOCKS_PER_SM.get(str(target.compute_capability), 16)
    return max(1, min(blocks, shape.max_threads // (32 * max(1, num_warps))))


def launch_terms(launch: dict, ex: Exercise, target) -> dict:
    """Seconds each ceiling needs for one launch (the longest one bounds it)."""
    bw = target.ceilings.copy_tbps * 1e12
    clock = gpu_mod.clock_hz(target)  # the SM clock the FMA ceiling implies
    moved = launch["load_bytes"] + launch["store_bytes"]
    # a streaming (memory-bound) kernel's bytes cross DRAM; a tiled one's re-reads are served by the L2
    level, level_bw, cycles = ("DRAM", bw, LATENCY_CYCLES["hbm"]) if ex.metric == "tbps" else \
        ("L2", L2_OVER_HBM * bw, LATENCY_CYCLES["l2"])
    terms = {"L2": moved / (L2_OVER_HBM * bw), level: moved / level_bw}
    programs = max(1, launch["programs"])
    calls = launch["load_calls"] / programs  # load instructions per program
    if launch["load_bytes"] and calls:
        # Little's law: the programs resident together keep `in_flight` bytes on their way. A load waits one
        # latency plus the bytes queued ahead of it, so the rate is in_flight / (latency + in_flight / bandwidth)
        per_call = launch["load_bytes"] / launch["load_calls"]
        outstanding = min(calls, 2 * max(1, launch["num_stages"] - 1))  # loads a program has in flight at once
        together = min(programs, target.sm_count * resident_programs(launch["num_warps"], target))
        in_flight = together * per_call * outstanding
        waiting = launch["load_bytes"] / in_flight * cycles / clock
        if waiting > 0.1 * terms[level]:  # worth naming: latency adds more than a tenth to the transfer time
            terms["in flight"] = terms[level] + waiting
    if launch["dot_flops"] or launch["exps"]:
        peak = target.ceilings.matmul_tflops.get(ex.dtype) or target.ceilings.matmul_tflops.get("fp16") \
            or target.ceilings.fma_tflops
        terms["tensor cores"] = launch["dot_flops"] / (peak * 1e12) + \
            launch["exps"] / (SFU_PER_SM_PER_CLOCK * target.sm_count * clock)
    if launch["dot_operand_bytes"]:
        terms["operands"] = launch["dot_operand_bytes"] / (SMEM_BYTES_PER_CLOCK * target.sm_count * clock)
    return terms


BOUND_WORDS = {"DRAM": "the bytes it moves through DRAM", "L2": "the bytes it requests through the L2",
               "in flight": "too few bytes in flight (Little's law: programs too small or too few)",
               "tensor cores": "tensor-core and exponential work", "operands": "tile operands read from shared memory",
               "floor": "the exercise's byte floor", "launch": "the launch cost"}


def predict_yours(counts: dict, ex: Exercise, point: Point, target) -> dict:
    """The predicted time of the learner's launches at this point on `target`, and what bounds it."""
    work = ex.work(point, target)
    launch_s = gpu_mod.KERNEL_LAUNCH_US * 1e-6
    total, bound, longest = 0.0, "launch", -1.0
    for launch in counts.get("launches", []):
        terms = launch_terms(launch, ex, target)
        name, seconds = max(terms.items(), key=lambda kv: kv[1]) if terms else ("launch", 0.0)
        total += seconds + launch_s
        if seconds > longest:
            bound, longest = name, seconds
    floor_s = work["bytes"] / (target.ceilings.copy_tbps * 1e12) + launch_s
    if total < floor_s:  # nothing a kernel does moves fewer bytes than the exercise's floor
        total, bound = floor_s, "floor"
    ms = total * 1e3
    return {"predicted_ms_yours": ms, f"predicted_{ex.metric}_yours": rate(ex.metric, work["bytes"], work["flops"], ms),
            "yours_bound": bound}


# ---------------------------------------------------------------------------------------------
# In a verdict
# ---------------------------------------------------------------------------------------------
def human_bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} bytes"


def launch_words(launch: dict) -> str:
    knobs = ", ".join(f"{k} = {v}" for k, v in launch["constexprs"].items() if isinstance(v, (int, bool)))
    warps = launch["num_warps"]
    return (f"{launch['kernel']}: {launch['programs']:,} programs of {warps} warp{'s' if warps != 1 else ''}"
            + (f", {knobs}" if knobs else ""))


def sentence(row: dict, counts: dict, target, unit: str) -> str:
    """One plain paragraph: what the kernel did in the interpreter, and what that predicts on the GPU."""
    launches = "; ".join(launch_words(launch) for launch in counts["launches"]) or "no kernel launch"
    per_program = counts["bytes"] / counts["programs"] if counts["programs"] else 0
    masked = f"{counts['masked_lanes']:,.0f} lanes were masked off." if counts["masked_lanes"] else \
        "No lane was masked off."
    rate_yours = row.get(f"predicted_{row['metric']}_yours")
    return (f"In Triton's interpreter at {row['point']}, your kernel launched {launches}. Its programs load and "
            f"store {human_bytes(counts['bytes'])}, {human_bytes(per_program)} per program, against the model's "
            f"floor of {human_bytes(row['bytes'])}. {masked} On the {target.name}, that launch is predicted to "
            f"take {row['predicted_ms_yours']:.3g} ms ({rate_yours:.3g} {unit}), bound by "
            f"{BOUND_WORDS.get(row['yours_bound'], row['yours_bound'])}; the model's best is "
            f"{row['predicted_ms']:.3g} ms.")


def attach(verdict: dict, ex: Exercise, code: str, target, counted: Optional[dict] = None) -> None:
    """Count a correct kernel in the interpreter and put what it did, and its predicted time, in the verdict:
    per point (interpreter_bytes, predicted_ms_yours, ...) and at the top level ({point: value})."""
    if not enabled():
        return
    counted = counted if counted is not None else count(ex, code)
    verdict["interpreter"] = {k: v for k, v in counted.items() if k != "points"}
    if counted.get("status") != "ok":
        verdict["notes"].append(f"The interpreted count did not finish, so your launch is not modelled: "
                                f"{counted.get('message', '')}")
        return
    by_label = {p.label: p for p in ex.points}
    for row in verdict.get("points", []):
        counts, point = counted["points"].get(row["point"]), by_label.get(row["point"])
        if not counts or point is None:
            continue
        row.update({"interpreter_bytes": counts["bytes"], "interpreter_load_bytes": counts["load_bytes"],
                    "interpreter_store_bytes": counts["store_bytes"], "interpreter_programs": counts["programs"],
                    "interpreter_bytes_per_program": counts["bytes"] / counts["programs"] if counts["programs"]
                    else None, "interpreter_masked_lanes": counts["masked_lanes"],
                    "interpreter_dot_flops": counts["dot_flops"],
                    "interpreter_launch": "; ".join(launch_words(launch) for launch in counts["launches"])})
        row.update(predict_yours(counts, ex, point, target))
        row["yours"] = sentence(dict(row, metric=ex.metric), counts, target, verdict.get("unit", ""))
    rows = [r for r in verdict.get("points", []) if r.get("predicted_ms_yours") is not None]
    verdict["interpreter_bytes"] = {r["point"]: r["interpreter_bytes"] for r in rows}
    verdict["predicted_ms_yours"] = {r["point"]: r["predicted_ms_yours"] for r in rows}
