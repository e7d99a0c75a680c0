"""The worker: runs inside the sandbox, in its own directory, with a copy of labs/engine/timing.py beside it.

    python harness.py WORKDIR

WORKDIR holds solution.py (the learner's code), job.json (which function, which points to time) and
inputs.pt (the check cases, made by the app). The worker calls the learner's function on every check case
and saves the outputs (the app compares them with float64 references), then, on a GPU, times the function
on each timing point with fresh random inputs. It writes result.json; anything it prints is only a log.

A job with "mode": "count" runs under Nsight Compute instead (ncu wraps this worker inside the sandbox):
for each point, one launch of the learner's function between two marker kernels, inside the NVTX range
that ncu profiles, so the app can add up that launch's DRAM bytes.

Nothing here imports the repository: the sandbox hides it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import triton  # the worker always has Triton: the learner's kernels need it, and so do the markers below
import triton.language as tl

WORK = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
NVTX_RANGE = "roofline_count"  # the range ncu profiles (labs.engine.counters.NVTX_RANGE)


def write_result(**result) -> None:
    (WORK / "result.json").write_text(json.dumps(result))


def learner_traceback(exc: BaseException) -> str:
    """The traceback cut to the frames of the learner's file (and the last frame, where it broke)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f.filename.endswith("solution.py")]
    shown = mine + ([frames[-1]] if frames and frames[-1] not in mine else [])
    lines = [f"solution.py line {f.lineno}: {f.line}" if f.filename.endswith("solution.py")
             else f"(in {Path(f.filename).name}, line {f.lineno})" for f in shown]
    text = f"{type(exc).__name__}: {exc}"
    return "\n".join(lines + [text[:2000]])


def load_solution(entry: str):
    spec = importlib.util.spec_from_file_location("solution", WORK / "solution.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, entry, None)
    if not callable(fn):
        raise LookupError(f"solution.py must define a function named {entry}(...)")
    return fn


def make_tensor(spec: dict, device: str):
    """A fresh random input of one timing point (never zeros: zeros hide bugs and time faster)."""
    import torch

    dtype = getattr(torch, spec["dtype"])
    return torch.randn(spec["shape"], device=device, dtype=torch.float32).to(dtype)


def run_checks(fn, cases: list, device: str) -> list:
    import torch

    outputs = []
    for case in cases:
        args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in case]
        if device == "cuda":  # NaN in the memory the next allocations reuse: unwritten outputs show up
            nbytes = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
            torch.full((max(nbytes, 4) // 2,), float("nan"), device=device, dtype=torch.float32)
        out = fn(*args)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"the function must return a tensor, not {type(out).__name__}")
        if device == "cuda":
            torch.cuda.synchronize()
        outputs.append(out.detach().to("cpu"))
    return outputs


def time_points(fn, points: list) -> list:
    import torch

    import timing  # labs/engine/timing.py, copied beside this file

    timings = []
    for point in points:
        args = [make_tensor(a, "cuda") if isinstance(a, dict) else a for a in point["args"]]
        fn(*args)  # compile outside the timed region
        torch.cuda.synchronize()
        timings.append({"label": point["label"], "ms": timing.time_ms(lambda: fn(*args))})
        del args
    return timings


@triton.jit
def roofline_count_begin(flag_ptr):
    tl.store(flag_ptr, 1.0)  # useless work: its name in ncu's list opens a counted launch (labs.engine.counters.MARK_BEGIN)


@triton.jit
def roofline_count_end(flag_ptr):
    tl.store(flag_ptr, 2.0)  # its name closes it (labs.engine.counters.MARK_END)


def count_points(fn, points: list, device: str) -> list:
    """One launch of the learner's function per point, between the markers, inside the counted range.
    Everything else (inputs, compilation, the markers' own first launch) happens outside it."""
    import torch

    begin, end = roofline_count_begin, roofline_count_end
    flag = torch.zeros(1, device=device)
    begin[(1,)](flag)  # compiled here, outside the range: ncu does not see these two
    end[(1,)](flag)
    counted = []
    for point in points:
        args = [make_tensor(a, device) if isinstance(a, dict) else a for a in point["args"]]
        fn(*args)  # compile and warm up outside the counted range
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(NVTX_RANGE)
        begin[(1,)](flag)
        fn(*args)
        end[(1,)](flag)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        counted.append(point["label"])
        del args
    return counted


def out_of_cpu_time(signum, frame) -> None:
    """RLIMIT_CPU's soft limit passed: say so (the hard limit, a few seconds on, kills outright)."""
    write_result(status="error", stage="running", kind="CPU-time limit",
                 message="Your code used up its CPU-time limit and was stopped (an endless loop?).")
    os._exit(3)


def main() -> None:
    signal.signal(signal.SIGXCPU, out_of_cpu_time)
    started = time.monotonic()
    job = json.loads((WORK / "job.json").read_text())
    import torch

    device = "cuda" if job.get("gpu") else "cpu"
    if device == "cuda" and job.get("gpu_memory_fraction"):
        torch.cuda.set_per_process_memory_fraction(job["gpu_memory_fraction"])
    stage = "loading solution.py"
    try:
        fn = load_solution(job["entry"])
        if job.get("mode") == "count":
            stage = "counting DRAM bytes"
            counted = count_points(fn, job["points"], device)
            write_result(status="ok", counted=counted, seconds=time.monotonic() - started)
            return
        inputs = torch.load(WORK / "inputs.pt", weights_only=True)
        stage = "running the check cases"
        outputs = run_checks(fn, inputs["cases"], device)
        torch.save({"outputs": outputs}, WORK / "outputs.pt")
        timings = []
        if device == "cuda" and job.get("points"):
            stage = "timing"
            timings = time_points(fn, job["points"])
    except torch.cuda.OutOfMemoryError as exc:
        write_result(status="error", stage=stage, kind="out of memory",
                     message=f"Out of GPU memory while {stage} (this worker may use "
                             f"{job.get('gpu_memory_fraction', 1):.0%} of the GPU): {str(exc)[:300]}")
        return
    except BaseException as exc:  # noqa: BLE001 - whatever the learner's code raises is the message
        write_result(status="error", stage=stage, kind=type(exc).__name__,
                     message=f"Your code raised an error while {stage}:\n{learner_traceback(exc)}")
        return
    write_result(status="ok", timings=timings, seconds=time.monotonic() - started,
                 device=torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)")


if __name__ == "__main__":
    main()
