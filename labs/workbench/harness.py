"""The worker: runs inside the jail (labs.workbench.jail), in its own folder (/run/learner), with a copy of
labs/engine/timing.py beside it. Everything it reports is untrusted: the learner's code shares its process.

    python harness.py /run/learner

The folder holds solution.py (the learner's code) and job.json. Two modes:

- "check": call the learner's function on the check cases (inputs.pt, made by the app) and save the outputs
  (outputs.pt: the app compares them with float64 references); then, on a GPU, time the function on each
  timing point with do_bench. That time is *self-timed*: shown beside the trusted one, never the verdict's.
- "judge": run under Nsight Compute, launched by the app *outside* the jail. Each call takes its inputs
  from judge-in.pt (made by the app from a seed this process never sees, one fresh set per call) and its
  output goes to judge-out.pt, which the app checks. This mode launches no kernel of its own: every kernel
  ncu sees is the learner's, and the app adds them all up.

The file `phase` says "compiling" while Triton compiles (its cache hook) and "running" once a kernel is
compiled or launched, or a call returned: the app charges the time to the compile budget or to the (shorter)
run budget accordingly. Lying about it only moves time between two budgets that both end in a kill. Nothing here imports the repository: the jail does not hold it.
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

WORK = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()


def write_result(**result) -> None:
    (WORK / "result.json").write_text(json.dumps(result))


def mark(state: str) -> None:
    """'compiling' or 'running': which budget the app charges from now on (labs.workbench.sandbox._watch)."""
    (WORK / "phase").write_text(state)
    PHASE[0] = state


PHASE = [""]


def mark_running(*_args, **_kwargs) -> None:
    """The learner's code is compiled and launching: the run budget applies from now on."""
    if PHASE[0] != "running":
        mark("running")


def mark_compiling(*_args, **_kwargs):
    """Triton is about to compile a kernel: the compile budget applies until it launches."""
    mark("compiling")
    return None  # a true value would tell Triton to skip the compilation


def watch_launches() -> None:
    try:
        from triton import knobs

        knobs.runtime.jit_cache_hook = mark_compiling
        knobs.runtime.jit_post_compile_hook = mark_running
        knobs.runtime.launch_enter_hook = mark_running
    except Exception:  # noqa: BLE001 - an older Triton: the first returned call marks the phase instead
        pass


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
    """A fresh random input of a self-timed point (never zeros: zeros hide bugs and time faster)."""
    import torch

    dtype = getattr(torch, spec["dtype"])
    return torch.randn(spec["shape"], device=device, dtype=torch.float32).to(dtype)


def call(fn, args: list, device: str):
    import torch

    out = fn(*args)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the function must return a tensor, not {type(out).__name__}")
    if device == "cuda":
        torch.cuda.synchronize()
    mark_running()
    return out.detach().to("cpu")


def run_checks(fn, cases: list, device: str) -> list:
    import torch

    outputs = []
    for case in cases:
        args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in case]
        if device == "cuda":  # NaN in the memory the next allocations reuse: unwritten outputs show up
            nbytes = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
            torch.full((max(nbytes, 4) // 2,), float("nan"), device=device, dtype=torch.float32)
        outputs.append(call(fn, args, device))
    return outputs


def self_time(fn, points: list) -> list:
    """do_bench in this process: what the learner would measure themselves (shown, never trusted)."""
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


JUDGE_WAIT_S = 900  # the app's budgets end a wait long before this; it only bounds a worker the app forgot


def judge(fn, device: str) -> int:
    """One call per input set of judge-in.pt, each output saved for the app to check. No kernel of ours.
    The app may start this worker before the inputs exist (while the check run still runs, so that Python,
    CUDA and the profiler start meanwhile): it then waits for the file, which the app moves in whole."""
    import torch

    waited = time.monotonic()
    while not (WORK / "judge-in.pt").exists():
        if time.monotonic() - waited > JUDGE_WAIT_S:
            raise TimeoutError("the judge's inputs never came")
        time.sleep(0.01)
    calls = torch.load(WORK / "judge-in.pt", weights_only=True, mmap=True)  # read as the copies to the GPU need it
    outputs = []
    for args in calls:
        args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]  # copies, not kernels
        outputs.append(call(fn, args, device))
        del args
    torch.save(outputs, WORK / "judge-out.pt")
    return len(outputs)


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
    watch_launches()
    stage = "loading solution.py"
    try:
        fn = load_solution(job["entry"])
        if job.get("mode") == "judge":
            stage = "running the timed calls"
            calls = judge(fn, device)
            write_result(status="ok", calls=calls, seconds=time.monotonic() - started)
            return
        inputs = torch.load(WORK / "inputs.pt", weights_only=True)
        stage = "running the check cases"
        outputs = run_checks(fn, inputs["cases"], device)
        torch.save({"outputs": outputs}, WORK / "outputs.pt")
        timings = []
        if device == "cuda" and job.get("points"):
            stage = "timing"
            timings = self_time(fn, job["points"])
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
