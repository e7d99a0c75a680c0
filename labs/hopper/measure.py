"""
Hopper matmul anatomy, measured: every step checked against float64, timed beside cuBLAS, its PTX read
====================================================================================================

Each step's configurations are compiled and checked on small odd shapes first; then, at every size, cuBLAS and
each step are checked on a sample of the real product and timed from a CUDA graph (labs/engine/timing.py). The
best-configuration step tries its candidates as autotuners do and keeps the fastest. The compiled kernel's PTX
(and SASS where Triton can disassemble it) is counted for the instructions that tell the story.
"""

from __future__ import annotations

import math
import re
from typing import Optional

import torch

from labs.engine import timing
from labs.engine.gpu import Target, free_memory_bytes
from labs.engine.params import ParamError
from labs.hopper import gluon_support
from labs.hopper.kernels import anatomy_matmul, prepare
from labs.hopper.model import BEST_STEP, STEPS, step_candidates
from labs.matmul.configs import dtype_support, tma_supported
from labs.matmul.kernels import cublas_matmul, operands
from labs.matmul.measure import compiled_resources, check_sampled, probe_floor_us
from labs.matmul.measure import reference  # noqa: F401  (A @ B in float64 of the stored values; the tests use it)
from labs.matmul.model import bytes_needed, load_latency_us


# ---------------------------------------------------------------------------------------------
# (family, regular expression) counted in the PTX and in the SASS of the compiled kernel
PTX_MARKERS = (("wgmma", r"\bwgmma\.mma_async"), ("mma.sync", r"\bmma\.sync"),
               ("cp.async.bulk.tensor", r"\bcp\.async\.bulk\.tensor"), ("cp.async", r"\bcp\.async\.(?:ca|cg)"),
               ("ld.global", r"\bld\.global"), ("mbarrier", r"\bmbarrier\."),
               # warp specialization: registers handed between partitions, and the consumers' arrivals on the
               # `empty` barriers (a plain arrive; the TMA's own barriers take arrive.expect_tx)
               ("setmaxnreg", r"\bsetmaxnreg\."), ("mbarrier.arrive", r"\bmbarrier\.arrive\.shared"))
SASS_MARKERS = (("HGMMA", r"\bHGMMA\b"), ("HMMA", r"\bHMMA\b"), ("UTMALDG", r"\bUTMALDG\b"),
                ("UTMASTG", r"\bUTMASTG\b"), ("LDGSTS", r"\bLDGSTS\b"), ("LDG", r"\bLDG\b"),
                ("USETMAXREG", r"\bUSETMAXREG\b"))


def count_instructions(text: str, markers) -> dict:
    """How many lines of an assembly listing hold each instruction family."""
    return {name: len(re.findall(pattern, text or "")) for name, pattern in markers}


def instruction_summary(compiled) -> dict:
    """Counts of the interesting instructions in the compiled kernel's PTX (and SASS, when Triton can
    disassemble it: that needs CUDA's cuobjdump), as row columns."""
    asm = getattr(compiled, "asm", None) or {}
    row = {f"ptx_{k.replace('.', '_')}": v for k, v in count_instructions(asm.get("ptx", ""), PTX_MARKERS).items()}
    try:
        sass = asm["sass"]
    except Exception:  # noqa: BLE001 - no disassembler here: PTX alone still tells the story
        sass = ""
    if sass:
        row |= {f"sass_{k}": v for k, v in count_instructions(sass, SASS_MARKERS).items()}
    return row


TENSOR_CORE_LINE = r"wgmma\.mma_async|mma\.sync"
PARTITION_LINE = r"setmaxnreg\."  # where a warp-specialized kernel's partitions take their registers


def ptx_excerpt(ptx: str, lines: int = 14, width: int = 120, at: str = TENSOR_CORE_LINE) -> str:
    """The lines around the first line matching `at` (by default the main loop's first tensor-core instruction):
    a short, readable window."""
    src = (ptx or "").splitlines()
    hit = next((i for i, line in enumerate(src) if re.search(at, line)), None)
    if hit is None:
        return ""
    lo = max(0, hit - lines // 2)
    # a wgmma line lists every accumulator register (128 of them): cut long lines
    return "\n".join(line.rstrip()[:width] + (" ..." if len(line.rstrip()) > width else "")
                     for line in src[lo:lo + lines])


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
PROBE_TMA = (517, 528, 560)  # M odd, N and K multiples of 16 elements: rows start on 16-byte boundaries
PROBE_ODD = (333, 347, 351)  # all odd: only the pointer path can take it
ASM_STEP = "3 TMA"  # the step whose PTX the page shows
WS_STEP = next(name for name, sw in STEPS.items() if sw.warp_specialize)  # the Gluon step: its PTX is shown too


def gluon_step_note(compute_capability: Optional[str]) -> str:
    """'' where the GPU of live runs (its compute capability, None without one) and this Triton can run the Gluon
    step; else the note the page shows: the step is left out of runs here, and why."""
    reason = gluon_support.unavailable_reason(compute_capability)
    if not reason:
        return ""
    return (f"Step {WS_STEP!r} is a Gluon kernel: it runs on a Hopper GPU with a Triton that has Gluon, and is left "
            f"out of runs here ({reason}). The model and the recorded runs still show it.")


def check(params, target: Target) -> None:
    if not tma_supported(target.compute_capability):  # first: no dtype choice makes this GPU a Hopper
        raise ParamError(f"This lab is about Hopper (compute capability 9.0 or newer: TMA, wgmma); {target.name} "
                         f"is {target.compute_capability}. The model and the recorded runs are shown instead.")
    support = dtype_support(target)
    if support.get(params.dtype):
        raise ParamError(support[params.dtype])
    multiple = 16 // timing.element_bytes(params.dtype)
    odd = [n for n in params.sizes if n % multiple]
    if odd and any(sw.tma for s in params.steps for sw in step_candidates(s)):
        raise ParamError(f"The TMA steps need rows that start on 16-byte boundaries: N a multiple of {multiple} in "
                         f"{params.dtype}; {', '.join(map(str, odd))} is not. Choose other sizes or only steps 1-2.")
    free = free_memory_bytes() if target.live else target.memory_bytes
    n = max(params.sizes)
    need = bytes_needed(n, params.dtype)
    if need > 0.9 * free:
        raise ParamError(f"N = {n} in {params.dtype} needs {need / 1e9:.1f} GB (A, B, C and the L2 flush buffer); "
                         f"this GPU has {free / 1e9:.1f} GB free. Choose smaller sizes.")


def probe_check(step, dtype: str, device: str = "cuda", programs: Optional[int] = None, **kw) -> float:
    """One configuration (a step name or Switches) on a small odd shape (fresh inputs, output poisoned
    with NaN) against float64. A persistent kernel gets fewer programs than tiles, so that each program
    walks several tiles (the path a flattened loop must get right)."""
    sw = STEPS[step] if isinstance(step, str) else step
    m, n, k = PROBE_TMA if sw.tma else PROBE_ODD
    a = timing.random_tensor((m, k), dtype, device)
    b = timing.random_tensor((k, n), dtype, device)
    out = torch.full((m, n), float("nan"), device=a.device, dtype=a.dtype)
    if programs is None and sw.persistent:
        programs = 3
    anatomy_matmul(a, b, sw, out, programs=programs, **kw)
    return timing.check_close(out, reference(a, b), dtype, f"{sw.config_label} ({dtype}, {m}x{n}x{k})")


def _failure_note(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def usable_configs(step: str, dtype: str, device: str = "cuda", **kw) -> tuple:
    """(the step's configurations that compile here and match float64, a note for each one that does
    not). A step's own kernel giving a wrong answer raises; a candidate of the best-configuration step
    that does is never timed, and its note says so (the search goes on without it)."""
    ok, notes = [], []
    if any(sw.warp_specialize for sw in step_candidates(step)):  # the Gluon kernel: left out where it cannot run
        reason = gluon_support.unavailable_reason(gluon_support.device_capability(device))
        if reason:
            return [], [f"it is written in Gluon and needs a Hopper GPU and a Triton with Gluon: {reason}"]
    for sw in step_candidates(step):
        try:
            probe_check(sw, dtype, device, **kw)
            ok.append(sw)
        except timing.KernelMismatch as exc:
            if step != BEST_STEP:
                raise
            notes.append(f"{sw.config_label}: WRONG RESULT, excluded ({_failure_note(exc)})")
        except Exception as exc:  # noqa: BLE001 - a feature this Triton or GPU cannot compile: say so, go on
            notes.append(f"{sw.config_label}: {_failure_note(exc)}")
    return ok, notes


SELECT_WARMUP_MS, SELECT_REP_MS = 10, 40  # a short timing per candidate; the chosen one is timed again in full


def fastest_config(configs, a, b, out, dtype: str, n: int) -> tuple:
    """Check every candidate at this size, time each briefly, keep the fastest: (Switches, what was tried).
    The chosen one is then timed again from scratch, so the row's time is not the best of several draws."""
    tried = []
    for sw in configs:
        try:
            out.fill_(float("nan"))
            launch = prepare(a, b, out, sw)
            launch()
            check_sampled(out, a, b, dtype, f"{sw.config_label} ({dtype}, N={n})")
            ms = timing.graph_time_ms(launch, timer=lambda fn: timing.time_ms(fn, SELECT_WARMUP_MS, SELECT_REP_MS))
        except timing.KernelMismatch as exc:  # never timed, and said so in the row
            tried.append((float("inf"), sw, "WRONG RESULT, excluded: " + _failure_note(exc)[:80]))
            continue
        except Exception as exc:  # noqa: BLE001 - out of resources at this size: not a candidate here
            tried.append((float("inf"), sw, _failure_note(exc)[:80]))
            continue
        tried.append((ms, sw, f"{timing.tflops(2.0 * n**3, ms):.0f} TFLOP/s"))
    ms, chosen, _ = min(tried, key=lambda t: t[0])
    if ms == float("inf"):
        raise RuntimeError(f"no configuration of {BEST_STEP!r} runs at N = {n}: " +
                           "; ".join(note for _, _, note in tried))
    return chosen, "; ".join(f"{sw.config_label}: {note}" for _, sw, note in tried)


def probed_load_latency_us(target: Target) -> float:
    """How long a slice asked of memory takes to land, measured by the Matmul lab's probe in this pass (the
    one-stage step waits it on every slice: labs/hopper/model.py load_latency). The probe is the difference of two
    ~6 us timings, so one reading can be far off (an H100 run read 0.32 us where the Matmul lab's probes of both
    GPU kinds read 0.66-0.83 us): probed in every pass, the rows carry the median of the passes' readings
    (labs/engine/passes.py). The probe's timings are its own, not a row's: they are kept out of the rows' spreads."""
    with timing.collecting():
        probe_floor_us(target)
    return load_latency_us(target)


def measure(params, target: Target, progress):
    dtype = params.dtype
    total = len(params.sizes) * (len(params.steps) + 1)
    done = 0
    usable = {}
    for step in params.steps:  # compile and check every configuration once, on small odd shapes
        progress(done / total, f"step {step}: compiling and checking against float64")
        ok, notes = usable_configs(step, dtype)
        if ok:
            usable[step] = ok
            for note in notes:
                yield f"Step {step!r}: the configuration {note}; the others are tried."
        else:
            yield f"Step {step!r} does not run here ({'; '.join(notes)}); it is left out."
    progress(done / total, "probe: how long a slice takes to arrive from memory")
    latency_us = probed_load_latency_us(target)  # on every step row, so that a re-prediction uses this run's
    previous_ptx = None  # a switch the compiler ignores leaves the PTX as it was: say so
    for n in params.sizes:
        a, b = operands(n, n, n, dtype, kmajor_b=False)
        out = torch.full((n, n), float("nan"), device=a.device, dtype=a.dtype)
        progress(done / total, f"N = {n}: cuBLAS")
        cublas_matmul(a, b, dtype, out)
        err = check_sampled(out, a, b, dtype, f"cuBLAS ({dtype}, N={n})")
        cublas_ms = timing.graph_time_ms(lambda: cublas_matmul(a, b, dtype, out))
        cublas_tflops = timing.tflops(2.0 * n**3, cublas_ms)
        done += 1
        yield {"step": "cuBLAS", "n": n, "dtype": dtype, "measured_ms": cublas_ms, "measured_tflops": cublas_tflops,
               "measured_pct_of_cublas": 100.0, "check_rel_error": err}
        for step in params.steps:
            progress(done / total, f"N = {n}: step {step}")
            done += 1
            if step not in usable:
                continue
            row = {}
            sw = usable[step][0]
            if step == BEST_STEP:
                try:
                    sw, tried = fastest_config(usable[step], a, b, out, dtype, n)
                except RuntimeError as exc:  # no candidate ran at this size: say so, keep the other rows
                    yield str(exc)
                    continue
                row = {"config": sw.config_label, "tried": tried}
            out.fill_(float("nan"))
            launch = prepare(a, b, out, sw)
            compiled = launch()
            err = check_sampled(out, a, b, dtype, f"{step} ({dtype}, N={n})")
            ms = timing.graph_time_ms(launch)
            tflops = timing.tflops(2.0 * n**3, ms)
            tiles = math.ceil(n / sw.block[0]) * math.ceil(n / sw.block[1])
            l2_bytes = tiles * (sw.block[0] + sw.block[1]) * n * timing.element_bytes(dtype)
            if step == BEST_STEP:  # cuBLAS again, right after: the same clocks and temperature as this row
                beside_ms = timing.graph_time_ms(lambda: cublas_matmul(a, b, dtype, out))
                row["measured_pct_of_cublas_beside"] = 100.0 * beside_ms / ms
            row = {"step": step, "n": n, "dtype": dtype, "measured_ms": ms, "measured_tflops": tflops,
                   "measured_pct_of_cublas": 100.0 * tflops / cublas_tflops, "check_rel_error": err,
                   "measured_l2_request_tbps": timing.tbps(l2_bytes, ms), "load_latency_us": latency_us,
                   "load_latency_each_pass": True} | row  # the latency is a median of passes, not one reading
            row |= instruction_summary(compiled)
            row |= compiled_resources(compiled)
            ptx = compiled.asm.get("ptx", "")
            if n == params.sizes[0]:
                row["ptx_changed"] = previous_ptx is None or ptx != previous_ptx
                previous_ptx = ptx
            if step == ASM_STEP and n == params.sizes[0]:
                row["ptx_excerpt"] = ptx_excerpt(ptx)
            if step == WS_STEP and n == params.sizes[0]:  # where the partitions split: setmaxnreg, then their code
                row["ptx_excerpt"] = ptx_excerpt(ptx, lines=24, at=PARTITION_LINE)
            yield row
        del a, b, out
    progress(1.0, "done")
