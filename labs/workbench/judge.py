"""The trusted judge: a submission's time comes from outside its process, and is held to physics.

For each timing point, after the learner's code passed its check cases:

1. this process makes CALLS fresh input sets on the GPU from a seed drawn here (secrets), never written
   anywhere the learner could read it; only the inputs themselves go to the run's folder (judge-in.pt);
2. the worker (harness "judge" mode) runs in the jail, launched by Nsight Compute (ncu) which runs
   *outside* the jail: the two share a network namespace of their own (ncu talks to its injection over
   loopback) and nothing else. ncu writes its CSV into a folder of this process that the jail does not
   show. `--clock-control none` leaves the clocks as the labs time them; ncu's default cache control
   flushes the caches (the L2 included) before every kernel and serialises every kernel on the device, so
   work on side streams or threads is profiled like the rest;
3. the worker loads each input set (a copy, no kernel), calls the learner's function once per set and saves
   every output: in that run, every kernel on the GPU is the learner's. Their durations are summed, however
   many there are (precomputation, warm-up, autotuning and side work included) and divided by CALLS;
4. every call's output is checked here against the float64 reference of its own inputs: an output cached
   from another call, computed lazily or from modified inputs fails;
5. the time is "not credible" if it is below this GPU's physics floor (the model's bytes at the peak
   bandwidth, the FLOPs at the peak tensor-core rate: the datasheet's, or a measured ceiling plus
   FLOOR_MARGIN where that is higher), if no kernel ran,
   if the kernel count reached the profiler's cap, or if the learner's own timing (do_bench in its process,
   shown beside) disagrees with it by more than SELF_TIMING_TOLERANCE.

What the learner's process does off the GPU's kernels (copy engines, the CPU) is not in ncu's sum: the floor
and the self-timing check catch it when it matters (README, "Threat model: the workbench").
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from labs.workbench import sandbox
from labs.workbench.exercises import Exercise, Point

CALLS = 3  # timed calls per point, each on a fresh input set
MAX_KERNELS = 400  # ncu profiles at most this many kernels per judged point; reaching it: not credible
FLOOR_MARGIN = 1.10  # a kernel may beat the calibrated copy or tensor rate by a little, never by more
SELF_TIMING_TOLERANCE = 0.10  # self-timed vs trusted: more apart than this and the time is not credible
LOG = "ncu.csv"
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "launch__grid_size",
           "launch__block_size", "launch__registers_per_thread", "launch__waves_per_multiprocessor")
MEASURED_BY = ("Nsight Compute kernel durations read outside the jail (--clock-control none; caches flushed and "
               "kernels serialised on the whole device), summed over every kernel of {calls} calls on fresh "
               "inputs; every output checked")
_REFUSED: dict = {}  # {"reason": ...} once the driver refused counters: it will again, so do not retry
SELF_TIMED = "self-timed in the learner's own process (do_bench): not trusted"


class JudgeUnavailable(Exception):
    """No trusted measurement here (no GPU, no ncu, no counters permission, ncu failed): the message says why."""


def unavailable(gpu: bool) -> str:
    """'' when the judge can run here, else why not (starts no process)."""
    from labs.engine import counters

    if not gpu:
        return "Trusted timing needs a GPU and Nsight Compute (ncu)."
    if os.environ.get("ROOFLINE_WORKBENCH_COUNTERS") == "0":
        return "Trusted timing is turned off on this server (ROOFLINE_WORKBENCH_COUNTERS=0)."
    if counters.ncu_path() is None:
        return ("Nsight Compute (ncu) was not found on this server: the trusted time of a submission needs it (it "
                "ships with the CUDA toolkit; ROOFLINE_NCU can name the binary).")
    if _REFUSED:
        return _REFUSED["reason"]
    if not sandbox.jail.status().jailed:
        return "The workbench runs unjailed here: the profiler's log would be within the learner's reach."
    return ""


# ---------------------------------------------------------------------------------------------
# Inputs and checks, on the trusted side
# ---------------------------------------------------------------------------------------------
def fresh_inputs(point: Point, generator: torch.Generator, device: str) -> list:
    """One input set of a point, drawn from this process's own generator (CPU tensors, for the file)."""
    args = []
    for a in point.args:
        if isinstance(a, dict):
            x = torch.randn(a["shape"], device=device, dtype=torch.float32, generator=generator)
            args.append(x.to(getattr(torch, a["dtype"])).cpu())
        else:
            args.append(a)
    return args


def reference(ex: Exercise, args: list, device: str) -> torch.Tensor:
    """The float64 reference of one call, on `device`; batch by batch where the whole would not fit."""
    on = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    if ex.name == "attention" and on[0].shape[0] > 1:  # (B, H, L, L) float64 scores: one batch item at a time
        return torch.cat([ex.reference(*[a[i:i + 1] if isinstance(a, torch.Tensor) else a for a in on])
                          for i in range(on[0].shape[0])])
    return ex.reference(*on)


def check_outputs(ex: Exercise, calls: list, outputs, device: str) -> list[dict]:
    """Each timed call's output against the reference of its own inputs (labs.workbench.verdict.compare)."""
    from labs.workbench.checks import compare

    if not isinstance(outputs, list) or len(outputs) != len(calls):
        got = len(outputs) if isinstance(outputs, list) else "no"
        return [{"passed": False, "message": f"{got} outputs came back for {len(calls)} timed calls"}]
    checks = []
    for args, out in zip(calls, outputs):
        ref = reference(ex, args, device)
        got = out.to(device) if isinstance(out, torch.Tensor) else out
        check = compare(got, ref, ex.dtype)
        checks.append({k: v for k, v in check.items() if k != "shape"})
        del ref, got
    return checks


# ---------------------------------------------------------------------------------------------
# One judged point
# ---------------------------------------------------------------------------------------------
def kernels_from_log(text: str) -> list:
    from labs.engine import counters

    return counters.parse_csv(text)


def summarise(kernels: list, calls: int) -> dict:
    """What the learner's kernels did per call: time, DRAM bytes, and the launch of the longest kernel."""
    def total(name):
        values = [k.metrics.get(name) for k in kernels]
        return None if any(v is None for v in values) or not values else sum(values)

    ns = total("gpu__time_duration.sum")
    read, write = total("dram__bytes_read.sum"), total("dram__bytes_write.sum")
    longest = max(kernels, key=lambda k: k.metrics.get("gpu__time_duration.sum") or 0) if kernels else None
    launch = None
    if longest is not None:
        m = longest.metrics
        launch = {"kernel": longest.name.split("(")[0][:80], "grid_blocks": m.get("launch__grid_size"),
                  "block_threads": m.get("launch__block_size"), "registers": m.get("launch__registers_per_thread"),
                  "waves": m.get("launch__waves_per_multiprocessor"),
                  "share_of_time": (m.get("gpu__time_duration.sum") or 0) / ns if ns else None}
    return {"trusted_ms": ns / 1e6 / calls if ns is not None else None, "kernels": len(kernels),
            "kernels_per_call": len(kernels) / calls,
            "dram_bytes": (read + write) / calls if read is not None and write is not None else None,
            "dram_read_bytes": read / calls if read is not None else None,
            "dram_write_bytes": write / calls if write is not None else None,
            "kernel_names": sorted({k.name.split("(")[0][:80] for k in kernels})[:8], "launch": launch}


@dataclass
class Pending:
    """A judged worker started ahead of its inputs (start): ncu outside, the learner's code in the jail, both
    up and waiting while the check run still runs. judge_point() hands it the inputs and waits for it."""

    started: sandbox.Started
    judge_dir: Path  # ncu's log folder: this process's, never in the jail's view
    shared: tuple


def start(ex: Exercise, code: str, limits: sandbox.Limits, gpu: bool, shared: Optional[tuple] = None) -> Pending:
    """Start the judged worker of one point under ncu (outside the jail), before its inputs exist. Raises
    JudgeUnavailable when ncu cannot be used here. The caller holds the GPU lock (or is about to run its
    check run under it: this worker launches nothing until judge_point hands it its inputs)."""
    from labs.engine import counters

    why = unavailable(gpu) if gpu else ""
    if why:
        raise JudgeUnavailable(why)
    if shared is None:
        shared = variant(gpu, limits)
    ncu = counters.ncu_path()
    if ncu is None:
        raise JudgeUnavailable(unavailable(True))
    judge_dir = Path(tempfile.mkdtemp(prefix="judge-", dir=sandbox.base_dir()))  # 0700, not in the jail
    log = judge_dir / LOG

    def under_ncu(work: Path) -> list:
        return counters.ncu_command(ncu, list(METRICS), str(log), ["--launch-count", str(MAX_KERNELS)], None)

    outer_env = {"HOME": str(judge_dir), "TMPDIR": str(judge_dir)}  # ncu's own, outside the jail
    extra = []
    uid = sandbox._next_uid()
    if "uid" in shared:  # ncu, as the run's uid, writes its log there
        os.chown(judge_dir, uid, uid)
    if "tmp" in shared:  # ncu's /tmp and /dev/shm are the jail's (its log stays in judge_dir, out of sight)
        judge_dir.chmod(0o711)  # the jail's uid must reach the two folders to bind them; it never sees judge_dir
        for name, inside in (("tmp", "/tmp"), ("shm", "/dev/shm")):
            (judge_dir / name).mkdir()
            (judge_dir / name).chmod(0o1777)
            extra += ["--bind", str(judge_dir / name), inside]
        extra += ["--dir", "/tmp/home"]  # the learner's HOME, inside the shared /tmp
        outer_env.update({"ROOFLINE_JUDGE_TMP": str(judge_dir / "tmp"), "ROOFLINE_JUDGE_SHM": str(judge_dir / "shm"),
                          "TMPDIR": "/tmp"})
    try:
        job = {"entry": ex.entry, "gpu": gpu, "mode": "judge"}
        started = sandbox.start_worker(code, job, {}, limits, gpu, keep_dir=True, profiler=under_ncu,
                                       outer_env=outer_env, jail_extra=tuple(extra), shared=tuple(shared), uid=uid)
    except BaseException:
        shutil.rmtree(judge_dir, ignore_errors=True)
        raise
    return Pending(started, judge_dir, tuple(shared))


def cancel(pending: Optional[Pending]) -> None:
    """A judged worker started ahead and not needed (the check failed, the verdict stopped): stopped, cleared."""
    if pending is not None:
        sandbox.cancel_worker(pending.started)
        shutil.rmtree(pending.started.work, ignore_errors=True)
        shutil.rmtree(pending.judge_dir, ignore_errors=True)


def _share_compilation(reuse: Optional[sandbox.WorkerRun], pending: Pending) -> None:
    """The check run's Triton cache copied into the judged run's folder before its first call: the same
    learner's kernels, compiled once (the judged worker looks the cache up only when it first launches)."""
    if reuse is None or reuse.workdir is None or not (reuse.workdir / ".triton").is_dir():
        return
    target = pending.started.work / ".triton"
    shutil.copytree(reuse.workdir / ".triton", target, symlinks=True, dirs_exist_ok=True)
    for root, dirs, files in os.walk(target):
        for name in [root] + [os.path.join(root, f) for f in dirs + files]:
            os.lchown(name, pending.started.uid, pending.started.uid)


def judge_point(ex: Exercise, code: str, point: Point, limits: sandbox.Limits, gpu: bool,
                reuse: Optional[sandbox.WorkerRun] = None, calls: int = CALLS,
                shared: Optional[tuple] = None, pending: Optional[Pending] = None) -> dict:
    """Run the learner's function `calls` times on fresh inputs under ncu (outside the jail); return
    {"status": "measured"|"wrong"|"failed", ...summarise(), "checks": [...], "message": ...}.
    shared: the profiler's private namespaces the jail keeps (None: the variant this server's self-test chose).
    pending: the worker start() started ahead for this point (None: started here). reuse: the check run,
    whose compiled kernels the judged run takes over. Raises JudgeUnavailable when ncu cannot be used here.
    The caller holds the GPU lock."""
    from labs.engine import counters

    pending = pending or start(ex, code, limits, gpu, shared)
    device = "cuda" if gpu else "cpu"
    generator = torch.Generator(device=device).manual_seed(secrets.randbits(62))  # never leaves this process
    inputs = [fresh_inputs(point, generator, device) for _ in range(calls)]
    log, run = pending.judge_dir / LOG, None
    try:
        _share_compilation(reuse, pending)
        sandbox.hand_over(pending.started, "judge-in.pt", inputs)
        run = sandbox.finish_worker(pending.started)
        text = log.read_text(errors="replace") if log.is_file() else ""
        outputs = None
        out_file = run.workdir / "judge-out.pt" if run.workdir else None
        expected = sum(a.numel() * a.element_size() for args in inputs for a in args if isinstance(a, torch.Tensor))
        if run.status == "ok" and out_file is not None and out_file.is_file() and not out_file.is_symlink() \
                and out_file.stat().st_size > 4 * expected + 2**20:
            outputs = f"too large ({out_file.stat().st_size} bytes)"  # never read a file the learner blew up
        elif run.status == "ok" and out_file is not None and out_file.is_file() and not out_file.is_symlink():
            try:
                outputs = torch.load(out_file, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - the learner's process wrote it
                outputs = f"unreadable ({exc})"
    finally:
        shutil.rmtree(pending.judge_dir, ignore_errors=True)
        if run is None:
            sandbox.cancel_worker(pending.started)
        shutil.rmtree(pending.started.work, ignore_errors=True)  # hundreds of MB of inputs and outputs
    shared = pending.shared
    problem = counters.ncu_failure(run.returncode or 0, run.stderr_tail + "\n" + text)
    if problem and counters.PERMISSION_HELP in problem:  # it will be refused again: the caller stops asking
        _REFUSED["reason"] = problem
        raise JudgeUnavailable(problem)
    if run.status != "ok":
        first = (run.message or "the worker stopped").strip().splitlines()
        said = [line for line in run.stderr_tail.strip().splitlines() if line.strip()][-4:]
        return {"status": "failed", "killed": run.status == "killed", "freed_s": run.freed_s,
                "message": " ".join(filter(None, [first[0] if first else "", first[-1] if len(first) > 1 else "",
                                                  problem or ""] + (["Last lines: " + " | ".join(said)] if said else []))),
                "seconds": run.seconds}
    kernels = kernels_from_log(text)
    if problem and not kernels and "No kernels were profiled" not in problem:
        return {"status": "failed", "message": problem, "seconds": run.seconds}
    checks = check_outputs(ex, inputs, outputs, device)
    summary = summarise(kernels, calls)
    status = "measured" if all(c.get("passed") for c in checks) else "wrong"
    return {"status": status, **summary, "checks": checks, "calls": calls, "seconds": run.seconds,
            "gpu_processes": run.gpu_processes,
            "shared": list(shared),
            "message": "" if status == "measured" else "the output of a timed call was wrong"}


# ---------------------------------------------------------------------------------------------
# Which jail the profiler can work with on this server: tried once on our own solution
# ---------------------------------------------------------------------------------------------
# what of the profiler's private namespaces (made for the run) the jail shares besides its network, least first
# "uid": ncu runs as the run's own uid, as in the sandbox that counted bytes before the jail (host-uid mode only)
VARIANTS = ((), ("ipc",), ("ipc", "tmp"), ("ipc", "tmp", "uid"), ("ipc", "tmp", "pid"))
def self_test_point(gpu: bool) -> Point:
    n = 2**22 if gpu else 1003  # a real kernel on a GPU; the interpreter (tests) takes a small one
    return Point(f"n={n}", ({"shape": [n], "dtype": "float32"},) * 2, {"n": n})
_VARIANT: dict = {}
RETRY_NONE_S = 600  # a server where no jail worked for the profiler tries again after this long


def _variant_file() -> Path:
    base = os.environ.get("ROOFLINE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "roofline")
    return Path(base) / "workbench-judge.json"


def _server_key(gpu: bool) -> str:
    from labs.engine import counters, gpu as gpu_mod

    st = sandbox.jail.status()
    return "|".join([gpu_mod.detect().name if gpu else "cpu", str(counters.ncu_path()), st.description, st.mode])


def variant(gpu: bool, limits: sandbox.Limits) -> tuple:
    """The namespaces the jail shares with the profiler on this server: the first of VARIANTS under which our
    own add solution is judged correctly (its outputs checked, its kernels counted). Remembered in this process
    and in ROOFLINE_CACHE/workbench-judge.json; raises JudgeUnavailable (with what each variant said) when none
    works: verdicts are then self-timed and marked so. Sharing the profiler's PID namespace is trusted only
    where the worker runs under a host uid of its own (it cannot reach the root-owned profiler's files)."""
    import json

    key = _server_key(gpu)
    stale = _VARIANT.get(key, {})
    if stale and stale["shared"] is None and time.time() - stale.get("time", 0) > RETRY_NONE_S:
        del _VARIANT[key]
    if key not in _VARIANT:
        try:
            saved = json.loads(_variant_file().read_text())
            retry = saved.get("shared") is None and time.time() - saved.get("time", 0) > RETRY_NONE_S
            if saved.get("key") == key and not retry:  # "none works" is tried again after a while
                _VARIANT[key] = saved
        except (OSError, ValueError):
            pass
    if key not in _VARIANT:
        from labs.workbench.exercises import get_exercise

        add, said = get_exercise("add"), []
        for shared in VARIANTS:
            if ("pid" in shared or "uid" in shared) and sandbox.jail.status().mode != "host-uid":
                said.append(f"{'+'.join(shared)}: not trusted without a host uid of its own")
                continue
            if "tmp" in shared and any(str(sandbox.SANDBOX_BASE).startswith(t) for t in ("/tmp", "/dev/shm")):
                said.append(f"{'+'.join(shared)}: the runs' folders ({sandbox.SANDBOX_BASE}) are under /tmp")
                continue
            try:
                got = judge_point(add, add.solution(), self_test_point(gpu), limits, gpu, shared=shared)
            except JudgeUnavailable:
                raise
            if got["status"] == "measured" and got.get("kernels"):
                _VARIANT[key] = {"key": key, "shared": list(shared), "said": said, "time": time.time()}
                break
            said.append(f"{'+'.join(shared) or 'isolated'}: {got.get('message', got['status'])[:400]}")
        else:
            _VARIANT[key] = {"key": key, "shared": None, "said": said, "time": time.time()}
        try:
            _variant_file().parent.mkdir(parents=True, exist_ok=True)
            _variant_file().write_text(json.dumps(_VARIANT[key]))
        except OSError:
            pass
    found = _VARIANT[key]
    if found["shared"] is None:
        raise JudgeUnavailable("Nsight Compute could not judge our own solution in any jail on this server ("
                               + "; ".join(found["said"]) + ").")
    return tuple(found["shared"])


def variant_words(shared: tuple) -> str:
    names = {"ipc": "IPC namespace", "pid": "PID namespace", "tmp": "/tmp and /dev/shm"}
    words = "" if not shared else ("; ncu and the jail also share a private " +
                                   ", ".join(names[x] for x in shared if x in names) + ", made for the run")
    return words + ("; ncu runs as the run's own uid, unseen by the jail" if "uid" in shared else "")


# ---------------------------------------------------------------------------------------------
# Physics and credibility
# ---------------------------------------------------------------------------------------------
def floor_ms(ex: Exercise, work: dict, target) -> tuple[Optional[float], str]:
    """The least time this GPU can take for the point's work: the model's bytes at its peak bandwidth and
    (compute-bound exercises) its FLOPs at its peak tensor-core rate. A peak is the datasheet's where this GPU
    has a row (what the hardware cannot beat), or the measured ceiling FLOOR_MARGIN faster, whichever is
    higher: a measured ceiling is a sustained rate that a kernel profiled alone at a cool boost clock can pass
    (an H100 ran our 4096 matmul at 729 TFLOP/s under Nsight Compute against a calibrated 647)."""
    c, sheet = target.ceilings, target.datasheet
    if c.source not in ("measured", "recorded", "datasheet"):
        return None, "no ceilings known for this GPU"

    def peak(measured: float, datasheet: Optional[float], unit: str) -> tuple[float, str]:
        if datasheet and datasheet >= measured * FLOOR_MARGIN:
            return datasheet, f"the datasheet's peak {unit}"
        return measured * FLOOR_MARGIN, f"{c.source} ceiling + {100 * (FLOOR_MARGIN - 1):.0f}%"

    copy, copy_from = peak(c.copy_tbps, sheet.bandwidth_tbps if sheet else None, "bandwidth")
    parts = [(work["bytes"] / (copy * 1e12) * 1e3, f"{work['bytes'] / 1e6:.0f} MB at {copy:.2f} TB/s, {copy_from}")]
    if ex.metric == "tflops":
        measured = c.matmul_tflops.get(ex.dtype) or c.matmul_tflops.get("bf16") or 0
        listed = (sheet.matmul_tflops(ex.dtype) or sheet.matmul_tflops("bf16")) if sheet else None
        if measured or listed:
            rate, rate_from = peak(measured, listed, "tensor-core rate")
            parts.append((work["flops"] / (rate * 1e12) * 1e3,
                          f"{work['flops'] / 1e9:.0f} GFLOP at {rate:.0f} TFLOP/s, {rate_from}"))
    ms, what = max(parts)
    return ms, what


def credibility(ex: Exercise, judged: dict, work: dict, target, self_ms: Optional[float]) -> list[str]:
    """Why the trusted time of a point is not credible (empty list: credible)."""
    reasons = []
    ms = judged.get("trusted_ms")
    if not judged.get("kernels"):
        return ["no kernel of yours ran on the GPU during the timed calls, yet the outputs were right: the work "
                "was done elsewhere (the CPU, copy engines) or before the calls, where no trusted clock sees it"]
    if judged["kernels"] >= MAX_KERNELS:
        reasons.append(f"your code launched {MAX_KERNELS} kernels or more in {judged.get('calls', CALLS)} calls: "
                       "past the profiler's cap, so part of its time went unmeasured")
    if judged.get("gpu_processes", 0) > 1:
        reasons.append(f"{judged['gpu_processes']} processes of yours held the GPU at once during the timed calls: "
                       "kernels of a second process can escape the profiler")
    floor, what = floor_ms(ex, work, target)
    if ms is not None and floor is not None and ms < floor:
        reasons.append(f"{ms:.4g} ms per call is below this GPU's physics floor of {floor:.4g} ms ({what})")
    if ms and self_ms and abs(self_ms - ms) / ms > SELF_TIMING_TOLERANCE:
        reasons.append(f"your process timed itself at {self_ms:.4g} ms, {100 * abs(self_ms - ms) / ms:.0f}% away "
                       f"from the trusted {ms:.4g} ms (more than {100 * SELF_TIMING_TOLERANCE:.0f}%)")
    return reasons
