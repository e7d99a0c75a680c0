"""A submission's verdict: checked against float64, timed by the trusted judge, placed beside our kernel,
the library and the model.

    submit(exercise, code) -> dict     (JSON-ready; the page, the CLI, the store and recordings all use it)

The learner's code runs only in the jailed worker (labs.workbench.sandbox, labs.workbench.jail). This process
makes the check inputs, computes the float64 references and compares. On a GPU, a correct submission is then
timed by the judge (labs.workbench.judge): Nsight Compute, outside the jail, reads the durations of every
kernel of a few calls on fresh inputs, whose outputs are checked here too. That trusted time is the verdict's;
the worker's own do_bench time is shown beside it ("self-timed"), and a time below this GPU's physics floor,
or 10 % away from the self-timed one, reads **not credible**. Our kernel and the vendor library are timed here
at the same point (once per process). Everything on the GPU happens inside `runner.gpu_session`.

Every verdict says how it was measured (`measured_by`) and in which jail it ran (`jail`).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Callable, Optional

import torch

from labs.engine import timing
from labs.engine import runner
from labs.engine import gpu as gpu_mod
from labs.engine.lab import noop_progress
from labs.workbench import judge, sandbox
from labs.workbench.checks import compare, describe_check  # noqa: F401  (the page and the CLI read them here)
from labs.workbench.exercises import Exercise, Point, rate

UNITS = {"tbps": "TB/s", "tflops": "TFLOP/s"}
NEAR_MODEL = 0.85  # at or above this fraction of the model's rate the verdict says "at the model"
AS_FAST_AS_OURS = 0.9  # at or above this fraction of our kernel's rate the gap is not blamed on the code
_REFERENCE_TIMINGS: dict = {}  # (exercise, point, gpu key) -> {"ours": ..., "library": ...}
BYTES_FAR_OFF = 1.25  # measured / model DRAM bytes at or above this: the extra bytes are the gap's cause
RUN_FACTOR, MIN_RUN_S = 50, 10.0  # once compiled: killed past 50x the model's time for the phase, at least 10 s


# ---------------------------------------------------------------------------------------------
# Correctness
# ---------------------------------------------------------------------------------------------
def case_label(args) -> str:
    """'1001x517 @ 517x1003', '2x3x1000x64, causal': the check case's input shapes (and flags)."""
    shapes = []
    for a in args:
        if isinstance(a, torch.Tensor):
            shape = "x".join(map(str, a.shape))
            if shape not in shapes:
                shapes.append(shape)
        elif a is True:
            shapes.append("causal")
    return ", ".join(shapes)


# ---------------------------------------------------------------------------------------------
# Performance: our kernel, the library, the model, and the gap
# ---------------------------------------------------------------------------------------------
def reference_figures(ex: Exercise, point: Point, target) -> dict:
    """Our kernel's and the library's achieved rate at this point: timed here on a GPU (once per process),
    else the committed lab recordings. Values: (rate, where it comes from)."""
    if target is None or not target.live:
        return ex.recorded(point)
    key = (ex.name, point.label, target.key)
    if key not in _REFERENCE_TIMINGS:
        figures = {}
        for who, build in (("ours", ex.ours), ("library", ex.library)):
            try:
                fn, nbytes, flops = build(point)
                ms = timing.time_ms(fn)
                figures[who] = (rate(ex.metric, nbytes, flops, ms), f"{target.name}, measured now ({ex.lab} lab)")
                del fn
            except Exception as exc:  # noqa: BLE001 - a missing compiler must not cost the learner the verdict
                recorded = ex.recorded(point).get(who)
                figures[who] = recorded or (None, f"could not run: {exc}")
        _REFERENCE_TIMINGS[key] = figures
    return _REFERENCE_TIMINGS[key]


def slow_reason(ex: Exercise) -> str:
    """The lesson's 'When it is slow' section: the usual causes (a pointer for the learner, never a diagnosis)."""
    match = re.search(r"^## When it is slow\s*\n(.*?)(?=^## |\Z)", ex.lesson(), re.S | re.M)
    return " ".join(match.group(1).split()) if match else ""


def counted_clause(dram_ratio: Optional[float]) -> str:
    """' The GPU's counters: 1.02x the DRAM bytes the model counts.' (empty without counters)."""
    return "" if dram_ratio is None else f" The GPU's counters: {dram_ratio:.2f}x the DRAM bytes the model counts."


def launch_clause(judged: Optional[dict]) -> str:
    """What ncu read of the learner's own launch: ' Your longest kernel, add_kernel, ran 65536 blocks of 128
    threads (4 warps) (26 registers per thread); 1 kernel per call.' (empty when nothing was read)."""
    launch = (judged or {}).get("launch") or {}
    if not launch.get("grid_blocks") or not launch.get("block_threads"):
        return ""
    regs = f" ({launch['registers']:.0f} registers per thread)" if launch.get("registers") else ""
    per_call = judged.get("kernels_per_call") or 0
    warps = launch["block_threads"] / 32
    return (f" Your longest kernel, {launch['kernel']}, ran {launch['grid_blocks']:.0f} blocks of "
            f"{launch['block_threads']:.0f} threads ({warps:.0f} warp{'s' if warps != 1 else ''}){regs}; "
            f"{per_call:.0f} kernel{'s' if per_call >= 1.5 else ''} per call.")


def explanation(ex: Exercise, judged: Optional[dict], dram_ratio: Optional[float], target, ours_close: bool) -> str:
    """Why the kernel misses the model, from what was measured of its own launch only; says so when nothing
    measured explains it."""
    facts = []
    if ours_close:
        facts.append(f"Our kernel misses the model by as much: the {ex.lab} lab explains that gap "
                     f"(ceilings {target.ceilings.source}).")
    if dram_ratio is not None and dram_ratio >= BYTES_FAR_OFF:
        facts.append(f"The GPU's counters show where time goes: it moved {dram_ratio:.1f}x the DRAM bytes the model "
                     "counts.")
    launch = (judged or {}).get("launch") or {}
    blocks = launch.get("grid_blocks")
    if blocks and target.sm_count and blocks < target.sm_count:
        facts.append(f"Its longest kernel ran only {blocks:.0f} blocks for {target.sm_count} SMs: "
                     f"{target.sm_count - blocks:.0f} SMs had nothing to do.")
    per_call = (judged or {}).get("kernels_per_call") or 0
    if per_call >= 1.5:
        facts.append(f"It launched {per_call:.0f} kernels per call where the model counts one.")
    if facts:
        return " ".join(facts)
    if not judged:
        return ("No counters were read for this kernel, so nothing measured explains the gap; the lesson's "
                "'When it is slow' lists the usual causes.")
    bytes_part = f"its DRAM bytes are {dram_ratio:.2f}x the model's" if dram_ratio is not None else "no DRAM bytes read"
    waves = f", {launch['waves']:.1f} waves on the SMs" if launch.get("waves") else ""
    return (f"Nothing we measured explains the gap: {bytes_part}{waves}. The lesson's 'When it is slow' lists the "
            "usual causes.")


def gap_sentence(ex: Exercise, measured_ms: float, work: dict, ours: Optional[float], target,
                 judged: Optional[dict] = None) -> str:
    """Sentences that name the gap between this kernel and the model (and our kernel), told only from what
    was measured: the time, and from `judged` (ncu, on the learner's own launches) DRAM bytes and the launch."""
    unit = UNITS[ex.metric]
    achieved = rate(ex.metric, work["bytes"], work["flops"], measured_ms)
    predicted = rate(ex.metric, work["bytes"], work["flops"], work["predicted_ms"])
    vs_ours = f" That is {achieved / ours:.2f}x our kernel." if ours else ""
    ours_close = bool(ours) and achieved >= AS_FAST_AS_OURS * ours
    dram = (judged or {}).get("dram_bytes")
    dram_ratio = dram / work["bytes"] if dram is not None and work.get("bytes") else None
    launch = launch_clause(judged)
    if ex.metric == "tbps":
        times = measured_ms / work["predicted_ms"]
        if times <= 1 / NEAR_MODEL:
            return (f"At the byte floor: {achieved:.2f} {unit}, {100 / times:.0f}% of the model's {predicted:.2f} "
                    f"{unit} ({target.ceilings.copy_tbps:.2f} TB/s copy).{vs_ours}{counted_clause(dram_ratio)}{launch}")
        return (f"Takes {times:.1f}x the model's time: {achieved:.2f} {unit} against {predicted:.2f}.{vs_ours} "
                f"{explanation(ex, judged, dram_ratio, target, ours_close)}{launch}")
    share = achieved / predicted
    if share >= NEAR_MODEL:
        return (f"At the model: {achieved:.0f} {unit}, {100 * share:.0f}% of its {predicted:.0f} {unit}.{vs_ours}"
                f"{counted_clause(dram_ratio)}{launch}")
    return (f"Reaches {100 * share:.0f}% of the model's {predicted:.0f} {unit} ({achieved:.0f} {unit}).{vs_ours} "
            f"{explanation(ex, judged, dram_ratio, target, ours_close)}{launch}")


def point_rows(ex: Exercise, target, self_timings: dict, judged: Optional[dict] = None) -> list[dict]:
    """One row per timing point: model, our kernel, the library; when timed, the trusted time (`judged`,
    {label: judge_point()}) or else the self-timed one, marked as such; credibility; the gap."""
    rows = []
    for point in ex.points:
        work = ex.work(point, target)
        figures = reference_figures(ex, point, target)
        ours, ours_from = figures.get("ours", (None, "no recording"))
        library, library_from = figures.get("library", (None, "no recording"))
        row = {"point": point.label, "bytes": work["bytes"], "flops": work["flops"],
               "intensity_flop_per_byte": work["flops"] / work["bytes"] if work["bytes"] else None,
               "predicted_ms": work["predicted_ms"],
               f"predicted_{ex.metric}": rate(ex.metric, work["bytes"], work["flops"], work["predicted_ms"]),
               "model": work["model"], f"ours_{ex.metric}": ours, "ours_source": ours_from,
               f"library_{ex.metric}": library, "library_source": library_from, "library": ex.library_name}
        self_ms = self_timings.get(point.label)
        if self_ms is not None:
            row.update({"self_ms": self_ms, f"self_{ex.metric}": rate(ex.metric, work["bytes"], work["flops"], self_ms)})
        got = (judged or {}).get(point.label)
        ms, by = None, None
        if got and got.get("status") == "measured" and got.get("trusted_ms"):
            ms, by = got["trusted_ms"], "trusted"
            reasons = judge.credibility(ex, got, work, target, self_ms)
            floor, floor_what = judge.floor_ms(ex, work, target)
            row.update({"trusted_ms": ms, "credible": not reasons, "not_credible": reasons,
                        "floor_ms": floor, "floor": floor_what, "kernels": got["kernels"],
                        "kernels_per_call": got["kernels_per_call"], "kernel_names": got["kernel_names"],
                        "launch": got["launch"], "judged_calls": got["calls"]})
            if got.get("dram_bytes") is not None:
                row.update({"counted_dram_bytes": got["dram_bytes"], "counted_dram_read_bytes": got["dram_read_bytes"],
                            "counted_dram_write_bytes": got["dram_write_bytes"],
                            "dram_bytes_ratio": got["dram_bytes"] / work["bytes"] if work["bytes"] else None})
        elif got and got.get("status") == "measured":  # ncu read no duration: no kernel ran
            row.update({"credible": False, "not_credible": judge.credibility(ex, got, work, target, self_ms)})
        elif self_ms is not None:
            ms, by = self_ms, "self-timed"
            floor, floor_what = judge.floor_ms(ex, work, target)
            beyond = [f"your self-timed {self_ms:.4g} ms per call is below this GPU's physics floor of {floor:.4g} ms "
                      f"({floor_what})"] if floor is not None and self_ms < floor else []
            row.update({"credible": False, "beyond_physics": bool(beyond), "floor_ms": floor, "floor": floor_what,
                        "not_credible": beyond + [(got or {}).get("message") or "no trusted measurement of this point"]})
        if ms is not None:
            row.update({"measured_ms": ms, "measured_by": by,
                        f"measured_{ex.metric}": rate(ex.metric, work["bytes"], work["flops"], ms),
                        "gap": gap_sentence(ex, ms, work, ours, target, got if by == "trusted" else None)})
            row["error_pct"] = 100 * (row[f"measured_{ex.metric}"] / row[f"predicted_{ex.metric}"] - 1)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# A submission
# ---------------------------------------------------------------------------------------------
def limits_for(gpu: bool, ex: Optional[Exercise] = None, target=None) -> sandbox.Limits:
    """Budgets apart: compiling (to the first launch), then running: 50x what the model predicts for the
    check cases and the self-timing (do_bench spends ~0.15 s per point), at least 10 s."""
    if not gpu:
        return sandbox.Limits(compile_s=120, run_s=None, cpu_s=120)
    total = torch.cuda.mem_get_info()[1]
    fraction = max(0.05, min(0.9, 0.85 * gpu_mod.free_memory_bytes() / total))
    expected_s = sum(0.15 + 10 * (ex.work(p, target)["predicted_ms"] or 0) / 1e3 for p in ex.points) if ex else 1.0
    return sandbox.Limits(compile_s=120, run_s=max(MIN_RUN_S, RUN_FACTOR * expected_s), cpu_s=600,
                          memory_bytes=16 * 2**30, gpu_memory_fraction=fraction)


def judge_limits(limits: sandbox.Limits, ex: Exercise, point: Point, target) -> sandbox.Limits:
    """The judged run: ncu's start and the input files count as compiling; then 50x the model's time of the
    judged calls, at least 30 s (ncu profiles each kernel separately and the outputs are written out)."""
    predicted_s = judge.CALLS * (ex.work(point, target)["predicted_ms"] or 0) / 1e3
    return dataclasses.replace(limits, compile_s=90, run_s=max(3 * MIN_RUN_S, RUN_FACTOR * predicted_s),
                               open_files=max(limits.open_files, 4096), processes=max(limits.processes, 4096),
                               file_bytes=max(limits.file_bytes, 16 * 2**30))


def model_target(name: Optional[str] = None):
    """Without a GPU: the datasheet GPU to model; by default the labs' selector's first choice, the first
    datasheet row with committed recordings (the H100 SXM), so the workbench and the labs model one GPU."""
    names = [row.name for row in gpu_mod.DATASHEET]
    if name not in names:
        recorded = {gpu_mod.datasheet_for(k.replace("-", " ")) for k in gpu_mod.recorded_gpu_keys()}
        name = next((row.name for row in gpu_mod.DATASHEET if row in recorded), "H100 SXM")
    return gpu_mod.datasheet_target(gpu_mod.datasheet_by_name(name))


def verdict_target(v: dict):
    """The GPU a verdict's model describes: the attached one for a live run, else the named datasheet GPU."""
    return (gpu_mod.live_target() if v.get("gpu") else None) or model_target(v.get("model_gpu"))


def protections() -> list[str]:
    return sandbox.protections()


def start_judges(ex: Exercise, code: str, limits: sandbox.Limits, target) -> dict:
    """{point label: judge.Pending}: the first point's judged worker started ahead (judge.start), where the
    trusted judge can run here; {} where it cannot (judge_point then says why) or starting failed (it starts
    then). One only: two profilers up at once on one GPU would have to agree on whose kernels are whose; a
    later point's worker starts when its turn comes."""
    if judge.unavailable(True):
        return {}
    pending = {}
    try:
        for point in ex.points[:1]:
            pending[point.label] = judge.start(ex, code, judge_limits(limits, ex, point, target), True)
    except Exception:  # noqa: BLE001 - JudgeUnavailable or a failed start: judge_point tries again and says why
        for started in pending.values():
            judge.cancel(started)
        return {}
    return pending


_PREPARING: dict = {}  # the one background preparation of this process (its thread)


def prepare_judge(background: bool = True) -> str:
    """Settle, before any learner's first run, how the trusted judge's profiler works with the jail on this
    server (judge.variant: our own add solution judged under Nsight Compute in a few jail variants, the first
    that works remembered in ROOFLINE_CACHE/workbench-judge.json). The app starts it once per process, in the
    background and under the GPU lock like any run, so a learner's first verdict never waits on it;
    `python -m labs warmup` runs it in the foreground. Returns what it started or did, or why nothing."""
    if background and "thread" in _PREPARING:  # the app's every rerun calls this: once per process
        return "trusted judge: prepared (or being prepared) in the background"
    info = gpu_mod.detect()
    why = judge.unavailable(info.available) or ("" if sandbox.jail.status().ok else sandbox.jail.status().reason)
    if why:
        return f"trusted judge not prepared: {why}"
    if background:
        import threading

        _PREPARING["thread"] = threading.Thread(target=_prepare_quietly, name="roofline-judge-prepare", daemon=True)
        _PREPARING["thread"].start()
        return "trusted judge: finding the profiler's jail in the background"
    return _prepare_now()


def _prepare_now() -> str:
    from labs.workbench.exercises import get_exercise

    add = get_exercise("add")
    target = gpu_mod.live_target()
    point = judge.self_test_point(True)
    with runner.gpu_session("workbench:judge self-test"):
        limits = judge_limits(limits_for(True, add, target), add, point, target)
        try:
            shared = judge.variant(True, limits)
        except judge.JudgeUnavailable as exc:
            return f"trusted judge unavailable: {exc}"
    return "trusted judge ready: " + ("+".join(shared) or "isolated") + judge.variant_words(tuple(shared))


def _prepare_quietly() -> None:
    import logging

    log = logging.getLogger("roofline")
    try:
        log.warning("%s", _prepare_now())
    except Exception:  # noqa: BLE001 - a failed preparation leaves the first learner's run to try again
        log.exception("trusted judge preparation failed")


def submit(ex: Exercise, code: str, progress: Callable[[float, str], None] = noop_progress,
           on_wait: Optional[Callable[[int], None]] = None, static_check: bool = True,
           limits: Optional[sandbox.Limits] = None, counters: bool = True, model_gpu: Optional[str] = None,
           where: str = "") -> dict:
    """Check (and on a GPU, judge) the learner's code for one exercise. Never raises for the learner's faults.
    counters: time a correct kernel by the trusted judge (Nsight Compute) where it can run here.
    model_gpu: without a GPU, the datasheet GPU to model (the labs' selector; default: model_target's).
    where: the GPU of a pool's worker ("gpu1.host"), named in the lock's enter/exit log (the per-GPU audit)."""
    started = time.monotonic()
    code = code.encode("utf-8", "replace").decode("utf-8")  # lone surrogates from a browser cannot be written
    info = gpu_mod.detect()
    gpu = info.available
    target = gpu_mod.live_target() if gpu else model_target(model_gpu)
    st = sandbox.jail.status()
    verdict = {"exercise": ex.name, "metric": ex.metric, "unit": UNITS[ex.metric], "gpu": info.name if gpu else None,
               "model_gpu": target.name, "jail": st.description, "sandbox": protections(), "checks": [],
               "points": [], "notes": [], "measured_by": "not timed", "credible": False}
    if not st.ok:
        return verdict | {"status": "refused", "message": st.reason}
    problems = sandbox.static_problems(code) if static_check else []
    if problems:
        return verdict | {"status": "refused", "message": "Not run: " + " ".join(problems)}
    cases = ex.check_cases(gpu)
    job = {"entry": ex.entry, "gpu": gpu, "mode": "check",
           "points": [{"label": p.label, "args": list(p.args)} for p in ex.points] if gpu else []}
    limits = limits or limits_for(gpu, ex, target)
    judged, why_untrusted, rows, checks = {}, "", [], []
    progress(0.1, "waiting for the GPU lock, then starting the jail")
    asked_at = time.monotonic()
    with runner.gpu_session(f"workbench:{ex.name}" + (f"@{where}" if where else ""), on_wait):
        locked_at = time.monotonic()
        progress(0.2, "running your code in the jail" + (" (check, then self-timing)" if gpu else " (check)"))
        # the judged workers start now, beside the check run: ncu, Python and CUDA come up while it runs
        pending = start_judges(ex, code, limits, target) if gpu and counters else {}
        run = None
        try:
            # on a GPU the run's folder stays for the judged runs (its Triton cache saves the compilation)
            run = sandbox.run_worker(code, job, {"cases": [list(c) for c in cases]}, limits, gpu, keep_dir=gpu)
            checks = _checks(ex, run, cases)
            if gpu and run.status == "ok":
                correct = bool(checks) and all(c["passed"] for c in checks)
                why_untrusted = judge.unavailable(True) if counters else "Trusted timing was not asked for."
                for i, point in enumerate(ex.points if correct and not why_untrusted else ()):
                    progress(0.4 + 0.4 * i / len(ex.points), f"timing {point.label} by the trusted judge (Nsight "
                                                             f"Compute, outside the jail, {judge.CALLS} fresh calls)")
                    try:
                        judged[point.label] = judge.judge_point(ex, code, point, judge_limits(limits, ex, point, target),
                                                                gpu, reuse=run, pending=pending.pop(point.label, None))
                    except judge.JudgeUnavailable as exc:
                        why_untrusted = str(exc)
                        break
                    except Exception as exc:  # noqa: BLE001 - the judge's own failure: no trusted time, said so
                        judged[point.label] = {"status": "failed", "message": f"the judge failed ({type(exc).__name__}: "
                                                                              f"{str(exc)[:300]})"}
                progress(0.85, "timing our kernel and the library at the same size")
                self_ms = {t["label"]: t["ms"] for t in run.result.get("timings", []) if isinstance(t, dict)}
                rows = point_rows(ex, target, self_ms, judged)
        finally:
            for unused in pending.values():  # the check failed or the judge stopped early: nothing left behind
                judge.cancel(unused)
            sandbox.discard(run)
    held_s = time.monotonic() - locked_at
    finished = _finish(verdict, ex, run, checks, rows, target, info, judged, why_untrusted, code)
    # what the class queue's estimates are made of: the GPU lock held, and the whole judging (lock wait left out)
    judge_s = time.monotonic() - started - (locked_at - asked_at)
    return finished | {"held_s": round(held_s, 2), "judge_s": round(judge_s, 2)}


def _checks(ex: Exercise, run: sandbox.WorkerRun, cases: list) -> list[dict]:
    if run.status != "ok":
        return []
    outputs = run.outputs.get("outputs", [])
    checks = [{"case": case_label(args)} | compare(out, ex.reference(*args), ex.dtype)
              for args, out in zip(cases, outputs)]
    return checks if len(checks) == len(cases) else checks + [{"case": "?", "passed": False,
                                                               "message": "missing outputs"}]


def _finish(verdict: dict, ex: Exercise, run: sandbox.WorkerRun, checks: list, rows: list, target, info,
            judged: dict, why_untrusted: str, code: str = "") -> dict:
    """The verdict from the worker's runs: its checks against float64, then (correct, on a GPU) the judged
    points: wrong in a timed call, killed, not credible, or correct with a trusted time."""
    gpu = info.available
    verdict["seconds"] = round(run.seconds + sum(j.get("seconds", 0) for j in judged.values()), 2)
    verdict["jail"] = run.jail or verdict["jail"]
    if run.status != "ok":
        message = run.message or "The worker stopped."
        if run.status == "crashed" and run.stderr_tail.strip():
            message += " Last lines it printed:\n" + "\n".join(run.stderr_tail.strip().splitlines()[-6:])
        return verdict | {"status": run.status, "message": message, "freed_s": run.freed_s}
    verdict["checks"] = checks
    verdict["device"] = run.result.get("device", "")
    if not all(c["passed"] for c in checks):
        bad = next(c for c in checks if not c["passed"])
        verdict["points"] = [{k: val for k, val in r.items() if k in _MODEL_KEYS} for r in rows] if gpu \
            else point_rows(ex, target, {})
        return verdict | {"status": "wrong", "message": describe_check(bad)}
    message = "Correct on every check case (" + "; ".join(c["case"] for c in checks) + ")."
    if not gpu:
        verdict["points"] = point_rows(ex, target, {})
        from labs.workbench import interpret  # what the kernel does, counted in the interpreter, and its model time

        interpret.attach(verdict, ex, code, target)
        verdict["notes"].append(f"Timing needs a GPU, and this machine has none. The check ran in Triton's interpreter "
                                f"on small shapes. Beside the model for the {target.name} are our kernel and the "
                                f"library as recorded on a real GPU.")
        return verdict | {"status": "correct", "message": message, "measured_by": "not timed (no GPU)"}
    verdict["points"] = rows
    for label, got in judged.items():
        if got["status"] == "wrong":
            i, bad = next((i, c) for i, c in enumerate(got["checks"]) if not c.get("passed"))
            return verdict | {"status": "wrong", "message": f"Wrong in timed call {i + 1} of {got.get('calls')} at "
                                                           f"{label} (fresh inputs, checked here): "
                                                           + describe_check({"case": label, **bad})}
        if got["status"] == "failed":
            status = "killed" if got.get("killed") else "not credible"
            return verdict | {"status": status, "freed_s": got.get("freed_s"),
                              "message": f"The trusted timing of {label} did not finish: {got['message']}"}
    if why_untrusted:
        verdict["notes"].append(f"Timing not verified: {why_untrusted} The times shown are self-timed by your own "
                                "process, which your code could alter.")
        beyond = [f"{r['point']}: {r['not_credible'][0]}" for r in rows if r.get("beyond_physics")]
        if beyond:  # no verdict beyond physics, trusted or not
            return verdict | {"status": "not credible", "measured_by": judge.SELF_TIMED,
                              "message": message + " Its time is not credible: " + "; ".join(beyond) + "."}
        return verdict | {"status": "correct", "message": message, "measured_by": judge.SELF_TIMED}
    shared = next((tuple(j.get("shared") or ()) for j in judged.values()), ())
    verdict["measured_by"] = judge.MEASURED_BY.format(calls=judge.CALLS) + judge.variant_words(shared)
    reasons = [f"{r['point']}: {why}" for r in rows for why in r.get("not_credible", [])]
    if reasons:
        return verdict | {"status": "not credible", "message": message + " Its time is not credible: " +
                          "; ".join(reasons) + "."}
    return verdict | {"status": "correct", "credible": True, "message": message}


_MODEL_KEYS = ("point", "bytes", "flops", "intensity_flop_per_byte", "predicted_ms", "predicted_tbps",
               "predicted_tflops", "model", "ours_tbps", "ours_tflops", "ours_source", "library_tbps",
               "library_tflops", "library_source", "library")


# ---------------------------------------------------------------------------------------------
# Recordings: a verdict as a Result (content/recorded/<gpu>/workbench-<exercise>.json)
# ---------------------------------------------------------------------------------------------
def to_result(v: dict, source: str):
    """The verdict of a live GPU run as a Result: one row per timing point, the gap sentences as messages."""
    from labs.engine.results import Result, run_metadata

    info = gpu_mod.detect()
    meta = run_metadata("live" if v.get("gpu") else "model", info if info.available else None,
                         gpu_mod.live_target() or model_target())
    meta |= {"sandbox": v.get("sandbox", []), "jail": v.get("jail"), "measured_by": v.get("measured_by"),
             "credible": v.get("credible"), "status": v.get("status"), "source_file": source,
             "checks": [{k: c.get(k) for k in ("case", "passed", "rel_error", "max_abs_error")} for c in v["checks"]]}
    rows = [{k: val for k, val in r.items() if k not in ("gap", "model")} for r in v.get("points", [])]
    messages = [v.get("message", "")] + [f"{r['point']}: {r['gap']}" for r in v.get("points", []) if r.get("gap")]
    return Result(f"workbench-{v['exercise']}", {"exercise": v["exercise"], "file": source}, rows, meta, messages,
                  v.get("status") == "correct")


def summary_line(v: dict) -> str:
    """One line per timing point for the CLI and the GPU script."""
    lines = []
    m = v["metric"]
    for r in v.get("points", []) or [{}]:
        you, ours = r.get(f"measured_{m}"), r.get(f"ours_{m}")
        ratio = f"{you / ours:5.2f}x ours" if you and ours else "    -    "
        dram = r.get("dram_bytes_ratio")
        lines.append(f"{v['exercise']:10s} {v.get('status', ''):12s} {r.get('point', ''):24s} you {_f(you)} "
                     f"({r.get('measured_by') or '-'}; self {_f(r.get(f'self_{m}')).strip()}) "
                     f"ours {_f(ours)} library {_f(r.get(f'library_{m}'))} model {_f(r.get(f'predicted_{m}'))} "
                     f"{v['unit']:7s} {ratio}" + (f"  DRAM bytes {dram:.2f}x model" if dram else ""))
    return "\n".join(lines)


def _f(x) -> str:
    return f"{x:8.3f}" if isinstance(x, (int, float)) and x == x else "       -"
